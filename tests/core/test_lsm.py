"""Log-structured trees against a plain sorted dict.

Random puts and deletes in transactions, commits (pending changes become a run), merges
of random neighbouring runs, savepoints and rollbacks; after every step, point reads,
counts and windows (offsets, limits, both directions) of random ranges must be exactly
the dict's, whether they are answered from one run, many, or pending changes.
"""

from __future__ import annotations

from bisect import bisect_left

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from zerodb_core.btree import DELETE, PUT, REPLACE, NodeSizes, build_run_of, node_from_payload
from zerodb_core.exceptions import IntegrityError, QueryError
from zerodb_core.lsm import merge_reader, merge_windows
from zerodb_core.lsm.merge import FLOOR_BYTES, _combine_reader, _concatenate_reader
from zerodb_core.rootstate import RootState
from zerodb_core.transaction import MergeRuns, Transaction

NAME = "r/t"
SIZES = NodeSizes(inner=160, records=70, index=70, text=70)


class DictSource:
    """Persisted nodes by id (as their payloads, decoded on every fetch: no cache)."""

    def __init__(self) -> None:
        self.blobs: dict[bytes, list] = {}
        self.fetches = 0

    def lookup(self, blob_id):
        return None

    def fetch(self, requests):
        self.fetches += 1
        return {i: node_from_payload(i, self.blobs[i]) for i in requests}


class StoreHarness:
    """One tree of a store kept in a dict: committed runs, a transaction on them, and
    merges of neighbouring runs (the tests of each kind of tree say what it holds)."""

    name = NAME
    catalog = None
    leaf_bytes = 70
    merge = staticmethod(merge_reader)  # the reader that merges runs of this kind of tree
    postings = False

    def __init__(self) -> None:
        self.source = DictSource()
        self.state = self._state(0, {})
        self.txn = Transaction(self.source, self.state, sizes=SIZES)
        self.savepoints: list = []

    def _state(self, seq: int, trees: dict) -> RootState:
        return RootState(seq, None, trees, *(() if self.catalog is None else (self.catalog,)))

    @property
    def tree(self):
        return self.txn.tree(self.name)

    def commit(self) -> None:
        trees, objects = self.txn.flush()
        for obj in objects:
            self.source.blobs[obj.id] = obj.to_payload()
        for blob_id in self.txn.ws.garbage:
            del self.source.blobs[blob_id]
        self.state = self._state(self.state.seq + 1, trees)
        self.txn = Transaction(self.source, self.state, sizes=SIZES)
        self.savepoints = []

    def merge_runs(self, start: int, stop: int) -> None:
        """Merge runs ``[start, stop)`` (newest first) in a transaction of its own."""
        self.commit()
        runs = self.state.trees.get(self.name, ())
        stop = min(stop, len(runs))
        if stop - start < 2:
            return
        window = runs[start:stop]
        txn = self.txn
        segments, garbage = txn.run([type(self).merge(window, stop == len(runs))])[0]
        output, nodes = None, []
        if segments:
            output, nodes = build_run_of(
                segments, leaf_bytes=self.leaf_bytes, inner_bytes=160, postings=self.postings
            )
        roots = tuple(run.root for run in window)
        assert txn.apply(MergeRuns(self.name, roots, output, tuple(nodes), tuple(garbage)))
        self.commit()
        assert len(self.state.trees.get(self.name, ())) == (
            len(runs) - len(window) + bool(segments)
        )

    def step(self, op: str, a, b) -> None:
        """The operations every kind of tree takes: commit, merge, savepoint, rollback."""
        if op == "commit":
            self.commit()
        elif op == "merge":
            self.merge_runs(a, a + b)
        elif op == "savepoint":
            self.savepoints.append((self.txn.savepoint(), dict(self.model)))
        elif op == "rollback" and self.savepoints:
            sp, model = self.savepoints.pop()
            self.txn.rollback_to(sp)
            self.model = model


class Harness(StoreHarness):
    """A tree of keys and values, and the dict it must equal."""

    def __init__(self) -> None:
        super().__init__()
        self.model: dict[bytes, bytes] = {}

    def put(self, key: bytes, value: bytes) -> None:
        self.tree.put(key, value, key in self.model)
        self.model[key] = value

    def delete(self, key: bytes) -> None:
        self.tree.delete(key)
        del self.model[key]

    def check(self, probes) -> None:
        tree = self.tree
        keys = sorted(self.model)
        assert len(tree) == len(keys)
        run = self.txn.run
        wanted = [key for key, *_ in probes] + keys[:3] + keys[-3:]
        assert run([tree.get_many_reader(wanted)])[0] == {
            k: self.model[k] for k in wanted if k in self.model
        }
        for lo, hi, skip, limit, reverse in probes:
            if hi is not None and hi < lo:
                lo, hi = hi, lo
            a = bisect_left(keys, lo)
            b = len(keys) if hi is None else bisect_left(keys, hi)
            expected = [(k, self.model[k]) for k in keys[a:b]]
            if reverse:
                expected.reverse()
            window = expected[skip:] if limit is None else expected[skip : skip + limit]
            got = run([tree.scan_reader(lo, hi, skip=skip, limit=limit, reverse=reverse)])[0]
            assert got == window, (lo, hi, skip, limit, reverse)
            assert run([tree.count_reader(lo, hi)])[0] == len(expected)


keys_st = st.binary(min_size=0, max_size=3)
op_st = st.one_of(
    st.tuples(st.just("put"), keys_st, st.binary(max_size=12)),
    st.tuples(st.just("delete"), st.integers(0, 10**6), st.none()),
    st.tuples(st.just("batch"), st.lists(keys_st, max_size=30), st.binary(max_size=6)),
    st.tuples(st.just("commit"), st.none(), st.none()),
    st.tuples(st.just("merge"), st.integers(0, 6), st.integers(2, 6)),
    st.tuples(st.just("savepoint"), st.none(), st.none()),
    st.tuples(st.just("rollback"), st.none(), st.none()),
)
probe_st = st.tuples(
    keys_st,
    st.one_of(st.none(), keys_st),
    st.integers(0, 40),
    st.one_of(st.none(), st.integers(0, 12)),
    st.booleans(),
)


@settings(max_examples=250, deadline=None)
@given(ops=st.lists(op_st, max_size=60), probes=st.lists(probe_st, min_size=1, max_size=5))
def test_log_structured_tree_matches_a_sorted_dict(ops, probes):
    h = Harness()
    for op, a, b in ops:
        if op == "put":
            h.put(a, b)
        elif op == "delete" and h.model:
            h.delete(sorted(h.model)[a % len(h.model)])
        elif op == "batch":
            for key in a:
                if key in h.model and len(key) % 2:
                    h.delete(key)
                else:
                    h.put(key, b + key)
        else:
            h.step(op, a, b)
        h.check(probes)
    h.commit()
    # Everything merged into one run: the oldest, so puts only.
    runs = h.state.trees.get(NAME, ())
    h.merge_runs(0, len(runs))
    runs = h.state.trees.get(NAME, ())
    assert len(runs) <= 1 and all(run.plain for run in runs)
    h.check(probes)
    # Every blob still stored is reachable: merges named every input node as garbage.
    reachable = set()
    for run in runs:
        ids = h.txn.run([_ids(run)])[0]
        reachable.update(ids)
    assert reachable == set(h.source.blobs)


def _ids(run):
    from zerodb_core.btree import Run

    return (yield from Run(run).node_ids_reader())


def test_a_window_deep_in_many_runs_reads_one_path_per_run():
    """An offset far into several interleaved runs costs one round trip per level, and
    reads a handful of nodes per run, not the runs."""
    h = Harness()
    for batch in range(4):
        for i in range(batch, 800, 4):  # four runs of interleaved keys
            h.put(i.to_bytes(2, "big"), b"v%d" % i)
        h.commit()
    runs = h.state.trees[NAME]
    assert len(runs) == 4 and min(run.height for run in runs) >= 3
    h.source.fetches = 0
    fetched = []
    fetch = h.source.fetch
    h.source.fetch = lambda requests: fetched.append(len(requests)) or fetch(requests)
    got = h.txn.run([h.tree.scan_reader(skip=555, limit=7)])[0]
    assert [int.from_bytes(k, "big") for k, _ in got] == list(range(555, 562))
    assert len(fetched) == max(run.height for run in runs)
    assert sum(fetched) <= 4 * 3 * max(run.height for run in runs)


def _disjoint_runs(h: Harness, runs: int = 4, per_run: int = 300) -> None:
    """Runs of growing keys, as a load of new records makes them."""
    for batch in range(runs):
        for i in range(batch * per_run, (batch + 1) * per_run):
            h.put(i.to_bytes(2, "big"), b"v%d" % i)
        h.commit()


def test_runs_whose_keys_do_not_overlap_merge_without_reading_their_leaves():
    h = Harness()
    _disjoint_runs(h)
    runs = h.state.trees[NAME]
    assert min(run.height for run in runs) >= 3
    leaves = set().union(*h.txn.run([_leaf_ids(run) for run in runs]))
    fetched: set[bytes] = set()
    fetch = h.source.fetch
    h.source.fetch = lambda requests: fetched.update(requests) or fetch(requests)
    h.merge_runs(0, len(runs))
    h.source.fetch = fetch
    assert fetched and not fetched & leaves  # inner nodes only
    (merged,) = h.state.trees[NAME]
    assert h.txn.run([_leaf_ids(merged)])[0] == leaves  # every leaf kept as it was
    assert (merged.count, merged.plain, merged.dels) == (len(h.model), True, 0)
    assert (merged.first, merged.last) == (min(h.model), max(h.model))
    h.check([])
    assert set(h.source.blobs) == set(h.txn.run([_ids(merged)])[0])  # nothing lost or left


def test_runs_whose_keys_do_not_overlap_merge_as_reading_every_leaf_would():
    """Same leaves, counts and fences as the merge that reads and combines every leaf;
    the run's bytes (which steer merges) within the rounding of sharing each input's
    leaf bytes out evenly."""
    h = Harness()
    _disjoint_runs(h)
    runs = h.state.trees[NAME]
    built = []
    for reader in (_concatenate_reader(runs), _combine_reader(runs, True)):
        segments, garbage = h.txn.run([reader])[0]
        ref, _ = build_run_of(segments, leaf_bytes=70, inner_bytes=160)
        built.append((ref, set(garbage), {leaf.id for leaf in segments}))
    (fast, fast_garbage, fast_leaves), (full, full_garbage, full_leaves) = built
    assert fast_leaves == full_leaves and fast_garbage == full_garbage
    assert (fast.count, fast.height, fast.first, fast.last, fast.plain) == (
        full.count,
        full.height,
        full.first,
        full.last,
        full.plain,
    )
    assert abs(fast.bytes - full.bytes) <= 0.02 * full.bytes


def test_a_load_then_deletes_merge_exactly():
    """A tombstone lies in the range of the run holding its key, so runs of a load
    followed by deletes are combined entry by entry, and at the bottom the deleted
    keys are gone."""
    h = Harness()
    _disjoint_runs(h, runs=2)
    h.delete((0).to_bytes(2, "big"))
    h.put((5000).to_bytes(2, "big"), b"new")  # keeps the newest run apart from the others
    h.commit()
    runs = h.state.trees[NAME]
    assert not runs[0].plain
    h.merge_runs(0, len(runs))
    (merged,) = h.state.trees[NAME]
    assert merged.plain and merged.dels == 0
    h.check([])


def test_merge_combines_exact_changes():
    """Added then deleted leaves nothing; deleted then added again is a replacement;
    at the bottom tombstones vanish and replacements become puts."""
    h = Harness()
    for key in (b"a", b"b", b"c"):
        h.put(key, b"1")
    h.commit()
    h.delete(b"a")
    h.put(b"b", b"2")
    h.put(b"d", b"1")
    h.commit()
    h.put(b"a", b"3")
    h.delete(b"d")
    h.commit()
    newest_two = h.state.trees[NAME][:2]
    segments, _ = h.txn.run([merge_reader(newest_two, False)])[0]
    ((keys, values, tags),) = segments
    assert list(zip(keys, tags, values)) == [(b"a", REPLACE, b"3"), (b"b", REPLACE, b"2")]
    segments, _ = h.txn.run([merge_reader(h.state.trees[NAME], True)])[0]
    assert segments == [([b"a", b"b", b"c"], [b"3", b"2", b"1"], b"")]


def test_runs_that_disagree_fail_the_merge_closed():
    h = Harness()
    h.put(b"a", b"1")
    h.commit()
    h.txn.changes.writable(NAME).restore(b"a", (PUT, b"2"))  # a put of a present key
    h.commit()
    with pytest.raises(IntegrityError, match="disagree"):
        h.txn.run([merge_reader(h.state.trees[NAME], True)])


def test_pending_changes_follow_the_exact_rules():
    h = Harness()
    h.put(b"a", b"1")
    h.commit()
    pending = h.txn.changes.writable(NAME)
    h.put(b"b", b"1")
    h.delete(b"b")
    assert pending.get(b"b") is None  # added and removed: nothing to record
    h.delete(b"a")
    assert pending.get(b"a") == (DELETE, b"")
    h.put(b"a", b"2")
    assert pending.get(b"a") == (REPLACE, b"2")
    pending.delete(b"a")
    assert pending.get(b"a") == (DELETE, b"")
    with pytest.raises(QueryError, match="deleted twice"):
        pending.delete(b"a")


def test_a_merge_keeps_the_leaves_no_other_run_overlaps():
    """Runs of growing keys (a load) merge by new inner nodes over their old leaves; a
    leaf overlapped by another run's is rewritten, with its neighbour."""
    h = Harness()
    for start in (0, 100, 200):
        for i in range(start, start + 100):
            h.put(i.to_bytes(2, "big"), b"v")
        h.commit()
    h.put((150).to_bytes(2, "big"), b"w")  # overlaps one leaf of the middle run
    h.commit()
    runs = h.state.trees[NAME]
    leaf_ids = set().union(*(h.txn.run([_leaf_ids(run)])[0] for run in runs))
    segments, garbage = h.txn.run([merge_reader(runs, True)])[0]
    kept = {s.id for s in segments if not isinstance(s, tuple)}
    rewritten = [s for s in segments if isinstance(s, tuple)]
    # Every leaf but the two holding key 150 (the middle run's and the newest run's).
    assert len(kept) == len(leaf_ids) - 2 and not kept & set(garbage)
    assert len(rewritten) == 1 and (150).to_bytes(2, "big") in rewritten[0][0]
    h.merge_runs(0, len(runs))
    h.check([(b"", None, 140, 20, False)])


def _leaf_ids(run):
    from zerodb_core.btree import Run

    leaves = yield from Run(run).leaves_reader()
    return {leaf.id for leaf in leaves}


def test_merge_policy_merges_runs_of_one_size_only():
    def run(size):
        return _Ref(size)

    assert merge_windows(tuple(run(100) for _ in range(3)), 4) == []
    assert merge_windows(tuple(run(100) for _ in range(4)), 4) == [(0, 4)]
    big = FLOOR_BYTES * 64
    # Three small runs on a big one: not four of one level.
    assert merge_windows((run(100), run(100), run(100), run(big)), 4) == []
    # Four runs of one level above the big one merge, the big one stays.
    assert merge_windows((*(run(FLOOR_BYTES * 4) for _ in range(4)), run(big)), 4) == [(0, 4)]
    # Small runs stranded between big ones are swept into the big ones' level.
    mixed = (run(big), run(100), run(big), run(big), run(big))
    assert merge_windows(mixed, 4) == [(1, 5)]


class _Ref:
    def __init__(self, size: int) -> None:
        self.bytes = size


HASH = b"c" * 16  # a child id
WELL_FORMED = [
    [0, [b"a"], [b"x"]],  # a leaf of puts
    [0, [b"a", b"b"], [b"x", b""], bytes([REPLACE, DELETE])],  # a leaf with tags
    [1, [b"a"], [HASH], [3]],  # an inner node of puts
    [1, [b"a"], [HASH], [0], [2]],  # with tombstone counts
    [3, 8, 2, b"\x00"],  # a Bloom filter
]
MALFORMED = [
    [9],
    "x",
    [0, [b"a"], []],  # a key without a value
    [0, [b"a"], ["x"]],  # a value that is not bytes
    [0, [b"a"], [b"x"], b""],  # tags, but not one per key
    [0, [b"a"], [b"x"], bytes([DELETE + 1])],  # a tag no entry has
    [1, [], [], []],  # an inner node without children
    [1, [b"a"], [HASH], [0]],  # a child that adds no key, without tombstone counts
    [1, [b"a"], [HASH], [1], [-1]],  # a negative tombstone count
    [1, [b"a"], [HASH], [-2], [1]],  # fewer live keys than its tombstones remove
    [1, [b"a"], [HASH], [1], [0, 0]],  # tombstone counts, not one per child
    [3, 8, 2, b"\x00\x00"],  # filter bits that are not its size
    [3, 8, 0, b"\x00"],  # a filter with no probes
    [3, 8, 2],  # a filter without its bits
]


@pytest.mark.parametrize("payload", WELL_FORMED)
def test_well_formed_node_payloads_load(payload):
    assert node_from_payload(HASH, payload).id == HASH


@pytest.mark.parametrize("payload", MALFORMED)
def test_malformed_node_payload_fails_closed(payload):
    with pytest.raises(IntegrityError, match="not a well-formed"):
        node_from_payload(HASH, payload)

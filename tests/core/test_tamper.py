"""A hostile store, seen from the native API: every tampering fails closed, by name.

The store (the blob server, or whoever can write the SQLite file) is untrusted. These
tests build a real database, then play the attacker directly on the storage: flip,
truncate, swap, relabel, move or delete blobs, serve old or forked roots, damage the
keyring. A *new* ``DB`` (empty cache) then queries it, and each attack must raise the
named exception (``IntegrityError``, ``FreshnessError``, ``WrongPassphraseError``) --
never return different data, and never hand a byte of the tampered blob to the decoder.

"Nothing is deserialised first" is checked by a spy (:class:`DecodeSpy`) that logs every
``BlobSealer.open`` (accepted or rejected) and every msgpack decode, in order. For a
rejected blob it asserts that the error came out of ``BlobSealer.open`` itself (not from
a shape check after decoding, which raises the same ``IntegrityError``), that the
rejection is the last thing that happened, and that everything the decoder ever saw was
a slice of a plaintext that had passed authentication.

The crypto unit tests (``test_crypto_*.py``) cover the blob format byte by byte; this
module covers the wiring: that the engine asks for the right id and kind, checks roots
against what it has seen, and cannot be talked into skipping a check.
"""

from __future__ import annotations

import random
import shutil
import sqlite3
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

import msgpack
import pytest

from blob_server.storage.memory import MemoryStorage
from tests.core.hr import Employee
from zerodb_core import DB, FreshnessError, IntegrityError, MissingBlobError, WrongPassphraseError
from zerodb_core import serialization as serialization_module
from zerodb_core.crypto import BlobSealer, Keyring, slot_name
from zerodb_core.crypto.blobs import CIPHERTEXT_OFFSET, HEADER_BYTES, OVERHEAD
from zerodb_core.query import Contains, Gt, InRange
from zerodb_core.rootstate import root_blob_id
from zerodb_core.transport import LocalTransport

USER = "tamper-test-user"
PASSWORD = "tamper test passphrase"
NODE_BYTES = 512  # small nodes: 300 records make trees three levels deep
N_EMPLOYEES = 300
WORDS = ["alpha", "beta", "gamma", "delta", "kernel", "panic", "docs", "bugs", "stone", "lee"]
KIND_NODE, KIND_RECORD = 3, 4


def open_db(path: Path, **kwargs) -> DB:
    """A new client on the store file: empty cache, the freshness file beside the store."""
    kwargs.setdefault("username", USER)
    kwargs.setdefault("password", PASSWORD)
    return DB(f"sqlite:///{path}", kdf="fast", node_bytes=NODE_BYTES, **kwargs)


def staff(seed: int = 7) -> list[Employee]:
    rnd = random.Random(seed)
    people = [
        Employee(
            name=f"n{i % 37}",
            surname=f"s{i:03d}",
            salary=10_000 + 7 * i,
            description=" ".join(rnd.choices(WORDS, k=6)),
        )
        for i in range(N_EMPLOYEES)
    ]
    # Over SPILL_BYTES: this record lives in a RECORD blob of its own.
    people.append(Employee(name="big", surname="big", salary=1, description="lorem " * 1200))
    return people


def battery(db: DB) -> tuple:
    """Queries that together read every tree (records, each index, a spilled record).

    Returns a plain, comparable answer: tampering must either raise or give exactly this.
    """
    emp = db[Employee]
    everyone = sorted((e.pk, sorted(e.to_record().items())) for e in emp)
    big = [e.pk for e in emp.query(name="big")]
    return (
        everyone,
        len(emp),
        [e.pk for e in emp.query(Gt("salary", 0), sort_index="salary")],
        [e.pk for e in emp.query(InRange("surname", "s000", "s999"), sort_index="surname")],
        sorted(e.pk for e in emp.query(InRange("name", "a", "z"))),
        sorted(e.pk for e in emp.query(Contains("description", "kernel panic"))),
        sorted(e.pk for e in emp.query(Contains("description", "gamma"))),
        sorted(e.pk for e in emp.query(Contains("description", "lorem"))),
        emp.get(big[0]).description,
    )


# -- the attacker's view of the SQLite file -------------------------------------------


def _scope(conn: sqlite3.Connection, database: str = "main") -> int:
    (scope,) = conn.execute(
        "SELECT scope FROM scopes WHERE tenant = 'local' AND database = ?", (database,)
    ).fetchone()
    return scope


def _sql(path: Path, fn: Callable[[sqlite3.Connection], object]):
    """Run ``fn`` on a raw connection to the store file, committed, as the attacker."""
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        conn.execute("BEGIN IMMEDIATE")
        result = fn(conn)
        conn.execute("COMMIT")
        return result
    finally:
        conn.close()


def read_blobs(path: Path, database: str = "main") -> dict[bytes, bytes]:
    return _sql(
        path,
        lambda c: dict(
            c.execute("SELECT id, data FROM blobs WHERE scope = ?", (_scope(c, database),))
        ),
    )


def write_blob(path: Path, blob_id: bytes, data, database: str = "main") -> None:
    _sql(
        path,
        lambda c: c.execute(
            "INSERT INTO blobs (scope, id, data) VALUES (?, ?, ?) "
            "ON CONFLICT (scope, id) DO UPDATE SET data = excluded.data",
            (_scope(c, database), blob_id, data),
        ),
    )


def delete_blob(path: Path, blob_id: bytes) -> None:
    _sql(path, lambda c: c.execute("DELETE FROM blobs WHERE id = ?", (blob_id,)))


def read_root(path: Path, database: str = "main") -> tuple[int, bytes]:
    return _sql(
        path,
        lambda c: c.execute(
            "SELECT seq, data FROM roots WHERE scope = ?", (_scope(c, database),)
        ).fetchone(),
    )


def write_root(path: Path, seq, data, database: str = "main") -> None:
    _sql(
        path,
        lambda c: c.execute(
            "UPDATE roots SET seq = ?, data = ? WHERE scope = ?", (seq, data, _scope(c, database))
        ),
    )


def read_keyring(path: Path, name: str = USER) -> bytes:
    slot = slot_name("local", "main", name)
    return _sql(
        path,
        lambda c: c.execute("SELECT data FROM keyrings WHERE name = ?", (slot,)).fetchone()[0],
    )


def write_keyring(path: Path, data: bytes, name: str = USER) -> None:
    slot = slot_name("local", "main", name)
    _sql(path, lambda c: c.execute("UPDATE keyrings SET data = ? WHERE name = ?", (data, slot)))


def serve_state(src: Path, dst: Path) -> None:
    """Make ``dst`` serve the root and blobs of ``src`` (a server showing another branch)."""
    seq, data = read_root(src)
    for blob_id, blob in read_blobs(src).items():
        write_blob(dst, blob_id, blob)
    write_root(dst, seq, data)


def flip(data: bytes, offset: int, mask: int = 0x01) -> bytes:
    out = bytearray(data)
    out[offset] ^= mask
    return bytes(out)


# -- the decode spy -------------------------------------------------------------------


class DecodeSpy:
    """Log, in order, every blob authentication (accepted or rejected) and every decode.

    Decoding is watched at two levels: ``msgpack.unpackb`` itself (which the engine's
    ``serialization.unpack`` and the keyring both call through the module attribute, so
    nothing decodes msgpack without passing here), and the engine's ``unpack`` under every
    name a ``zerodb_core`` module imported it as (so a module that later switches to
    another decoder still shows up through the engine's entry point).
    """

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.events: list[tuple[str, bytes]] = []
        self.plaintexts: list[bytes] = []
        real_open = BlobSealer.open

        def spy_open(sealer, kind, blob_id, sealed, **options):
            try:
                plaintext = real_open(sealer, kind, blob_id, sealed, **options)
            except BaseException:
                self.events.append(("rejected", bytes(blob_id)))
                raise
            self.events.append(("opened", bytes(blob_id)))
            self.plaintexts.append(plaintext)
            return plaintext

        real_unpackb = msgpack.unpackb

        def spy_unpackb(data, *args, **kwargs):
            self.events.append(("decoded", bytes(data)))
            return real_unpackb(data, *args, **kwargs)

        real_unpack = serialization_module.unpack

        def spy_unpack(data):
            self.events.append(("unpack", bytes(data)))
            return real_unpack(data)

        real_keyring_plaintext = Keyring._from_plaintext.__func__

        def spy_keyring_plaintext(cls, plaintext, name):
            # Reached only after the keyring's tag verified: count it as authenticated.
            self.plaintexts.append(plaintext)
            return real_keyring_plaintext(cls, plaintext, name)

        monkeypatch.setattr(BlobSealer, "open", spy_open)
        monkeypatch.setattr(Keyring, "_from_plaintext", classmethod(spy_keyring_plaintext))
        monkeypatch.setattr(msgpack, "unpackb", spy_unpackb)
        patched = []
        for name, module in list(sys.modules.items()):
            if name.startswith("zerodb_core") and getattr(module, "unpack", None) is real_unpack:
                monkeypatch.setattr(module, "unpack", spy_unpack)
                patched.append(name)
        # If this ever shrinks, a module stopped importing ``unpack`` by name: re-check
        # that it did not grow a decoder of its own.
        assert {"zerodb_core.serialization", "zerodb_core.db", "zerodb_core.blobsource"} <= set(
            patched
        )

    def decodes(self) -> list[bytes]:
        return [data for kind, data in self.events if kind in ("decoded", "unpack")]

    def assert_only_authenticated_decoded(self) -> None:
        """Everything the decoder ever saw came out of a blob that passed authentication."""
        plaintexts = self.plaintexts[::-1]  # a decode is most often of a recent blob
        for data in set(self.decodes()):
            assert any(data in plaintext for plaintext in plaintexts), (
                f"decoded {len(data)} bytes that no authenticated blob contained"
            )

    def assert_rejected_first(self, excinfo: pytest.ExceptionInfo, ids: Iterable[bytes]) -> None:
        """The failure is ``BlobSealer.open`` rejecting one of ``ids``, and nothing ran after.

        ``IntegrityError`` is also what shape checks raise *after* decoding (e.g. a
        malformed record); requiring the innermost frame to be ``BlobSealer.open`` in
        ``crypto/blobs.py`` rules that out.
        """
        ids = set(ids)
        last = excinfo.traceback[-1]
        assert (last.name, Path(str(last.path)).name) == ("open", "blobs.py"), (
            f"{excinfo.typename} raised in {last.path}:{last.lineno} ({last.name}), "
            "not by blob authentication"
        )
        assert self.events, "no blob was opened"
        kind, blob_id = self.events[-1]
        assert kind == "rejected" and blob_id in ids, "something ran after the rejection"
        rejected = [e for e in self.events if e[0] == "rejected"]
        # One rejection; a blob naming an unknown key epoch is tried twice in a row
        # (before and after the client reloads its keyring: another may have rotated).
        assert set(rejected) == {self.events[-1]} and len(rejected) <= 2
        opens = [e for e in self.events if e[0] in ("opened", "rejected")]
        assert opens[-len(rejected) :] == rejected, "a blob was opened in between"
        opened = {blob_id for kind, blob_id in self.events if kind == "opened"}
        assert not opened & ids, "a tampered blob was accepted"
        self.assert_only_authenticated_decoded()


@pytest.fixture
def spy(monkeypatch):
    return DecodeSpy(monkeypatch)


# -- the database under attack --------------------------------------------------------


@dataclass(frozen=True)
class Template:
    path: Path  # a closed store file (with its freshness file beside it) at seq 3
    expected: tuple  # battery() on it
    old_root: tuple[int, bytes]  # the sealed root of seq 1
    touched: tuple[bytes, ...]  # blob ids battery() opens, in order (root excluded)
    tree_roots: dict[str, bytes]  # tree name -> root node id of its (only) run
    garbage: frozenset[bytes]  # ids the merge made unreachable
    big: bytes  # the spilled record's blob id


@pytest.fixture(scope="module")
def template(tmp_path_factory) -> Template:
    """Build the database once per module: 301 employees, then one change (seq 2), then
    the merge of each tree's two runs (seq 3), which leaves the first runs as garbage."""
    path = tmp_path_factory.mktemp("tamper") / "hr.zdb"
    db = open_db(path)
    with db.transaction():
        db.add(*staff())
    old_root = read_root(path)
    first = db[Employee].query(surname="s000")[0]
    first.salary = 999_999
    db.add(first)
    assert db.compact() > 0
    current = db.read_root()
    trees = current.trees
    assert current.seq == 3 and all(len(runs) == 1 for runs in trees.values())
    db.close()
    garbage = _sql(path, lambda c: frozenset(i for (i,) in c.execute("SELECT id FROM garbage")))
    assert garbage, "the merge should have replaced the first runs"

    # What a fresh client opens to answer the battery, recorded by a throwaway spy.
    with pytest.MonkeyPatch.context() as mp:
        recorder = DecodeSpy(mp)
        db = open_db(path)
        expected = battery(db)
        db.close()
    touched = tuple(
        dict.fromkeys(i for kind, i in recorder.events if kind == "opened" and i != root_blob_id(3))
    )
    blobs = read_blobs(path)
    (big,) = [i for i in touched if blobs[i][5] == KIND_RECORD]
    assert len(touched) > 50 and not garbage & set(touched)
    return Template(
        path=path,
        expected=expected,
        old_root=old_root,
        touched=touched,
        tree_roots={name: runs[0].root for name, runs in trees.items()},
        garbage=garbage,
        big=big,
    )


@pytest.fixture
def store(template, tmp_path) -> Path:
    """A private copy of the template store (and its freshness file) for one test."""
    path = tmp_path / "hr.zdb"
    for suffix in ("", ".fresh"):
        shutil.copy(str(template.path) + suffix, str(path) + suffix)
    return path


def leaf_node(template: Template) -> bytes:
    """A touched node that is no tree's root (a leaf or inner node deeper down)."""
    roots = set(template.tree_roots.values())
    return next(i for i in reversed(template.touched) if i not in roots and i != template.big)


def expect_rejected(store: Path, spy: DecodeSpy, ids: Iterable[bytes], match: str):
    """A fresh client's battery fails in ``BlobSealer.open`` on one of ``ids``."""
    db = open_db(store)
    try:
        with pytest.raises(IntegrityError, match=match) as excinfo:
            battery(db)
    finally:
        db.close()
    assert type(excinfo.value) is IntegrityError
    spy.assert_rejected_first(excinfo, ids)
    return excinfo


# -- blobs: altered, truncated, swapped, relabelled, deleted --------------------------


def test_untampered_store_answers(template, store, spy):
    """Baseline: the copy answers like the original, and the spy sees only good blobs."""
    db = open_db(store)
    assert battery(db) == template.expected
    db.close()
    assert spy.decodes() and not any(kind == "rejected" for kind, _ in spy.events)
    spy.assert_only_authenticated_decoded()


@pytest.mark.parametrize(
    "where",
    ["tree root", "deep node", "spilled record"],
)
@pytest.mark.parametrize(
    "region",
    ["nonce", "ciphertext", "tag"],
)
def test_flipped_byte_is_rejected(template, store, spy, where, region):
    blob_id = {
        "tree root": template.tree_roots["r/Employee"],
        "deep node": leaf_node(template),
        "spilled record": template.big,
    }[where]
    data = read_blobs(store)[blob_id]
    offset = {"nonce": HEADER_BYTES + 3, "ciphertext": CIPHERTEXT_OFFSET + 5, "tag": -1}[region]
    write_blob(store, blob_id, flip(data, offset, 0x80))
    expect_rejected(store, spy, [blob_id], "authentication failed")


@pytest.mark.parametrize(
    ("field", "offset", "value", "match"),
    [
        ("magic", 0, ord("X"), "bad magic"),
        ("format version", 3, 2, "unknown format version 2"),
        ("cipher suite", 4, 2, "unknown cipher suite 2"),
        ("cipher suite 0", 4, 0, "unknown cipher suite 0"),
        ("kind", 5, KIND_RECORD, "kind 4 where NODE was expected"),
        ("key epoch", 9, 7, "unknown key epoch 7"),
    ],
)
def test_header_fields_are_checked(template, store, spy, field, offset, value, match):
    blob_id = leaf_node(template)
    data = bytearray(read_blobs(store)[blob_id])
    assert data[offset] != value
    data[offset] = value
    write_blob(store, blob_id, bytes(data))
    expect_rejected(store, spy, [blob_id], match)


def test_record_blob_relabelled_as_node_is_rejected(template, store, spy):
    data = bytearray(read_blobs(store)[template.big])
    data[5] = KIND_NODE
    write_blob(store, template.big, bytes(data))
    expect_rejected(store, spy, [template.big], "kind 3 where RECORD was expected")


@pytest.mark.parametrize(
    ("how", "match"),
    [
        ("last byte cut", "not a sealed size"),
        ("tag cut", "not a sealed size"),
        ("header only", "not a sealed size"),
        ("empty", "not a sealed size"),
        ("smaller size class", "authentication failed"),
        ("grown to next size class", "authentication failed"),
    ],
)
def test_truncated_or_extended_blob_is_rejected(template, store, spy, how, match):
    blob_id = template.big  # large enough to cut down to a smaller valid size class
    data = read_blobs(store)[blob_id]
    assert len(data) > OVERHEAD + 4096
    cut = {
        "last byte cut": data[:-1],
        "tag cut": data[:-16],
        "header only": data[:CIPHERTEXT_OFFSET],
        "empty": b"",
        "smaller size class": data[: OVERHEAD + 4096],
        "grown to next size class": data + bytes(len(data) - OVERHEAD),
    }[how]
    write_blob(store, blob_id, cut)
    expect_rejected(store, spy, [blob_id], match)


def test_two_blobs_swapped(template, store, spy):
    a, b = template.tree_roots["r/Employee"], leaf_node(template)
    blobs = read_blobs(store)
    write_blob(store, a, blobs[b])
    write_blob(store, b, blobs[a])
    expect_rejected(store, spy, [a, b], r"swapped or moved")


def test_two_blobs_swapped_with_headers_rewritten(template, store, spy):
    """Relabelling the header's id as well does not help: the header is authenticated."""
    a, b = template.tree_roots["r/Employee"], leaf_node(template)
    blobs = read_blobs(store)

    def relabel(data: bytes, new_id: bytes) -> bytes:
        return data[:10] + new_id + data[HEADER_BYTES:]

    write_blob(store, a, relabel(blobs[b], a))
    write_blob(store, b, relabel(blobs[a], b))
    expect_rejected(store, spy, [a, b], "authentication failed")


@pytest.mark.parametrize("relabel", [False, True], ids=["as is", "header id rewritten"])
def test_blob_copied_under_another_id(template, store, spy, relabel):
    """A valid blob served in place of another (the original still there)."""
    target = leaf_node(template)
    source = template.tree_roots["i/Employee/salary"]
    data = read_blobs(store)[source]
    if relabel:
        data = data[:10] + target + data[HEADER_BYTES:]
    write_blob(store, target, data)
    expect_rejected(
        store, spy, [target], "authentication failed" if relabel else "swapped or moved"
    )


def test_old_version_of_a_node_served_under_its_new_id(template, store, spy):
    """A garbage node (the previous version of a path) relabelled as the current one."""
    blobs = read_blobs(store)
    old = next(iter(template.garbage))
    target = template.tree_roots["r/Employee"]
    write_blob(store, target, blobs[old][:10] + target + blobs[old][HEADER_BYTES:])
    expect_rejected(store, spy, [target], "authentication failed")


def test_deleted_blob_is_missing_not_empty(template, store, spy):
    target = leaf_node(template)
    delete_blob(store, target)
    db = open_db(store)
    with pytest.raises(IntegrityError, match="missing from the store") as excinfo:
        battery(db)
    db.close()
    # From the current root: the tamper alarm, never "snapshot too old".
    assert type(excinfo.value) is MissingBlobError
    assert not any(blob_id == target for _, blob_id in spy.events)
    spy.assert_only_authenticated_decoded()


def test_tampering_with_unreachable_blobs_is_harmless(template, store):
    """Garbage is never read: flipping or deleting it changes no answer."""
    ids = sorted(template.garbage)
    blobs = read_blobs(store)
    for blob_id in ids[::2]:
        write_blob(store, blob_id, flip(blobs[blob_id], -1))
    for blob_id in ids[1::2]:
        delete_blob(store, blob_id)
    write_blob(store, bytes(16), b"junk the server added")  # an id nobody refers to
    db = open_db(store)
    assert battery(db) == template.expected
    db.close()


def test_any_single_byte_flip_raises_or_changes_nothing(template, store):
    """Sweep: flip one seeded-random byte in each blob in turn; the answer is either an
    ``IntegrityError`` or exactly the untampered one -- and always the error for blobs
    the battery reads."""
    rnd = random.Random(20240601)
    blobs = read_blobs(store)
    touched = set(template.touched)
    ids = sorted(blobs)
    rnd.shuffle(ids)
    # Every touched blob would take a while; a seeded sample plus all garbage suffices.
    sample = ids[:60] + sorted(template.garbage)
    raised = 0
    for blob_id in sample:
        data = blobs[blob_id]
        offset = rnd.choice([rnd.randrange(HEADER_BYTES), rnd.randrange(HEADER_BYTES, len(data))])
        write_blob(store, blob_id, flip(data, offset, 1 << rnd.randrange(8)))
        db = open_db(store)
        try:
            answer = battery(db)
        except IntegrityError as exc:
            assert type(exc) is IntegrityError
            raised += 1
        else:
            assert blob_id not in touched, f"flip at {offset} of a read blob went unnoticed"
            assert answer == template.expected
        finally:
            db.close()
            write_blob(store, blob_id, data)
    assert raised >= len(set(sample) & touched)


# -- the root record: tampered, relabelled, rolled back, forked -----------------------


def test_root_flipped_byte(store, spy):
    seq, data = read_root(store)
    write_root(store, seq, flip(data, -5))
    expect_rejected(store, spy, [root_blob_id(seq)], "authentication failed")


@pytest.mark.parametrize(("offset", "value"), [(3, 9), (4, 9)], ids=["version", "suite"])
def test_root_unknown_version_or_suite(store, spy, offset, value):
    seq, data = read_root(store)
    data = bytearray(data)
    data[offset] = value
    write_root(store, seq, bytes(data))
    expect_rejected(store, spy, [root_blob_id(seq)], f"unknown .* {value}")


def test_root_served_under_another_seq(template, store, spy):
    """The root is sealed with its seq as blob id: the server cannot renumber it."""
    seq, data = read_root(store)
    write_root(store, seq + 1, data)
    expect_rejected(store, spy, [root_blob_id(seq + 1)], "swapped or moved")


def test_old_root_served_under_the_current_seq(template, store, spy):
    seq, _ = read_root(store)
    write_root(store, seq, template.old_root[1])
    expect_rejected(store, spy, [root_blob_id(seq)], "swapped or moved")


def test_rollback_seen_by_the_same_client(template, store):
    db = open_db(store)
    assert battery(db) == template.expected  # this client has now seen seq 3
    write_root(store, *template.old_root)
    with pytest.raises(FreshnessError, match="rollback"):
        battery(db)
    with pytest.raises(FreshnessError):
        db.add(Employee(name="late"))
    db.close()


def test_rollback_seen_by_a_new_process(template, store):
    """A new ``DB`` on the same path reads the freshness file the old one wrote."""
    write_root(store, *template.old_root)
    db = open_db(store)
    with pytest.raises(FreshnessError, match="rollback"):
        battery(db)
    db.close()


def test_rollback_to_an_empty_database(store):
    """Serving "never committed" (seq 0) after seq 3 was seen is a rollback too."""
    write_root(store, 0, b"")
    db = open_db(store)
    with pytest.raises(FreshnessError, match="rollback"):
        len(db[Employee])
    db.close()


def test_rollback_of_the_whole_file(template, store, tmp_path):
    """Restoring an old copy of the store file (backup, snapshot) is caught as well."""
    old = tmp_path / "old.zdb"
    shutil.copy(store, old)
    db = open_db(store)
    db.add(Employee(name="newer"))  # seq 4, remembered in hr.zdb.fresh
    db.close()
    shutil.copy(old, store)  # the file goes back to seq 3; the freshness file stays
    db = open_db(store)
    with pytest.raises(FreshnessError, match="rollback"):
        battery(db)
    db.close()


def test_fork_same_seq(template, store, tmp_path):
    """Two clients branch from one copy; showing one the other's branch is a fork."""
    branch = tmp_path / "branch.zdb"
    shutil.copy(store, branch)  # the server keeps two histories from seq 3 on
    x_fresh, y_fresh = tmp_path / "x.fresh", tmp_path / "y.fresh"
    x = open_db(store, freshness_path=x_fresh)
    y = open_db(branch, freshness_path=y_fresh)
    x.add(Employee(name="only in x"))  # seq 4 on one branch
    y.add(Employee(name="only in y"))  # another seq 4 on the other
    assert read_root(store)[0] == read_root(branch)[0] == 4

    serve_state(branch, store)  # x is now shown y's branch
    with pytest.raises(FreshnessError, match="fork"):
        battery(x)
    x.close()
    restarted = open_db(store, freshness_path=x_fresh)  # a new process of client x
    with pytest.raises(FreshnessError, match="fork"):
        battery(restarted)
    restarted.close()

    y.add(Employee(name="y again"))  # seq 4 on y's branch: its prev is y's seq 3
    serve_state(branch, store)
    restarted = open_db(store, freshness_path=x_fresh)
    with pytest.raises(FreshnessError, match="does not follow"):
        battery(restarted)
    restarted.close()
    y.close()


# -- store values of the wrong type (a hostile or corrupt store file) -----------------
# SQLite columns take any type, so a tampered file can hand back TEXT or INTEGER where
# the engine expects BLOB, and any seq a 64-bit integer holds. All of it must be an
# IntegrityError; today it escapes as TypeError/OverflowError/AttributeError.


@pytest.mark.parametrize(
    "bad",
    [
        pytest.param(-1, id="negative seq"),
        pytest.param("x3", id="seq as text"),
        pytest.param(b"\x00\x03", id="seq as blob"),
    ],
)
def test_root_seq_of_the_wrong_type_or_range(store, bad):
    """The root comes with the keyring, so opening fails (before any query)."""
    _, data = read_root(store)
    write_root(store, bad, data)
    with pytest.raises(IntegrityError, match="root"):
        open_db(store, freshness_path=store.parent / "blank.fresh")


@pytest.mark.parametrize("bad", ["sealed root as text", 12345], ids=["text", "integer"])
def test_root_data_of_the_wrong_type(store, bad):
    """The root comes with the keyring, so opening fails (before any query)."""
    seq, _ = read_root(store)
    write_root(store, seq, bad)
    with pytest.raises(IntegrityError, match="root"):
        open_db(store)


@pytest.mark.parametrize("bad", ["a blob as text", 12345], ids=["text", "integer"])
def test_blob_data_of_the_wrong_type(template, store, bad):
    write_blob(store, leaf_node(template), bad)
    db = open_db(store)
    with pytest.raises(IntegrityError):
        battery(db)
    db.close()


def test_keyring_of_the_wrong_type(store):
    write_keyring(store, "a keyring as text")  # type: ignore[arg-type]
    with pytest.raises(IntegrityError):
        open_db(store)


def test_rewound_id_counter_does_not_overwrite_records(template, store):
    """The store hands out primary keys; handing out one already in use must not turn
    ``add()`` of a new object into a silent overwrite of an existing record."""
    _sql(store, lambda c: c.execute("UPDATE counters SET next = 1"))
    db = open_db(store)
    newcomer = Employee(name="mallory", surname="x", salary=1, description="x")
    with pytest.raises(IntegrityError):
        db.add(newcomer)
    assert newcomer.pk is None
    assert battery(db) == template.expected
    db.close()


# -- the keyring and the passphrase ---------------------------------------------------


def test_wrong_passphrase(store, spy):
    with pytest.raises(WrongPassphraseError):
        open_db(store, password="not the passphrase")
    assert spy.decodes() == []  # the keyring did not open, so nothing was decoded


@pytest.mark.parametrize(
    ("offset", "error"),
    [
        (-1, WrongPassphraseError),  # tag
        (70, WrongPassphraseError),  # ciphertext
        (30, WrongPassphraseError),  # salt: derives another key
        (50, WrongPassphraseError),  # nonce
        (3, IntegrityError),  # format version
        (4, IntegrityError),  # cipher suite
        (5, IntegrityError),  # KDF algorithm
        (6, IntegrityError),  # opslimit: far out of bounds, refused before Argon2id
    ],
)
def test_tampered_keyring(store, spy, offset, error):
    write_keyring(store, flip(read_keyring(store), offset, 0x40))
    with pytest.raises(error) as excinfo:
        open_db(store)
    assert type(excinfo.value) is error
    assert spy.decodes() == []


def test_truncated_keyring(store, spy):
    write_keyring(store, read_keyring(store)[:-1])
    with pytest.raises(IntegrityError, match="not a sealed keyring size"):
        open_db(store)
    assert spy.decodes() == []


def test_keyring_of_another_user_with_their_passphrase(store, spy):
    """Bob's keyring served in Alice's slot does not open, even with Bob's passphrase:
    the slot name is authenticated."""
    bob = open_db(store, username="bob", password="bob's passphrase")
    bob.close()
    write_keyring(store, read_keyring(store, "bob"))
    with pytest.raises(WrongPassphraseError):
        open_db(store, password="bob's passphrase")
    assert spy.decodes() == []


def test_deleted_keyring_does_not_give_an_empty_database(store):
    """With the keyring gone the client makes a new one, and the existing root no longer
    opens: an error, never a silently empty database."""
    _sql(store, lambda c: c.execute("DELETE FROM keyrings"))
    db = open_db(store)
    with pytest.raises(IntegrityError, match="authentication failed"):
        len(db[Employee])
    db.close()


# -- moved between databases and tenants (MemoryStorage) ------------------------------


def _memory_db(storage, database: str, tenant: str = "local", keys_from: DB | None = None):
    db = DB(
        LocalTransport(storage, tenant=tenant),
        username=USER,
        password=PASSWORD,
        database=database,
        kdf="fast",
        node_bytes=NODE_BYTES,
    )
    if keys_from is not None:
        # Keys are per database today, so a moved blob would already fail on the key
        # alone. Giving both databases the same keys isolates what is under test: the
        # database and tenant names sealed into every blob's associated data.
        db.sealer = db.source.sealer = BlobSealer(keys_from.keys, tenant, database)
    return db


@pytest.fixture
def two_databases():
    storage = MemoryStorage()
    main = _memory_db(storage, "main")
    main.add(*staff()[:80])
    other = _memory_db(storage, "other", keys_from=main)
    other.add(*staff(seed=8)[:20])
    yield storage, main, other
    main.close()


@pytest.mark.parametrize("same_keys", [False, True], ids=["own keys", "same keys"])
def test_whole_database_replayed_under_another_name(two_databases, spy, same_keys):
    storage, main, _ = two_databases
    src = storage._databases[("local", "main")]
    dst = storage._databases[("local", "other")]
    dst.blobs.update(src.blobs)
    dst.root = src.root
    reader = _memory_db(storage, "other", keys_from=main if same_keys else None)
    with pytest.raises(IntegrityError, match="authentication failed") as excinfo:
        len(reader[Employee])
    spy.assert_rejected_first(excinfo, [root_blob_id(src.root.seq)])


def test_blob_moved_to_another_database_under_its_own_id(two_databases, spy):
    """Same id, same keys, other database: only the associated data tells them apart."""
    storage, main, other = two_databases
    blobs = storage._databases[("local", "main")].blobs
    node = main.read_root().trees["r/Employee"][0].root
    storage._databases[("local", "other")].blobs[node] = blobs[node]
    assert main.source.fetch([node])  # where it belongs, it opens
    spy.events.clear()
    with pytest.raises(IntegrityError, match="authentication failed") as excinfo:
        other.source.fetch([node])
    spy.assert_rejected_first(excinfo, [node])


def test_database_moved_to_another_tenant(two_databases, spy):
    storage, main, _ = two_databases
    state = storage._databases[("local", "main")]
    # The keyring copied into mallory's slot for the same user: it names its tenant.
    keyrings = {
        slot_name("mallory", "main", USER): state.keyrings[slot_name("local", "main", USER)]
    }
    moved = type(state)(root=state.root, blobs=dict(state.blobs), keyrings=keyrings)
    storage._databases[("mallory", "main")] = moved
    with pytest.raises(WrongPassphraseError):
        _memory_db(storage, "main", tenant="mallory")
    moved.keyrings.clear()  # so the reader makes its own, then gets main's keys
    reader = _memory_db(storage, "main", tenant="mallory", keys_from=main)
    with pytest.raises(IntegrityError, match="authentication failed") as excinfo:
        len(reader[Employee])
    spy.assert_rejected_first(excinfo, [root_blob_id(state.root.seq)])


class _RefusingTransport(LocalTransport):
    """A store that refuses every new keyring, as if another client had created one,
    yet holds none."""

    def _put_keyring(
        self, database: str, name: str, data: bytes, *, expected: bytes | None
    ) -> bool:
        return False


def test_a_store_that_refuses_a_keyring_it_does_not_hold_fails_closed():
    transport = _RefusingTransport(MemoryStorage())
    with pytest.raises(IntegrityError, match="refused a new keyring"):
        DB(transport, USER, PASSWORD, kdf="fast")

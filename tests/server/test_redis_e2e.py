"""End to end on the production stack: a real redis-server (or 3-master cluster),
``zerodb-server serve --redis`` (``--redis-cluster``) as a subprocess, tenants and keys
made with the CLI, ``DB((host, port), key_file=...)``.

One module-wide deployment (two tenants; every name a random marker) runs the workload
under a raw ``MONITOR`` capture: 10,000 Employees loaded in transactions and queried,
then a database of a model defined at run time whose model name, field names, values,
full-text words, undeclared attribute and big integers are all markers. Then:

1. the server process is restarted and a new ``DB`` gives the same answers;
2. no marker (raw, UTF-16 LE/BE, base64 at 3 alignments std/url-safe, hex lower/upper;
   the integers also decimal and 8-byte BE/LE) is in any Redis key name or value, in the
   MONITOR capture, or in the RDB file after ``SAVE`` (on the cluster: of every master);
   key names are opaque. A planted control marker (a ``ctl:`` key beside the server's) is
   found in each of the three (the scanner reads what it claims to);
3. tampering through redis-py (a byte, a swap, a deletion, an old root) makes a fresh
   client raise ``IntegrityError`` / ``FreshnessError``, never return wrong data;
4. the second tenant cannot read, list, overwrite, commit to or subscribe to the first
   tenant's databases by any request of the protocol, and the first tenant's keys in Redis
   are byte-for-byte unchanged afterwards.

The tests share one Redis database and one server, so they run on one xdist worker.
The module runs on one database of the session's redis-server and on the session's
3-master cluster (the ``server_backend`` fixture).
"""

from __future__ import annotations

import os
import random
import re
import secrets
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import redis
from coincurve import PrivateKey

from blob_server.wire import protocol
from tests.core.hr import Employee
from tests.core.test_canary import int_needles, marker, text_needles
from tests.server.conftest import ServerBackend
from tests.server.leakscan import FastScanner, MonitorCapture, flush_monitor, keyspace
from tests.server.test_server_e2e import ServerProcess, run
from tests.server.wire import Wire
from zerodb_core import DB, FreshnessError, IntegrityError, MissingBlobError
from zerodb_core.crypto import slot_name
from zerodb_core.keyfile import KeyFile
from zerodb_core.models import Field, Model, Text
from zerodb_core.query import Contains, Gt, InRange

pytestmark = pytest.mark.xdist_group("redis_e2e")

REDIS_DB = 9  # the blob server's database (the storage contract tests flush database 0)
CONTROL = b"ctl:"  # the positive control's key: beside the server's keys, told apart by name
N_EMPLOYEES = 10_000
BATCH = 2_500
N_MARKED = 300
NAMES = ["Ann", "Bob", "Cleo", "Dan", "Eve"]
WORDS = ["kernel", "payroll", "audit", "printer", "network", "alpha", "beta"]
TAG = rb"[0-9a-f]{32}"
KEY_NAME = {  # the key layouts of blob_server.storage.redis and .cluster
    "redis": re.compile(rb"zdb:(ns|gc|\{%s\}:(root|s|g|p|k|c|u|d|b:%s))" % (TAG, TAG)),
    "cluster": re.compile(
        rb"zdb:(ns|gct?:[0-9a-f]|b:%s:%s|\{%s\}:(root|s|g|p|k|c|o|u|d|j))" % (TAG, TAG, TAG)
    ),
}
BLOB_READ = {"redis": b'"MGET"', "cluster": b'"GET"'}  # one per backend's get_blobs


@dataclass
class Deployment:
    backend: ServerBackend
    tmp: Path
    server: ServerProcess
    tenant_a: str
    tenant_b: str
    keys: dict[str, Path]
    username: str
    password: str
    employees_db: str
    marked_db: str
    before: dict
    capture: bytes = b""
    secrets: dict[bytes, str] = field(default_factory=dict)
    control: dict[bytes, str] = field(default_factory=dict)
    _scanner: FastScanner | None = None
    written_by_b: set[str] = field(default_factory=set)  # databases the 2nd tenant made

    def open(self, database: str, tenant: str | None = None, **kwargs) -> DB:
        return DB(
            ("127.0.0.1", self.server.port),
            username=self.username,
            password=self.password,
            database=database,
            key_file=self.keys[tenant or self.tenant_a],
            kdf="fast",
            **kwargs,
        )

    def scanner(self) -> FastScanner:
        """One scanner for all the markers (indexing ~30,000 needles takes a second)."""
        if self._scanner is None:
            self._scanner = FastScanner(self.secrets)
        return self._scanner

    def admin(self) -> redis.Redis | redis.RedisCluster:
        return self.backend.client()

    def scope(self, database: str, tenant: str | None = None):
        """The key names of a database, as anyone who can read ``zdb:ns`` computes them."""
        store = self.backend.storage()
        try:
            return store._scope(tenant or self.tenant_a, database)
        finally:
            store.close()


def answers(db: DB) -> dict:
    staff = db[Employee]
    return {
        "len": len(staff),
        "eq": sorted(e.pk for e in staff.query(name="Ann")),
        "eq_len": len(staff.query(name="Eve")),
        "range": sorted(e.pk for e in staff.query(InRange("salary", 100_000, 110_000))),
        "range_len": len(staff.query(InRange("salary", 30_000, 60_000))),
        "top": [
            (e.pk, e.salary) for e in staff.query(Gt("salary", 0), sort_index="salary", limit=7)
        ],
        "text": sorted(e.pk for e in staff.query(Contains("description", "kernel audit"))),
        "text_len": len(staff.query(Contains("description", "printer"))),
        "get": staff.get(4321).to_record(),
    }


def employees(rng: random.Random, start: int, n: int) -> list[Employee]:
    return [
        Employee(
            name=rng.choice(NAMES),
            surname=f"S{i}",
            salary=rng.randrange(30_000, 200_000),
            description=" ".join(rng.sample(WORDS, 3)),
        )
        for i in range(start, start + n)
    ]


def load_marked(dep: Deployment, model_name: str) -> None:
    """The canary workload: every name and value is a marker (see tests/core/test_canary)."""
    names = {role: marker(role[:2]) for role in ("name", "surname", "description", "pay", "uq")}
    extra = marker("ex")
    model = type(
        model_name,
        (Model,),
        {
            "__module__": __name__,
            names["name"]: Field(),
            names["surname"]: Field(),
            names["description"]: Text(),
            names["pay"]: Field(),
            names["uq"]: Field(unique=True),
        },
    )
    values: list[str] = []
    numbers: list[int] = []

    def record(words: int = 3) -> Model:
        fields = {role: marker(role[:2]) for role in ("name", "surname", "uq")}
        fields["description"] = " ".join(marker("de") for _ in range(words))
        number = secrets.randbits(62) | 1 << 61
        obj = model(**{names[role]: value for role, value in fields.items()})
        setattr(obj, names["pay"], number)
        setattr(obj, extra, marker("xv"))
        values.extend([*fields.values(), *fields["description"].split(), getattr(obj, extra)])
        numbers.append(number)
        return obj

    with dep.open(dep.marked_db, freshness_path=dep.tmp / "marked.fresh") as db:
        with db.transaction():
            db.add(*(record() for _ in range(N_MARKED - 6)))
        for _ in range(4):  # separate commits: several roots, garbage
            db.add(record())
        big = record(words=400)  # spills to a RECORD blob of its own
        db.add(big)
        changed = db[model].get(big.pk)
        setattr(changed, names["name"], marker("re"))
        values.append(getattr(changed, names["name"]))
        db.add(changed)
        word = getattr(big, names["description"]).split()[7]
        assert [o.pk for o in db[model].query(Contains(names["description"], word))] == [big.pk]
        assert len(db[model]) == N_MARKED - 1
    with dep.open(dep.marked_db, freshness_path=dep.tmp / "marked.fresh") as cold:
        assert len(cold[model].query(Contains(names["description"], word))) == 1  # MGETs
    for text in [model_name, extra, *names.values(), *values]:
        dep.secrets.update(text_needles(text))
    for number in numbers:
        dep.secrets.update(int_needles(number))


@pytest.fixture(scope="module")
def dep(server_backend, tmp_path_factory) -> Iterator[Deployment]:
    tmp = tmp_path_factory.mktemp("redis-e2e")
    admin = server_backend.client()
    captures = [MonitorCapture(port) for port in server_backend.node_ports()]
    tenants = tmp / "tenants.json"
    tenant_a, tenant_b = marker("ta"), marker("tb")
    password = marker("pw")
    keys: dict[str, Path] = {}
    for tenant in (tenant_a, tenant_b):
        run("-m", "blob_server.cli", "add-tenant", tenant, "--tenants", str(tenants))
        keys[tenant] = tmp / f"{tenant}.zdbkey"
        public = run(
            "-m",
            "zerodb_core.keyfile",
            "create",
            "--tenant",
            tenant,
            "--out",
            str(keys[tenant]),
            "--kdf",
            "fast",
            env={"ZERODB_PASSPHRASE": password},
        ).strip()
        run("-m", "blob_server.cli", "add-key", tenant, public, "--tenants", str(tenants))
    listing = run("-m", "blob_server.cli", "list-tenants", "--tenants", str(tenants))
    assert tenant_a in listing and tenant_b in listing
    server = ServerProcess(server_backend.address, tenants, tmp / "server.log")
    server_backend.serve_on(server)
    server.start()
    dep = Deployment(
        backend=server_backend,
        tmp=tmp,
        server=server,
        tenant_a=tenant_a,
        tenant_b=tenant_b,
        keys=keys,
        username=marker("us"),
        password=password,
        employees_db=marker("de"),
        marked_db=marker("dm"),
        before={},
    )
    try:
        # The positive control: a marker Redis sees (MONITOR) and keeps (RDB), under a
        # key of its own, in forms that only an unescaped capture or a raw file read can show.
        control_text, control_int = marker("ct"), secrets.randbits(62) | 1 << 61
        dep.control = {**text_needles(control_text), **int_needles(control_int)}
        admin.set(
            CONTROL + control_text.encode(),
            os.urandom(64)
            + control_text.encode("utf-16-le")
            + os.urandom(64)
            + control_int.to_bytes(8, "little")
            + os.urandom(64),
        )

        rng = random.Random(2024)
        with dep.open(dep.employees_db, freshness_path=tmp / "employees.fresh") as db:
            for start in range(0, N_EMPLOYEES, BATCH):
                with db.transaction():
                    db.add(*employees(rng, start, BATCH))
            dep.before = answers(db)
        load_marked(dep, "Zq" + secrets.token_hex(7))
        for name in (tenant_a, tenant_b, dep.employees_db, dep.marked_db, dep.username):
            dep.secrets.update(text_needles(name))
        dep.secrets.update(text_needles(password))
        for port, capture in zip(server_backend.node_ports(), captures, strict=True):
            node = redis.Redis(port=port)
            flush_monitor(node, capture, b"end-of-workload-" + secrets.token_hex(8).encode())
            node.close()
    finally:
        dep.capture = b"".join(capture.stop() for capture in captures)
    yield dep
    server.stop()
    admin.close()
    log = server.log.read_text(errors="replace")
    assert "Traceback" not in log, log


# -- 1. end to end ---------------------------------------------------------------------------


def test_10000_employees_same_answers_after_a_restart(dep):
    before = dep.before
    assert before["len"] == N_EMPLOYEES
    for name in ("eq", "range", "text", "top"):
        assert before[name], name
    assert 0 < before["eq_len"] < N_EMPLOYEES and 0 < before["range_len"] < N_EMPLOYEES
    assert before["text_len"] > 0 and before["get"]["surname"] == "S4320"
    prefix = dep.scope(dep.employees_db).blob_prefix
    blobs = list(dep.admin().scan_iter(match=prefix + b"*", count=1000))
    assert len(blobs) > 100  # the data is in Redis, not somewhere else

    old_port = dep.server.port
    dep.server.stop()
    dep.server.start()
    assert dep.server.port == old_port
    with dep.open(dep.employees_db, freshness_path=dep.tmp / "employees.fresh") as fresh:
        assert answers(fresh) == before
        assert fresh.transport.tenant == dep.tenant_a


# -- 2. no plaintext ---------------------------------------------------------------------------


def test_scanner_finds_every_encoding_at_every_position():
    needles = {**text_needles(marker("t")), **int_needles(secrets.randbits(62) | 1 << 61)}
    scanner = FastScanner(needles)
    for needle, label in needles.items():
        for pad in range(4):  # every alignment relative to the scanner's 4-byte windows
            hay = os.urandom(997 + pad) + needle + os.urandom(13)
            assert label in scanner.find(hay), (label, pad)
        assert label in scanner.find(needle)  # at both ends of the haystack
    assert scanner.find(os.urandom(100_000)) == []


def test_no_marker_in_any_redis_key_or_value(dep):
    admin = dep.admin()
    every = list(admin.scan_iter(count=1000))
    controls = [name for name in every if name.startswith(CONTROL)]
    names, values = keyspace(admin, [name for name in every if name not in controls])
    assert len(controls) == 1 and len(names) > 100 and len(values) > 1_000_000
    scanner = dep.scanner()
    assert scanner.find(b"\n".join(names)) == []
    assert scanner.find(values) == []
    for name in names:  # opaque: fixed prefixes, a 128-bit tag, 128-bit blob ids
        assert KEY_NAME[dep.backend.name].fullmatch(name), name
    # The tenant's two databases (and more from other tests) are different scopes.
    tags = {m.group(0) for n in names for m in [re.search(rb"\{[0-9a-f]{32}\}", n)] if m}
    assert len(tags) >= 2
    # Positive control: the same scan of the control database finds the planted marker,
    # in its key name (UTF-8) and inside its value (UTF-16, 8-byte little-endian).
    control_names, control_values = keyspace(admin, controls)
    found = FastScanner(dep.control).find(b"\n".join(control_names) + control_values)
    assert any("utf-8" in hit for hit in found)
    assert any("utf-16-le" in hit for hit in found)
    assert any("little-endian" in hit for hit in found)


def test_no_marker_in_the_monitor_capture(dep):
    capture = dep.capture
    assert len(capture) > 1_000_000
    read = BLOB_READ[dep.backend.name]
    assert capture.count(b'"EVALSHA"') >= 8 and read in capture  # commits and reads
    assert dep.scanner().find(capture) == []
    found = FastScanner(dep.control).find(capture)
    assert any("utf-16-le" in hit for hit in found), "MONITOR capture not unescaped?"
    assert any("little-endian" in hit for hit in found)


def saved_rdb(port: int) -> bytes:
    """``SAVE`` on one redis-server, uncompressed, and its RDB file."""
    admin = redis.Redis(port=port)
    compression = admin.config_get("rdbcompression")["rdbcompression"]
    admin.config_set("rdbcompression", "no")  # LZF could hide a plaintext value
    try:
        admin.save()
    finally:
        admin.config_set("rdbcompression", compression)
    config = admin.config_get("dir") | admin.config_get("dbfilename")
    admin.close()
    rdb = (Path(config["dir"]) / config["dbfilename"]).read_bytes()
    assert rdb.startswith(b"REDIS")
    return rdb


def test_no_marker_in_the_rdb_file_after_save(dep):
    rdb = b"".join(saved_rdb(port) for port in dep.backend.node_ports())
    assert len(rdb) > 1_000_000
    assert dep.scanner().find(rdb) == []
    found = FastScanner(dep.control).find(rdb)
    assert any("utf-16-le" in hit for hit in found), "RDB not read?"
    assert any("utf-8" in hit for hit in found)


def test_no_marker_of_the_data_in_the_server_log(dep):
    """The log names tenants by design; it must not contain any record, model or field."""
    tenants = (repr(dep.tenant_a), repr(dep.tenant_b))
    log = dep.server.log.read_bytes()
    hits = dep.scanner().find(log)
    assert any(repr(dep.tenant_a) in hit for hit in hits)  # positive control: logins
    assert [hit for hit in hits if not hit.startswith(tenants)] == []


# -- 3. tampering in Redis ---------------------------------------------------------------------


@dataclass
class Victim:
    database: str
    fresh: Path  # the freshness file of the client that wrote it
    old_root: tuple[bytes, bytes]  # (seq, data) after the first commit
    expected: tuple
    read: list[bytes]  # blob ids a cold client fetched for the battery
    scope: object


def battery(db: DB) -> tuple:
    staff = db[Employee]
    return (
        sorted((e.pk, sorted(e.to_record().items())) for e in staff),
        len(staff),
        [e.pk for e in staff.query(Gt("salary", 0), sort_index="salary")],
        sorted(e.pk for e in staff.query(name="Bob")),
        sorted(e.pk for e in staff.query(Contains("description", "kernel"))),
    )


@pytest.fixture
def victim(dep, request) -> Victim:
    """A small database of the first tenant, three levels deep, committed twice."""
    database = f"tamper-{request.node.name[:40]}-{secrets.token_hex(4)}"
    fresh = dep.tmp / f"{database}.fresh"
    scope = dep.scope(database)
    rng = random.Random(5)
    with dep.open(database, freshness_path=fresh, node_bytes=512) as db:
        db.add(*employees(rng, 0, 150))
        old = dep.admin().hmget(scope.root, "seq", "data")
        db.add(*employees(rng, 150, 150))
        expected = battery(db)
    read: list[bytes] = []
    with dep.open(database, freshness_path=fresh) as cold:
        original = cold.transport._get_blobs

        def spy(database, ids):
            read.extend(ids)
            return original(database, ids)

        cold.transport._get_blobs = spy
        assert battery(cold) == expected
    assert len(read) > 20
    return Victim(database, fresh, tuple(old), expected, read, scope)


def fresh_client_raises(dep, victim, error=IntegrityError, match=None, fresh=None):
    """A new DB (empty cache) runs the battery: it must raise ``error``, exactly."""
    path = fresh or dep.tmp / "blank.fresh"
    with (
        dep.open(victim.database, freshness_path=path) as db,
        pytest.raises(error, match=match) as excinfo,
    ):
        battery(db)
    assert type(excinfo.value) is error
    Path(dep.tmp / "blank.fresh").unlink(missing_ok=True)


def flip(data: bytes, offset: int, mask: int = 0x01) -> bytes:
    out = bytearray(data)
    out[offset] ^= mask
    return bytes(out)


@pytest.mark.parametrize("offset", [10, 30, 60, -1], ids=["id", "nonce", "ciphertext", "tag"])
def test_changed_byte_of_a_blob(dep, victim, offset):
    key = victim.scope.blob(victim.read[len(victim.read) // 2])
    admin = dep.admin()
    admin.set(key, flip(admin.get(key), offset))
    fresh_client_raises(dep, victim)


def test_two_blobs_swapped(dep, victim):
    admin = dep.admin()
    a, b = victim.scope.blob(victim.read[0]), victim.scope.blob(victim.read[-1])
    data_a, data_b = admin.get(a), admin.get(b)
    assert data_a != data_b
    admin.set(a, data_b)  # two SETs: on a cluster the keys are in different slots
    admin.set(b, data_a)
    fresh_client_raises(dep, victim, match="swapped or moved")


def test_deleted_blob(dep, victim):
    assert dep.admin().delete(victim.scope.blob(victim.read[-1])) == 1
    # Missing from the current root: the tamper alarm, never "snapshot too old".
    fresh_client_raises(dep, victim, error=MissingBlobError, match="missing")


def test_root_rolled_back_to_an_older_one(dep, victim):
    admin = dep.admin()
    with dep.open(victim.database, freshness_path=victim.fresh) as warm:
        assert battery(warm) == victim.expected  # this client saw the newer root
        seq, _ = admin.hmget(victim.scope.root, "seq", "data")
        assert int(seq) > int(victim.old_root[0])
        admin.hset(
            victim.scope.root, mapping={"seq": victim.old_root[0], "data": victim.old_root[1]}
        )
        if warm.transport.known_root_seq(victim.database) is None:
            with pytest.raises(FreshnessError, match="rollback"):
                battery(warm)
        else:
            # Its subscription vouches that nothing was committed through the server, so
            # it skips the root read and keeps answering with the newer (right) data...
            assert battery(warm) == victim.expected
        # ...and its next commit meets the old root in the conflict answer: refused.
        with pytest.raises(FreshnessError, match="rollback"):
            warm.add(Employee(name="late"))
    # A restarted client (a new process: a new DB on the same freshness file) detects it.
    fresh_client_raises(dep, victim, FreshnessError, "rollback", fresh=victim.fresh)
    with (
        dep.open(victim.database, freshness_path=victim.fresh) as writer,
        pytest.raises(FreshnessError),
    ):
        writer.add(Employee(name="late"))


def test_root_rolled_back_to_empty(dep, victim):
    dep.admin().delete(victim.scope.root)
    fresh_client_raises(dep, victim, FreshnessError, "rollback", fresh=victim.fresh)


def test_root_of_another_database_or_tenant(dep, victim):
    """Another database's current root served here (it has its own keys and names this
    database nowhere), then this database's old root under the current seq."""
    admin = dep.admin()
    other = admin.hgetall(dep.scope(dep.employees_db).root)
    admin.hset(victim.scope.root, mapping={"data": other[b"data"]})
    fresh_client_raises(dep, victim)
    admin.hset(victim.scope.root, mapping={"data": victim.old_root[1]})
    fresh_client_raises(dep, victim)


def test_any_single_byte_flip_raises_or_changes_nothing(dep, victim):
    """A seeded sweep over blobs (read or not, garbage included): a fresh client either
    raises IntegrityError or gives exactly the untampered answers."""
    admin = dep.admin()
    rnd = random.Random(77)
    blob_keys = sorted(admin.scan_iter(match=victim.scope.blob_prefix + b"*", count=1000))
    read = {victim.scope.blob(i) for i in victim.read}
    raised = 0
    for key in rnd.sample(blob_keys, 12):
        data = admin.get(key)
        offset = rnd.randrange(len(data))
        admin.set(key, flip(data, offset, 1 << rnd.randrange(8)))
        try:
            with dep.open(victim.database, freshness_path=dep.tmp / "sweep.fresh") as db:
                answer = battery(db)
        except IntegrityError as exc:
            assert type(exc) is IntegrityError
            raised += 1
        else:
            assert key not in read, f"flip at {offset} of a read blob went unnoticed"
            assert answer == victim.expected
        finally:
            admin.set(key, data)
    assert raised >= 1


# -- 4. isolation between tenants --------------------------------------------------------------


def owned(key: bytes, scope) -> bool:
    """Whether the key is one of the scope's (on a cluster its blobs carry no hash tag)."""
    return key.startswith((b"zdb:{" + scope.tag + b"}:", scope.blob_prefix))


def snapshot(client: redis.Redis, scopes: list) -> dict[bytes, bytes]:
    """Every key of these scopes, DUMPed (type, value and encoding), by name."""
    keys = [k for k in client.scan_iter(count=1000) if any(owned(k, s) for s in scopes)]
    pipe = client.pipeline(transaction=False)
    for key in keys:
        pipe.dump(key)
    return dict(zip(keys, pipe.execute(), strict=True))


def collect_all_garbage(dep) -> None:
    """What the server's collector does, now and with no retention window."""
    store = dep.backend.storage()
    try:
        store.collect_garbage(retention=0)
    finally:
        store.close()


def login(dep, tenant: str, key_tenant: str | None = None) -> Wire:
    wire = Wire(dep.server.port)
    key = PrivateKey(KeyFile.load(dep.keys[key_tenant or tenant], dep.password).login_key)
    answer, _ = wire.login(tenant, key)
    if key_tenant in (None, tenant):
        assert answer.ok, answer.result
    else:
        assert not answer.ok and answer.result[0] == protocol.AUTH_FAILED, answer
    return wire


def no_frame(wire: Wire, seconds: float = 0.5) -> bool:
    wire.sock.settimeout(seconds)
    try:
        frame = protocol.recv_frame(wire.sock)
    except TimeoutError:
        return True
    finally:
        wire.sock.settimeout(5)
    raise AssertionError(f"unexpected frame {frame!r}")


def test_second_tenant_db_sees_an_empty_database_of_the_same_name(dep):
    with dep.open(dep.employees_db, tenant=dep.tenant_b) as other:
        assert other.transport.tenant == dep.tenant_b
        assert len(other[Employee]) == 0
        other.add(Employee(name="Mallory", surname="B", salary=2, description="kernel"))
        dep.written_by_b.add(dep.employees_db)
        assert len(other[Employee]) == 1
    with dep.open(dep.employees_db, freshness_path=dep.tmp / "employees.fresh") as mine:
        assert len(mine[Employee].query(name="Mallory")) == 0
        assert len(mine[Employee]) == N_EMPLOYEES


def test_requests_before_login_are_refused(dep):
    wire = Wire(dep.server.port)
    try:
        for op in ("get_root", "get_blobs", "commit", "stats", "subscribe", "get_keyring"):
            answer = wire.call(op, {"database": dep.employees_db})
            assert not answer.ok and answer.result[0] == protocol.UNAUTHENTICATED, op
    finally:
        wire.close()


def test_second_tenant_cannot_reach_the_first_tenants_databases(dep):
    admin = dep.admin()
    targets = [dep.employees_db, dep.marked_db]
    scopes = {db: dep.scope(db) for db in targets}
    collect_all_garbage(dep)  # so that only garbage made during this test can go
    before = snapshot(admin, list(scopes.values()))
    assert len(before) > 100
    roots = {db: admin.hgetall(s.root) for db, s in scopes.items()}
    blob_ids = {
        db: [bytes.fromhex(k.rsplit(b":", 1)[1].decode()) for k in before if s.blob_prefix in k]
        for db, s in scopes.items()
    }
    assert all(len(ids) > 5 for ids in blob_ids.values())

    # Logging in as the first tenant with the second tenant's key is refused.
    login(dep, dep.tenant_a, key_tenant=dep.tenant_b).close()

    wire = login(dep, dep.tenant_b)
    try:
        # A second login on the session (to switch tenants) is refused.
        assert not wire.call("challenge").ok
        # Naming a tenant in any request is refused outright.
        for op, args in [
            ("get_root", {"database": targets[0]}),
            ("get_blobs", {"database": targets[0], "ids": blob_ids[targets[0]][:5]}),
            ("stats", {"database": targets[0]}),
            ("subscribe", {"database": targets[0]}),
            ("get_keyring", {"database": targets[0], "name": "x"}),
            ("allocate_ids", {"database": targets[0], "sequence": "x", "count": 1}),
        ]:
            answer = wire.call(op, {**args, "tenant": dep.tenant_a})
            assert not answer.ok and answer.result[0] == protocol.BAD_REQUEST, (op, answer)

        # The first tenant's database names, and names that try to smuggle its tenant or
        # its scope tag in: each is the second tenant's own database, or refused.
        names = [*targets, dep.tenant_a]
        for db in targets:
            names += [f"{dep.tenant_a}/{db}", f"{dep.tenant_a}:{db}", f"../{dep.tenant_a}/{db}"]
            names += [f"{{{scopes[db].tag.decode()}}}", f"{dep.tenant_a}\x00{db}", db + "\x00"]
        for name in names:
            owner = next((db for db in targets if db in name), targets[0])
            ids = blob_ids[owner]
            root = wire.call("get_root", {"database": name})
            if "\x00" in name:
                assert not root.ok and root.result[0] == protocol.BAD_REQUEST, name
                continue
            assert root.ok and root.result["data"] != roots[owner][b"data"], name
            own_seq = root.result["seq"]
            # Only the database the second tenant wrote through its DB has a root.
            assert own_seq == (1 if name in dep.written_by_b else 0), name
            assert own_seq != int(roots[owner][b"seq"])
            got = wire.call("get_blobs", {"database": name, "ids": ids[:4096]})
            assert got.ok and got.result == {"blobs": {}, "deferred": []}, name
            stats = wire.call("stats", {"database": name})
            assert stats.ok and stats.result["seq"] == own_seq, name
            for user in (dep.username, "root"):
                slot = slot_name(dep.tenant_a, owner, user)
                keyring = wire.call("get_keyring", {"database": name, "name": slot})
                assert keyring.ok and keyring.result is None, name
                put = wire.call(  # lands in the second tenant's own namespace
                    "put_keyring",
                    {"database": name, "name": slot, "data": b"x" * 200, "expected": None},
                )
                assert put.ok and put.result is True, name
            # The first tenant's seq is a conflict here, answered with this tenant's root;
            # from its own seq the commit creates blobs under the first tenant's ids and
            # lists the first tenant's blobs as garbage -- all in its own namespace.
            args = {
                "database": name,
                "expected_seq": int(roots[owner][b"seq"]),
                "root": roots[owner][b"data"],
                "blobs": {i: b"overwritten" for i in ids[:50]},
                "garbage": ids[50:4000],
            }
            conflict = wire.call("commit", args)
            assert conflict.ok and conflict.result == {"ok": False, **root.result}, name
            done = wire.call("commit", {**args, "expected_seq": own_seq})
            assert done.ok and done.result["ok"] is True, (name, done.result)
            again = wire.call("commit", {**args, "expected_seq": own_seq + 1, "garbage": []})
            assert not again.ok and again.result[0] == protocol.BLOB_EXISTS, name
            for sequence in ("r/Employee", "Employee", dep.tenant_a, "root"):
                allocated = wire.call(
                    "allocate_ids", {"database": name, "sequence": sequence, "count": 5}
                )
                assert allocated.ok and allocated.result == 1, (name, sequence)
            assert wire.call("subscribe", {"database": name}).ok

        # The first tenant commits: the second, subscribed to databases of the same
        # names, is pushed nothing.
        with dep.open(dep.employees_db, freshness_path=dep.tmp / "employees.fresh") as db:
            db.add(Employee(name="Zed", surname="after", salary=1, description="kernel"))
            after_commit = answers(db)
        assert no_frame(wire)
        assert wire.call("ping").ok
    finally:
        wire.close()

    # The collector deletes what the second tenant listed as garbage in its own namespace
    # only; of the first tenant's blobs, only those its own commit just replaced may go.
    employees = scopes[dep.employees_db]
    replaced = {employees.blob_prefix + m for m in admin.zrange(employees.garbage, 0, -1)}
    collect_all_garbage(dep)
    after = snapshot(admin, list(scopes.values()))
    changed = {k for k in before.keys() | after.keys() if before.get(k) != after.get(k)}
    outside = sorted(k for k in changed if not owned(k, employees))
    assert changed and not outside, outside
    for key, value in before.items():
        if employees.blob_prefix in key and key not in after:
            assert key in replaced, key
        elif employees.blob_prefix in key:
            assert after[key] == value, key
    assert after_commit["len"] == N_EMPLOYEES + 1
    assert after_commit["eq"] == dep.before["eq"] and after_commit["range"] == dep.before["range"]
    with dep.open(dep.employees_db, freshness_path=dep.tmp / "employees.fresh") as fresh:
        assert answers(fresh) == after_commit

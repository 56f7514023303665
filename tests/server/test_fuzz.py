"""Fuzzing a running blob server: hostile bytes, frames and arguments must never crash it.

The server runs as a real subprocess (``zerodb-server serve --storage memory://``), so a
crash, a hang or a leaked exception is seen exactly as a deployment would see it. Each
hypothesis example talks to it over raw sockets:

* **streams**: random byte streams built from chunks (raw bytes, frames with a right or
  wrong length, garbage or ext-typed or deeply nested msgpack, request-shaped bodies of
  wrong types, oversized headers, truncated frames), then a half-close. The framing is
  simulated here, so the test knows how many answers the server owes: exactly one per
  complete frame, then the end of the stream; an oversized header gets ``too_large``
  and ends it (a reset of the connection may then eat answers, nothing else may).
* **operations**: pipelined batches of every operation with generated arguments (wrong
  types and sizes, missing and extra names, a ``tenant``), before and after a valid login.
  Each answer must carry its request id, never be ``internal``, and match a prediction:
  an argument set the protocol accepts gets ``ok`` (or the one storage refusal it may
  meet), anything else an error; the connection stays open.
* **logins**: a correctly signed login with one field mutated (replaced, dropped,
  added, a flipped signature bit, another tenant, a replayed nonce) is refused, the
  unmutated one accepted. Each example logs in from a fresh loopback address
  (127.1.x.y), so the per-address rate limit does not hide the checks behind it.

After every batch the server process is alive, a ping on a new connection is answered,
a legitimate ``DB`` client stores and queries a record, and the server log shows no
internal error. Unauthenticated fuzzing comes from 127.0.0.2 so that its failed logins
never rate-limit the legitimate clients (127.0.0.1).

``make test`` runs a few thousand examples; ``make fuzz`` runs the ``slow`` variant,
``ZERODB_FUZZ_EXAMPLES`` examples in all (default 50,000), spread over the same tests.
"""

from __future__ import annotations

import itertools
import os
import socket
import struct
import time
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

import msgpack
import pytest
from coincurve import PrivateKey
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from blob_server.leases import DEFAULT_LEASE_TIMEOUT, MAX_LEASE_WAIT, TOKEN_BYTES
from blob_server.server import DEFAULT_MAX_COMMIT_BLOBS, DEFAULT_MAX_COMMIT_BYTES
from blob_server.storage import MemoryStorage
from blob_server.tenants import TenantRegistry
from blob_server.wire import protocol
from blob_server.wire.storage import DEFAULT_RETENTION_SECONDS
from tests.core.hr import Employee
from tests.server.test_server_e2e import ServerProcess
from zerodb_core import DB
from zerodb_core.keyfile import KeyFile

PASSWORD = "correct horse battery staple"
#: Seconds one answer may take before the server counts as hung.
ANSWER_TIMEOUT = 10.0
FUZZ_TENANT = "fuzz"
# What the server (default settings) announces at login.
LIMITS = {
    "max_commit_blobs": DEFAULT_MAX_COMMIT_BLOBS,
    "max_commit_bytes": DEFAULT_MAX_COMMIT_BYTES,
}
ANON_ADDRESS = "127.0.0.2"  # unauthenticated fuzzing (its failed logins get rate limited)
LEGIT_ADDRESS = "127.0.0.1"

#: Examples per test in ``make test`` (2,400 examples, about 6,000 requests).
QUICK = {"streams": 800, "anonymous": 300, "authenticated": 1000, "logins": 300}
#: ``make fuzz``: the total number of examples, spread over the tests like QUICK.
LONG_TOTAL = int(os.environ.get("ZERODB_FUZZ_EXAMPLES", "50000"))

PUBLIC_OPS = {"challenge", "hello", "login", "ping"}
STORAGE_OPS = {
    "get_blobs",
    "get_root",
    "commit",
    "stage",
    "allocate_ids",
    "get_keyring",
    "put_keyring",
    "stats",
    "subscribe",
    "acquire_lease",
    "release_lease",
}
OPS = sorted(PUBLIC_OPS | STORAGE_OPS)
#: Codes a hostile request may get; "internal" (an exception escaped a handler) and
#: "unavailable" (the memory store never fails) are bugs.
REFUSALS = {
    protocol.BAD_FRAME,
    protocol.BAD_REQUEST,
    protocol.UNKNOWN_OP,
    protocol.UNAUTHENTICATED,
    protocol.AUTH_FAILED,
    protocol.RATE_LIMITED,
    protocol.BLOB_EXISTS,
    protocol.NOT_STAGED,
    protocol.TOO_LARGE,
}
MAX_NAME = 255  # blob_server.storage.validation.MAX_NAME_LENGTH
MAX_ALLOCATE = 1_000_000


# -- the server and raw connections ----------------------------------------------------------


class Conn:
    """One raw socket to the server, from a chosen loopback source address."""

    def __init__(self, port: int, source: str = LEGIT_ADDRESS) -> None:
        self.sock = socket.create_connection(
            ("127.0.0.1", port), timeout=ANSWER_TIMEOUT, source_address=(source, 0)
        )
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.ids = itertools.count(1)
        self.open = True

    def close(self) -> None:
        self.open = False
        self.sock.close()

    def __enter__(self) -> Conn:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def _exactly(self, size: int) -> bytes | None:
        buf = bytearray()
        while len(buf) < size:
            try:
                chunk = self.sock.recv(size - len(buf))
            except TimeoutError:
                raise AssertionError(f"no answer within {ANSWER_TIMEOUT} s: server hung") from None
            if not chunk:
                if buf:
                    raise AssertionError("the server closed the connection inside a frame")
                return None
            buf += chunk
        return bytes(buf)

    def frame(self) -> bytes | None:
        """The next frame body from the server, or None at the end of the stream."""
        header = self._exactly(4)
        if header is None:
            self.open = False
            return None
        (length,) = protocol.LENGTH.unpack(header)
        assert length <= protocol.MAX_FRAME_BYTES, "the server sent an oversized frame"
        body = self._exactly(length)
        assert body is not None, "the server closed the connection inside a frame"
        return body

    def answer(self) -> protocol.Response | None:
        """The next answer (root pushes are skipped), or None at the end of the stream."""
        while True:
            body = self.frame()
            if body is None:
                return None
            obj = protocol.decode_body(body)
            if type(obj) is list and len(obj) == 3 and obj[0] == 0 and obj[1] == "root":
                continue  # a push to a subscription made by a fuzzed request
            return protocol.parse_response(body)

    def call(self, op: str, args: dict) -> protocol.Response:
        rid = next(self.ids)
        self.send(protocol.request_frame(rid, op, args))
        response = self.answer()
        assert response is not None, f"the server closed the connection on {op}"
        assert response.request_id == rid
        return response

    def login(self, tenant: str, key: PrivateKey) -> protocol.Response:
        challenge = self.call("challenge", {})
        assert challenge.ok, challenge.result
        return self.call("login", login_args(challenge.result, tenant, key))


def login_args(challenge: dict, tenant: str, key: PrivateKey, at: int | None = None) -> dict:
    public = key.public_key.format()
    at = challenge["time"] if at is None else at
    digest = protocol.login_digest(challenge["server_id"], tenant, public, challenge["nonce"], at)
    return {
        "tenant": tenant,
        "public_key": public,
        "time": at,
        "signature": key.sign(digest, hasher=None),
    }


@dataclass
class Target:
    """The running server, its keys, and the connections reused across examples."""

    server: ServerProcess
    fuzz_key: PrivateKey
    acme_key: Path
    log_offset: int = 0
    conns: dict[str, Conn] = field(default_factory=dict)
    addresses: itertools.count = field(default_factory=lambda: itertools.count(1))

    @property
    def port(self) -> int:
        return self.server.port

    def anonymous(self) -> Conn:
        conn = self.conns.get("anon")
        if conn is None or not conn.open:
            conn = self.conns["anon"] = Conn(self.port, ANON_ADDRESS)
        return conn

    def authenticated(self) -> Conn:
        conn = self.conns.get("auth")
        if conn is None or not conn.open:
            conn = self.conns["auth"] = Conn(self.port, LEGIT_ADDRESS)
            answer = conn.login(FUZZ_TENANT, self.fuzz_key)
            assert answer.ok, answer.result
        return conn

    def fresh_address(self) -> str:
        """A loopback address no login came from yet (until 62,500 have been used)."""
        n = next(self.addresses) % 62_500
        return f"127.1.{n // 250}.{n % 250 + 1}"

    def close_connections(self) -> None:
        for conn in self.conns.values():
            conn.close()
        self.conns.clear()

    def assert_alive(self) -> None:
        """The server runs, answers a ping on a new connection, serves a real client,
        and logged no internal error."""
        self.close_connections()
        assert self.server.process is not None and self.server.process.poll() is None, (
            "the server process died"
        )
        with Conn(self.port) as conn:
            pong = conn.call("ping", {})
            assert pong.ok and pong.result["authenticated"] is False
        with DB(
            ("127.0.0.1", self.port), password=PASSWORD, key_file=self.acme_key, kdf="fast"
        ) as db:
            marker = f"alive-{time.monotonic_ns()}"
            db.add(Employee(name=marker, surname="x", salary=1, description="still serving"))
            assert [e.name for e in db[Employee].query(name=marker)] == [marker]
        log = self.server.log.read_bytes()
        fresh, self.log_offset = log[self.log_offset :], len(log)
        for bad in (b"Traceback", b"event=op_failed", b"event=connection_failed"):
            assert bad not in fresh, fresh.decode(errors="replace")[-4000:]


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("fuzz")
    registry = TenantRegistry(tmp / "tenants.json")
    fuzz_key = PrivateKey()
    registry.add_tenant(FUZZ_TENANT)
    registry.add_key(FUZZ_TENANT, fuzz_key.public_key.format())
    acme = KeyFile.create("acme")
    acme.save(tmp / "acme.zdbkey", PASSWORD, kdf="fast")
    registry.add_tenant("acme")
    registry.add_key("acme", acme.public_key)
    server = ServerProcess("memory://", tmp / "tenants.json", tmp / "server.log")
    server.start()
    found = Target(server, fuzz_key, tmp / "acme.zdbkey")
    yield found
    found.close_connections()
    server.stop()


# -- strategies ------------------------------------------------------------------------------

ints = st.one_of(
    st.integers(-3, 5),
    st.sampled_from([2**31, 2**32, 2**53 + 1, 2**62, 2**62 + 1, 2**63 - 1, 2**63, 2**64 - 1]),
    st.integers(-(2**63), 2**64 - 1),
)
scalars = st.one_of(
    st.none(),
    st.booleans(),
    ints,
    st.sampled_from([0.0, -1.5, float("inf"), float("nan")]),
    st.text(max_size=12),
    st.binary(max_size=40),
)
values = st.one_of(
    scalars,
    st.lists(scalars, max_size=4),
    st.dictionaries(
        st.text(max_size=6), st.one_of(scalars, st.lists(scalars, max_size=3)), max_size=3
    ),
)
#: Values the protocol refuses wherever they appear: ext types, non-str map keys.
exotic = st.one_of(
    st.builds(msgpack.ExtType, st.integers(0, 127), st.binary(max_size=8)),
    st.dictionaries(
        st.one_of(st.integers(-5, 5), st.binary(max_size=4), st.booleans()),
        scalars,
        min_size=1,
        max_size=3,
    ),
)
anything = st.one_of(values, exotic, st.lists(st.one_of(values, exotic), max_size=3))
op_names = st.one_of(
    st.sampled_from([*OPS, "", "nope", "x" * 33, "Ping", "ping\x00"]), st.text(max_size=40)
)
request_ids = st.one_of(st.integers(0, 9), ints, values)


def pack(obj: object) -> bytes:
    return msgpack.packb(obj, use_bin_type=True)


def framed(body: bytes) -> bytes:
    return protocol.LENGTH.pack(len(body)) + body


#: Bodies of the wrong shape or types: request-like triples, other lists and values, a
#: valid request with trailing bytes, nesting deeper than any decoder stack.
bodies = st.one_of(
    st.tuples(
        request_ids,
        op_names,
        st.one_of(st.dictionaries(st.text(max_size=10), anything, max_size=4), anything),
    ).map(lambda t: pack(list(t))),
    st.lists(anything, max_size=5).map(pack),
    anything.map(pack),
    st.tuples(st.sampled_from(OPS), st.binary(min_size=1, max_size=4)).map(
        lambda t: pack([1, t[0], {}]) + t[1]
    ),
    st.integers(1, 5000).map(lambda depth: b"\x91" * depth + b"\xc0"),
    st.integers(1, 200).map(lambda depth: b"\x81\xa1k" * depth + b"\xc0"),
    st.binary(max_size=120),
)


def _wrong_length(body: bytes, delta: int) -> bytes:
    return protocol.LENGTH.pack(max(0, len(body) + delta)) + body


chunks = st.one_of(
    st.binary(max_size=48),  # raw bytes: usually announces a huge frame
    bodies.map(framed),  # right length, wrong content
    st.tuples(bodies, st.integers(-6, 6)).map(lambda t: _wrong_length(*t)),
    st.integers(protocol.MAX_PREAUTH_FRAME_BYTES + 1, 2**32 - 1).map(protocol.LENGTH.pack),
    st.integers(0, protocol.MAX_PREAUTH_FRAME_BYTES).map(protocol.LENGTH.pack),  # truncated
    st.just(protocol.request_frame(7, "ping", {})),
    st.just(protocol.request_frame(8, "challenge", {})),
)
streams = st.lists(chunks, min_size=1, max_size=6).map(b"".join)


def blob_ids(max_size: int = 6):
    good = st.binary(min_size=16, max_size=16)
    return st.one_of(
        st.lists(good, max_size=max_size),
        st.lists(st.one_of(good, st.binary(max_size=20), scalars), max_size=max_size),
        st.sampled_from([4095, 4096, 4097]).map(
            lambda n: [i.to_bytes(16, "big") for i in range(n)]
        ),
    )


new_blobs = st.one_of(
    st.dictionaries(st.binary(min_size=16, max_size=16), st.binary(max_size=64), max_size=4),
    st.dictionaries(
        st.one_of(st.binary(max_size=20), st.text(max_size=4)),
        st.one_of(st.binary(max_size=8), scalars),
        max_size=3,
    ),
    st.just({i.to_bytes(16, "big"): b"" for i in range(4097)}),
)
names = st.one_of(
    st.sampled_from(["main", "fz", "db-1", "a" * MAX_NAME, "a" * (MAX_NAME + 1), "", "a\x00b"]),
    st.text(max_size=40),
)
lease_tokens = st.one_of(st.none(), st.binary(min_size=16, max_size=16), st.binary(max_size=20))
#: Every operation's argument names, each with a strategy of mostly well-typed values
#: (including out-of-range ones); wrong types come from ``anything``.
SPECS: dict[str, dict[str, st.SearchStrategy]] = {
    "challenge": {},
    "hello": {},
    "ping": {},
    "login": {
        "tenant": st.one_of(st.sampled_from([FUZZ_TENANT, "acme", "x" * 65]), st.text()),
        "public_key": st.one_of(
            st.binary(min_size=33, max_size=33), st.binary(max_size=70), st.just(b"\x02" * 33)
        ),
        "time": st.one_of(ints, st.just(int(time.time()))),
        "signature": st.binary(max_size=80),
    },
    "get_blobs": {"database": names, "ids": blob_ids()},
    "get_root": {"database": names},
    "stats": {"database": names},
    "subscribe": {"database": names},
    "allocate_ids": {
        "database": names,
        "sequence": names,
        "count": st.one_of(
            st.integers(-2, 3), st.sampled_from([MAX_ALLOCATE, MAX_ALLOCATE + 1]), ints
        ),
    },
    "get_keyring": {"database": names, "name": names},
    "put_keyring": {
        "database": names,
        "name": names,
        "data": st.binary(max_size=64),
        "expected": st.one_of(st.none(), st.binary(max_size=16)),
    },
    "commit": {
        "database": names,
        "expected_seq": st.one_of(st.integers(0, 3), ints),
        "root": st.binary(max_size=64),
        "blobs": new_blobs,
        "garbage": blob_ids(),
        "staged": blob_ids(),
        "lease": lease_tokens,
    },
    "stage": {"database": names, "blobs": new_blobs},
    # Short waits only: a lease this connection holds makes its next wait last.
    "acquire_lease": {
        "database": names,
        "wait": st.one_of(
            st.floats(0, 0.01), st.sampled_from([-1.0, 61.0, float("nan"), float("inf")])
        ),
    },
    "release_lease": {"database": names, "token": lease_tokens},
}
#: Argument names an operation accepts but does not require.
OPTIONAL = {"commit": {"staged", "lease"}}
EXTRA_NAMES = st.one_of(
    st.sampled_from(["tenant", "user", "database ", "id", ""]), st.text(max_size=8)
)


@st.composite
def op_args(draw, op: str) -> dict:
    """Arguments for ``op``: each name valid-ish, wrong-typed or missing, maybe extras."""
    args: dict = {}
    for name, valid in SPECS[op].items():
        how = draw(st.sampled_from(["valid", "valid", "valid", "wrong", "missing"]))
        if how == "valid":
            args[name] = draw(valid)
        elif how == "wrong":
            args[name] = draw(anything)
    if draw(st.integers(0, 9)) == 0:
        for name, value in draw(st.dictionaries(EXTRA_NAMES, values, max_size=2)).items():
            args.setdefault(name, value)
    return args


requests = st.sampled_from(OPS).flatmap(lambda op: st.tuples(st.just(op), op_args(op)))


# -- predictions -----------------------------------------------------------------------------


def _name(value: object) -> bool:
    return type(value) is str and 0 < len(value) <= MAX_NAME and "\x00" not in value


def _ids(value: object, limit: int = protocol.MAX_IDS_PER_REQUEST) -> bool:
    return (
        type(value) is list
        and len(value) <= limit
        and all(type(i) is bytes and len(i) == 16 for i in value)
    )


def _new_blobs(blobs: object) -> bool:
    return (
        type(blobs) is dict
        and _ids(list(blobs))
        and all(type(data) is bytes for data in blobs.values())
    )


def _token(value: object, *, nil: bool) -> bool:
    return (value is None and nil) or (type(value) is bytes and len(value) == TOKEN_BYTES)


def _int(value: object, low: int, high: int) -> bool:
    return type(value) is int and low <= value <= high


def accepted(op: str, args: dict) -> bool:
    """Whether the protocol accepts these arguments (after login)."""
    spec = SPECS[op]
    if not set(spec) - OPTIONAL.get(op, set()) <= set(args) <= set(spec):
        return False
    if "database" in spec and not _name(args["database"]):
        return False
    if op == "get_blobs":
        return _ids(args["ids"])
    if op == "allocate_ids":
        return _name(args["sequence"]) and _int(args["count"], 1, MAX_ALLOCATE)
    if op == "get_keyring":
        return _name(args["name"])
    if op == "put_keyring":
        return (
            _name(args["name"])
            and type(args["data"]) is bytes
            and (args["expected"] is None or type(args["expected"]) is bytes)
        )
    if op == "commit":
        staged = args.get("staged", [])
        return (
            _int(args["expected_seq"], 0, 2**62)
            and type(args["root"]) is bytes
            and _new_blobs(args["blobs"])
            and _ids(args["garbage"], protocol.MAX_COMMIT_IDS)
            and _ids(staged, protocol.MAX_COMMIT_IDS)
            and len(staged) + len(args["garbage"]) <= protocol.MAX_COMMIT_IDS
            and _token(args.get("lease"), nil=True)
        )
    if op == "acquire_lease":
        return type(args["wait"]) is float and 0 <= args["wait"] <= MAX_LEASE_WAIT
    if op == "release_lease":
        return _token(args["token"], nil=False)
    if op == "stage":
        return _new_blobs(args["blobs"])
    return True  # challenge, hello, ping, get_root, stats, subscribe: names checked above


def check_answer(op: str, args: dict, answer: protocol.Response, *, authenticated: bool) -> None:
    """The answer to a well-framed request is exactly what the protocol promises."""
    code = None if answer.ok else answer.result[0]
    assert answer.ok or code in REFUSALS, (op, args, answer.result)
    if op in ("challenge", "hello"):
        assert answer.ok == (not authenticated and args == {}), (op, args, answer.result)
    elif op == "ping":
        assert answer.ok == (args == {}), (op, args, answer.result)
    elif op == "login":
        assert not answer.ok, (op, args)
        expected = (
            {protocol.BAD_REQUEST}
            if authenticated
            else {
                protocol.AUTH_FAILED,
                protocol.RATE_LIMITED,
            }
        )
        assert code in expected, (op, args, answer.result)
    elif not authenticated:
        assert code == protocol.UNAUTHENTICATED, (op, args, answer.result)
    elif accepted(op, args):
        # The only refusals a well-formed request may meet: an id repeated from an
        # earlier commit or stage, a staged id that is not pending (random ids never
        # are), or one subscription too many on this connection.
        allowed = {
            "commit": {protocol.BLOB_EXISTS, protocol.NOT_STAGED},
            "stage": {protocol.BLOB_EXISTS},
            "subscribe": {protocol.TOO_LARGE},
            "acquire_lease": {protocol.TOO_LARGE},
        }
        assert answer.ok or code in allowed.get(op, ()), (op, args, answer.result)
    else:
        assert code in (protocol.BAD_REQUEST, protocol.TOO_LARGE), (op, args, answer.result)


def undecodable(obj: object) -> bool:
    """Whether the strict decoder refuses a body holding ``obj``: ext types anywhere, map
    keys other than str and bytes anywhere."""
    if isinstance(obj, msgpack.ExtType):
        return True
    if type(obj) is dict:
        return any(
            type(k) not in (str, bytes) or undecodable(k) or undecodable(v) for k, v in obj.items()
        )
    if type(obj) is list:
        return any(undecodable(item) for item in obj)
    return False


def expected_frames(stream: bytes, limit: int = protocol.MAX_PREAUTH_FRAME_BYTES):
    """How many complete frames the server reads from ``stream`` before it ends, and how
    it ends: "eof" (clean), "truncated" (inside a frame) or "too_large" (oversized)."""
    count, pos = 0, 0
    while len(stream) - pos >= 4:
        (length,) = struct.unpack_from(">I", stream, pos)
        if length > limit:
            return count, "too_large"
        if len(stream) - pos - 4 < length:
            return count, "truncated"
        count += 1
        pos += 4 + length
    return count, "eof" if pos == len(stream) else "truncated"


# -- the properties --------------------------------------------------------------------------


def check_stream(target: Target, stream: bytes) -> None:
    """Send a stream and half-close: one answer per complete frame, then the end."""
    count, ending = expected_frames(stream)
    answers: list[protocol.Response] = []
    reset = False  # the server closed with our bytes unread: the kernel may drop answers
    with Conn(target.port, ANON_ADDRESS) as conn:
        try:
            conn.send(stream)
            conn.sock.shutdown(socket.SHUT_WR)
        except OSError:  # the server may close first after an oversized header
            assert ending == "too_large"
            reset = True
        while True:
            try:
                answer = conn.answer()
            except ConnectionResetError:
                assert ending == "too_large"
                reset = True
                break
            if answer is None:
                break
            answers.append(answer)
    for answer in answers:
        assert answer.ok or answer.result[0] in REFUSALS, answer.result
    if ending == "too_large":  # the answers, then the refusal of the oversized frame
        if not reset:
            assert len(answers) == count + 1, (len(answers), count, ending)
        assert len(answers) <= count + 1
        if len(answers) == count + 1:
            assert answers[-1].request_id == 0
            assert answers[-1].result[0] == protocol.TOO_LARGE, answers[-1]
    else:
        assert len(answers) == count, (len(answers), count, ending)


def check_batch(conn: Conn, batch: list, *, authenticated: bool) -> None:
    """Pipeline a batch of requests (and raw bodies); check every answer, in order.

    A frame over the limit (64 KiB before login) ends the batch: it is refused from its
    header with ``too_large`` and the connection is closed.
    """
    limit = protocol.MAX_FRAME_BYTES if authenticated else protocol.MAX_PREAUTH_FRAME_BYTES
    sent = []
    oversized = False
    for item in batch:
        if item[0] == "raw":
            frame = framed(item[1])
            rid = op = args = None
        else:
            op, args = item
            rid = next(conn.ids)
            frame = protocol.request_frame(rid, op, args)
        if len(frame) - 4 > limit:
            oversized = True
            conn.send(frame[:4])
            break
        conn.send(frame)
        sent.append((rid, op, args))
    for rid, op, args in sent:
        answer = conn.answer()
        assert answer is not None, f"the server closed the connection (after {op}, {args})"
        if rid is None:
            assert answer.ok or answer.result[0] in REFUSALS, answer.result
        elif undecodable(args):
            assert answer.request_id == 0 and answer.result[0] == protocol.BAD_FRAME, answer
        elif any(type(name) is not str for name in args):
            assert answer.request_id == rid and answer.result[0] == protocol.BAD_FRAME, answer
        else:
            assert answer.request_id == rid, (op, args, answer)
            check_answer(op, args, answer, authenticated=authenticated)
    if oversized:
        answer = conn.answer()
        assert answer.request_id == 0 and answer.result[0] == protocol.TOO_LARGE, answer
        assert conn.answer() is None
        conn.close()


MUTATIONS = [
    "none",
    "replace",
    "drop",
    "extra",
    "flip",
    "other_tenant",
    "unregistered",
    "skewed_time",
    "no_challenge",
    "replay",
]


def check_login(target: Target, how: str, name: str, value: object, n: int) -> None:
    """A signed login with one thing wrong is refused; the right one is accepted once."""
    with Conn(target.port, target.fresh_address()) as conn:
        if how == "no_challenge":
            challenge = {"server_id": "x", "nonce": b"\0" * 32, "time": int(time.time())}
        else:
            reply = conn.call("challenge", {})
            assert reply.ok, reply.result
            challenge = reply.result
        key = PrivateKey() if how == "unregistered" else target.fuzz_key
        tenant = "acme" if how == "other_tenant" else FUZZ_TENANT
        at = None
        if how == "skewed_time":
            at = challenge["time"] + (61 + n if n % 2 else -61 - n)
        args = login_args(challenge, tenant, key, at)
        if how == "replace":
            if args[name] == value and type(args[name]) is type(value):
                how = "none"  # drew the right value: nothing is wrong
            args[name] = value
        elif how == "drop":
            del args[name]
        elif how == "extra":
            args[f"{name}_" if n % 2 else "tenant_id"] = value
        elif how == "flip":
            signature = bytearray(args["signature"])
            signature[n % len(signature)] ^= 1 << (n % 8)
            args["signature"] = bytes(signature)
        answer = conn.call("login", args)
        if how in ("none", "replay"):
            assert answer.ok and answer.result == {
                "tenant": FUZZ_TENANT,
                "limits": LIMITS,
                "garbage_retention": DEFAULT_RETENTION_SECONDS,
                "durability": MemoryStorage().durability().as_dict(),  # serve on memory://
                "commit_lease": DEFAULT_LEASE_TIMEOUT,
            }
            again = conn.call("login", args)
            assert again.result[0] == protocol.BAD_REQUEST  # one login per connection
            assert conn.call("get_root", {"database": "fz"}).ok
        else:
            assert not answer.ok and answer.result[0] == protocol.AUTH_FAILED, (how, args)
            denied = conn.call("get_root", {"database": "fz"})
            assert denied.result[0] == protocol.UNAUTHENTICATED
    if how == "replay":  # the same signed login on another connection: the nonce is dead
        with Conn(target.port, target.fresh_address()) as other:
            assert other.call("challenge", {}).ok
            refused = other.call("login", args)
            assert refused.result[0] == protocol.AUTH_FAILED, refused.result


logins = st.tuples(
    st.sampled_from(MUTATIONS),
    st.sampled_from(["tenant", "public_key", "time", "signature"]),
    values,
    st.integers(0, 10_000),
)
batches = st.lists(
    st.one_of(requests, requests, requests, bodies.map(lambda b: ("raw", b))),
    min_size=1,
    max_size=6,
)
anonymous_batches = st.lists(requests, min_size=1, max_size=6)


def on_connection(get, check):
    """Run ``check`` on a reused connection; drop the connection if the check failed (its
    unread answers would be blamed on the next example)."""

    def run(case):
        conn = get()
        try:
            check(conn, case)
        except BaseException:
            conn.close()
            raise

    return run


def run_examples(strategy, check, examples: int) -> None:
    @settings(
        max_examples=examples,
        deadline=None,
        suppress_health_check=list(HealthCheck),
        print_blob=True,
    )
    @given(strategy)
    def fuzz(case):
        check(case)

    fuzz()


def fuzz_streams(target: Target, examples: int) -> None:
    run_examples(streams, lambda s: check_stream(target, s), examples)


def fuzz_anonymous(target: Target, examples: int) -> None:
    check = on_connection(target.anonymous, partial(check_batch, authenticated=False))
    run_examples(anonymous_batches, check, examples)


def fuzz_authenticated(target: Target, examples: int) -> None:
    check = on_connection(target.authenticated, partial(check_batch, authenticated=True))
    run_examples(batches, check, examples)


def fuzz_logins(target: Target, examples: int) -> None:
    run_examples(logins, lambda case: check_login(target, *case), examples)


FUZZERS = {
    "streams": fuzz_streams,
    "anonymous": fuzz_anonymous,
    "authenticated": fuzz_authenticated,
    "logins": fuzz_logins,
}


@pytest.mark.parametrize("kind", FUZZERS)
def test_fuzz(target, kind):
    FUZZERS[kind](target, QUICK[kind])
    target.assert_alive()


@pytest.mark.slow
@pytest.mark.parametrize("kind", FUZZERS)
def test_fuzz_long(target, kind):
    share = QUICK[kind] / sum(QUICK.values())
    FUZZERS[kind](target, max(1, round(LONG_TOTAL * share)))
    target.assert_alive()


# -- limits and slow peers, once each ----------------------------------------------------------


def test_oversized_frames_close_only_their_connection(target):
    bystander = target.authenticated()
    with Conn(target.port, ANON_ADDRESS) as conn:
        conn.send(protocol.request_frame(1, "ping", {}))
        conn.send(protocol.LENGTH.pack(protocol.MAX_PREAUTH_FRAME_BYTES + 1) + b"x" * 100)
        assert conn.answer().ok
        assert conn.answer().result[0] == protocol.TOO_LARGE
        assert conn.answer() is None
    with Conn(target.port) as conn:
        assert conn.login(FUZZ_TENANT, target.fuzz_key).ok
        # After login 64 KiB is fine, 64 MiB + 1 is not (refused from the header alone).
        big = {"database": "fz", "name": "k", "data": b"\1" * 100_000, "expected": None}
        assert conn.call("put_keyring", big).ok
        conn.send(protocol.LENGTH.pack(protocol.MAX_FRAME_BYTES + 1))
        assert conn.answer().result[0] == protocol.TOO_LARGE
        assert conn.answer() is None
    assert bystander.call("ping", {}).ok
    target.assert_alive()


def test_size_limits_answer_errors(target):
    conn = target.authenticated()
    ids = [i.to_bytes(16, "big") for i in range(protocol.MAX_IDS_PER_REQUEST + 1)]
    assert conn.call("get_blobs", {"database": "fz", "ids": ids}).result[0] == protocol.TOO_LARGE
    assert conn.call("get_blobs", {"database": "fz", "ids": ids[:-1]}).ok
    commit = {"database": "lim", "expected_seq": 0, "garbage": [], "blobs": {}}
    huge = b"\0" * (protocol.MAX_BLOB_BYTES + 1)
    assert conn.call("commit", {**commit, "root": huge}).result[0] == protocol.TOO_LARGE
    blob = {b"\7" * 16: huge}
    assert conn.call("commit", {**commit, "root": b"r", "blobs": blob}).result[0] == (
        protocol.BAD_REQUEST
    )
    assert conn.call("stats", {"database": "lim"}).result["seq"] == 0  # nothing was stored
    target.assert_alive()


def test_slow_and_silent_peers_do_not_block_others(target):
    """Peers that stop inside a header or a body, or never read their answers, hold
    only their own connections."""
    stalled = []
    for i in range(20):
        conn = Conn(target.port, ANON_ADDRESS)
        frame = protocol.request_frame(1, "ping", {})
        conn.send(frame[: 1 + i % (len(frame) - 1)])
        stalled.append(conn)
    flood = Conn(target.port)
    assert flood.login(FUZZ_TENANT, target.fuzz_key).ok
    request = {"database": "flood", "name": f"k{time.monotonic_ns()}"}
    assert flood.call("put_keyring", {**request, "data": b"\1" * 100_000, "expected": None}).ok
    flood.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    for _ in range(300):  # ~30 MB of answers nobody reads
        flood.send(protocol.request_frame(2, "get_keyring", request))
    try:
        with Conn(target.port) as conn:
            assert conn.call("ping", {}).ok
            assert conn.login(FUZZ_TENANT, target.fuzz_key).ok
            assert conn.call("get_keyring", request).ok
    finally:
        for conn in stalled:
            conn.close()
        flood.close()
    target.assert_alive()

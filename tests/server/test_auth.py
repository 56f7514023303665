"""Login, tenant binding and hostile input against an in-process server.

Every refusal must be an error answer (never a crash), and the server must go on
answering pings afterwards.
"""

from __future__ import annotations

import os
import time

import pytest
from coincurve import PrivateKey

from blob_server import protocol
from blob_server.auth import (
    FAILURE_WINDOW,
    MAX_ADDRESS_FAILURES,
    MAX_FAILURES,
    Authenticator,
)
from blob_server.cli import build_parser
from blob_server.limits import TenantLimits
from blob_server.storage import MemoryStorage
from tests.server.wire import FakeClock, InProcessServer, Wire, registry_with
from zerodb_core.exceptions import AuthenticationError, StoreUnavailableError
from zerodb_core.transport.remote import RemoteTransport, _DroppedError

KEY_A = PrivateKey()
KEY_B = PrivateKey()


@pytest.fixture
def clock():
    return FakeClock()


@pytest.fixture
def registry(tmp_path):
    return registry_with(tmp_path / "tenants.json", acme=[KEY_A], beta=[KEY_B])


@pytest.fixture
def server(registry, clock):
    srv = InProcessServer(MemoryStorage(), Authenticator(registry, clock=clock))
    yield srv
    srv.stop()


@pytest.fixture
def wire(server):
    opened = []

    def connect() -> Wire:
        w = Wire(server.port)
        opened.append(w)
        return w

    yield connect
    for w in opened:
        w.close()


def still_serving(server) -> None:
    w = Wire(server.port)
    try:
        assert w.call("ping").ok
    finally:
        w.close()


def refused(response, code=protocol.AUTH_FAILED) -> bool:
    return not response.ok and response.result[0] == code


def test_valid_login_then_storage_calls(wire):
    w = wire()
    assert refused(w.call("get_root", {"database": "main"}), protocol.UNAUTHENTICATED)
    answer, _ = w.login("acme", KEY_A)
    # The answer tells the client the per-request limits, so it splits large commits
    # without asking.
    limits = {"max_commit_blobs": 4096, "max_commit_bytes": 48 * 1024 * 1024}
    # And the garbage retention, so that a client can tell a snapshot too old from a
    # blob withheld (an in-process server of the tests says nothing of durability), and
    # how long a commit lease lasts (the client queues for one after a lost race).
    expected = {
        "tenant": "acme",
        "limits": limits,
        "garbage_retention": 600.0,
        "commit_lease": 2.0,
    }
    assert answer.ok and answer.result == expected
    root = w.call("get_root", {"database": "main"})
    assert root.ok and root.result == {"seq": 0, "data": b""}
    assert refused(w.call("login", {}), protocol.BAD_REQUEST)  # no second login


def test_replayed_login_is_refused(wire, server):
    w = wire()
    answer, args = w.login("acme", KEY_A)
    assert answer.ok
    other = wire()
    other.call("challenge")  # a fresh nonce; the replayed signature is over the old one
    assert refused(other.call("login", args))
    third = wire()
    assert refused(third.call("login", args))  # no challenge on this connection at all
    still_serving(server)


def test_nonce_is_single_use_even_after_a_failure(wire):
    w = wire()
    challenge = w.call("challenge").result
    bad = w.login_args(
        "acme", KEY_B, server_id=challenge["server_id"], nonce=challenge["nonce"], at=0
    )
    assert refused(w.call("login", bad))
    good = w.login_args(
        "acme",
        KEY_A,
        server_id=challenge["server_id"],
        nonce=challenge["nonce"],
        at=challenge["time"],
    )
    assert refused(w.call("login", good))  # the nonce was consumed by the failed attempt


def test_expired_nonce_is_refused(wire, clock, server):
    w = wire()
    challenge = w.call("challenge").result
    clock.now += 31
    args = w.login_args(
        "acme",
        KEY_A,
        server_id=challenge["server_id"],
        nonce=challenge["nonce"],
        at=int(clock.now),
    )
    assert refused(w.call("login", args))
    still_serving(server)


def test_client_clock_too_far_off_is_refused(wire, clock):
    answer, _ = wire().login("acme", KEY_A, at=int(clock.now) - 120)
    assert refused(answer)


def test_unregistered_key_is_refused(wire, server):
    answer, _ = wire().login("acme", PrivateKey())
    assert refused(answer)
    still_serving(server)


def test_malformed_der_signature_is_refused(wire, server):
    w = wire()
    challenge = w.call("challenge").result
    args = w.login_args(
        "acme",
        KEY_A,
        server_id=challenge["server_id"],
        nonce=challenge["nonce"],
        at=challenge["time"],
    )
    args["signature"] = b"\x30\x10" + os.urandom(14)
    assert refused(w.call("login", args))
    still_serving(server)


@pytest.mark.parametrize(
    "change",
    [
        {"signature": "not bytes"},
        {"public_key": b"\x02" + b"\x00" * 32},
        {"public_key": b"short"},
        {"time": 1.5},
        {"time": 2**62},
        {"tenant": ""},
        {"tenant": 12},
        {"extra": 1},
    ],
)
def test_malformed_login_arguments_are_refused(wire, server, change):
    w = wire()
    challenge = w.call("challenge").result
    args = w.login_args(
        "acme",
        KEY_A,
        server_id=challenge["server_id"],
        nonce=challenge["nonce"],
        at=challenge["time"],
    )
    args.update(change)
    assert refused(w.call("login", args))
    still_serving(server)


def test_wrong_tenant_is_refused(wire, server):
    answer, _ = wire().login("beta", KEY_A)  # KEY_A belongs to acme
    assert refused(answer)
    answer, _ = wire().login("nobody", KEY_A)
    assert refused(answer)
    still_serving(server)


def test_revoked_key_is_refused_without_restart(wire, registry):
    assert wire().login("acme", KEY_A)[0].ok
    registry.remove_key("acme", KEY_A.public_key.format())
    assert refused(wire().login("acme", KEY_A)[0])


def test_failed_logins_are_rate_limited_per_address_and_tenant(wire, server, clock):
    for _ in range(MAX_FAILURES):
        assert refused(wire().login("acme", PrivateKey())[0])
    answer, _ = wire().login("acme", KEY_A)  # valid, but acme is locked out here now
    assert refused(answer, protocol.RATE_LIMITED)
    assert "as this tenant" in answer.result[1]
    assert wire().login("beta", KEY_B)[0].ok  # another tenant at the same address is not
    clock.now += FAILURE_WINDOW + 1  # the failures age out
    assert wire().login("acme", KEY_A)[0].ok


def test_an_address_trying_many_tenant_names_is_limited(wire, server):
    """Each name stops counting at MAX_FAILURES; the address's own limit stops a spray."""
    names = iter(range(MAX_ADDRESS_FAILURES))
    while True:
        name = f"t{next(names)}"
        answers = [wire().login(name, PrivateKey())[0] for _ in range(MAX_FAILURES)]
        if not all(refused(answer) for answer in answers):
            break
    assert refused(answers[-1], protocol.RATE_LIMITED)
    assert "many tenant names" in answers[-1].result[1]
    assert int(name[1:]) == MAX_ADDRESS_FAILURES // MAX_FAILURES
    answer, _ = wire().login("beta", KEY_B)
    assert refused(answer, protocol.RATE_LIMITED)
    still_serving(server)


def test_session_is_bound_to_its_tenant(wire):
    a = wire()
    assert a.login("acme", KEY_A)[0].ok
    blob_id = os.urandom(16)
    done = a.call(
        "commit",
        {
            "database": "main",
            "expected_seq": 0,
            "root": b"root-of-acme",
            "blobs": {blob_id: b"secret blob"},
            "garbage": [],
        },
    )
    assert done.ok and done.result["ok"]
    b = wire()
    assert b.login("beta", KEY_B)[0].ok
    # beta sees its own (empty) database of the same name, never acme's.
    assert b.call("get_root", {"database": "main"}).result == {"seq": 0, "data": b""}
    got = b.call("get_blobs", {"database": "main", "ids": [blob_id]})
    assert got.result == {"blobs": {}, "deferred": []}
    # A request cannot name a tenant: an unknown argument is refused.
    smuggled = b.call("get_root", {"database": "main", "tenant": "acme"})
    assert refused(smuggled, protocol.BAD_REQUEST)
    # beta's commit on "main" lands in beta's scope; acme's root is untouched.
    assert b.call(
        "commit",
        {"database": "main", "expected_seq": 0, "root": b"beta", "blobs": {}, "garbage": []},
    ).result["ok"]
    assert a.call("get_root", {"database": "main"}).result == {"seq": 1, "data": b"root-of-acme"}
    assert a.call("get_blobs", {"database": "main", "ids": [blob_id]}).result["blobs"] == {
        blob_id: b"secret blob"
    }


@pytest.mark.parametrize(
    ("op", "args", "code"),
    [
        ("get_blobs", {"database": "main", "ids": [b"short"]}, protocol.BAD_REQUEST),
        ("get_blobs", {"database": "main", "ids": "nope"}, protocol.BAD_REQUEST),
        ("get_blobs", {"database": "main", "ids": [b"x" * 16] * 5000}, protocol.TOO_LARGE),
        ("get_blobs", {"database": "", "ids": []}, protocol.BAD_REQUEST),
        ("get_root", {}, protocol.BAD_REQUEST),
        ("get_root", {"database": 5}, protocol.BAD_REQUEST),
        ("allocate_ids", {"database": "m", "sequence": "s", "count": -1}, protocol.BAD_REQUEST),
        ("allocate_ids", {"database": "m", "sequence": "s", "count": True}, protocol.BAD_REQUEST),
        (
            "commit",
            {"database": "m", "expected_seq": -5, "root": b"", "blobs": {}, "garbage": []},
            protocol.BAD_REQUEST,
        ),
        (
            "commit",
            {"database": "m", "expected_seq": 0, "root": b"", "blobs": {b"k": 1}, "garbage": []},
            protocol.BAD_REQUEST,
        ),
        (
            "commit",
            {"database": "m", "expected_seq": 0, "root": b"", "blobs": {}, "garbage": []}
            | {"staged": [b"short"]},
            protocol.BAD_REQUEST,
        ),
        (
            "commit",
            {"database": "m", "expected_seq": 0, "root": b"", "blobs": {}, "garbage": []}
            | {"staged": b"x" * 16},
            protocol.BAD_REQUEST,
        ),
        (
            "commit",
            {"database": "m", "expected_seq": 0, "root": b"", "blobs": {}, "garbage": []}
            | {"staged": [b"x" * 16] * (protocol.MAX_COMMIT_IDS + 1)},
            protocol.TOO_LARGE,
        ),
        (
            "commit",
            {"database": "m", "expected_seq": 0, "root": b"", "blobs": {}, "garbage": []}
            | {"staged": [os.urandom(16)]},  # never staged
            protocol.NOT_STAGED,
        ),
        ("stage", {"database": "m", "blobs": {b"k": b"v"}}, protocol.BAD_REQUEST),
        ("stage", {"database": "m", "blobs": {b"k" * 16: 1}}, protocol.BAD_REQUEST),
        ("stage", {"database": "m", "blobs": [b"k" * 16]}, protocol.BAD_REQUEST),
        ("stage", {"database": "", "blobs": {}}, protocol.BAD_REQUEST),
        ("stage", {"blobs": {}}, protocol.BAD_REQUEST),
        ("stage", {"database": "m", "blobs": {}, "tenant": "beta"}, protocol.BAD_REQUEST),
        (
            "stage",
            {"database": "m", "blobs": {i.to_bytes(16, "big"): b"" for i in range(4097)}},
            protocol.TOO_LARGE,
        ),
        (
            "put_keyring",
            {"database": "m", "name": "n", "data": b"d", "expected": 7},
            protocol.BAD_REQUEST,
        ),
        ("no_such_op", {}, protocol.UNKNOWN_OP),
    ],
)
def test_bad_arguments_get_error_answers(wire, server, op, args, code):
    w = wire()
    assert w.login("acme", KEY_A)[0].ok
    answer = w.call(op, args)
    assert refused(answer, code)
    assert w.call("ping").ok  # the same connection goes on
    still_serving(server)


def test_garbage_and_oversized_frames(wire, server):
    w = wire()
    w.send_raw(protocol.LENGTH.pack(5) + b"\xc1\xc1\xc1\xc1\xc1")  # undecodable body
    answer = w.recv()
    assert refused(answer, protocol.BAD_FRAME)
    assert w.call("ping").ok  # framing intact: the connection goes on
    w.send_raw(protocol.LENGTH.pack(protocol.MAX_FRAME_BYTES + 1))
    assert refused(w.recv(), protocol.TOO_LARGE)
    assert w.closed_by_server()  # cannot resynchronise: closed
    half = wire()
    half.send_raw(protocol.LENGTH.pack(100) + b"abc")
    half.close()  # ends inside a frame
    still_serving(server)


def test_pipelined_requests_are_answered_in_order(wire):
    w = wire()
    ids = [w.send("ping") for _ in range(20)]
    assert [w.recv().request_id for _ in ids] == ids


def test_idle_connections_are_closed(registry, clock):
    srv = InProcessServer(MemoryStorage(), Authenticator(registry, clock=clock), idle_timeout=0.2)
    try:
        w = Wire(srv.port)
        assert w.closed_by_server()
        w.close()
    finally:
        srv.stop()


def test_connection_limit(registry, clock):
    """A full server refuses newcomers once every connection is logged in; an anonymous
    one makes way for a newcomer instead (the oldest first)."""
    srv = InProcessServer(
        MemoryStorage(),
        Authenticator(registry, clock=clock),
        max_connections=2,
        tenant_limits=TenantLimits(max_connections=2),
    )
    try:
        first = Wire(srv.port)
        assert first.login("acme", KEY_A)[0].ok
        anonymous = Wire(srv.port)
        assert anonymous.call("ping").ok
        second = Wire(srv.port)  # the anonymous one makes way
        assert refused(anonymous.recv(), protocol.BUSY)
        assert anonymous.closed_by_server()
        assert second.login("acme", KEY_A)[0].ok
        third = Wire(srv.port)  # both logged in: refused
        assert refused(third.recv(), protocol.BUSY)
        for wire in (first, second):
            assert wire.call("ping").ok
            wire.close()
        anonymous.close()
        third.close()
    finally:
        srv.stop()


def test_remote_transport_login_errors(server):
    with pytest.raises(AuthenticationError):
        RemoteTransport(
            "127.0.0.1", server.port, tenant="acme", login_key=PrivateKey().secret, timeout=5
        )
    transport = RemoteTransport(
        "127.0.0.1", server.port, tenant="acme", login_key=KEY_A.secret, timeout=5
    )
    try:
        assert transport.get_root("main").seq == 0
        assert transport.counters.round_trips == 1
    finally:
        transport.close()


def test_tls(registry, clock, tmp_path):
    """The server speaks TLS with --tls-cert/--tls-key; the client verifies the cert."""
    import shutil
    import ssl
    import subprocess

    openssl = shutil.which("openssl")
    if openssl is None:
        pytest.skip("openssl is needed to make a test certificate")
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    command = (
        "req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 1 "
        "-subj /CN=localhost -addext subjectAltName=DNS:localhost,IP:127.0.0.1 "
        f"-keyout {key} -out {cert}"
    )
    subprocess.run([openssl, *command.split()], check=True, capture_output=True)
    server_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_ctx.load_cert_chain(cert, key)
    srv = InProcessServer(MemoryStorage(), Authenticator(registry, clock=clock), ssl=server_ctx)
    try:
        client_ctx = ssl.create_default_context(cafile=str(cert))
        transport = RemoteTransport(
            "127.0.0.1", srv.port, tenant="acme", login_key=KEY_A.secret, ssl=client_ctx
        )
        assert transport.get_root("main").seq == 0
        transport.close()
        with pytest.raises(StoreUnavailableError):  # a client that does not trust the cert
            RemoteTransport(
                "127.0.0.1",
                srv.port,
                tenant="acme",
                login_key=KEY_A.secret,
                ssl=ssl.create_default_context(),
            )
    finally:
        srv.stop()


def test_remote_transport_reconnects_reads_but_not_writes(server):
    transport = RemoteTransport(
        "127.0.0.1", server.port, tenant="acme", login_key=KEY_A.secret, timeout=5
    )
    try:
        transport._sock.close()  # a dropped connection, noticed on the next call
        transport._sock = None
        assert transport.get_root("main").seq == 0
        # The server side closes: the idle socket turns readable (EOF), so the next call
        # reconnects before sending anything, and even a commit goes through.
        for writer in list(server.server._writers):
            server.loop.call_soon_threadsafe(writer.close)
        deadline = time.monotonic() + 5
        while not transport._stale() and time.monotonic() < deadline:
            time.sleep(0.01)
        done = transport.commit("main", expected_seq=0, root=b"r", blobs={}, garbage=[])
        assert done.ok and transport.reconnects >= 1

        # A write whose answer is lost is not replayed: its outcome is unknown.
        def drop(requests):
            raise _DroppedError(ConnectionError("lost"), sent=True)

        transport._exchange_responses = drop  # what every exchange goes through
        with pytest.raises(StoreUnavailableError):
            transport.commit("main", expected_seq=1, root=b"r2", blobs={}, garbage=[])
    finally:
        transport.close()


def test_large_frames_need_a_login(wire):
    w = wire()
    w.send_raw(protocol.LENGTH.pack(protocol.MAX_PREAUTH_FRAME_BYTES + 1))
    assert refused(w.recv(), protocol.TOO_LARGE)
    assert w.closed_by_server()
    a = wire()
    assert a.login("acme", KEY_A)[0].ok
    big = a.call("get_blobs", {"database": "main", "ids": [os.urandom(16) for _ in range(4096)]})
    assert big.ok  # 4096 ids (~70 KiB) are fine once logged in


def test_big_answers_are_chunked_and_deferred(server, monkeypatch):
    transport = RemoteTransport(
        "127.0.0.1", server.port, tenant="acme", login_key=KEY_A.secret, timeout=5
    )
    try:
        blobs = {os.urandom(16): os.urandom(64) for _ in range(9)}
        assert transport.commit("main", expected_seq=0, root=b"r", blobs=blobs).ok
        # Tiny limits: the client splits ids into pipelined chunks of 2 and the server
        # defers whatever does not fit 100 bytes; still one counted round trip.
        monkeypatch.setattr(protocol, "MAX_IDS_PER_REQUEST", 2)
        monkeypatch.setattr(protocol, "MAX_RESPONSE_BLOB_BYTES", 100)
        before = transport.counters.round_trips
        missing = os.urandom(16)
        assert transport.get_blobs("main", [*blobs, missing]) == blobs
        assert transport.counters.round_trips == before + 1
    finally:
        transport.close()


def test_a_tenants_own_failed_login_limit_applies_to_it_alone(wire, registry, clock):
    """``max_login_failures`` in the tenants file: 3 for acme, none at all for beta."""
    registry.set_limits("acme", max_login_failures=3)
    registry.set_limits("beta", max_login_failures=None)
    for _ in range(3):
        assert refused(wire().login("acme", PrivateKey())[0])
    assert refused(wire().login("acme", KEY_A)[0], protocol.RATE_LIMITED)
    for _ in range(MAX_FAILURES + 2):  # past the server's default: beta has no limit
        assert refused(wire().login("beta", PrivateKey())[0])
    assert wire().login("beta", KEY_B)[0].ok
    clock.now += FAILURE_WINDOW + 1
    assert wire().login("acme", KEY_A)[0].ok


def test_the_servers_default_failed_login_limit_comes_from_its_tenant_limits(registry):
    server = InProcessServer(
        MemoryStorage(),
        Authenticator(registry),
        tenant_limits=TenantLimits(max_login_failures=2),
    )
    try:
        for _ in range(2):
            assert refused(Wire(server.port).login("acme", PrivateKey())[0])
        assert refused(Wire(server.port).login("acme", KEY_A)[0], protocol.RATE_LIMITED)
        assert Wire(server.port).login("beta", KEY_B)[0].ok
    finally:
        server.stop()


def test_serve_takes_the_failed_login_limits():
    base = ["serve", "--storage", "memory://", "--tenants", "t.json"]
    defaults = build_parser().parse_args(base)
    assert defaults.tenant_max_login_failures == MAX_FAILURES
    assert defaults.max_address_login_failures == MAX_ADDRESS_FAILURES
    assert defaults.login_failure_window == FAILURE_WINDOW
    given = build_parser().parse_args(
        [
            *base,
            *("--tenant-max-login-failures", "unlimited"),
            *("--max-address-login-failures", "500", "--login-failure-window", "30"),
        ]
    )
    assert given.tenant_max_login_failures is None
    assert (given.max_address_login_failures, given.login_failure_window) == (500, 30.0)

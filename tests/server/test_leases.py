"""Commit leases on the blob server: the lease table (``blob_server.leases``) on its own,
then the protocol (``acquire_lease``, ``release_lease``, a commit told to ``wait``)
against an in-process server.
"""

from __future__ import annotations

import asyncio
import os

import pytest
from coincurve import PrivateKey

from blob_server.auth import Authenticator
from blob_server.leases import MAX_LEASE_WAIT, TOKEN_BYTES, MemoryCommitLeases
from blob_server.storage import MemoryStorage
from blob_server.wire import protocol
from tests.server.wire import InProcessServer, Wire, registry_with

KEY_A = PrivateKey()
KEY_B = PrivateKey()
ALIVE = lambda: True  # noqa: E731 - an owner whose connection is open


def run(coroutine):
    return asyncio.run(coroutine)


# -- the lease table -------------------------------------------------------------------------
# Each test runs on the table of one process (memory) and on the one in Redis, which every
# server process in front of that Redis (or Redis Cluster) shares
# (``blob_server.storage.redis_leases``).


@pytest.fixture(params=["memory", "redis", "cluster"])
def make_leases(request):
    """``make_leases(timeout)``: a fresh lease table of the kind under test."""
    if request.param == "memory":
        yield MemoryCommitLeases
        return
    factory = request.getfixturevalue(f"{request.param}_storage_factory")
    yield lambda timeout: factory().commit_leases(timeout)


async def queued(leases, n: int, database: str = "main") -> None:
    """Wait until ``n`` clients wait for the lease (a Redis waiter joins after a round trip)."""
    while (await leases.state("acme", database))["waiting"] < n:
        await asyncio.sleep(0.001)


def test_an_uncontended_lease_is_granted_at_once_and_holds_off_everyone_else(make_leases):
    async def scenario():
        leases = make_leases(5)
        token = await leases.acquire("acme", "main", 1, 0, ALIVE)
        assert type(token) is bytes and len(token) == TOKEN_BYTES
        assert await leases.state("acme", "main") == {"held": 1, "waiting": 0}
        assert await leases.held_by_other("acme", "main", None)
        assert await leases.held_by_other("acme", "main", os.urandom(TOKEN_BYTES))
        assert not await leases.held_by_other("acme", "main", token)
        # Another database, or another tenant's database of the same name, is free.
        assert not await leases.held_by_other("acme", "other", None)
        assert not await leases.held_by_other("beta", "main", None)
        assert not await leases.release("beta", "main", token)  # not that tenant's
        assert await leases.release("acme", "main", token)
        assert not await leases.release("acme", "main", token)  # once
        assert await leases.state("acme", "main") == {"held": 0, "waiting": 0}
        assert not await leases.held_by_other("acme", "main", None)
        assert leases.stats()["granted"] == leases.stats()["released"] == 1

    run(scenario())


def test_waiters_get_the_lease_in_the_order_they_asked(make_leases):
    async def scenario():
        leases = make_leases(5)
        first = await leases.acquire("acme", "main", 0, 0, ALIVE)
        order: list[int] = []

        async def waiter(owner: int) -> None:
            token = await leases.acquire("acme", "main", owner, 10, ALIVE)
            order.append(owner)
            await asyncio.sleep(0)
            await leases.release("acme", "main", token)

        tasks = []
        for owner in (3, 1, 2):
            tasks.append(asyncio.create_task(waiter(owner)))
            await queued(leases, len(tasks))  # queued in this order
        assert await leases.state("acme", "main") == {"held": 1, "waiting": 3}
        await leases.release("acme", "main", first)
        await asyncio.gather(*tasks)
        assert order == [3, 1, 2]
        assert await leases.state("acme", "main") == {"held": 0, "waiting": 0}

    run(scenario())


def test_a_lease_not_given_back_expires_and_the_next_waiter_holds_it(make_leases):
    async def scenario():
        leases = make_leases(0.05)
        hung = await leases.acquire("acme", "main", 1, 0, ALIVE)
        token = await leases.acquire("acme", "main", 2, 30, ALIVE)
        assert token is not None and token != hung
        assert leases.stats()["expired"] == 1
        assert await leases.held_by_other("acme", "main", hung)  # its commits now wait
        assert not await leases.release("acme", "main", hung)

    run(scenario())


def test_a_wait_that_runs_out_gives_the_place_up(make_leases):
    async def scenario():
        leases = make_leases(30)
        held = await leases.acquire("acme", "main", 1, 0, ALIVE)
        assert await leases.acquire("acme", "main", 2, 0.01, ALIVE) is None
        assert await leases.state("acme", "main") == {"held": 1, "waiting": 0}
        assert leases.claims_of(2) == 0
        await leases.release("acme", "main", held)
        assert await leases.state("acme", "main") == {"held": 0, "waiting": 0}

    run(scenario())


def test_a_closed_connection_lets_go_of_its_lease_and_its_places(make_leases):
    async def scenario():
        leases = make_leases(30)
        await leases.acquire("acme", "main", 1, 0, ALIVE)
        await leases.acquire("acme", "other", 9, 0, ALIVE)
        waiting = asyncio.create_task(leases.acquire("acme", "main", 2, 30, ALIVE))
        other = asyncio.create_task(leases.acquire("acme", "other", 1, 30, ALIVE))
        await queued(leases, 1)
        await queued(leases, 1, "other")
        assert leases.claims_of(1) == 2
        await leases.forget(1)  # owner 1's connection closed: its lease goes to owner 2
        assert await waiting is not None
        assert leases.stats()["dropped"] == 1
        assert leases.claims_of(1) == 0
        other.cancel()  # owner 1's wait for "other" ended with its connection: no grant
        (result,) = await asyncio.gather(other, return_exceptions=True)
        assert result is None or isinstance(result, asyncio.CancelledError)
        assert await leases.state("acme", "other") == {"held": 1, "waiting": 0}

    run(scenario())


def test_a_waiter_whose_connection_closed_is_skipped(make_leases):
    async def scenario():
        leases = make_leases(30)
        held = await leases.acquire("acme", "main", 1, 0, ALIVE)
        dead = asyncio.create_task(leases.acquire("acme", "main", 2, 0.2, lambda: False))
        alive = asyncio.create_task(leases.acquire("acme", "main", 3, 30, ALIVE))
        await queued(leases, 1)
        await leases.release("acme", "main", held)
        assert await alive is not None
        assert await dead is None

    run(scenario())


@pytest.mark.parametrize("timeout", [0, -1, MAX_LEASE_WAIT + 1, float("nan"), "2"])
def test_a_lease_timeout_out_of_range_is_refused(timeout):
    with pytest.raises(ValueError, match="lease timeout"):
        MemoryCommitLeases(timeout)


# -- the protocol ----------------------------------------------------------------------------


@pytest.fixture
def registry(tmp_path):
    return registry_with(tmp_path / "tenants.json", acme=[KEY_A], beta=[KEY_B])


def _server(registry, **kwargs) -> InProcessServer:
    return InProcessServer(MemoryStorage(), Authenticator(registry), **kwargs)


@pytest.fixture
def server(registry):
    srv = _server(registry)
    yield srv
    srv.stop()


@pytest.fixture
def wire(server):
    opened = []

    def connect(tenant: str = "acme") -> Wire:
        w = Wire(server.port)
        opened.append(w)
        answer, _ = w.login(tenant, KEY_A if tenant == "acme" else KEY_B)
        assert answer.ok
        return w

    yield connect
    for w in opened:
        w.close()


def acquire(w: Wire, database: str = "main", wait: float = 5.0):
    return w.call("acquire_lease", {"database": database, "wait": wait})


def commit(w: Wire, expected_seq: int, root: bytes, **extra):
    args = {"database": "main", "expected_seq": expected_seq, "root": root, "blobs": {}}
    return w.call("commit", {**args, "garbage": [], **extra})


def lease_state(w: Wire) -> dict:
    return w.call("stats", {"database": "main"}).result["lease"]


def test_login_announces_the_lease_timeout(registry):
    srv = _server(registry, commit_lease_timeout=3.5)
    try:
        w = Wire(srv.port)
        answer, _ = w.login("acme", KEY_A)
        assert answer.result["commit_lease"] == 3.5
        w.close()
    finally:
        srv.stop()


def test_while_a_client_holds_the_lease_other_commits_are_told_to_wait(wire):
    holder, other, old = wire(), wire(), wire()
    granted = acquire(holder)
    assert granted.ok and granted.result["granted"] is True
    assert granted.result["seq"] == 0 and granted.result["data"] == b""
    token = granted.result["token"]
    assert lease_state(holder) == {"held": 1, "waiting": 0}
    # A lease-aware commit (``lease`` nil) is not tried: the answer is the current root.
    told = commit(other, 0, b"theirs", lease=None)
    assert told.ok and told.result == {"ok": False, "wait": True, "seq": 0, "data": b""}
    # A client that takes no part in leases (no ``lease`` argument) races as it always
    # did: the storage's compare-and-swap decides.
    raced = commit(old, 0, b"old client")
    assert raced.ok and raced.result["ok"] is True and raced.result["seq"] == 1
    # The holder lost that race; it keeps the lease, replays, and commits in its turn.
    lost = commit(holder, 0, b"mine", lease=token)
    assert lost.result["ok"] is False and "wait" not in lost.result
    assert lease_state(holder) == {"held": 1, "waiting": 0}
    done = commit(holder, 1, b"mine", lease=token)
    assert done.result == {"ok": True, "seq": 2, "data": b"mine"}
    assert lease_state(holder) == {"held": 0, "waiting": 0}  # given back by the commit
    assert commit(other, 2, b"theirs", lease=None).result["ok"] is True


def test_a_lease_is_given_back_without_a_commit_once(wire):
    holder, other = wire(), wire()
    token = acquire(holder).result["token"]
    assert other.call("release_lease", {"database": "main", "token": token}).result == {
        "released": True
    }  # a token is a bearer token of its tenant: any of the tenant's connections
    assert holder.call("release_lease", {"database": "main", "token": token}).result == {
        "released": False
    }
    assert commit(other, 0, b"r", lease=None).result["ok"] is True


def test_another_tenant_neither_waits_for_nor_releases_a_lease(wire):
    acme, beta = wire("acme"), wire("beta")
    token = acquire(acme).result["token"]
    assert beta.call("release_lease", {"database": "main", "token": token}).result == {
        "released": False
    }
    assert commit(beta, 0, b"beta's", lease=None).result["ok"] is True  # beta's own "main"
    assert commit(beta, 1, b"beta's", lease=token).result["ok"] is True
    assert lease_state(acme) == {"held": 1, "waiting": 0}
    assert lease_state(beta) == {"held": 0, "waiting": 0}


def test_a_closed_connection_gives_its_lease_to_the_next_in_line(wire):
    holder, waiter = wire(), wire()
    assert acquire(holder).result["granted"]
    rid = waiter.send("acquire_lease", {"database": "main", "wait": 30.0})
    holder.close()  # the lease goes with the connection, long before its timeout
    answer = waiter.recv()
    assert answer.request_id == rid and answer.result["granted"] is True


def test_a_wait_that_runs_out_is_answered_not_granted(wire):
    holder, waiter = wire(), wire()
    assert acquire(holder).result["granted"]
    answer = acquire(waiter, wait=0.01)
    assert answer.ok and answer.result == {"granted": False, "token": None, "seq": 0, "data": b""}
    assert lease_state(holder) == {"held": 1, "waiting": 0}


@pytest.mark.parametrize(
    ("op", "args"),
    [
        ("acquire_lease", {"database": "main", "wait": -1.0}),
        ("acquire_lease", {"database": "main", "wait": MAX_LEASE_WAIT + 1}),
        ("acquire_lease", {"database": "main", "wait": 1}),  # an int, not a float
        ("acquire_lease", {"database": "main"}),
        ("acquire_lease", {"database": "main", "wait": 1.0, "tenant": "beta"}),
        ("release_lease", {"database": "main", "token": b"short"}),
        ("release_lease", {"database": "main", "token": None}),
        ("commit", {"expected_seq": 0, "root": b"r", "blobs": {}, "garbage": [], "lease": b"x"}),
        ("commit", {"expected_seq": 0, "root": b"r", "blobs": {}, "garbage": [], "lease": 1}),
    ],
)
def test_malformed_lease_requests_are_refused(wire, op, args):
    answer = wire().call(op, {"database": "main", **args})
    assert not answer.ok and answer.result[0] == protocol.BAD_REQUEST


@pytest.mark.parametrize("expected_seq", [-1, 2**62 + 1])
def test_a_malformed_commit_is_refused_even_while_another_client_holds_the_lease(
    wire, expected_seq
):
    """The request is checked before the lease: a bad seq is a bad request, not a
    ``wait`` (found by the long fuzz run)."""
    holder, other = wire(), wire()
    assert acquire(holder).result["granted"]
    answer = commit(other, expected_seq, b"r", lease=None)
    assert not answer.ok and answer.result[0] == protocol.BAD_REQUEST


def test_a_connection_holds_a_bounded_number_of_leases(wire):
    w = wire()
    for n in range(protocol.MAX_SUBSCRIPTIONS):
        assert acquire(w, f"db{n}").result["granted"]
    answer = acquire(w, "one-too-many")
    assert not answer.ok and answer.result[0] == protocol.TOO_LARGE


def test_with_leases_off_nobody_waits(registry):
    srv = _server(registry, commit_lease_timeout=0)
    try:
        holder, other = Wire(srv.port), Wire(srv.port)
        answer, _ = holder.login("acme", KEY_A)
        assert "commit_lease" not in answer.result
        other.login("acme", KEY_A)
        assert acquire(holder).result["granted"] is False
        assert commit(other, 0, b"r", lease=None).result["ok"] is True
        assert "lease" not in other.call("stats", {"database": "main"}).result
        holder.close()
        other.close()
    finally:
        srv.stop()

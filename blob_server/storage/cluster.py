"""Redis Cluster storage: one database's blobs over every node, its commit still atomic.

Key layout (``S`` a database's scope tag, ``T`` its tenant's tag, made as in
``blob_server.storage.redis``; ``{...}`` is the Redis Cluster hash tag)::

    zdb:ns                      the namespace key (one slot, read once per process)
    zdb:gc:<h>                  sets of scope tags with garbage, pending blobs or operations
    zdb:gct:<h>                 sets of tenant tags with journal entries
                                (<h>: the tag's first hex digit, 16 sets over the slots)
    zdb:b:S:<blob id hex>       one write-once blob: NO hash tag, so it lands on any slot
    zdb:{S}:root                hash: seq, data
    zdb:{S}:s                   hash: t (tenant tag), w (a write counter, see _CANCEL)
    zdb:{S}:g / :p / :k / :c    garbage, pending (staged), keyrings, id counters
    zdb:{S}:o                   hash: open operations, op id -> state|time|blob ids
    zdb:{T}:u                   hash: blobs, bytes (the tenant's usage), S:n, S:b (per db),
                                S:r (reservations made, see _DROP)
    zdb:{T}:d                   set: the scope tags of the tenant's databases
    zdb:{T}:j                   hash: journal, op id -> S n blob-bytes counted later time

*Why blobs carry no hash tag*: under ``{S}`` a database lives on one slot, so on one
node, and cannot outgrow that node's memory. Blobs are write-once and unreachable until
a root names them, so they can be written anywhere, in any order, before the one step
that must be atomic: the root compare-and-swap, a single-slot script on ``{S}``.

*Why usage moved to the tenant's slot*: a quota spans the tenant's databases, so its
counters sit in ``{T}``, a different slot from ``{S}`` (Redis Cluster refuses a script
over two slots; the single-Redis backend's one-script commit does exactly that). A
write that changes usage is then a two-slot operation, made exact and crash-safe by an
operation id ``R`` recorded on both sides:

1. *open*: ``{S}:o[R] = o|time|ids`` (the blob ids it will write); only an open ``R``
   can be swapped in, and whoever cancels ``R`` (tombstone ``x``) makes that impossible.
2. *reserve*: one ``{T}`` script checks the quota and adds the growth to the usage at
   once (so concurrent commits see it: quotas are never overrun), and journals
   ``{T}:j[R]``. A shrink (smaller root or keyring) is journalled, applied at settle.
3. *write* the blobs (``SET NX``, pipelined per node, every node's pipeline at once).
4. *swap*: one ``{S}`` script: seq, ``R`` still open, staged ids pending; root, garbage,
   and ``HDEL {S}:o[R]``: the op's disappearance is the record that it was applied.
5. *settle*: ``{T}`` applies the journalled shrink and deletes ``j[R]``.

Anything that fails before 4 is *aborted*: tombstone ``R`` (``x``), undo ``j[R]``,
delete the blobs it wrote, forget ``R``. A crash leaves ``R`` open or tombstoned, and
maybe ``j[R]``: garbage collection tombstones open ops older than ``OP_TIMEOUT`` and
aborts them, and settles journal entries older than that whose op is gone (applied).
A commit whose swap answer is lost is never re-sent: it cancels ``R``; "already gone"
means applied, "cancelled" means it will never apply, so the client is told the truth.

Garbage collection, per scope: a ``{S}`` script moves a batch of due ids (garbage past
the retention, pending past the staging timeout) into an op ``g|time|ids``; their sizes
are read (``EXISTS``/``STRLEN``), subtracted once in ``{T}`` (``HSETNX j[R']``), the
blobs deleted on whichever nodes hold them, then ``R'`` forgotten: a crash at any step
is finished by the next pass.

Durability: every write pipeline ends with ``WAIT n timeout`` on the same connection,
so a step counts only once ``n`` replicas have it (``min_replicas``; by default 1 when
the slot's master has a replica, 0 when it has none). A commit whose swap is applied
but not confirmed in time is answered ``StorageUnavailableError`` (outcome unknown), so
an acknowledged commit is on a replica and survives its master's failover.

Round trips: a step whose keys live on several masters (the blob writes, the checks
before a commit, open or reserve with their collector set on another node) sends one
pipeline per master, writing all of them before reading any answer (``_send``): it
costs one round trip of latency, whatever the number of masters, in the caller's thread. A
commit with blobs waits for six (checks, open, reserve, write, swap, settle), as many
as on one master; the single-Redis backend's one script takes one.

Retries: a step that Redis did not execute (MOVED, ASK, TRYAGAIN, CLUSTERDOWN, NOSCRIPT)
is re-sent to the right node, for up to ``retry_seconds`` (a failover takes the
cluster's node timeout). A step whose answer was lost is re-sent only when it is
idempotent (open, reserve, settle, abort, blob writes, reads); the swap, a keyring
compare-and-set and an id allocation are not (see above for the swap).
"""

from __future__ import annotations

import asyncio
import binascii
import hashlib
import logging
import os
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, NamedTuple

import redis
import redis.asyncio
from redis.asyncio.retry import Retry as AsyncRetry
from redis.backoff import NoBackoff
from redis.cluster import ClusterNode, RedisCluster
from redis.exceptions import (
    AskError,
    ClusterDownError,
    MovedError,
    NoScriptError,
    RedisClusterException,
    RedisError,
    ResponseError,
    TryAgainError,
)
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError
from redis.retry import Retry

from blob_server.exceptions import (
    BlobExistsError,
    InvalidRequestError,
    NotStagedError,
    StorageUnavailableError,
)
from blob_server.storage import validation as v
from blob_server.storage.cluster_address import parse_cluster_address
from blob_server.storage.redis import (
    _NAMESPACE,
    PUBLISH_PROBE,
    RedisNames,
    _limit,
    _quota_error,
    _Scope,
    _Tenant,
    check_server,
    node_durability,
    publish_refused,
)
from blob_server.wire.storage import (
    DEFAULT_RETENTION_SECONDS,
    DEFAULT_STAGING_TIMEOUT,
    DURABILITY_MODES,
    EMPTY_ROOT,
    NO_QUOTA,
    ChangeCallback,
    CommitLeases,
    CommitResult,
    DatabaseUsage,
    Durability,
    LostCallback,
    Quota,
    RootChanges,
    RootRecord,
    Storage,
    TenantUsage,
)

log = logging.getLogger(__name__)

#: The collector's sets of scope tags (``zdb:gc:<h>``) and of tenant tags with journal
#: entries (``zdb:gct:<h>``), split by the tag's first hex digit into 16 keys without a
#: hash tag: every commit adds its scope, and one key would put every commit of every
#: tenant on one node.
GC_SHARDS = "0123456789abcdef"


def _gc_key(kind: bytes, tag: bytes) -> bytes:
    """The collector's set that holds ``tag`` (``kind``: ``gc`` or ``gct``)."""
    return b"zdb:%s:%s" % (kind, tag[:1])


#: How long an operation may stay open before garbage collection aborts it: far longer
#: than any commit (its steps are bounded by socket timeouts and ``retry_seconds``).
OP_TIMEOUT = 600.0
#: How often the default ``min_replicas`` reads the topology again to see new replicas.
TOPOLOGY_TTL = 10.0
_GC_BATCH = 500
_HEX = 2 * 16  # a blob id in hex

# -- scripts on the database's slot {S} ---------------------------------------------------

# KEYS: ops, stats. ARGV: op id, value, tenant tag. Idempotent (a retry finds it open).
_OPEN = """
if redis.call('HEXISTS', KEYS[1], ARGV[1]) == 0 then
  redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
end
redis.call('HSET', KEYS[2], 't', ARGV[3])
return 1
"""

# KEYS: root, garbage, pending, ops. ARGV: op id, expected seq, new seq, root data, now,
# k, k staged members..., garbage members...
# Returns {1} applied, {0, seq, data} conflict, {5} the op was cancelled, {4, index}
# staged member not pending (nothing written in the last three cases).
_SWAP = """
local cur = redis.call('HMGET', KEYS[1], 'seq', 'data')
local seq = cur[1] or '0'
if seq ~= ARGV[2] then
  return {0, seq, cur[2] or ''}
end
local op = redis.call('HGET', KEYS[4], ARGV[1])
if not op or string.sub(op, 1, 1) ~= 'o' then
  return {5}
end
local staged = 7
local garbage = staged + tonumber(ARGV[6])
for j = staged, garbage - 1 do
  if not redis.call('ZSCORE', KEYS[3], ARGV[j]) then
    return {4, j - staged}
  end
end
redis.call('HSET', KEYS[1], 'seq', ARGV[3], 'data', ARGV[4])
redis.call('HDEL', KEYS[4], ARGV[1])
for j = staged, garbage - 1 do
  redis.call('ZREM', KEYS[3], ARGV[j])
end
for j = garbage, #ARGV do
  redis.call('ZREM', KEYS[3], ARGV[j])
  redis.call('ZADD', KEYS[2], 'NX', ARGV[5], ARGV[j])
end
redis.call('SPUBLISH', KEYS[1], ARGV[3])  -- the root change (storage.cluster_changes)
return {1}
"""

# KEYS: ops, pending. ARGV: op id, now, members... Makes a stage's blobs pending.
# Returns 1, or 0 if the op was cancelled.
_PARK = """
local op = redis.call('HGET', KEYS[1], ARGV[1])
if not op or string.sub(op, 1, 1) ~= 'o' then
  return 0
end
redis.call('HDEL', KEYS[1], ARGV[1])
for i = 3, #ARGV do
  redis.call('ZADD', KEYS[2], ARGV[2], ARGV[i])
end
return 1
"""

# KEYS: keyrings, ops. ARGV: op id, field, data, '1' if expected follows else '0', expected.
# Returns {1} set, {0} the slot did not hold the expected value, {5} op cancelled.
_KEYRING = """
local op = redis.call('HGET', KEYS[2], ARGV[1])
if not op or string.sub(op, 1, 1) ~= 'o' then
  return {5}
end
local cur = redis.call('HGET', KEYS[1], ARGV[2])
if ARGV[4] == '0' then
  if cur then return {0} end
elseif cur ~= ARGV[5] then
  return {0}
end
redis.call('HSET', KEYS[1], ARGV[2], ARGV[3])
redis.call('HDEL', KEYS[2], ARGV[1])
return {1}
"""

# KEYS: ops, stats. ARGV: op id, '1' to replace the op's ids, now, ids.
# Returns {1} if the op is gone (it was applied, or forgotten after an abort), else
# {0, value} with the op now a tombstone ('x'): it can never be applied any more.
# When the op is gone it still writes (HINCRBY w), so a WAIT after it on the same
# connection covers the earlier swap this caller did not hear back from.
_CANCEL = """
local op = redis.call('HGET', KEYS[1], ARGV[1])
if not op then
  redis.call('HINCRBY', KEYS[2], 'w', 1)
  return {1}
end
if string.sub(op, 1, 1) == 'o' then
  if ARGV[2] == '1' then
    op = 'x|' .. ARGV[3] .. '|' .. ARGV[4]
  else
    op = 'x' .. string.sub(op, 2)
  end
  redis.call('HSET', KEYS[1], ARGV[1], op)
end
return {0, op}
"""

# KEYS: garbage, pending, ops. ARGV: garbage cutoff, staging cutoff, batch, op id, now.
# Moves up to a batch of due members into a new op 'g|now|ids'; returns the ids.
_DOOM = """
local ids = {}
local function take(set, cutoff)
  local left = tonumber(ARGV[3]) - #ids
  if left <= 0 then return end
  local members = redis.call('ZRANGEBYSCORE', set, '-inf', cutoff, 'LIMIT', 0, left)
  if #members > 0 then
    redis.call('ZREM', set, unpack(members))
    for _, m in ipairs(members) do ids[#ids + 1] = m end
  end
end
take(KEYS[1], ARGV[1])
take(KEYS[2], ARGV[2])
if #ids > 0 then
  redis.call('HSET', KEYS[3], ARGV[4], 'g|' .. ARGV[5] .. '|' .. table.concat(ids))
end
return ids
"""

# -- scripts on the tenant's slot {T} ------------------------------------------------------

_JOURNAL = """
local function entry(journal, op)
  local v = redis.call('HGET', journal, op)
  if not v then return nil end
  local f = {}
  for w in string.gmatch(v, '%S+') do f[#f + 1] = w end
  return f
end
local function add(usage, scope, blobs, blob_bytes, bytes)
  if blobs ~= 0 then
    redis.call('HINCRBY', usage, 'blobs', blobs)
    redis.call('HINCRBY', usage, scope .. ':n', blobs)
  end
  if bytes ~= 0 then redis.call('HINCRBY', usage, 'bytes', bytes) end
  if blob_bytes ~= 0 then redis.call('HINCRBY', usage, scope .. ':b', blob_bytes) end
end
"""

# KEYS: usage, dbs, journal. ARGV: op id, scope tag, blobs, blob bytes, bytes counted
# now, bytes given back at settle, max blobs, max bytes ('' = no limit), now.
# Returns {1} reserved (or already reserved: a retry), or the quota refusal.
_RESERVE = (
    _JOURNAL
    + """
if redis.call('HEXISTS', KEYS[3], ARGV[1]) == 1 then
  return {1}
end
local u = redis.call('HMGET', KEYS[1], 'blobs', 'bytes')
local used_blobs, used_bytes = tonumber(u[1] or '0'), tonumber(u[2] or '0')
local n, net = tonumber(ARGV[3]), tonumber(ARGV[5]) - tonumber(ARGV[6])
if ARGV[7] ~= '' and n > 0 and used_blobs + n > tonumber(ARGV[7]) then
  return {3, 'blobs', used_blobs, n, tonumber(ARGV[7])}
end
if ARGV[8] ~= '' and net > 0 and used_bytes + net > tonumber(ARGV[8]) then
  return {3, 'bytes', used_bytes, net, tonumber(ARGV[8])}
end
add(KEYS[1], ARGV[2], n, tonumber(ARGV[4]), tonumber(ARGV[5]))
redis.call('HINCRBY', KEYS[1], ARGV[2] .. ':r', 1)
local fields = {ARGV[2], ARGV[3], ARGV[4], ARGV[5], ARGV[6], ARGV[9]}
redis.call('HSET', KEYS[3], ARGV[1], table.concat(fields, ' '))
redis.call('SADD', KEYS[2], ARGV[2])
return {1}
"""
)

# KEYS: usage, journal. ARGV: op id, '1' applied (give back the shrink) or '0' aborted
# (undo the reservation). Idempotent: the entry goes with the change.
_SETTLE = (
    _JOURNAL
    + """
local f = entry(KEYS[2], ARGV[1])
if not f then return 0 end
if ARGV[2] == '1' then
  add(KEYS[1], f[1], 0, 0, -tonumber(f[5]))
else
  add(KEYS[1], f[1], -tonumber(f[2]), -tonumber(f[3]), -tonumber(f[4]))
end
redis.call('HDEL', KEYS[2], ARGV[1])
return 1
"""
)

# KEYS: usage, journal. ARGV: op id, scope tag, blobs, bytes, now. Subtracts deleted
# blobs once per garbage-collection op (the journal entry marks it done).
_RELEASE = (
    _JOURNAL
    + """
if redis.call('HSETNX', KEYS[2], ARGV[1], ARGV[2] .. ' 0 0 0 0 ' .. ARGV[5]) == 0 then
  return 0
end
add(KEYS[1], ARGV[2], -tonumber(ARGV[3]), -tonumber(ARGV[4]), -tonumber(ARGV[4]))
return 1
"""
)

# KEYS: usage, dbs, journal. ARGV: scope tag, its reservation count as read before the
# collector found the database empty. Takes a database that holds nothing any more out
# of its tenant's count, unless an operation on it is journalled or reserved since (a
# first commit racing the collector: S:r is kept, so it never counts back to the value).
_DROP = """
if tonumber(redis.call('HGET', KEYS[1], ARGV[1] .. ':n') or '0') ~= 0 then
  return 0
end
if (redis.call('HGET', KEYS[1], ARGV[1] .. ':r') or '0') ~= ARGV[2] then
  return 0
end
for _, v in ipairs(redis.call('HVALS', KEYS[3])) do
  if string.sub(v, 1, #ARGV[1] + 1) == ARGV[1] .. ' ' then return 0 end
end
redis.call('HDEL', KEYS[1], ARGV[1] .. ':n', ARGV[1] .. ':b')
redis.call('SREM', KEYS[2], ARGV[1])
return 1
"""

_SCRIPTS = {
    name: (script, hashlib.sha1(script.encode()).hexdigest())
    for name, script in {
        "open": _OPEN,
        "swap": _SWAP,
        "park": _PARK,
        "keyring": _KEYRING,
        "cancel": _CANCEL,
        "doom": _DOOM,
        "reserve": _RESERVE,
        "settle": _SETTLE,
        "release": _RELEASE,
        "drop": _DROP,
        "namespace": _NAMESPACE,
    }.items()
}
_BY_SHA = {sha: script for script, sha in _SCRIPTS.values()}

#: Replies meaning Redis did not execute the command: re-sending it is always safe.
_NOT_EXECUTED = (MovedError, AskError, TryAgainError, ClusterDownError, NoScriptError)


class _Written(NamedTuple):
    """What a commit's blob writes did: the ids it created (the only ones its abort may
    delete), the index of a blob another writer holds, the first error reply."""

    created: list[bytes]
    taken: int | None
    error: Exception | None


class NotReplicatedError(StorageUnavailableError):
    """A write was applied on its master but fewer replicas than required confirmed it
    within the replica timeout: its outcome after a failover is unknown."""


def _gc_op(command: str, kind: bytes, tag: bytes) -> tuple[bytes, tuple[Any, ...]]:
    """``(key, command)`` adding ``tag`` to, or removing it from, its collector's set."""
    key = _gc_key(kind, tag)
    return key, (command, key, tag)


def _raise_any(replies: list[Any]) -> list[Any]:
    """Raise the first error among pipeline replies; else return them."""
    for reply in replies:
        if isinstance(reply, Exception):
            raise reply
    return replies


def _send(
    batches: Sequence[tuple[redis.Redis, Sequence[tuple[Any, ...]]]],
) -> list[list[Any] | Exception]:
    """Run each batch of commands on its node's client, pipelined: write every batch
    first, then read every batch's replies, so a step over three masters waits for its
    slowest answer, not for three in a row (and needs no thread). Redis reads a client's
    commands whether or not it has read the replies yet, so writing all before reading
    any cannot stall.

    Returns each batch's replies (an error reply in its place, as redis-py's pipelines
    give them with ``raise_on_error=False``), or the error that lost its connection.
    Every reply on the wire is read before it returns, so no command of a step is still
    in flight when its caller goes on, and a connection goes back to its pool only once
    read to the end (else it is closed)."""
    outcomes: list[list[Any] | Exception] = []
    sent: list[tuple[int, redis.Redis, Any]] = []  # (batch, client, connection) to read
    try:
        for client, commands in batches:
            try:
                connection = client.connection_pool.get_connection()
            except Exception as exc:  # could not connect (the pool took it back)
                outcomes.append(exc)
                continue
            # Listed at once, so the finally below closes it whatever interrupts the
            # write (a KeyboardInterrupt too), and gives it back to its pool.
            sent.append((len(outcomes), client, connection))
            outcomes.append([])
            try:
                connection.send_packed_command(connection.pack_commands(commands))
            except Exception as exc:
                sent.pop()
                connection.disconnect()
                client.connection_pool.release(connection)
                outcomes[-1] = exc
        while sent:
            index, client, connection = sent[0]
            replies: list[Any] = []
            try:
                for command in batches[index][1]:
                    try:
                        replies.append(client.parse_response(connection, command[0]))
                    except ResponseError as exc:
                        replies.append(exc)
                outcomes[index] = replies
            except Exception as exc:
                connection.disconnect()
                outcomes[index] = exc
            sent.pop(0)  # before the release: never released twice
            client.connection_pool.release(connection)
    finally:
        for _, client, connection in sent:  # interrupted: replies left unread
            connection.disconnect()
            client.connection_pool.release(connection)
    return outcomes


def _ids_of(value: bytes) -> list[bytes]:
    """The blob ids of an op value ``state|time|hex ids``."""
    hexed = value.split(b"|", 2)[2]
    return [binascii.unhexlify(hexed[i : i + _HEX]) for i in range(0, len(hexed), _HEX)]


def _op_time(value: bytes) -> float:
    return float(value.split(b"|", 2)[1])


class ClusterStorage(RedisNames, Storage):
    """Store blobs, roots, keyrings, counters and garbage in a Redis Cluster.

    ``nodes`` is ``HOST:PORT[,HOST:PORT...]`` of some of the cluster's nodes (the rest
    are discovered), or the same as a ``redis://`` or ``rediss://`` URL with a user,
    password and TLS options (``blob_server.storage.cluster_address``). ``min_replicas``:
    how many replicas must confirm each write (None: 1 where the slot's master has a
    replica, else 0); ``replica_timeout`` bounds that wait, in seconds. ``retry_seconds``
    bounds the re-sending of steps Redis did not execute (a failover or a slot migration
    in progress). ``password`` authenticates to every node (one not in the URL: read
    from a file).
    """

    _spread_blobs = True

    def __init__(
        self,
        nodes: str,
        *,
        clock: Callable[[], float] = time.time,
        password: str | None = None,
        socket_timeout: float = 30.0,
        connect_timeout: float = 5.0,
        min_replicas: int | None = None,
        replica_timeout: float = 1.0,
        retry_seconds: float = 20.0,
    ) -> None:
        self._address = parse_cluster_address(nodes, password=password)
        self.url = self._address.url
        if min_replicas is not None and min_replicas < 0:
            raise InvalidRequestError("min_replicas must be None or >= 0")
        self._clock = clock
        self._min_replicas = min_replicas
        self._replica_timeout_ms = max(1, int(replica_timeout * 1000))
        self._retry_seconds = retry_seconds
        self._startup = list(self._address.nodes)
        self._options: dict[str, Any] = {
            **self._address.connection_options(),
            "socket_timeout": socket_timeout,
            "socket_connect_timeout": connect_timeout,
        }
        self._cluster: RedisCluster | None = None
        self._aclient: redis.asyncio.RedisCluster | None = None
        self._aclient_loop: asyncio.AbstractEventLoop | None = None
        self._refreshed = time.monotonic()
        #: Replies that sent a command elsewhere or back (MOVED, ASK, TRYAGAIN,
        #: CLUSTERDOWN): slot migrations and failovers seen, for operators and tests.
        self.redirects = 0
        #: Steps re-sent after a lost connection or answer (idempotent ones only).
        self.resent = 0
        self._cluster_lock = threading.Lock()
        self._namespace_script = self._namespace_call
        self._namespace: bytes | None = None
        self._namespace_lock = threading.Lock()
        self._scopes: dict[tuple[str, str], _Scope] = {}
        self._tenants: dict[str, _Tenant] = {}
        self._closed = False

    # -- plumbing ------------------------------------------------------------------------

    def _client(self) -> RedisCluster:
        """The cluster client (topology, slot to node), made on first use."""
        if self._cluster is None:
            with self._cluster_lock:
                if self._cluster is None:
                    self._cluster = RedisCluster(
                        startup_nodes=self._startup,
                        retry=Retry(NoBackoff(), 0),
                        **self._options,
                    )
        return self._cluster

    def _namespace_call(self, keys: list[bytes], args: list[bytes]) -> Any:
        """``_NAMESPACE`` on ``zdb:ns`` (SET NX then GET: safe to re-send)."""
        return self._idempotent(lambda: self._call(keys[0], "namespace", keys, args))

    def _check_server(self) -> None:
        """On every node (each has its own ACL; a replica may become a master): refuse
        a user that may not ``SPUBLISH`` root changes (``publish_refused``), then
        ``check_server`` (eviction refused, no AOF warned about).

        The probe is the swap script's own command on a ``zdb:`` channel; a node that
        does not own the probe's slot answers MOVED, but only after its ACL let the
        command through (Redis checks permissions before it redirects), so every node
        is checked with one command."""
        for node, client in self._nodes():
            try:
                client.execute_command("SPUBLISH", PUBLISH_PROBE, b"0")
            except (MovedError, AskError):
                pass  # permitted, and sent elsewhere
            except ResponseError as exc:
                raise publish_refused(
                    f"Redis Cluster node {node.name} of {self.url}", exc
                ) from None
            check_server(client, node.name)

    def _nodes(self) -> list[tuple[ClusterNode, redis.Redis]]:
        """Every node (masters and replicas) with its client."""
        cluster = self._client()
        return [(node, cluster.get_redis_connection(node)) for node in cluster.get_nodes()]

    def _refresh(self) -> None:
        """Read the cluster's topology again (after MOVED, a failover, a lost node)."""
        self._refreshed = time.monotonic()
        try:
            self._client().nodes_manager.initialize()
        except (RedisError, RedisClusterException) as exc:
            log.info("cluster topology refresh failed: %s", exc)

    def _replicas_needed(self, slot: int) -> int:
        """``min_replicas``, or by default 1 if the slot's master has a replica in the
        topology, read again every ``TOPOLOGY_TTL`` seconds so new replicas are seen."""
        if self._min_replicas is not None:
            return self._min_replicas
        if time.monotonic() - self._refreshed > TOPOLOGY_TTL:
            self._refresh()
        nodes = self._client().nodes_manager.slots_cache.get(slot) or []
        return 1 if len(nodes) > 1 else 0

    def _run(
        self, commands: Sequence[tuple[bytes, tuple[Any, ...]]], *, write: bool = True
    ) -> list[Any]:
        """Run each ``(key, command)`` on the master of its key's slot, pipelined per
        node, every node's pipeline written before any answer is read (``_send``), and
        return the replies in order; a write pipeline ends with ``WAIT``.

        Commands Redis did not execute (MOVED, ASK, TRYAGAIN, CLUSTERDOWN, NOSCRIPT) are
        re-sent where they belong until ``retry_seconds`` pass; connection errors and
        timeouts propagate (the caller knows whether re-sending is safe), the first in
        node order once every pipeline was answered or failed."""
        cluster = self._client()
        replies: list[Any] = [None] * len(commands)
        todo: dict[int, ClusterNode | None] = dict.fromkeys(range(len(commands)))  # ASK node
        deadline = time.monotonic() + self._retry_seconds
        while todo:
            groups: dict[tuple[str, bool], list[int]] = {}
            targets: dict[str, tuple[ClusterNode, int]] = {}
            for index, asking in todo.items():
                slot = cluster.keyslot(commands[index][0])
                node = asking or cluster.nodes_manager.get_node_from_slot(slot)
                groups.setdefault((node.name, asking is not None), []).append(index)
                targets[node.name] = (node, slot)
            todo = {}
            failure: Exception | None = None
            sends: list[tuple[ClusterNode, bool, list[int], int]] = []
            batches: list[tuple[redis.Redis, list[tuple[Any, ...]]]] = []
            for (name, asking), indexes in groups.items():
                node, slot = targets[name]
                batch: list[tuple[Any, ...]] = []
                for index in indexes:
                    if asking:
                        batch.append(("ASKING",))
                    batch.append(commands[index][1])
                need = self._replicas_needed(slot) if write else 0
                if need:
                    batch.append(("WAIT", need, self._replica_timeout_ms))
                sends.append((node, asking, indexes, need))
                batches.append((cluster.get_redis_connection(node), batch))
            outcomes = _send(batches)
            for (node, asking, indexes, need), got in zip(sends, outcomes, strict=True):
                if isinstance(got, BaseException):
                    raise got
                if need:
                    acked = got.pop()
                    if isinstance(acked, Exception):
                        raise acked
                if asking:
                    got = got[1::2]
                for index, reply in zip(indexes, got, strict=True):
                    if isinstance(reply, NoScriptError):
                        sha = commands[index][1][1]
                        cluster.get_redis_connection(node).script_load(_BY_SHA[sha])
                        todo[index] = None
                    elif isinstance(reply, MovedError):
                        todo[index] = None
                        failure = reply
                        self.redirects += 1
                    elif isinstance(reply, AskError):  # migrating: this one command there
                        todo[index] = cluster.nodes_manager.get_node(reply.host, reply.port)
                        failure = reply if todo[index] is not None else MovedError(str(reply))
                        self.redirects += 1
                    elif isinstance(reply, _NOT_EXECUTED):
                        todo[index] = None
                        failure = reply
                        self.redirects += 1
                    else:
                        replies[index] = reply
                if need and acked < need and any(i not in todo for i in indexes):
                    raise NotReplicatedError(
                        f"Redis Cluster at {self.url}: {acked} of {need} replicas of "
                        f"{node.name} confirmed a write within {self._replica_timeout_ms} ms"
                    )
            if todo:
                if time.monotonic() > deadline:
                    raise failure or StorageUnavailableError(
                        f"Redis Cluster at {self.url}: scripts kept being lost (NOSCRIPT)"
                    )
                if all(asked is None for asked in todo.values()):  # not only ASKs
                    time.sleep(0.05)
                    self._refresh()
        return replies

    def _call(self, key: bytes, script: str, keys: list[bytes], args: list[Any]) -> Any:
        """One script on the slot of ``key`` (all ``keys`` share it)."""
        sha = _SCRIPTS[script][1]
        return _raise_any(self._run([(key, ("EVALSHA", sha, len(keys), *keys, *args))]))[0]

    def _idempotent(self, step: Callable[[], Any]) -> Any:
        """Run ``step``, re-sending it after a lost answer (only for steps that may be
        repeated) until ``retry_seconds`` pass."""
        deadline = time.monotonic() + self._retry_seconds
        while True:
            try:
                return step()
            except (RedisConnectionError, RedisTimeoutError, ClusterDownError) as exc:
                if time.monotonic() > deadline:
                    raise
                log.info("Redis Cluster at %s: %s; retrying", self.url, exc)
                self.resent += 1
                time.sleep(0.1)
                self._refresh()

    def _read(self, commands: Sequence[tuple[bytes, tuple[Any, ...]]]) -> list[Any]:
        """Reads: safe to re-send."""
        return _raise_any(self._idempotent(lambda: self._run(commands, write=False)))

    def durability(self) -> Durability:
        """The weakest persistence of any node (a replica may become the master), with
        what the replicas add; ``PersistenceUnknownError`` if a node will not say.

        It is the storage's first use when ``serve`` starts (``blob_server.durability``),
        so it makes the first use's checks (``_check_server``): a user the nodes' ACLs
        will not let publish root changes stops ``serve`` with the grant to make, instead
        of failing every request later with no more than "storage unavailable"."""
        with self._errors():
            self._namespace_key()
            found = [node_durability(client, node.name) for node, client in self._nodes()]
            replicas = len(self._client().get_replicas())
        weakest = max(found, key=lambda d: DURABILITY_MODES.index(d.mode))
        if self._min_replicas == 0:
            wait = "commits do not wait for replicas (--min-replicas 0)"
        elif self._min_replicas is None:
            wait = f"commits wait for 1 replica where the master has one ({replicas} replicas now)"
        else:
            wait = f"commits wait for {self._min_replicas} replicas"
        return Durability(
            weakest.mode,
            f"Redis Cluster at {self.url}: {len(found)} nodes, weakest {weakest.detail}; {wait}",
        )

    def info_aof_enabled(self) -> bool | None:
        """Not used on a cluster: ``durability`` reads every node's CONFIG."""
        return None

    # -- operations over two slots -------------------------------------------------------

    def _open(self, scope: _Scope, owner: _Tenant, ids: Sequence[bytes]) -> bytes:
        """Step 1: record an open operation naming the blobs it will write."""
        op = os.urandom(12).hex().encode("ascii")
        value = b"o|%s|%s" % (
            repr(float(self._clock())).encode(),
            b"".join(map(binascii.hexlify, ids)),
        )
        keys = [scope.ops, scope.stats]
        script = ("EVALSHA", _SCRIPTS["open"][1], len(keys), *keys, op, value, owner.tag)
        commands = [(scope.ops, script), _gc_op("SADD", b"gc", scope.tag)]
        _raise_any(self._idempotent(lambda: self._run(commands)))
        return op

    def _reserve(
        self,
        tenant: str,
        scope: _Scope,
        owner: _Tenant,
        op: bytes,
        blobs: int,
        blob_bytes: int,
        net: int,
        quota: Quota,
    ) -> None:
        """Step 2: check the quota and count the growth now (a shrink at settle)."""
        args = [op, scope.tag, blobs, blob_bytes, max(net, 0), max(-net, 0)]
        args += [_limit(quota.max_blobs), _limit(quota.max_bytes), repr(float(self._clock()))]
        keys = [owner.usage, owner.databases, owner.journal]
        script = ("EVALSHA", _SCRIPTS["reserve"][1], len(keys), *keys, *args)
        commands = [_gc_op("SADD", b"gct", owner.tag), (owner.usage, script)]
        reply = _raise_any(self._idempotent(lambda: self._run(commands)))[1]
        if reply[0] == 3:
            raise _quota_error(tenant, reply)

    def _settle(self, owner: _Tenant, op: bytes, *, applied: bool) -> None:
        keys = [owner.usage, owner.journal]
        self._idempotent(lambda: self._call(owner.usage, "settle", keys, [op, int(applied)]))

    def _write_blobs(self, scope: _Scope, pairs: Sequence[tuple[bytes, bytes]]) -> _Written:
        """Step 3: ``SET NX`` every blob; return which ids this op created, the index of
        one that another writer holds, and the first error reply.

        A blob that was already there on the first attempt is another writer's, even with
        our bytes: the op must never delete it. Only after a lost answer (the pipeline
        re-sent) is a blob found with our bytes taken as ours, written by our own earlier
        attempt: ids are 128 random bits and clients never re-send a commit, so only a
        client of this same database reusing ids could make it someone else's, and such
        a client can overwrite its own data anyway."""
        keys = [scope.blob(i) for i, _ in pairs]
        commands = [(k, ("SET", k, data, "NX")) for k, (_, data) in zip(keys, pairs, strict=True)]
        attempts = 0

        def write() -> list[Any]:
            nonlocal attempts
            attempts += 1
            return self._run(commands)

        replies = self._idempotent(write)
        mine = [reply is not None and not isinstance(reply, Exception) for reply in replies]
        present = [i for i, reply in enumerate(replies) if reply is None]
        if attempts > 1 and present:
            held = self._read([(keys[i], ("GET", keys[i])) for i in present])
            for i, data in zip(present, held, strict=True):
                mine[i] = data == pairs[i][1]
        return _Written(
            [pairs[i][0] for i, own in enumerate(mine) if own],
            next((i for i in present if not mine[i]), None),
            next((r for r in replies if isinstance(r, Exception)), None),
        )

    def _abort(
        self, scope: _Scope, owner: _Tenant, op: bytes, written: Sequence[bytes] | None = None
    ) -> bool:
        """Cancel ``op`` and undo it: tombstone, give back the reservation, delete its
        blobs (only ``written`` ones if given), forget it. Return False if the op turns
        out to be applied (its swap happened after all): nothing is undone then."""
        args: list[Any] = [op, b"0", repr(float(self._clock())), b""]
        if written is not None:
            args[1:] = [b"1", args[2], b"".join(map(binascii.hexlify, written))]
        reply = self._idempotent(
            lambda: self._call(scope.ops, "cancel", [scope.ops, scope.stats], args)
        )
        if reply[0] == 1:
            return False
        self._finish_abort(scope, owner, op, reply[1])
        return True

    def _finish_abort(self, scope: _Scope, owner: _Tenant, op: bytes, value: bytes) -> None:
        """Undo a tombstoned op (each step may be repeated by garbage collection): give
        back the reservation and delete the blobs in one step (either order is fine, and
        a crash between them leaves the tombstone to finish), then forget the op."""
        keys = [owner.usage, owner.journal]
        settle = ("EVALSHA", _SCRIPTS["settle"][1], len(keys), *keys, op, 0)
        commands = [
            (owner.usage, settle),
            *((k, ("DEL", k)) for k in map(scope.blob, _ids_of(value))),
        ]
        _raise_any(self._idempotent(lambda: self._run(commands)))
        self._idempotent(lambda: self._run([(scope.ops, ("HDEL", scope.ops, op))]))

    def _undo_quietly(
        self, scope: _Scope, owner: _Tenant, op: bytes, written: Sequence[bytes] | None = None
    ) -> None:
        """Abort after a failure; if that fails too, garbage collection finishes it."""
        try:
            self._abort(scope, owner, op, written)
        except (RedisError, RedisClusterException, StorageUnavailableError) as exc:
            log.warning("Redis Cluster at %s: abort of op %s left to GC: %s", self.url, op, exc)

    def _guarded(
        self,
        scope: _Scope,
        owner: _Tenant,
        op: bytes,
        pairs: Sequence[tuple[bytes, bytes]],
        final: Callable[[], Any],
    ) -> Any:
        """Steps 3 and 4: write the blobs, then the final single-slot step ``final``
        (not re-sent). Abort on any failure before it; after a lost answer, cancel to
        learn the truth. Returns the final step's reply, or raises."""
        try:
            if pairs:
                written = self._write_blobs(scope, pairs)
                if written.taken is not None or written.error is not None:
                    self._undo_quietly(scope, owner, op, written.created)
                    if written.error is not None:
                        raise StorageUnavailableError(
                            f"Redis Cluster at {self.url}: {written.error}"
                        ) from written.error
                    raise BlobExistsError(f"blob {pairs[written.taken][0].hex()} already exists")
        except (RedisError, RedisClusterException, NotReplicatedError) as exc:
            # No complete answer: the op's own ids are ours or were never written (see
            # _write_blobs), so the abort deletes them all.
            self._undo_quietly(scope, owner, op)
            raise StorageUnavailableError(f"Redis Cluster at {self.url}: {exc}") from exc
        try:
            return final()
        except NotReplicatedError:
            raise  # applied on the master, not confirmed: outcome unknown, GC settles it
        except (RedisConnectionError, RedisTimeoutError, ClusterDownError) as exc:
            try:
                cancelled = self._abort(scope, owner, op)
            except (RedisError, RedisClusterException) as again:
                raise StorageUnavailableError(
                    f"Redis Cluster at {self.url}: {exc}; outcome unknown ({again})"
                ) from exc
            if cancelled:
                raise StorageUnavailableError(
                    f"Redis Cluster at {self.url}: {exc}; not applied"
                ) from exc
            return None  # applied (and, through the cancel's WAIT, replicated)

    # -- the Storage interface -----------------------------------------------------------

    def get_root(self, tenant: str, database: str) -> RootRecord:
        with self._errors():
            root = self._scope(tenant, database).root
            seq, data = self._read([(root, ("HMGET", root, "seq", "data"))])[0]
        return EMPTY_ROOT if seq is None else RootRecord(int(seq), data or b"")

    def get_blobs(self, tenant: str, database: str, ids: Sequence[bytes]) -> dict[bytes, bytes]:
        """Return the blobs with these ids (GETs pipelined per node, one round trip each)."""
        v.check_scope(tenant, database)
        wanted = v.check_ids(ids)
        if not wanted:
            return {}
        with self._errors():
            keys = list(map(self._scope(tenant, database).blob, wanted))
            values = self._read([(k, ("GET", k)) for k in keys])
        return {i: data for i, data in zip(wanted, values) if data is not None}

    def commit(
        self,
        tenant: str,
        database: str,
        *,
        expected_seq: int,
        root: bytes,
        blobs: Mapping[bytes, bytes],
        garbage: Iterable[bytes] = (),
        quota: Quota = NO_QUOTA,
        staged: Sequence[bytes] = (),
    ) -> CommitResult:
        """Open, reserve, write the blobs, swap the root, settle (see the module doc).

        Checked first, as the other backends do, without writing: the seq (a stale commit
        gets the current root), new ids that exist, staged ids that are not pending."""
        v.check_scope(tenant, database)
        seq, root_data, pairs, dead, claimed = v.check_commit(
            expected_seq, root, blobs, garbage, staged
        )
        with self._errors():
            scope = self._scope(tenant, database)
            owner = self._tenant(tenant)
            root_reads = [
                (scope.root, ("HGET", scope.root, "seq")),
                (scope.root, ("HSTRLEN", scope.root, "data")),
            ]
            (current, old_size), check = self._check_new(scope, pairs, claimed, root_reads)
            if int(current or 0) != seq:
                return CommitResult(False, self.get_root(tenant, database))
            check()
            blob_bytes = sum(len(data) for _, data in pairs)
            op = self._open(scope, owner, [i for i, _ in pairs])
            try:
                self._reserve(
                    tenant,
                    scope,
                    owner,
                    op,
                    len(pairs),
                    blob_bytes,
                    blob_bytes + len(root_data) - int(old_size),
                    quota,
                )
            except BaseException:
                self._undo_quietly(scope, owner, op)
                raise
            keys = [scope.root, scope.garbage, scope.pending, scope.ops]
            args: list[Any] = [op, str(seq), str(seq + 1), root_data, repr(float(self._clock()))]
            args += [len(claimed), *(i.hex() for i in claimed), *(i.hex() for i in dead)]
            reply = self._guarded(
                scope, owner, op, pairs, lambda: self._call(scope.root, "swap", keys, args)
            )
            if reply is not None and reply[0] != 1:
                self._undo_quietly(scope, owner, op)
                if reply[0] == 0:
                    return CommitResult(False, RootRecord(int(reply[1]), reply[2]))
                if reply[0] == 4:
                    raise NotStagedError(f"blob {claimed[int(reply[1])].hex()} is not staged")
                raise StorageUnavailableError(
                    f"Redis Cluster at {self.url}: the commit was cancelled (open longer "
                    f"than {OP_TIMEOUT:.0f} s); not applied"
                )
            self._settle_quietly(owner, op)
        return CommitResult(True, RootRecord(seq + 1, root_data))

    def _settle_quietly(self, owner: _Tenant, op: bytes) -> None:
        """Settle an applied op; if Redis is unreachable, garbage collection will."""
        try:
            self._settle(owner, op, applied=True)
        except (RedisError, RedisClusterException) as exc:
            log.warning("Redis Cluster at %s: settling op %s left to GC: %s", self.url, op, exc)

    def _check_new(
        self,
        scope: _Scope,
        pairs: Sequence[tuple[bytes, bytes]],
        claimed: Sequence[bytes],
        also: Sequence[tuple[bytes, tuple[Any, ...]]] = (),
    ) -> tuple[list[Any], Callable[[], None]]:
        """Read, in one pass over the masters, ``also`` (the caller's reads) and whether
        the new ids exist and the staged ids are pending; return ``also``'s replies and a
        check that raises ``BlobExistsError`` then ``NotStagedError`` (the caller looks
        at its own replies first: a stale commit is answered with the root). Reads
        only; the writes check again, so a race is caught there."""
        keys = [scope.blob(i) for i, _ in pairs]
        members = [i.hex() for i in claimed]
        commands = [*also, *((k, ("EXISTS", k)) for k in keys)]
        if members:
            commands.append((scope.pending, ("ZMSCORE", scope.pending, *members)))
        replies = self._read(commands)
        found = replies[len(also) : len(also) + len(keys)]
        scores = replies[-1] if members else []

        def check() -> None:
            for (blob_id, _), exists in zip(pairs, found, strict=True):
                if exists:
                    raise BlobExistsError(f"blob {blob_id.hex()} already exists")
            for blob_id, score in zip(claimed, scores, strict=True):
                if score is None:
                    raise NotStagedError(f"blob {blob_id.hex()} is not staged")

        return replies[: len(also)], check

    def stage(
        self,
        tenant: str,
        database: str,
        blobs: Mapping[bytes, bytes],
        *,
        quota: Quota = NO_QUOTA,
    ) -> None:
        """Open, reserve, write, then make the blobs pending in ``{S}`` (see base)."""
        v.check_scope(tenant, database)
        pairs = v.check_blobs(blobs)
        if not pairs:
            return
        with self._errors():
            scope = self._scope(tenant, database)
            owner = self._tenant(tenant)
            self._check_new(scope, pairs, ())[1]()
            size = sum(len(data) for _, data in pairs)
            op = self._open(scope, owner, [i for i, _ in pairs])
            try:
                self._reserve(tenant, scope, owner, op, len(pairs), size, size, quota)
            except BaseException:
                self._undo_quietly(scope, owner, op)
                raise
            args = [op, repr(float(self._clock())), *(i.hex() for i, _ in pairs)]
            keys = [scope.ops, scope.pending]
            parked = self._guarded(
                scope, owner, op, pairs, lambda: self._call(scope.ops, "park", keys, args)
            )
            if parked == 0:
                self._undo_quietly(scope, owner, op)
                raise StorageUnavailableError(
                    f"Redis Cluster at {self.url}: the stage was cancelled; not applied"
                )
            self._settle_quietly(owner, op)

    def allocate_ids(self, tenant: str, database: str, sequence: str, count: int) -> int:
        """Reserve ``count`` consecutive integers (HINCRBY, never re-sent)."""
        v.check_scope(tenant, database)
        v.check_name(sequence, "sequence")
        v.check_int(count, "count", low=1, high=v.MAX_ALLOCATE)
        with self._errors():
            key = self._scope(tenant, database).counters
            last = _raise_any(self._run([(key, ("HINCRBY", key, self._field(sequence), count))]))[0]
        return int(last) - count + 1

    def get_keyring(self, tenant: str, database: str, name: str) -> bytes | None:
        v.check_scope(tenant, database)
        v.check_name(name, "keyring name")
        with self._errors():
            key = self._scope(tenant, database).keyrings
            return self._read([(key, ("HGET", key, self._field(name)))])[0]

    def put_keyring(
        self,
        tenant: str,
        database: str,
        name: str,
        data: bytes,
        *,
        expected: bytes | None,
        quota: Quota = NO_QUOTA,
    ) -> bool:
        """Compare-and-set a keyring slot as a two-slot op: its growth is reserved
        first (exact: the set happens only if the slot holds ``expected``)."""
        v.check_scope(tenant, database)
        v.check_name(name, "keyring name")
        v.check_data(data, "keyring data")
        if expected is not None:
            v.check_data(expected, "expected keyring data")
        with self._errors():
            scope = self._scope(tenant, database)
            owner = self._tenant(tenant)
            field = self._field(name)
            if self._read([(scope.keyrings, ("HGET", scope.keyrings, field))])[0] != expected:
                return False
            op = self._open(scope, owner, ())
            try:
                growth = len(data) - len(expected or b"")
                self._reserve(tenant, scope, owner, op, 0, 0, growth, quota)
            except BaseException:
                self._undo_quietly(scope, owner, op)
                raise
            keys = [scope.keyrings, scope.ops]
            args = [op, field, data, b"0" if expected is None else b"1", expected or b""]
            reply = self._guarded(
                scope, owner, op, (), lambda: self._call(scope.keyrings, "keyring", keys, args)
            )
            if reply is not None and reply[0] != 1:
                self._undo_quietly(scope, owner, op)
                if reply[0] == 5:
                    raise StorageUnavailableError(
                        f"Redis Cluster at {self.url}: the keyring write was cancelled"
                    )
                return False
            self._settle_quietly(owner, op)
        return True

    def collect_garbage(
        self,
        *,
        retention: float = DEFAULT_RETENTION_SECONDS,
        staging_timeout: float = DEFAULT_STAGING_TIMEOUT,
    ) -> int:
        """Per scope in the ``zdb:gc:<h>`` sets: finish or abort what operations left, then delete
        due garbage and stale pending blobs in batches across nodes; then settle the
        journal entries of applied operations (see the module doc)."""
        now = self._clock()
        cutoff = repr(now - v.check_retention(retention))
        stale = repr(now - v.check_retention(staging_timeout, "staging_timeout"))
        deleted = 0
        with self._errors():
            for tag in self._members(b"gc"):
                deleted += self._collect_scope(
                    _Scope(tag.decode("ascii"), spread_blobs=True), now, cutoff, stale
                )
            for tag in self._members(b"gct"):
                self._reclaim_journal(_Tenant(tag.decode("ascii")), now)
        return deleted

    def _members(self, kind: bytes) -> list[bytes]:
        """Every tag in the collector's ``kind`` sets (one pipeline per node)."""
        keys = [_gc_key(kind, shard.encode()) for shard in GC_SHARDS]
        return sorted(
            tag for found in self._read([(k, ("SMEMBERS", k)) for k in keys]) for tag in found
        )

    def _collect_scope(self, scope: _Scope, now: float, cutoff: str, stale: str) -> int:
        tenant = self._read([(scope.stats, ("HGET", scope.stats, "t"))])[0]
        if tenant is None:  # never opened an op: nothing of it is counted or pending
            self._run([_gc_op("SREM", b"gc", scope.tag)])
            return 0
        owner = _Tenant(tenant.decode("ascii"))
        deleted = 0
        for op, value in self._read([(scope.ops, ("HGETALL", scope.ops))])[0].items():
            state = value[:1]
            if state == b"g":
                deleted += self._delete(scope, owner, op, value)
            elif state == b"x" or now - _op_time(value) > OP_TIMEOUT:
                self._abort(scope, owner, op)
        while True:
            op = os.urandom(12).hex().encode("ascii")
            keys = [scope.garbage, scope.pending, scope.ops]
            ids = self._call(
                scope.ops, "doom", keys, [cutoff, stale, _GC_BATCH, op, repr(float(now))]
            )
            if ids:
                deleted += self._delete(scope, owner, op, b"g|0|" + b"".join(ids))
            if len(ids) < _GC_BATCH:
                break
        # With the database's reservations so far (in the same round trip, read before
        # looking again below): a commit reserved before this is seen there (open, or
        # swapped in); one reserved after, by _DROP.
        *left, reserved = self._read(
            [
                (scope.root, ("ZCARD", scope.garbage)),
                (scope.root, ("ZCARD", scope.pending)),
                (scope.root, ("HLEN", scope.ops)),
                (owner.usage, ("HGET", owner.usage, scope.tag + b":r")),
            ]
        )
        if not any(left):
            self._run([_gc_op("SREM", b"gc", scope.tag)])
            again = self._read(
                [
                    (scope.root, ("EXISTS", scope.root, scope.keyrings)),
                    (scope.root, ("ZCARD", scope.garbage)),
                    (scope.root, ("ZCARD", scope.pending)),
                    (scope.root, ("HLEN", scope.ops)),
                ]
            )
            if any(again[1:]):  # a commit or stage slipped some in: it stays
                self._run([_gc_op("SADD", b"gc", scope.tag)])
            elif not again[0]:
                keys = [owner.usage, owner.databases, owner.journal]
                self._call(owner.usage, "drop", keys, [scope.tag, reserved or b"0"])
        return deleted

    def _delete(self, scope: _Scope, owner: _Tenant, op: bytes, value: bytes) -> int:
        """Finish a garbage-collection op: measure, subtract once, delete, forget."""
        keys = [scope.blob(i) for i in _ids_of(value)]
        sizes = self._read([(k, cmd) for k in keys for cmd in (("EXISTS", k), ("STRLEN", k))])
        count = sum(sizes[0::2])
        size = sum(n for e, n in zip(sizes[0::2], sizes[1::2], strict=True) if e)
        args = [op, scope.tag, count, size, repr(float(self._clock()))]
        self._call(owner.usage, "release", [owner.usage, owner.journal], args)
        # In this order, each step confirmed by replicas before the next: were the op's
        # removal lost in a failover after its journal mark's removal got through, the
        # next pass would subtract the same blobs again; were a DEL lost after the op's
        # removal, its blob would stay, counted nowhere. The mark may go unconfirmed:
        # _reclaim_journal removes a leftover one (its op is gone, it gives back 0).
        gone = _raise_any(self._run([(k, ("DEL", k)) for k in keys])) if keys else []
        _raise_any(self._run([(scope.ops, ("HDEL", scope.ops, op))]))
        self._run([(owner.journal, ("HDEL", owner.journal, op))], write=False)
        return sum(1 for n in gone if n == 1)

    def _reclaim_journal(self, owner: _Tenant, now: float) -> None:
        """Settle journal entries older than ``OP_TIMEOUT`` whose op is gone (applied);
        an entry whose op is still there is its scope's to abort."""
        entries = self._read([(owner.journal, ("HGETALL", owner.journal))])[0]
        for op, value in entries.items():
            fields = value.split()
            if now - float(fields[5]) <= OP_TIMEOUT:
                continue
            scope = _Scope(fields[0].decode("ascii"), spread_blobs=True)
            if not self._read([(scope.ops, ("HEXISTS", scope.ops, op))])[0]:
                self._settle(owner, op, applied=True)
        if not entries:
            self._run([_gc_op("SREM", b"gct", owner.tag)])
            if self._read([(owner.journal, ("HLEN", owner.journal))])[0]:
                self._run([_gc_op("SADD", b"gct", owner.tag)])

    def stats(self, tenant: str, database: str) -> dict[str, int]:
        """Return seq, blobs, bytes, garbage, staged, counters and keyrings (two
        round trips: the database's slot, then its figures in the tenant's)."""
        with self._errors():
            scope = self._scope(tenant, database)
            owner = self._tenant(tenant)
            seq, garbage, staged, counters, keyrings = self._read(
                [
                    (scope.root, ("HGET", scope.root, "seq")),
                    (scope.root, ("ZCARD", scope.garbage)),
                    (scope.root, ("ZCARD", scope.pending)),
                    (scope.root, ("HLEN", scope.counters)),
                    (scope.root, ("HLEN", scope.keyrings)),
                ]
            )
            blobs, size = self._figures(owner, [scope.tag])[0]
        return {
            "seq": int(seq or 0),
            "blobs": blobs,
            "bytes": size,
            "garbage": garbage,
            "staged": staged,
            "counters": counters,
            "keyrings": keyrings,
        }

    def _figures(self, owner: _Tenant, tags: Sequence[bytes]) -> list[tuple[int, int]]:
        """Blobs and blob bytes of each scope, from the tenant's usage hash."""
        fields = [f for tag in tags for f in (tag + b":n", tag + b":b")]
        values = self._read([(owner.usage, ("HMGET", owner.usage, *fields))])[0]
        return [(int(values[i] or 0), int(values[i + 1] or 0)) for i in range(0, len(values), 2)]

    def usage(self, tenant: str, *, detail: bool = False) -> TenantUsage:
        with self._errors():
            owner = self._tenant(tenant)
            (blobs, size), tags = self._read(
                [
                    (owner.usage, ("HMGET", owner.usage, "blobs", "bytes")),
                    (owner.usage, ("SMEMBERS", owner.databases)),
                ]
            )
            per_database: list[DatabaseUsage] = []
            if detail and tags:
                ordered = sorted(tags)
                scopes = [_Scope(tag.decode("ascii"), spread_blobs=True) for tag in ordered]
                replies = self._read(
                    [
                        (s.root, cmd)
                        for s in scopes
                        for cmd in (
                            ("HGET", s.root, "seq"),
                            ("ZCARD", s.garbage),
                            ("ZCARD", s.pending),
                        )
                    ]
                )
                for i, (scope, (n, nbytes)) in enumerate(
                    zip(scopes, self._figures(owner, ordered), strict=True)
                ):
                    seq, garbage, staged = replies[3 * i : 3 * i + 3]
                    per_database.append(
                        DatabaseUsage(
                            f"tag:{scope.tag.decode('ascii')}",
                            int(seq or 0),
                            n,
                            nbytes,
                            garbage,
                            staged,
                        )
                    )
        return TenantUsage(int(blobs or 0), int(size or 0), len(tags), tuple(per_database))

    # -- root changes (blob_server.storage.cluster_changes) ----------------------------------

    def root_changes(self, on_change: ChangeCallback, on_lost: LostCallback) -> RootChanges:
        """Follow every process's commits through sharded pub/sub (one subscriber
        connection per master this process watches databases on)."""
        from blob_server.storage.cluster_changes import ClusterRootChanges

        return ClusterRootChanges(self, on_change, on_lost)

    def commit_leases(self, timeout: float) -> CommitLeases:
        """Commit leases in the cluster, shared by every server process on it: the single
        Redis's FIFO (``redis_leases``), whose keys all carry the database's hash tag
        ``{S}``, so each of its scripts runs on the one master of that slot."""
        from blob_server.storage.redis_leases import RedisCommitLeases

        return RedisCommitLeases(self, timeout)

    def async_client(self) -> redis.asyncio.RedisCluster:
        """The asyncio cluster client of the running event loop (made on first use there),
        for the commit leases. It follows MOVED and ASK, and re-sends a command whose
        connection broke: the lease scripts are safe to run twice (a second ``_TURN``
        finds its token holding or queued, a second ``_LEAVE`` has nothing to undo)."""
        if self._closed:
            raise StorageUnavailableError(f"storage {self.url} is closed")
        loop = asyncio.get_running_loop()
        if self._aclient is None or self._aclient_loop is not loop:
            self._aclient = redis.asyncio.RedisCluster(
                startup_nodes=[
                    redis.asyncio.cluster.ClusterNode(n.host, n.port) for n in self._startup
                ],
                **self._options,
            )
            self._aclient_loop = loop
        return self._aclient

    async def aclose(self) -> None:
        if self._aclient is not None and self._aclient_loop is asyncio.get_running_loop():
            await self._aclient.aclose()
        self._aclient = None

    def master_of(self, channel: bytes) -> ClusterNode:
        """The master that owns ``channel``'s slot now (topology read again when older
        than ``TOPOLOGY_TTL``)."""
        with self._errors():
            cluster = self._client()
            if time.monotonic() - self._refreshed > TOPOLOGY_TTL:
                self._refresh()
            return cluster.nodes_manager.get_node_from_slot(cluster.keyslot(channel))

    def pubsub_connection(self, node: ClusterNode) -> Any:
        """A new, unconnected asyncio connection to ``node`` for a subscriber (reads on
        it block until a message; the feed checks its health itself)."""
        options = self._address.connection_options()
        tls = options.pop("ssl", False)
        pool = redis.asyncio.ConnectionPool(
            connection_class=redis.asyncio.SSLConnection if tls else redis.asyncio.Connection,
            host=node.host,
            port=node.port,
            **options,
            socket_timeout=None,
            socket_connect_timeout=self._options["socket_connect_timeout"],
            retry=AsyncRetry(NoBackoff(), 0),
        )
        return pool.make_connection()

    def root_seqs(self, channels: Sequence[bytes]) -> list[int]:
        """The current seq of each database named by its ``root_channel``."""
        with self._errors():
            return [
                int(seq or 0) for seq in self._read([(c, ("HGET", c, "seq")) for c in channels])
            ]

    def close(self) -> None:
        self._closed = True
        if self._cluster is not None:
            self._cluster.close()

    def __repr__(self) -> str:
        return f"ClusterStorage({self.url!r})"

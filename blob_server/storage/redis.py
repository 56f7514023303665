"""The production storage backend: Redis through redis-py (hiredis parses replies in C).

Key layout (every name is opaque; no tenant, database, model or plaintext appears in it)::

    zdb:ns                      32 random bytes, the namespace key (created once, SET NX)
    zdb:gc                      set of scope tags that may have garbage or staged blobs
    zdb:{S}:root                hash: seq, data (the opaque root)
    zdb:{S}:s                   hash: blobs, bytes (maintained by the scripts), t (tenant tag)
    zdb:{S}:b:<blob id hex>     string: one write-once blob (live or pending)
    zdb:{S}:g                   sorted set: blob id hex -> time it became garbage
    zdb:{S}:p                   sorted set: pending (staged) blob id hex -> time staged
    zdb:{S}:k                   hash: keyring slots, field = H(name)
    zdb:{S}:c                   hash: id counters, field = H(name)
    zdb:{T}:u                   hash: blobs, bytes of the whole tenant (quota usage)
    zdb:{T}:d                   set: the scope tags of the tenant's databases

``S`` is the scope tag of one (tenant, database): 32 hex digits of a BLAKE2b-128 of the
length-prefixed names, keyed with the namespace key. Someone who sees key names (MONITOR,
SLOWLOG, a key listing, a cluster migration log) learns nothing about tenant names; the
key lives in Redis so tags stay stable across restarts and across blob-server processes.
(Whoever can read *values* can read ``zdb:ns`` too and test guessed names: it hides
names, it is not a secret against the Redis operator.) ``T`` is the tenant tag, made the
same way from the tenant name alone (another BLAKE2b personalisation). ``{S}`` is a Redis
Cluster hash tag, so one database's keys share a slot; the tenant keys have their own
slot, so a commit here (which counts usage) spans two slots, which one Redis allows and
a cluster refuses. ``blob_server.storage.cluster`` (``--redis-cluster``) shares this
module's naming (``RedisNames``) and splits the commit instead: blobs without a hash tag
(``zdb:b:S:<id>``, spread over every slot), the root swap one script on ``{S}``, usage
on ``{T}`` through journalled operations (``zdb:{S}:o``, ``zdb:{T}:j``). This backend
keeps its one-script commit: one round trip where the cluster needs 6 to 11.
Someone who reads values or watches MONITOR learns which scopes belong to one tenant
(``t``, ``zdb:{T}:d``, the keys of one script call), not the names.

Commits are one Lua script (atomic, EVALSHA): check ``seq``, check that no new blob id
exists, check that every staged id is pending, check the tenant's quota against its
usage, count blobs and bytes, SET every blob, swap the root, ZREM the staged ids from the
pending set, ZADD the garbage, PUBLISH the new seq on the channel named like the root key
(``zdb:{S}:root``: opaque, and in the scope's cluster slot, as sharded pub/sub wants);
server processes follow it through ``blob_server.storage.redis_changes``. A stage is one
script too (no id exists, quota, count, SET, ZADD pending). Keyring writes and garbage
collection (which also deletes pending blobs past the staging timeout) update the usage
in their scripts too, so usage is never out of step with what is stored. Time
comes from the storage's ``clock`` as an argument, and seqs travel as decimal strings
(Lua numbers are doubles and would round seqs above 2**53; quotas and usage stay below
2**53, see ``MAX_QUOTA``).

There are no automatic retries: a command whose answer is lost is not re-sent, because
re-sending a commit or an id allocation is not safe. Errors become
``StorageUnavailableError``; the pool reconnects on the next call.
"""

from __future__ import annotations

import asyncio
import binascii
import hashlib
import logging
import os
import struct
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qsl, quote, urlencode, urlsplit, urlunsplit

import redis
import redis.asyncio
from redis.asyncio.retry import Retry as AsyncRetry
from redis.backoff import NoBackoff
from redis.connection import parse_url
from redis.exceptions import NoScriptError, RedisClusterException, RedisError, ResponseError
from redis.maint_notifications import MaintNotificationsConfig
from redis.retry import Retry

from blob_server.exceptions import (
    BlobExistsError,
    NotStagedError,
    PersistenceUnknownError,
    QuotaExceededError,
    StorageUnavailableError,
)
from blob_server.storage import validation as v
from blob_server.storage.resp import MGET_CHUNK, RespBlobReader
from blob_server.wire.storage import (
    DEFAULT_RETENTION_SECONDS,
    DEFAULT_STAGING_TIMEOUT,
    DURABLE,
    EMPTY_ROOT,
    EVERYSEC,
    NO_QUOTA,
    OS_FLUSH,
    VOLATILE,
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

NAMESPACE_KEY = b"zdb:ns"
GC_SCOPES_KEY = b"zdb:gc"
NAMESPACE_KEY_SIZE = 32
#: A channel the storage publishes on once, to find out whether an ACL forbids it.
PUBLISH_PROBE = b"zdb:probe"
_GC_BATCH = 500  # garbage entries per GC script run: keeps Redis responsive to committers

# Shared by the scripts that write: tenant usage and quotas. ``zdb:{T}:u`` holds the
# tenant's blobs and bytes (blobs + roots + keyrings); a scope joins it the first time a
# script writes to it, marked by the field ``t`` (the tenant tag) of its stats hash and
# by its tag in the tenant's set ``zdb:{T}:d``. A scope written before quotas existed has
# no ``t``: joining then adopts what it already holds (its blob counters, root and
# keyring slots), so usage is right for old data too. Everything here only reads; the
# caller writes after every check passed (Redis does not roll a script back).
_USAGE = """
local function unjoined(stats, root, keyrings)
  if redis.call('HEXISTS', stats, 't') == 1 then
    return false, 0, 0
  end
  local s = redis.call('HMGET', stats, 'blobs', 'bytes')
  local size = tonumber(s[2] or '0') + redis.call('HSTRLEN', root, 'data')
  for _, v in ipairs(redis.call('HVALS', keyrings)) do
    size = size + #v
  end
  return true, tonumber(s[1] or '0'), size
end
local function used(usage, blobs, size)
  local u = redis.call('HMGET', usage, 'blobs', 'bytes')
  return tonumber(u[1] or '0') + blobs, tonumber(u[2] or '0') + size
end
local function refuse(max_blobs, max_bytes, used_blobs, used_bytes, add_blobs, add_bytes)
  if max_blobs ~= '' and add_blobs > 0 and used_blobs + add_blobs > tonumber(max_blobs) then
    return {3, 'blobs', used_blobs, add_blobs, tonumber(max_blobs)}
  end
  if max_bytes ~= '' and add_bytes > 0 and used_bytes + add_bytes > tonumber(max_bytes) then
    return {3, 'bytes', used_bytes, add_bytes, tonumber(max_bytes)}
  end
  return nil
end
local function count(usage, stats, dbs, join, stag, ttag, blobs, size)
  if blobs ~= 0 then
    redis.call('HINCRBY', usage, 'blobs', blobs)
  end
  if size ~= 0 then
    redis.call('HINCRBY', usage, 'bytes', size)
  end
  if join then
    redis.call('HSET', stats, 't', ttag)
  end
  redis.call('SADD', dbs, stag)  -- again after a collection took it out (see _COLLECT)
end
"""

# KEYS: root, stats, garbage, keyrings, usage, dbs, pending, n blob keys...
# ARGV: expected seq, new seq, root data, now, max blobs, max bytes ('' = no limit),
#       scope tag, tenant tag, k, n blob data..., k staged members..., garbage members...
# Returns {1} applied, {0, seq, data} conflict, {2, index} blob KEYS[8 + index] exists,
# {4, index} staged member index is not pending, {3, resource, used, adding, limit} over
# quota (nothing written in the last three cases).
# Redis does not roll a script back when a call fails midway, so the calls that could
# fail on a damaged keyspace (HINCRBY on a non-integer) come before any blob is written,
# and garbage is recorded only after the root swap (never garbage of a root not yet live).
# A garbage id still pending (staged, never made live) is released: it leaves the
# pending set and is collected after the retention like any garbage.
_COMMIT = (
    _USAGE
    + """
local cur = redis.call('HMGET', KEYS[1], 'seq', 'data')
local seq = cur[1] or '0'
if seq ~= ARGV[1] then
  return {0, seq, cur[2] or ''}
end
local n = #KEYS - 7
local bytes = 0
for i = 8, #KEYS do
  if redis.call('EXISTS', KEYS[i]) == 1 then
    return {2, i - 8}
  end
  bytes = bytes + #ARGV[i + 2]
end
local staged = 10 + n
local garbage = staged + tonumber(ARGV[9])
for j = staged, garbage - 1 do
  if not redis.call('ZSCORE', KEYS[7], ARGV[j]) then
    return {4, j - staged}
  end
end
local size = bytes + #ARGV[3] - #(cur[2] or '')
local join, old_blobs, old_bytes = unjoined(KEYS[2], KEYS[1], KEYS[4])
local used_blobs, used_bytes = used(KEYS[5], old_blobs, old_bytes)
local refused = refuse(ARGV[5], ARGV[6], used_blobs, used_bytes, n, size)
if refused then
  return refused
end
if n > 0 then
  redis.call('HINCRBY', KEYS[2], 'blobs', n)
  redis.call('HINCRBY', KEYS[2], 'bytes', bytes)
end
count(KEYS[5], KEYS[2], KEYS[6], join, ARGV[7], ARGV[8], old_blobs + n, old_bytes + size)
for i = 8, #KEYS do
  redis.call('SET', KEYS[i], ARGV[i + 2])
end
redis.call('HSET', KEYS[1], 'seq', ARGV[2], 'data', ARGV[3])
for j = staged, garbage - 1 do
  redis.call('ZREM', KEYS[7], ARGV[j])
end
local release = garbage <= #ARGV and redis.call('EXISTS', KEYS[7]) == 1
for j = garbage, #ARGV do
  if release then
    redis.call('ZREM', KEYS[7], ARGV[j])
  end
  redis.call('ZADD', KEYS[3], 'NX', ARGV[4], ARGV[j])
end
redis.call('PUBLISH', KEYS[1], ARGV[2])  -- the root change, to every server process
return {1}
"""
)

# KEYS: stats, root, keyrings, usage, dbs, pending, n blob keys...
# ARGV: now, max blobs, max bytes ('' = no limit), scope tag, tenant tag, n blob data...,
#       n members (the blob ids in hex)...
# Returns {1} staged, {2, index} blob KEYS[7 + index] exists, or the quota refusal
# (nothing written in the last two cases). As in the commit, every check comes first.
_STAGE = (
    _USAGE
    + """
local n = #KEYS - 6
local bytes = 0
for i = 7, #KEYS do
  if redis.call('EXISTS', KEYS[i]) == 1 then
    return {2, i - 7}
  end
  bytes = bytes + #ARGV[i - 1]
end
local join, old_blobs, old_bytes = unjoined(KEYS[1], KEYS[2], KEYS[3])
local used_blobs, used_bytes = used(KEYS[4], old_blobs, old_bytes)
local refused = refuse(ARGV[2], ARGV[3], used_blobs, used_bytes, n, bytes)
if refused then
  return refused
end
redis.call('HINCRBY', KEYS[1], 'blobs', n)
redis.call('HINCRBY', KEYS[1], 'bytes', bytes)
count(KEYS[4], KEYS[1], KEYS[5], join, ARGV[4], ARGV[5], old_blobs + n, old_bytes + bytes)
for i = 7, #KEYS do
  redis.call('SET', KEYS[i], ARGV[i - 1])
  redis.call('ZADD', KEYS[6], ARGV[1], ARGV[n + i - 1])
end
return {1}
"""
)

#: What EVALSHA names a script by: SCRIPT LOAD, after Redis lost its scripts, gives
#: back the same SHA1, computed here once.
_COMMIT_SHA = hashlib.sha1(_COMMIT.encode()).hexdigest()
_STAGE_SHA = hashlib.sha1(_STAGE.encode()).hexdigest()

# KEYS: keyrings, stats, root, usage, dbs.
# ARGV: field, data, '1' if an expected value follows else '0', expected, max bytes
#       ('' = no limit), scope tag, tenant tag.
# Returns 1 set, 0 not (the slot did not hold the expected value), or the quota refusal.
_PUT_KEYRING = (
    _USAGE
    + """
local cur = redis.call('HGET', KEYS[1], ARGV[1])
if ARGV[3] == '0' then
  if cur then return 0 end
elseif cur ~= ARGV[4] then
  return 0
end
local size = #ARGV[2] - #(cur or '')
local join, old_blobs, old_bytes = unjoined(KEYS[2], KEYS[3], KEYS[1])
local used_blobs, used_bytes = used(KEYS[4], old_blobs, old_bytes)
local refused = refuse('', ARGV[5], used_blobs, used_bytes, 0, size)
if refused then
  return refused
end
count(KEYS[4], KEYS[2], KEYS[5], join, ARGV[6], ARGV[7], old_blobs, old_bytes + size)
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
return 1
"""
)

# KEYS: garbage zset, stats hash, pending zset, root, keyrings[, tenant usage hash, tenant
# databases set]. ARGV: garbage cutoff, batch size, blob key prefix, the scope's tenant
# tag ('' if it had none when the caller looked), staging cutoff, scope tag.
# Deletes up to a batch of due blobs (garbage past the retention, then pending blobs past
# the staging timeout); returns {deleted, due, garbage and pending left}, or {-1} if the
# scope joined a tenant since the caller looked (it must pass the usage key and retry).
# Blobs of a scope that never joined a tenant are not in any usage yet: nothing to return.
# A scope left with no root, keyring or pending blob (orphans of a database never
# committed) leaves its tenant's databases, as the other backends count them.
_COLLECT = """
local tenant = redis.call('HGET', KEYS[2], 't')
if (tenant or '') ~= ARGV[4] then
  return {-1, 0, 0}
end
local deleted, bytes, due = 0, 0, 0
local function sweep(set, cutoff)
  local batch = tonumber(ARGV[2]) - due
  if batch <= 0 then
    return
  end
  local members = redis.call('ZRANGEBYSCORE', set, '-inf', cutoff, 'LIMIT', 0, batch)
  for _, member in ipairs(members) do
    local key = ARGV[3] .. member
    local size = redis.call('STRLEN', key)
    if redis.call('DEL', key) == 1 then
      deleted = deleted + 1
      bytes = bytes + size
    end
  end
  if #members > 0 then
    redis.call('ZREM', set, unpack(members))
  end
  due = due + #members
end
sweep(KEYS[1], ARGV[1])
sweep(KEYS[3], ARGV[5])
if deleted > 0 then
  redis.call('HINCRBY', KEYS[2], 'blobs', -deleted)
  redis.call('HINCRBY', KEYS[2], 'bytes', -bytes)
  if tenant then
    redis.call('HINCRBY', KEYS[6], 'blobs', -deleted)
    redis.call('HINCRBY', KEYS[6], 'bytes', -bytes)
  end
end
local pending = redis.call('ZCARD', KEYS[3])
if tenant and pending == 0 and redis.call('HEXISTS', KEYS[4], 'seq') == 0
    and redis.call('HLEN', KEYS[5]) == 0 then
  redis.call('SREM', KEYS[7], ARGV[6])
end
return {deleted, due, redis.call('ZCARD', KEYS[1]) + pending}
"""

# KEYS: the namespace key. ARGV: a fresh random key, kept only if none exists yet.
_NAMESPACE = """
redis.call('SET', KEYS[1], ARGV[1], 'NX')
return redis.call('GET', KEYS[1])
"""


def url_with_password(url: str, password: str) -> str:
    """``url`` with ``password`` put in (percent-encoded), for a password read from a file
    (``zerodb-server serve --redis-password-file``); one already there (in the user part
    or as the ``password`` query option redis-py also takes) is refused."""
    scheme, netloc, path, query, fragment = urlsplit(url)
    userinfo, at, hostport = netloc.rpartition("@")
    in_query = any(name == "password" for name, _ in parse_qsl(query, keep_blank_values=True))
    if in_query or (at and ":" in userinfo and userinfo.partition(":")[2]):
        raise StorageUnavailableError(
            "the Redis password is both in the URL and in a password file: give it once"
        )
    user = userinfo.partition(":")[0]
    netloc = f"{user}:{quote(password, safe='')}@{hostport}"
    return urlunsplit((scheme, netloc, path, query, fragment))


def redact_url(url: str) -> str:
    """Return ``url`` without its password (in the user part, or the ``password`` query
    option), for messages and reprs: the durability detail it appears in is sent to every
    tenant at login."""
    try:
        parts = urlsplit(url)
        netloc, query = parts.netloc, parts.query
        if parts.password is not None:
            user = parts.username or ""
            host = parts.hostname or ""
            if ":" in host:  # IPv6: urlsplit dropped the brackets
                host = f"[{host}]"
            if parts.port is not None:
                host = f"{host}:{parts.port}"
            netloc = f"{user}:***@{host}"
        options = parse_qsl(query, keep_blank_values=True)
        if any(name == "password" for name, _ in options):
            hidden = [(name, "***" if name == "password" else v) for name, v in options]
            query = urlencode(hidden, safe="*")
        return urlunsplit(parts._replace(netloc=netloc, query=query))
    except ValueError:
        return "<unparsable Redis URL>"


def _text(value: object) -> str:
    """A CONFIG GET value as text (redis-py answers bytes or str by its settings)."""
    return value.decode("ascii", "replace") if isinstance(value, bytes) else str(value or "")


def _length_prefixed(*names: str) -> bytes:
    """Encode names injectively (``("a:b", "c")`` and ``("a", "b:c")`` differ)."""
    out = bytearray()
    for name in names:
        raw = name.encode("utf-8", "surrogatepass")
        out += struct.pack(">I", len(raw)) + raw
    return bytes(out)


def publish_refused(where: str, exc: ResponseError) -> StorageUnavailableError:
    """The refusal of a Redis whose ACL forbids this user the root-change channels.

    *Why at first use and not at the first commit*: the commit script publishes last,
    after its writes, and a script's writes are not undone when it fails; every commit
    would be applied and yet answered as failed."""
    return StorageUnavailableError(
        f"{where} does not let this user publish on the zdb:* channels ({exc}); every "
        "commit announces its new root there: grant them (ACL SETUSER <user> &zdb:*)"
    )


def check_server(client: redis.Redis, where: str) -> None:
    """Refuse a Redis that evicts keys; warn about one that does not persist them.

    An evicted blob or root would look like tampering to every client. Durability is
    the operator's choice (AOF with ``appendfsync everysec`` or ``always``), so only
    a warning: the tests run a throwaway server without persistence on purpose.
    """
    info = client.info()
    policy = info.get("maxmemory_policy", "noeviction")
    if policy != "noeviction":
        raise StorageUnavailableError(
            f"Redis at {where} evicts keys (maxmemory-policy {policy}): blobs and "
            "roots would vanish; configure maxmemory-policy noeviction"
        )
    if not info.get("aof_enabled"):
        log.warning(
            "Redis at %s has no AOF (appendonly no): acknowledged commits may be lost "
            "in a crash, and clients would see that as a rollback",
            where,
        )


def node_durability(client: redis.Redis, where: str) -> Durability:
    """Read ``appendonly`` and ``appendfsync`` of one Redis with CONFIG GET.

    A Redis that refuses CONFIG (renamed or disabled, as managed services do, or an
    ACL without ``+config``) raises ``PersistenceUnknownError``, saying what INFO
    reports if it answers: the server does not guess from INFO, which does not
    give the fsync policy (see ``blob_server.durability``). Other redis-py errors
    propagate (the caller turns them into ``StorageUnavailableError``)."""
    try:
        settings = client.config_get("append*")
    except ResponseError as exc:
        enabled = info_aof_enabled(client)
        said = "" if enabled is None else f" (INFO reports aof_enabled:{int(enabled)})"
        raise PersistenceUnknownError(
            f"Redis at {where} does not let the server read its persistence "
            f"settings (CONFIG GET appendonly: {exc}); managed Redis services often "
            f"rename or disable CONFIG.{said}"
        ) from None
    appendonly = _text(settings.get("appendonly") or settings.get(b"appendonly"))
    fsync = _text(settings.get("appendfsync") or settings.get(b"appendfsync"))
    if appendonly != "yes":
        return Durability(
            VOLATILE,
            f"Redis at {where} has appendonly {appendonly or '?'}: no append-only "
            "file, so a restart of Redis loses the commits since its last RDB snapshot "
            "(all of them without one)",
        )
    mode = {"always": DURABLE, "everysec": EVERYSEC, "no": OS_FLUSH}.get(fsync)
    if mode is None:
        raise PersistenceUnknownError(
            f"Redis at {where} has appendonly yes and an unknown appendfsync {fsync!r}"
        )
    return Durability(mode, f"Redis at {where} with appendonly yes, appendfsync {fsync}")


def info_aof_enabled(client: redis.Redis) -> bool | None:
    """Whether INFO says the append-only file is on (None: INFO will not say)."""
    try:
        info = client.info("persistence")
    except RedisError:
        return None
    value = info.get("aof_enabled")
    return None if value is None else bool(int(value))


class _Scope:
    """The key names of one (tenant, database)."""

    __slots__ = (
        "blob_prefix",
        "counters",
        "garbage",
        "keyrings",
        "ops",
        "pending",
        "root",
        "stats",
        "tag",
    )

    def __init__(self, tag: str, *, spread_blobs: bool = False) -> None:
        self.tag = tag.encode("ascii")
        base = b"zdb:{" + self.tag + b"}:"
        self.root = base + b"root"
        self.stats = base + b"s"
        self.garbage = base + b"g"
        self.pending = base + b"p"
        self.keyrings = base + b"k"
        self.counters = base + b"c"
        self.ops = base + b"o"  # the cluster's open operations (blob_server.storage.cluster)
        # On a cluster a blob key carries no hash tag, so one database's blobs spread
        # over every slot (and node); one Redis keeps them beside the database's keys.
        self.blob_prefix = b"zdb:b:" + self.tag + b":" if spread_blobs else base + b"b:"

    def blob(self, blob_id: bytes) -> bytes:
        return self.blob_prefix + binascii.hexlify(blob_id)  # hex, as bytes, in one step


class _Tenant:
    """The key names of one tenant: its usage hash and the set of its scope tags."""

    __slots__ = ("databases", "journal", "tag", "usage")

    def __init__(self, tag: str) -> None:
        self.tag = tag.encode("ascii")
        base = b"zdb:{" + self.tag + b"}:"
        self.usage = base + b"u"
        self.databases = base + b"d"
        self.journal = base + b"j"  # the cluster's two-slot operations (storage.cluster)


def _limit(value: int | None) -> bytes:
    """A quota limit as the scripts take it: decimal, or empty for no limit."""
    return b"" if value is None else str(value).encode("ascii")


def _quota_error(tenant: str, reply: list) -> QuotaExceededError:
    """The exception for a script's ``{3, resource, used, adding, limit}`` answer."""
    _, resource, used, adding, limit = reply
    return QuotaExceededError(tenant, resource.decode("ascii"), used, adding, limit)


@dataclass(slots=True)
class _Plan:
    """One commit or stage as its Lua script takes it (see ``RedisStorage._commit_plan``
    and ``_stage_plan``), and how to read the script's answer."""

    script: str
    sha: str
    tenant: str
    keys: list[bytes]
    args: list[Any]
    ids: list[bytes]  # the new blobs, in the order of their keys
    staged: list[bytes]  # the staged ids, in the order of their members
    applied: CommitResult | None  # what the script's {1} means (None for a stage)
    gc_tag: bytes | None  # with garbage or staged blobs: SADD the scope's tag to zdb:gc

    def queue(self, pipe: Any) -> None:
        """Queue the script (and the SADD) on a pipeline, blocking or asyncio."""
        pipe.evalsha(self.sha, len(self.keys), *self.keys, *self.args)
        if self.gc_tag is not None:
            pipe.sadd(GC_SCOPES_KEY, self.gc_tag)

    @staticmethod
    def reply(replies: list[Any]) -> Any:
        """The script's reply among the pipeline's; an error is raised, except
        NoScriptError, which the caller answers by loading the script again."""
        reply = replies[0]
        if isinstance(reply, Exception) and not isinstance(reply, NoScriptError):
            raise reply
        return reply

    def result(self, reply: Any) -> CommitResult | None:
        if reply[0] == 1:
            return self.applied
        if reply[0] == 0:
            return CommitResult(False, RootRecord(int(reply[1]), reply[2]))
        if reply[0] == 3:
            raise _quota_error(self.tenant, reply)
        if reply[0] == 4:
            raise NotStagedError(f"blob {self.staged[int(reply[1])].hex()} is not staged")
        raise BlobExistsError(f"blob {self.ids[int(reply[1])].hex()} already exists")


#: Key names of tenants and databases remembered (each kind) before forgetting them all:
#: a client may name any number of databases that do not exist, and a name costs one
#: keyed hash to work out again.
NAMES_REMEMBERED = 4096


class RedisNames:
    """Key names from the namespace key, shared by ``RedisStorage`` and the cluster's
    ``ClusterStorage``: the scope and tenant tags of the module doc, and the error
    translation every call goes through.

    Needs ``url``, ``_closed``, ``_namespace``, ``_namespace_lock``, ``_scopes``,
    ``_tenants``, ``_namespace_script`` (the ``_NAMESPACE`` script on ``zdb:ns``) and
    ``_check_server``; ``_spread_blobs`` says where blob keys go.
    """

    url: str
    _closed: bool
    _namespace: bytes | None
    _namespace_lock: threading.Lock
    _scopes: dict[tuple[str, str], _Scope]
    _tenants: dict[str, _Tenant]
    _namespace_script: Callable[..., Any]
    _check_server: Callable[[], None]
    _spread_blobs: bool = False

    @contextmanager
    def _errors(self) -> Iterator[None]:
        """Turn every redis-py error into StorageUnavailableError naming the (redacted) URL."""
        if self._closed:
            raise StorageUnavailableError(f"storage {self.url} is closed")
        try:
            yield
        except (RedisError, RedisClusterException) as exc:  # the latter: no cluster node
            raise StorageUnavailableError(f"Redis at {self.url}: {exc}") from exc

    def _namespace_key(self) -> bytes:
        """Return the namespace key, creating it in Redis on first use (call in _errors)."""
        key = self._namespace
        if key is None:
            with self._namespace_lock:
                key = self._namespace
                if key is None:
                    key = self._namespace_script([NAMESPACE_KEY], [os.urandom(NAMESPACE_KEY_SIZE)])
                    if not isinstance(key, bytes) or len(key) != NAMESPACE_KEY_SIZE:
                        raise StorageUnavailableError(
                            f"Redis at {self.url}: {NAMESPACE_KEY.decode()} is not a "
                            f"{NAMESPACE_KEY_SIZE}-byte namespace key; refusing to guess"
                        )
                    self._check_server()
                    self._namespace = key
        return key

    def _scope(self, tenant: str, database: str) -> _Scope:
        """Return the key names of (tenant, database) (call inside _errors)."""
        names = v.check_scope(tenant, database)
        scope = self._scopes.get(names)
        if scope is None:
            if len(self._scopes) >= NAMES_REMEMBERED:
                self._scopes.clear()
            tag = hashlib.blake2b(
                _length_prefixed(*names),
                key=self._namespace_key(),
                digest_size=16,
                person=b"zdb:scope:v1",
            ).hexdigest()
            scope = self._scopes[names] = _Scope(tag, spread_blobs=self._spread_blobs)
        return scope

    def _tenant(self, tenant: str) -> _Tenant:
        """Return the key names of a tenant's usage (call inside _errors)."""
        keys = self._tenants.get(tenant)
        if keys is None:
            if len(self._tenants) >= NAMES_REMEMBERED:
                self._tenants.clear()
            tag = hashlib.blake2b(
                _length_prefixed(v.check_name(tenant, "tenant")),
                key=self._namespace_key(),
                digest_size=16,
                person=b"zdb:tenant:v1",
            ).hexdigest()
            keys = self._tenants[tenant] = _Tenant(tag)
        return keys

    def _field(self, name: str) -> bytes:
        """Return the opaque hash field for a keyring or counter name (call inside _errors)."""
        return hashlib.blake2b(
            _length_prefixed(name), key=self._namespace_key(), digest_size=16, person=b"zdb:name:v1"
        ).digest()

    async def _read_namespace_key(self) -> None:
        """Read (or create) the namespace key in a worker thread if it is not known yet.

        *Why:* key names derive from it, and ``_namespace_key`` asks Redis with the
        blocking client; on the event loop, the first read or commit after a start would
        stall every connection for that round trip (or for a whole timeout while Redis
        is unreachable)."""
        if self._namespace is None:
            with self._errors():
                await asyncio.to_thread(self._namespace_key)

    async def root_channel(self, tenant: str, database: str) -> bytes:
        """The channel the commit script publishes the database's new seqs on (on a
        cluster, a shard channel: the root key's slot)."""
        await self._read_namespace_key()
        with self._errors():
            return self._scope(tenant, database).root

    async def scope_prefix(self, tenant: str, database: str) -> bytes:
        """``zdb:{S}:``, the prefix of the database's key names (its cluster slot)."""
        await self._read_namespace_key()
        with self._errors():
            return self._scope(tenant, database).root[: -len(b"root")]

    def tenant_names(self) -> list[str]:
        """Return no names: Redis keeps only keyed hashes of them (see the module doc)."""
        return []


class RedisStorage(RedisNames, Storage):
    """Store blobs, roots, keyrings, counters and garbage in Redis.

    ``url`` is a redis-py URL (``redis://host:port/db``, ``rediss://`` for TLS, a password
    as ``redis://:password@host``). Nothing connects until the first call, so the storage
    can be built before Redis is up; a Redis restart needs no reopening. ``clock`` returns
    the current time in seconds (tests inject a fake one). ``socket_timeout`` bounds every
    command; ``max_connections`` bounds the pool (None: unbounded).
    """

    def __init__(
        self,
        url: str,
        *,
        clock: Callable[[], float] = time.time,
        socket_timeout: float = 30.0,
        connect_timeout: float = 5.0,
        max_connections: int | None = None,
    ) -> None:
        self.url = redact_url(url)
        self._clock = clock
        try:
            path = urlsplit(url).path.strip("/")
            if path and not path.isdigit():  # redis-py would silently use database 0
                raise ValueError(f"database must be a number, not {path!r}")
            self._pool = redis.ConnectionPool.from_url(
                url,
                socket_timeout=socket_timeout,
                socket_connect_timeout=connect_timeout,
                retry=Retry(NoBackoff(), 0),
                max_connections=max_connections,
            )
        except (ValueError, TypeError) as exc:
            raise StorageUnavailableError(f"bad Redis storage URL {self.url!r}: {exc}") from exc
        self._redis = redis.Redis(connection_pool=self._pool)
        # Blob reads on the event loop (aget_blobs); with TLS to Redis, which the reader
        # does not speak, they run the blocking client in a worker thread instead.
        self._reader: RespBlobReader | None = None
        # Commits on the event loop (acommit): redis-py's asyncio client, made on the
        # server's loop when first used, never retrying (a commit may not be re-sent).
        self._url = url
        self._timeouts = (socket_timeout, connect_timeout)
        self._max_connections = max_connections
        self._aclient: redis.asyncio.Redis | None = None
        self._aclient_loop: asyncio.AbstractEventLoop | None = None
        if not issubclass(self._pool.connection_class, redis.SSLConnection):
            self._reader = RespBlobReader(
                parse_url(url),
                url=self.url,
                socket_timeout=socket_timeout,
                connect_timeout=connect_timeout,
                max_connections=max_connections,
            )
        self._keyring_script = self._redis.register_script(_PUT_KEYRING)
        self._collect_script = self._redis.register_script(_COLLECT)
        self._namespace_script = self._redis.register_script(_NAMESPACE)
        self._namespace: bytes | None = None
        self._namespace_lock = threading.Lock()
        self._scopes: dict[tuple[str, str], _Scope] = {}
        self._tenants: dict[str, _Tenant] = {}
        self._closed = False

    # -- plumbing ----------------------------------------------------------------------

    def _check_server(self) -> None:
        """Refuse a Redis that will not let this user publish root changes; then
        ``check_server`` (eviction refused, no AOF warned about)."""
        try:  # every commit PUBLISHes its seq (redis_changes): an ACL must allow it
            self._redis.publish(PUBLISH_PROBE, b"0")
        except ResponseError as exc:
            raise publish_refused(f"Redis at {self.url}", exc) from None
        check_server(self._redis, self.url)

    def durability(self) -> Durability:
        """Read ``appendonly`` and ``appendfsync`` with CONFIG GET (one round trip; see
        ``node_durability``).

        It is the storage's first use when ``serve`` starts (``blob_server.durability``),
        so it makes the first use's checks first (``_check_server``, once): a user the
        ACL will not let publish root changes stops ``serve`` with the grant to make,
        instead of failing every request later with no more than "storage unavailable"."""
        with self._errors():
            self._namespace_key()
            return node_durability(self._redis, self.url)

    def info_aof_enabled(self) -> bool | None:
        """Whether INFO says the append-only file is on (None: INFO will not say)."""
        return info_aof_enabled(self._redis)

    # -- the Storage interface -----------------------------------------------------------

    def get_blobs(self, tenant: str, database: str, ids: Sequence[bytes]) -> dict[bytes, bytes]:
        """Return the blobs with these ids (one MGET per thousand ids, one round trip)."""
        v.check_scope(tenant, database)
        wanted = v.check_ids(ids)
        if not wanted:
            return {}
        with self._errors():
            keys = list(map(self._scope(tenant, database).blob, wanted))
            if len(keys) <= MGET_CHUNK:
                values = self._redis.mget(keys)
            else:
                pipe = self._redis.pipeline(transaction=False)
                for start in range(0, len(keys), MGET_CHUNK):
                    pipe.mget(keys[start : start + MGET_CHUNK])
                values = [value for chunk in pipe.execute() for value in chunk]
        return {i: data for i, data in zip(wanted, values) if data is not None}

    async def aget_blobs(
        self, tenant: str, database: str, ids: Sequence[bytes]
    ) -> dict[bytes, bytes | memoryview]:
        """:meth:`get_blobs` on the caller's event loop, through ``RespBlobReader`` (see
        ``blob_server.storage.resp`` for why not redis-py's asyncio client); the blobs
        are read-only views of the reply, not copies."""
        if self._reader is None:
            return await asyncio.to_thread(self.get_blobs, tenant, database, ids)
        v.check_scope(tenant, database)
        wanted = v.check_ids(ids)
        if not wanted:
            return {}
        await self._read_namespace_key()
        with self._errors():
            keys = list(map(self._scope(tenant, database).blob, wanted))
        values = await self._reader.mget(keys)
        return {i: data for i, data in zip(wanted, values, strict=True) if data is not None}

    def _async_client(self) -> redis.asyncio.Redis:
        """The asyncio client of the running event loop (made on first use there)."""
        if self._closed:
            raise StorageUnavailableError(f"storage {self.url} is closed")
        loop = asyncio.get_running_loop()
        if self._aclient is None or self._aclient_loop is not loop:
            self._aclient = redis.asyncio.Redis.from_url(
                self._url,
                socket_timeout=self._timeouts[0],
                socket_connect_timeout=self._timeouts[1],
                retry=AsyncRetry(NoBackoff(), 0),
                max_connections=self._max_connections,
                # "auto" (the default) counts as on, and turns off the pool's check for
                # dead connections on checkout: after a Redis restart every pooled
                # connection would fail one commit (found by test_concurrency).
                maint_notifications_config=MaintNotificationsConfig(enabled=False),
            )
            self._aclient_loop = loop
        return self._aclient

    async def aclose(self) -> None:
        if self._reader is not None:
            await self._reader.aclose()
        if self._aclient is not None and self._aclient_loop is asyncio.get_running_loop():
            await self._aclient.aclose()
        self._aclient = None

    def get_root(self, tenant: str, database: str) -> RootRecord:
        """Return the current root, ``EMPTY_ROOT`` for a database never committed to."""
        with self._errors():
            seq, data = self._redis.hmget(self._scope(tenant, database).root, "seq", "data")
        return EMPTY_ROOT if seq is None else RootRecord(int(seq), data or b"")

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
        """Write blobs, make the staged ones live, swap the root and record garbage in one
        Lua script (see base).

        The seq is checked first, so a stale commit is answered with the current root even
        if it also repeats an existing blob id. With garbage, the scope is added to the
        collector's set in the same round trip, after the script (see ``collect_garbage``).
        """
        plan = self._commit_plan(
            tenant, database, expected_seq, root, blobs, garbage, quota, staged
        )
        result = self._run(plan)
        assert result is not None
        return result

    async def acommit(
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
        """:meth:`commit` on the caller's event loop, through redis-py's asyncio client: no
        worker thread per commit (the hand-off was a large share of a commit). Its
        replies are a few bytes, so redis-py's asyncio path costs little here (compare
        ``blob_server.storage.resp``, which reads the blobs)."""
        await self._read_namespace_key()
        plan = self._commit_plan(
            tenant, database, expected_seq, root, blobs, garbage, quota, staged
        )
        result = await self._arun(plan)
        assert result is not None
        return result

    def stage(
        self,
        tenant: str,
        database: str,
        blobs: Mapping[bytes, bytes],
        *,
        quota: Quota = NO_QUOTA,
    ) -> None:
        """Write blobs as pending in one Lua script (see base); the scope joins the
        collector's set in the same round trip, so orphans are found after the timeout."""
        plan = self._stage_plan(tenant, database, blobs, quota)
        if plan is not None:
            self._run(plan)

    async def astage(
        self,
        tenant: str,
        database: str,
        blobs: Mapping[bytes, bytes],
        *,
        quota: Quota = NO_QUOTA,
    ) -> None:
        """:meth:`stage` on the caller's event loop, as :meth:`acommit` runs."""
        await self._read_namespace_key()
        plan = self._stage_plan(tenant, database, blobs, quota)
        if plan is not None:
            await self._arun(plan)

    def _run(self, plan: _Plan) -> CommitResult | None:
        """Run a commit or stage script with the blocking client, loading it again if
        Redis lost its scripts (a restart)."""
        with self._errors():
            for attempt in range(2):
                pipe = self._redis.pipeline(transaction=False)
                plan.queue(pipe)
                reply = plan.reply(pipe.execute(raise_on_error=False))
                if isinstance(reply, NoScriptError) and not attempt:  # Redis was restarted
                    self._redis.script_load(plan.script)  # under the same sha
                    continue
                return plan.result(reply)
        raise AssertionError("unreachable")  # pragma: no cover

    async def _arun(self, plan: _Plan) -> CommitResult | None:
        """:meth:`_run` with redis-py's asyncio client on the caller's event loop."""
        client = self._async_client()
        try:
            for attempt in range(2):
                pipe = client.pipeline(transaction=False)
                plan.queue(pipe)
                reply = plan.reply(await pipe.execute(raise_on_error=False))
                if isinstance(reply, NoScriptError) and not attempt:  # Redis was restarted
                    await client.script_load(plan.script)  # under the same sha
                    continue
                return plan.result(reply)
        except RedisError as exc:
            raise StorageUnavailableError(f"Redis at {self.url}: {exc}") from exc
        raise AssertionError("unreachable")  # pragma: no cover

    def _commit_plan(
        self,
        tenant: str,
        database: str,
        expected_seq: int,
        root: bytes,
        blobs: Mapping[bytes, bytes],
        garbage: Iterable[bytes],
        quota: Quota,
        staged: Sequence[bytes],
    ) -> _Plan:
        """Check a commit's arguments and name its keys: what ``commit`` and ``acommit``
        both send, and how they read the answer."""
        v.check_scope(tenant, database)
        seq, root_data, pairs, dead, claimed = v.check_commit(
            expected_seq, root, blobs, garbage, staged
        )
        with self._errors():
            scope = self._scope(tenant, database)
            owner = self._tenant(tenant)
        keys = [scope.root, scope.stats, scope.garbage, scope.keyrings]
        keys += [owner.usage, owner.databases, scope.pending, *(scope.blob(i) for i, _ in pairs)]
        args: list[Any] = [str(seq), str(seq + 1), root_data, repr(float(self._clock()))]
        args += [_limit(quota.max_blobs), _limit(quota.max_bytes), scope.tag, owner.tag]
        args.append(str(len(claimed)))
        args += [data for _, data in pairs]
        args += [i.hex() for i in claimed]
        args += [i.hex() for i in dead]
        return _Plan(
            script=_COMMIT,
            sha=_COMMIT_SHA,
            tenant=tenant,
            keys=keys,
            args=args,
            ids=[i for i, _ in pairs],
            staged=claimed,
            applied=CommitResult(True, RootRecord(seq + 1, root_data)),
            gc_tag=scope.tag if dead else None,
        )

    def _stage_plan(
        self, tenant: str, database: str, blobs: Mapping[bytes, bytes], quota: Quota
    ) -> _Plan | None:
        """Check a stage's arguments and name its keys (None: nothing to stage)."""
        v.check_scope(tenant, database)
        pairs = v.check_blobs(blobs)
        if not pairs:
            return None
        with self._errors():
            scope = self._scope(tenant, database)
            owner = self._tenant(tenant)
        keys = [scope.stats, scope.root, scope.keyrings, owner.usage, owner.databases]
        keys += [scope.pending, *(scope.blob(i) for i, _ in pairs)]
        args: list[Any] = [repr(float(self._clock()))]
        args += [_limit(quota.max_blobs), _limit(quota.max_bytes), scope.tag, owner.tag]
        args += [data for _, data in pairs]
        args += [i.hex() for i, _ in pairs]
        return _Plan(
            script=_STAGE,
            sha=_STAGE_SHA,
            tenant=tenant,
            keys=keys,
            args=args,
            ids=[i for i, _ in pairs],
            staged=[],
            applied=None,
            gc_tag=scope.tag,
        )

    def allocate_ids(self, tenant: str, database: str, sequence: str, count: int) -> int:
        """Reserve ``count`` consecutive integers of ``sequence`` (HINCRBY); return the first."""
        v.check_scope(tenant, database)
        v.check_name(sequence, "sequence")
        v.check_int(count, "count", low=1, high=v.MAX_ALLOCATE)
        with self._errors():
            last = self._redis.hincrby(
                self._scope(tenant, database).counters, self._field(sequence), count
            )
        return int(last) - count + 1

    def get_keyring(self, tenant: str, database: str, name: str) -> bytes | None:
        """Return keyring slot ``name`` or None."""
        v.check_scope(tenant, database)
        v.check_name(name, "keyring name")
        with self._errors():
            return self._redis.hget(self._scope(tenant, database).keyrings, self._field(name))

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
        """Set keyring slot ``name`` if it holds ``expected`` (a Lua compare-and-set)."""
        v.check_scope(tenant, database)
        v.check_name(name, "keyring name")
        v.check_data(data, "keyring data")
        if expected is not None:
            v.check_data(expected, "expected keyring data")
        with self._errors():
            scope = self._scope(tenant, database)
            owner = self._tenant(tenant)
            keys = [scope.keyrings, scope.stats, scope.root, owner.usage, owner.databases]
            args = [self._field(name), data, b"0" if expected is None else b"1", expected or b""]
            args += [_limit(quota.max_bytes), scope.tag, owner.tag]
            reply = self._keyring_script(keys, args)
        if isinstance(reply, list):
            raise _quota_error(tenant, reply)
        return bool(reply)

    def collect_garbage(
        self,
        *,
        retention: float = DEFAULT_RETENTION_SECONDS,
        staging_timeout: float = DEFAULT_STAGING_TIMEOUT,
    ) -> int:
        """Delete blobs that became garbage at least ``retention`` seconds ago and pending
        blobs staged at least ``staging_timeout`` seconds ago.

        Walks the scopes in ``zdb:gc``; each script run deletes at most a few hundred
        blobs, so committers are never held up long. A scope whose garbage and pending
        blobs are gone is removed from the set and re-added if a commit or stage slipped
        some in meanwhile (they add their scope *after* their script, so one of the two
        always re-adds it).
        """
        now = self._clock()
        cutoff = repr(now - v.check_retention(retention))
        stale = repr(now - v.check_retention(staging_timeout, "staging_timeout"))
        deleted = 0
        with self._errors():
            for tag in self._redis.sscan_iter(GC_SCOPES_KEY, count=100):
                scope = _Scope(tag.decode("ascii"))
                owner = self._redis.hget(scope.stats, "t")
                while True:
                    keys = [scope.garbage, scope.stats, scope.pending, scope.root, scope.keyrings]
                    if owner:
                        tenant = _Tenant(owner.decode("ascii"))
                        keys += [tenant.usage, tenant.databases]
                    args = [cutoff, _GC_BATCH, scope.blob_prefix, owner or b"", stale, scope.tag]
                    gone, due, left = self._collect_script(keys, args)
                    if gone < 0:  # the scope joined its tenant meanwhile: pass its usage
                        owner = self._redis.hget(scope.stats, "t")
                        continue
                    deleted += gone
                    if due < _GC_BATCH:
                        break
                if left == 0:
                    self._redis.srem(GC_SCOPES_KEY, tag)
                    if self._redis.zcard(scope.garbage) or self._redis.zcard(scope.pending):
                        self._redis.sadd(GC_SCOPES_KEY, tag)
        return deleted

    def stats(self, tenant: str, database: str) -> dict[str, int]:
        """Return seq, blobs, bytes, garbage, staged, counters and keyrings (one MULTI)."""
        with self._errors():
            scope = self._scope(tenant, database)
            pipe = self._redis.pipeline(transaction=True)
            pipe.hget(scope.root, "seq")
            pipe.hmget(scope.stats, "blobs", "bytes")
            pipe.zcard(scope.garbage)
            pipe.zcard(scope.pending)
            pipe.hlen(scope.counters)
            pipe.hlen(scope.keyrings)
            seq, (blobs, size), garbage, staged, counters, keyrings = pipe.execute()
        return {
            "seq": int(seq or 0),
            "blobs": int(blobs or 0),
            "bytes": int(size or 0),
            "garbage": garbage,
            "staged": staged,
            "counters": counters,
            "keyrings": keyrings,
        }

    def usage(self, tenant: str, *, detail: bool = False) -> TenantUsage:
        """Return the tenant's usage hash (one MULTI); with ``detail``, one more pipeline
        reads each database's seq and counters. Databases are labelled ``tag:<scope
        tag>``: Redis holds no database names."""
        with self._errors():
            owner = self._tenant(tenant)
            pipe = self._redis.pipeline(transaction=True)
            pipe.hmget(owner.usage, "blobs", "bytes")
            pipe.smembers(owner.databases)
            (blobs, size), tags = pipe.execute()
            per_database: list[DatabaseUsage] = []
            if detail and tags:
                scopes = [_Scope(tag.decode("ascii")) for tag in sorted(tags)]
                pipe = self._redis.pipeline(transaction=True)
                for scope in scopes:
                    pipe.hget(scope.root, "seq")
                    pipe.hmget(scope.stats, "blobs", "bytes")
                    pipe.zcard(scope.garbage)
                    pipe.zcard(scope.pending)
                replies = pipe.execute()
                for i, scope in enumerate(scopes):
                    seq, (n, nbytes), garbage, staged = replies[4 * i : 4 * i + 4]
                    per_database.append(
                        DatabaseUsage(
                            f"tag:{scope.tag.decode('ascii')}",
                            int(seq or 0),
                            int(n or 0),
                            int(nbytes or 0),
                            garbage,
                            staged,
                        )
                    )
        return TenantUsage(int(blobs or 0), int(size or 0), len(tags), tuple(per_database))

    # -- root changes (blob_server.storage.redis_changes) -----------------------------------

    def root_changes(self, on_change: ChangeCallback, on_lost: LostCallback) -> RootChanges:
        """Follow the commits of every process through Redis pub/sub (one subscriber
        connection for the calling server process)."""
        from blob_server.storage.redis_changes import RedisRootChanges

        return RedisRootChanges(self, on_change, on_lost)

    def commit_leases(self, timeout: float) -> CommitLeases:
        """Commit leases in Redis, shared by every server process on it."""
        from blob_server.storage.redis_leases import RedisCommitLeases

        return RedisCommitLeases(self, timeout)

    def async_client(self) -> redis.asyncio.Redis:
        """The asyncio client of the running event loop (never retrying a command)."""
        return self._async_client()

    def pubsub_connection(self) -> redis.asyncio.connection.AbstractConnection:
        """A new, unconnected asyncio connection to this Redis (URL, TLS, password and
        timeouts as the storage's), for a subscriber; reads on it block until a message
        (the caller checks the connection's health itself)."""
        pool = redis.asyncio.ConnectionPool.from_url(
            self._url,
            socket_timeout=None,
            socket_connect_timeout=self._timeouts[1],
            retry=AsyncRetry(NoBackoff(), 0),
        )
        return pool.make_connection()

    def root_seqs(self, channels: Sequence[bytes]) -> list[int]:
        """The current seq of each database named by its ``root_channel`` (one round trip;
        0 for a database never committed to)."""
        with self._errors():
            pipe = self._redis.pipeline(transaction=False)
            for channel in channels:
                pipe.hget(channel, "seq")
            return [int(seq or 0) for seq in pipe.execute()]

    def close(self) -> None:
        """Close the pool's connections; later calls raise."""
        self._closed = True
        self._pool.disconnect()

    def __repr__(self) -> str:
        return f"RedisStorage({self.url!r})"

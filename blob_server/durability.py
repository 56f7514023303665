"""Whether ``serve`` may run on a storage, and what its clients are told about it.

Acknowledged means durable. A commit the server acknowledged and its storage then lost
in a crash looks, to every client that saw it, exactly like a rollback attack: they
refuse the store (``FreshnessError``) until an operator resets their freshness floor,
and the data is gone anyway. So ``serve`` refuses a Redis without the append-only file
(``appendonly no``) unless the operator accepts the loss (``--allow-volatile-redis``),
and a Redis that will not say (CONFIG renamed or disabled, as managed services do) until
the operator states what they know (``--assume-redis-aof always|everysec``, or
``--allow-volatile-redis``): guessing would turn an unknown into a promise.

Whatever is admitted is announced to every client at login (a client logs a warning
when it is weaker than ``everysec``) and reported by the ``stats`` operation.
``memory://`` is admitted as it is: being volatile is what it is for (tests, demos).
"""

from __future__ import annotations

from blob_server.exceptions import PersistenceUnknownError, VolatileStorageError
from blob_server.storage import MemoryStorage, Storage
from blob_server.wire.storage import UNVERIFIED, VOLATILE, Durability

#: The fsync policies ``--assume-redis-aof`` accepts (``no`` is not a promise worth making).
ASSUMABLE = ("always", "everysec")
DOCS = 'docs/settings.md, "Durability"'


def admit(
    storage: Storage, *, allow_volatile: bool = False, assume_aof: str | None = None
) -> Durability:
    """Return what the clients of ``storage`` are to be told, or raise
    ``VolatileStorageError`` with what to do when ``serve`` must refuse it.

    ``allow_volatile``: ``--allow-volatile-redis``; ``assume_aof``: the fsync policy of
    ``--assume-redis-aof``, used only when the storage will not tell its own.
    """
    if assume_aof is not None and assume_aof not in ASSUMABLE:
        raise ValueError(f"assume_aof must be one of {ASSUMABLE}, not {assume_aof!r}")
    try:
        found = storage.durability()
    except PersistenceUnknownError as exc:
        return _unknown(storage, exc, allow_volatile=allow_volatile, assume_aof=assume_aof)
    if found.mode == VOLATILE and not allow_volatile and not isinstance(storage, MemoryStorage):
        raise VolatileStorageError(
            f"{found.detail}. A crash or restart of Redis would lose acknowledged commits, "
            "and every client that saw them would then refuse the store as rolled back "
            "(FreshnessError). Turn the append-only file on (redis.conf: appendonly yes and "
            "appendfsync always, or everysec to lose at most about a second; at runtime: "
            "CONFIG SET appendonly yes), or start with --allow-volatile-redis to accept the "
            f"loss (clients are told at login). See {DOCS}."
        )
    return found


def _unknown(
    storage: Storage,
    exc: PersistenceUnknownError,
    *,
    allow_volatile: bool,
    assume_aof: str | None,
) -> Durability:
    """The storage will not say what it persists: refuse, unless a flag says it."""
    where = getattr(storage, "url", type(storage).__name__)
    if assume_aof is not None:
        # Asked of a Redis only (the one storage with an INFO), by duck typing: naming
        # RedisStorage here would import redis-py, which the server without the
        # [redis] extra (memory://, sqlite://) does not have.
        probe = getattr(storage, "info_aof_enabled", None)
        info = probe() if probe is not None else None
        if info is False:
            raise VolatileStorageError(
                f"{exc} --assume-redis-aof {assume_aof} was given, but INFO reports "
                "aof_enabled:0: this Redis keeps no append-only file. Turn it on with your "
                f"provider, or start with --allow-volatile-redis. See {DOCS}."
            )
        return Durability(
            UNVERIFIED,
            f"Redis at {where} does not let the server read its persistence settings; "
            f"the operator vouches for appendonly yes, appendfsync {assume_aof} "
            "(--assume-redis-aof)",
        )
    if allow_volatile:
        return Durability(
            UNVERIFIED,
            f"Redis at {where} does not let the server read its persistence settings, "
            "and the server was started with --allow-volatile-redis: a restart of Redis "
            "may lose acknowledged commits",
        )
    raise VolatileStorageError(
        f"{exc} The server will not guess whether acknowledged commits survive a restart "
        "of Redis. If your provider keeps an append-only file, start with "
        "--assume-redis-aof always (or everysec, as it is configured); if it does not, "
        f"with --allow-volatile-redis (clients are told at login). See {DOCS}."
    )

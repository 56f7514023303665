"""Per-tenant fairness: who may hold the server's connections, and how fast a tenant may ask.

*Why per tenant and per address, with separate budgets:* limits that were global or per
address let one tenant starve the others: 40 idle sockets from one address, or one
tenant's 256 logged-in connections from 10 addresses, locked every other tenant out.
So a connection counts against its **address** only while it is anonymous (before its
login, which must come within the login deadline), and against its **tenant** once
logged in; a tenant at its own limit is refused at login (``busy``), whoever else is
connected. Anonymous connections are the cheap ones to hold and the only ones nobody
can be made to wait for, so when an address has used its anonymous budget, or the
server holds ``max_connections`` in all, the **oldest anonymous connection makes way**
for the newcomer (it is sent ``busy`` and closed): an honest client logs in within
milliseconds of connecting and is never the oldest for long, so idle sockets can no
longer lock anyone out; a connection is refused only when every connection is logged
in. Holding anonymous connections then takes a steady flood of new ones, not 40 sockets.

The request rate of a tenant is a token bucket (``rate`` requests a second, at most
``burst`` at once); a request over it is answered ``rate_limited`` with the wait, at
once, rather than held: a held request would keep its connection's later requests (and
their memory) waiting too, and the client is the one that knows whether to retry.

The defaults come from ``serve`` options; a tenant's entry in the tenants file may
override each (``blob_server.tenants``). Frame memory is ``blob_server.frames``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

from blob_server import protocol
from blob_server.exceptions import ServerFullError

#: Connections the server holds in all, and anonymous ones per client address.
DEFAULT_MAX_CONNECTIONS: Final = 256
DEFAULT_MAX_ANONYMOUS_PER_ADDRESS: Final = 32
#: Seconds a connection has to log in (then it is closed: anonymous ones hold nothing long).
DEFAULT_LOGIN_DEADLINE: Final = 10.0
#: Bytes of frames being received (and answered) at once: all tenants together, and one
#: tenant. Both are at least one largest frame, so no legitimate request is refused.
DEFAULT_MAX_FRAME_MEMORY: Final = 256 * 1024 * 1024
DEFAULT_TENANT_FRAME_MEMORY: Final = protocol.MAX_FRAME_BYTES
#: The tenants file keys of the limits below (next to the quota's).
FAIRNESS_KEYS: Final = (
    "max_connections",
    "max_frame_memory",
    "rate",
    "burst",
    "max_login_failures",
)
#: Failed logins as one tenant from one address within the failure window, after which
#: that (address, tenant) is refused until they age out (``blob_server.auth``).
DEFAULT_MAX_LOGIN_FAILURES: Final = 10


def default_tenant_connections(max_connections: int) -> int:
    """The default of a tenant's logged-in connections: half of the server's (at least
    one), so that one tenant never holds them all."""
    return max(1, max_connections // 2)


def check_frame_memory(value: int | None, what: str) -> int | None:
    """Return ``value`` if it is None (no limit of its own) or at least one largest frame;
    raise ``ValueError`` otherwise (a smaller budget would refuse legitimate requests)."""
    if value is not None and (type(value) is not int or value < protocol.MAX_FRAME_BYTES):
        raise ValueError(
            f"{what} must be at least {protocol.MAX_FRAME_BYTES} bytes (one largest frame)"
        )
    return value


@dataclass(frozen=True, slots=True)
class TenantLimits:
    """What one tenant may hold or do at once; None: no limit of that kind.

    ``max_connections``: logged-in connections; ``max_frame_memory``: bytes of its frames
    being received and answered (None: only the server's total bounds them); ``rate``:
    requests a second; ``burst``: requests at once over the rate (None: one second's
    worth, ``rate``); ``max_login_failures``: failed logins as this tenant from one
    address within the failure window before that address is refused as this tenant
    (``blob_server.auth.LoginFailures``; other tenants at the address are not).
    """

    max_connections: int | None = default_tenant_connections(DEFAULT_MAX_CONNECTIONS)
    max_frame_memory: int | None = DEFAULT_TENANT_FRAME_MEMORY
    rate: int | None = None
    burst: int | None = None
    max_login_failures: int | None = DEFAULT_MAX_LOGIN_FAILURES

    def __post_init__(self) -> None:
        check_frame_memory(self.max_frame_memory, "a tenant's max_frame_memory")

    @property
    def bucket(self) -> int:
        """Requests a full bucket holds: at least one, so that any rate can be met, but
        none at a rate of 0 (the tenant may send no request at all)."""
        if self.rate == 0:
            return 0
        return max(1, self.rate if self.burst is None else self.burst)

    def as_dict(self) -> dict[str, int | None]:
        return {key: getattr(self, key) for key in FAIRNESS_KEYS}


class ConnectionTable:
    """Who holds the server's connections: anonymous ones by address, oldest first, and
    logged-in ones by tenant (see the module docstring for the rules)."""

    def __init__(self, max_connections: int, max_anonymous_per_address: int) -> None:
        if type(max_connections) is not int or max_connections < 1:
            raise ValueError("max_connections must be at least 1")
        if type(max_anonymous_per_address) is not int or max_anonymous_per_address < 1:
            raise ValueError("max_anonymous_per_address must be at least 1")
        self.max_connections = max_connections
        self.max_anonymous_per_address = max_anonymous_per_address
        self._anonymous: dict[int, str] = {}  # conn id -> address, oldest first
        self._by_address: dict[str, dict[int, None]] = {}  # anonymous ones, oldest first
        self._tenant_of: dict[int, str] = {}
        self._by_tenant: dict[str, int] = {}

    @property
    def total(self) -> int:
        return len(self._anonymous) + len(self._tenant_of)

    def of_tenant(self, tenant: str) -> int:
        """The tenant's logged-in connections."""
        return self._by_tenant.get(tenant, 0)

    def open(self, conn_id: int, address: str) -> int | None:
        """Count a new (anonymous) connection from ``address``; return the id of the
        anonymous connection that makes way for it (already forgotten here: the caller
        closes it), or None. Raise ``ServerFullError`` when all are logged in."""
        victim = None
        same_address = self._by_address.get(address)
        if same_address is not None and len(same_address) >= self.max_anonymous_per_address:
            victim = next(iter(same_address))
        elif self.total >= self.max_connections:
            if not self._anonymous:
                raise ServerFullError("every connection is logged in")
            victim = next(iter(self._anonymous))
        if victim is not None:
            self.close(victim)
        self._anonymous[conn_id] = address
        self._by_address.setdefault(address, {})[conn_id] = None
        return victim

    def log_in(self, conn_id: int, tenant: str, limit: int | None) -> bool:
        """Move an anonymous connection to its tenant's budget; False (and nothing
        changed) when the tenant holds ``limit`` already or the connection was closed."""
        if conn_id not in self._anonymous:
            return False
        held = self._by_tenant.get(tenant, 0)
        if limit is not None and held >= limit:
            return False
        self._forget_anonymous(conn_id)
        self._tenant_of[conn_id] = tenant
        self._by_tenant[tenant] = held + 1
        return True

    def close(self, conn_id: int) -> None:
        """Forget a connection (nothing happens for one forgotten already)."""
        if conn_id in self._anonymous:
            self._forget_anonymous(conn_id)
            return
        tenant = self._tenant_of.pop(conn_id, None)
        if tenant is not None:
            left = self._by_tenant.pop(tenant) - 1
            if left:
                self._by_tenant[tenant] = left

    def _forget_anonymous(self, conn_id: int) -> None:
        address = self._anonymous.pop(conn_id)
        same_address = self._by_address[address]
        del same_address[conn_id]
        if not same_address:
            del self._by_address[address]


class TokenBucket:
    """``rate`` tokens a second, at most ``size`` kept; a request takes one."""

    __slots__ = ("rate", "size", "stamp", "tokens")

    def __init__(self, rate: int, size: int, now: float) -> None:
        self.rate = rate
        self.size = size
        self.tokens = float(size)
        self.stamp = now

    def take(self, now: float) -> float:
        """Take a token: return 0.0, or the seconds until one is there (none taken)."""
        self.tokens = min(self.size, self.tokens + (now - self.stamp) * self.rate)
        self.stamp = now
        if self.tokens >= 1:
            self.tokens -= 1
            return 0.0
        if self.rate == 0:
            return float("inf")
        return (1 - self.tokens) / self.rate


class RequestRates:
    """One token bucket per tenant, made again (full) when the tenant's limits change."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self._buckets: dict[str, TokenBucket] = {}

    def take(self, tenant: str, limits: TenantLimits) -> float:
        """Count one request of ``tenant``: 0.0 if its rate allows it, else the seconds
        until it would (always 0.0 for a tenant without a rate)."""
        if limits.rate is None:
            return 0.0
        now = self.clock()
        bucket = self._buckets.get(tenant)
        if bucket is None or (bucket.rate, bucket.size) != (limits.rate, limits.bucket):
            bucket = self._buckets[tenant] = TokenBucket(limits.rate, limits.bucket, now)
        return bucket.take(now)

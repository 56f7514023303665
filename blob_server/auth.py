"""Challenge-response login with secp256k1 keys, and the rate limit on failed logins.

1. The client asks for a ``challenge``; the server answers its id, a fresh random
   32-byte nonce (kept by this connection only, valid for ``NONCE_TTL`` seconds) and
   its clock.
2. The client signs ``protocol.login_digest(server_id, tenant, public_key, nonce, time)``
   with its random login key (ECDSA over the raw 32-byte digest, DER) and sends
   ``login {tenant, public_key, time, signature}``.
3. The server consumes the nonce (single use, whatever the outcome), then checks the
   key is registered for that tenant, the nonce is fresh, ``time`` is within
   ``CLOCK_SKEW`` of its own clock, and the signature is valid. The session is then
   bound to that tenant for the rest of the connection; no later request can name a
   tenant.

Every failure answers the same ``auth_failed`` error (the reason is logged on the
server only), so an attacker learns nothing about which tenants or keys exist.

Failed logins are counted per (address, claimed tenant) and per address
(``LoginFailures``); past either limit, logins are answered ``rate_limited`` until the
failures age out.
"""

from __future__ import annotations

import logging
import os
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from coincurve import PublicKey

from blob_server import protocol
from blob_server.limits import DEFAULT_MAX_LOGIN_FAILURES
from blob_server.tenants import PUBLIC_KEY_BYTES, TenantRegistry

NONCE_TTL = 30.0
CLOCK_SKEW = 60.0
MAX_SIGNATURE_BYTES = 72  # DER-encoded secp256k1 ECDSA
#: Failed logins as one tenant from one address within ``FAILURE_WINDOW`` seconds, after
#: which that (address, tenant) is refused until they age out (``serve
#: --tenant-max-login-failures``, a tenant's ``max_login_failures``) ...
MAX_FAILURES = DEFAULT_MAX_LOGIN_FAILURES
#: ... and failed logins from one address for any tenant names: only a client trying
#: many names gets there (each name stops counting at ``MAX_FAILURES``).
MAX_ADDRESS_FAILURES = 100
FAILURE_WINDOW = 60.0
#: Most (address, tenant) pairs and addresses remembered (a flood of them starts over).
MAX_TRACKED = 10_000

log = logging.getLogger("blob_server.auth")


class LoginRefusedError(Exception):
    """A login failed. ``code`` goes to the client; ``reason`` only to the server log."""

    def __init__(self, code: str, reason: str) -> None:
        super().__init__(reason)
        self.code = code
        self.reason = reason


@dataclass(slots=True)
class Challenge:
    nonce: bytes
    issued: float


class LoginFailures:
    """Recent failed logins per (address, tenant) and per address.

    *Why both:* counted per address alone, ten failures of one misconfigured client (or
    of someone else behind the same NAT) locked every tenant at that address out for a
    minute. Per (address, tenant), a client failing as one tenant locks out only that
    tenant from that address; the per-address count is the guard against one address
    trying many tenant names, set high enough that only that reaches it.
    """

    def __init__(self, *, max_failures: int, max_address_failures: int, window: float) -> None:
        self.max_failures = max_failures
        self.max_address_failures = max_address_failures
        self.window = window
        self._pairs: dict[tuple[str, str], deque[float]] = {}
        self._addresses: dict[str, deque[float]] = {}

    def limited(
        self, address: str, tenant: str, now: float, max_failures: int | None = -1
    ) -> str | None:
        """Why a login as ``tenant`` from ``address`` is refused now, or None.
        ``max_failures``: the tenant's own limit (None: none; -1: ``self.max_failures``)."""
        limit = self.max_failures if max_failures == -1 else max_failures
        recent = self._recent(self._pairs, (address, tenant), now)
        if limit is not None and len(recent) >= limit:
            return "too many failed logins as this tenant from this address"
        if len(self._recent(self._addresses, address, now)) >= self.max_address_failures:
            return "too many failed logins from this address (for many tenant names)"
        return None

    def add(self, address: str, tenant: str, now: float) -> None:
        """Count a failed login."""
        self._recent(self._pairs, (address, tenant), now).append(now)
        self._recent(self._addresses, address, now).append(now)

    def _recent(self, table: dict, key: object, now: float) -> deque[float]:
        failures = table.get(key)
        if failures is None:
            if len(table) >= MAX_TRACKED:
                self._prune(table, now)
            failures = table[key] = deque()
        while failures and failures[0] <= now - self.window:
            failures.popleft()
        return failures

    def _prune(self, table: dict, now: float) -> None:
        horizon = now - self.window
        for key in [k for k, f in table.items() if not f or f[-1] <= horizon]:
            del table[key]
        if len(table) >= MAX_TRACKED:  # a flood of addresses or names: start over
            table.clear()


class Authenticator:
    """Issue challenges and check logins against a ``TenantRegistry``."""

    def __init__(
        self,
        registry: TenantRegistry,
        *,
        clock: Callable[[], float] = time.time,
        nonce_ttl: float = NONCE_TTL,
        clock_skew: float = CLOCK_SKEW,
        max_failures: int = MAX_FAILURES,
        max_address_failures: int = MAX_ADDRESS_FAILURES,
        failure_window: float = FAILURE_WINDOW,
    ) -> None:
        self.registry = registry
        self.server_id = registry.ensure_server_id()
        self.clock = clock
        self.nonce_ttl = nonce_ttl
        self.clock_skew = clock_skew
        self.failures = LoginFailures(
            max_failures=max_failures,
            max_address_failures=max_address_failures,
            window=failure_window,
        )

    def challenge(self) -> tuple[Challenge, dict]:
        """Return a new challenge and the answer that carries it."""
        now = self.clock()
        challenge = Challenge(os.urandom(protocol.NONCE_BYTES), now)
        answer = {
            "version": protocol.PROTOCOL_VERSION,
            "server_id": self.server_id,
            "nonce": challenge.nonce,
            "time": int(now),
        }
        return challenge, answer

    # -- login -------------------------------------------------------------------------------

    def login(
        self,
        address: str,
        challenge: Challenge | None,
        args: dict,
        max_failures: Callable[[str], int | None] | None = None,
    ) -> tuple[str, bytes]:
        """Check a login; return ``(tenant, public_key)`` or raise ``LoginRefusedError``.

        The caller must drop ``challenge`` before calling (single use). ``max_failures``
        gives the claimed tenant's own limit of failed logins per address (the server
        reads it from the tenant's limits); without it, the authenticator's applies.
        """
        now = self.clock()
        claimed = args.get("tenant")
        tenant = claimed if type(claimed) is str and len(claimed) <= 64 else ""
        limit = -1 if max_failures is None or not tenant else max_failures(tenant)
        limited = self.failures.limited(address, tenant, now, limit)
        if limited is not None:
            raise LoginRefusedError(protocol.RATE_LIMITED, limited)
        try:
            return self._check(challenge, args, now)
        except LoginRefusedError:
            self.failures.add(address, tenant, now)
            raise

    def _check(self, challenge: Challenge | None, args: dict, now: float) -> tuple[str, bytes]:
        def refuse(reason: str) -> LoginRefusedError:
            return LoginRefusedError(protocol.AUTH_FAILED, reason)

        if set(args) != {"tenant", "public_key", "time", "signature"}:
            raise refuse("login arguments are tenant, public_key, time, signature")
        tenant, public_key = args["tenant"], args["public_key"]
        timestamp, signature = args["time"], args["signature"]
        if type(tenant) is not str or not 0 < len(tenant) <= 64:
            raise refuse("malformed tenant")
        if type(public_key) is not bytes or len(public_key) != PUBLIC_KEY_BYTES:
            raise refuse("malformed public key")
        if type(timestamp) is not int or abs(timestamp) >= 2**62:
            raise refuse("malformed time")
        if type(signature) is not bytes or not 8 <= len(signature) <= MAX_SIGNATURE_BYTES:
            raise refuse("malformed signature")
        if challenge is None:
            raise refuse("no challenge was issued on this connection (or it was used)")
        if now - challenge.issued > self.nonce_ttl:
            raise refuse("the challenge expired")
        if abs(now - timestamp) > self.clock_skew:
            raise refuse("client clock too far from the server's")
        digest = protocol.login_digest(
            self.server_id, tenant, public_key, challenge.nonce, timestamp
        )
        try:
            valid = PublicKey(public_key).verify(signature, digest, hasher=None)
        except Exception:  # malformed DER or key: coincurve raises ValueError
            valid = False
        # The signature is checked before the registry so that both refusals cost the same.
        if not valid:
            raise refuse("bad signature")
        try:
            self.registry.refresh()
        except Exception as exc:  # keep the last good registry; an admin must fix the file
            log.error("event=tenants_reload_failed error=%s", type(exc).__name__)
        if not self.registry.is_registered(tenant, public_key):
            raise refuse("key not registered for this tenant")
        return tenant, public_key

"""Tenants and the secp256k1 public keys allowed to log in as each of them.

The registry is a small JSON file (``--tenants PATH``), replaced atomically on every
change and re-read by the running server when its modification time changes, so
``zerodb-server add-key`` takes effect without a restart. Read-modify-write cycles hold
an advisory lock on ``PATH.lock`` so two admin commands cannot lose each other's change.

The file holds public keys only; nothing in it lets anyone log in.

Each tenant may carry its own limits, each an int, or ``null`` for no limit at all; a
tenant without the key gets the server's default (the ``serve`` option in brackets):

* its quota: ``"max_bytes"`` and ``"max_blobs"`` (``--default-max-bytes/-blobs``);
* its fairness limits (``blob_server.limits``): ``"max_connections"`` logged in at once
  (``--tenant-max-connections``), ``"max_frame_memory"``, bytes of its frames being
  received (``--tenant-max-frame-memory``; at least one largest frame, 64 MiB),
  ``"rate"``, requests a second, and ``"burst"``, requests at once over it
  (``--tenant-rate``, ``--tenant-burst``; a null burst is one second's worth), and
  ``"max_login_failures"``, failed logins as the tenant from one address within the
  failure window before that address is refused as the tenant for a while
  (``--tenant-max-login-failures``, 10; ``blob_server.auth``).

The server re-reads the file as it does for keys, so ``zerodb-server set-limits`` (or
its older name ``set-quota``) needs no restart either.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import json
import os
import re
import secrets
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Final, Literal

from coincurve import PublicKey

from blob_server.exceptions import InvalidRequestError
from blob_server.limits import FAIRNESS_KEYS, TenantLimits, check_frame_memory
from blob_server.storage.base import MAX_QUOTA, Quota

FORMAT_VERSION = 1
PUBLIC_KEY_BYTES = 33  # compressed secp256k1
TENANT_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
#: A tenant's limit as the file holds it: an int, None (no limit), or DEFAULT (the key is
#: absent: the server's default applies).
DEFAULT: Final = "default"
QUOTA_KEYS: Final = ("max_bytes", "max_blobs")
#: Every limit a tenant's entry may hold.
LIMIT_KEYS: Final = QUOTA_KEYS + FAIRNESS_KEYS
Limit = int | None | Literal["default"]


def check_limit(value: object, what: str) -> Limit:
    """Return ``value`` if it is an int in [0, 2**53] (for ``max_frame_memory``, at least
    one largest frame), None (no limit) or ``DEFAULT``."""
    if value is None or value == DEFAULT:
        return DEFAULT if value == DEFAULT else None
    if type(value) is not int or not 0 <= value <= MAX_QUOTA:
        raise InvalidRequestError(f"{what} must be an int in [0, 2**53], null or 'default'")
    if what == "max_frame_memory":
        try:
            check_frame_memory(value, what)
        except ValueError as exc:
            raise InvalidRequestError(str(exc)) from None
    return value


def check_tenant_name(name: object) -> str:
    """Return ``name`` if it is 1-64 characters of letters, digits, ``_ . -``."""
    if not isinstance(name, str) or not TENANT_NAME.fullmatch(name):
        raise InvalidRequestError(
            "a tenant name is 1-64 letters, digits, '_', '.' or '-', starting with a "
            "letter or digit"
        )
    return name


def parse_public_key(value: str | bytes) -> bytes:
    """Return a compressed secp256k1 public key (33 bytes) from hex or bytes."""
    if isinstance(value, str):
        try:
            value = bytes.fromhex(value.strip())
        except ValueError:
            raise InvalidRequestError("public key is not hex") from None
    if type(value) is not bytes or len(value) != PUBLIC_KEY_BYTES or value[0] not in (2, 3):
        raise InvalidRequestError("public key must be a 33-byte compressed secp256k1 key")
    try:
        PublicKey(value)
    except Exception:
        raise InvalidRequestError("public key is not a point on secp256k1") from None
    return value


class TenantRegistry:
    """Tenants, their public keys, and this server's stable random id."""

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = Path(path)
        self._lock = threading.Lock()
        self._stamp: tuple[int, int, int] | None = None
        self._tenants: dict[str, dict] = {}
        self.server_id = ""
        #: How many times the file was read: a cache of what it says is stale once it moves.
        self.generation = 0
        self.refresh(force=True)

    # -- reading ---------------------------------------------------------------------------

    def _read(self) -> dict:
        try:
            raw = self.path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return {"version": FORMAT_VERSION, "server_id": "", "tenants": {}}
        data = json.loads(raw)
        if (
            not isinstance(data, dict)
            or data.get("version") != FORMAT_VERSION
            or not isinstance(data.get("tenants"), dict)
            or not isinstance(data.get("server_id", ""), str)
        ):
            raise ValueError(f"{self.path}: not a tenants file of version {FORMAT_VERSION}")
        for name, entry in data["tenants"].items():
            check_tenant_name(name)
            if not isinstance(entry, dict) or not isinstance(entry.get("keys"), list):
                raise ValueError(f"{self.path}: malformed entry for tenant {name!r}")
            for key in entry["keys"]:
                parse_public_key(key)
            for limit in LIMIT_KEYS:
                value = entry.get(limit)
                try:
                    if value == DEFAULT:  # in the file, the default is an absent key
                        raise InvalidRequestError(limit)
                    check_limit(value, limit)
                except InvalidRequestError:
                    raise ValueError(
                        f"{self.path}: malformed {limit} for tenant {name!r}"
                    ) from None
        return data

    def refresh(self, *, force: bool = False) -> None:
        """Re-read the file if it changed since it was last read."""
        try:
            st = self.path.stat()
            stamp = (st.st_ino, st.st_mtime_ns, st.st_size)
        except FileNotFoundError:
            stamp = None
        with self._lock:
            if not force and stamp == self._stamp:
                return
            data = self._read()
            self._tenants = data["tenants"]
            self.server_id = data.get("server_id", "")
            self._stamp = stamp
            self.generation += 1

    def tenants(self) -> dict[str, list[str]]:
        """Return {tenant: [public key hex, ...]}."""
        with self._lock:
            return {name: list(entry["keys"]) for name, entry in sorted(self._tenants.items())}

    def limits(self, tenant: str) -> dict[str, Limit]:
        """Return the tenant's own limits (``LIMIT_KEYS``) as the file holds them
        (``DEFAULT`` where it has none); raise ``InvalidRequestError`` for no such tenant."""
        with self._lock:
            entry = self._tenants.get(tenant)
            if entry is None:
                raise InvalidRequestError(f"no tenant {tenant!r}")
            return {key: entry.get(key, DEFAULT) for key in LIMIT_KEYS}

    def quota(self, tenant: str, default: Quota) -> Quota:
        """Return the quota the server enforces for ``tenant``: its own limits where the
        file has them, ``default``'s elsewhere (an unknown tenant gets the default)."""
        with self._lock:
            entry = self._tenants.get(tenant) or {}
        return Quota(
            max_bytes=entry.get("max_bytes", default.max_bytes),
            max_blobs=entry.get("max_blobs", default.max_blobs),
        )

    def tenant_limits(self, tenant: str, default: TenantLimits) -> TenantLimits:
        """Return the fairness limits the server applies to ``tenant``: its own where the
        file has them, ``default``'s elsewhere."""
        with self._lock:
            entry = self._tenants.get(tenant) or {}
            own = {key: entry[key] for key in FAIRNESS_KEYS if key in entry}
        return dataclasses.replace(default, **own) if own else default

    def is_registered(self, tenant: str, public_key: bytes) -> bool:
        """Whether ``public_key`` may log in as ``tenant``."""
        with self._lock:
            entry = self._tenants.get(tenant)
            return entry is not None and public_key.hex() in entry["keys"]

    # -- changing (admin commands) -----------------------------------------------------------

    @contextlib.contextmanager
    def _editing(self) -> Iterator[dict]:
        """Lock, read the current file, let the caller change it, write it atomically."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        lock_path = self.path.with_name(self.path.name + ".lock")
        with open(lock_path, "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            data = self._read()
            if not data.get("server_id"):
                data["server_id"] = secrets.token_hex(16)
            yield data
            self._write(data)
        self.refresh(force=True)

    def _write(self, data: dict) -> None:
        fd, tmp = tempfile.mkstemp(prefix=self.path.name + ".", dir=self.path.parent)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as fh:
                json.dump(data, fh, indent=2, sort_keys=True)
                fh.write("\n")
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, self.path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
        dir_fd = os.open(self.path.parent, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)

    def ensure_server_id(self) -> str:
        """Return the server id, creating the file with a fresh random id if needed."""
        if not self.server_id:
            with self._editing():
                pass
        return self.server_id

    def add_tenant(self, name: str, **limits: Limit) -> None:
        """Create a tenant with no keys (and its own limits, ``LIMIT_KEYS``, if given);
        raise ``InvalidRequestError`` if it exists."""
        check_tenant_name(name)
        self._check_limits(limits)
        with self._editing() as data:
            if name in data["tenants"]:
                raise InvalidRequestError(f"tenant {name!r} already exists")
            entry = {"keys": [], "created": int(time.time())}
            entry.update({k: v for k, v in limits.items() if v != DEFAULT})
            data["tenants"][name] = entry

    def set_limits(self, tenant: str, **changes: Limit) -> dict[str, Limit]:
        """Change some of a tenant's limits (``LIMIT_KEYS``: an int, None for no limit,
        ``DEFAULT`` for the server's default; the others are kept); return them all.
        Running servers apply them from their next write (quota), login or second."""
        self._check_limits(changes)
        with self._editing() as data:
            entry = data["tenants"].get(tenant)
            if entry is None:
                raise InvalidRequestError(f"no tenant {tenant!r}")
            for key, value in changes.items():
                if value == DEFAULT:
                    entry.pop(key, None)
                else:
                    entry[key] = value
        return self.limits(tenant)

    @staticmethod
    def _check_limits(limits: dict[str, object]) -> None:
        unknown = set(limits) - set(LIMIT_KEYS)
        if unknown:
            raise InvalidRequestError(f"unknown limit(s) {sorted(unknown)}: not {LIMIT_KEYS}")
        for key, value in limits.items():
            check_limit(value, key)

    def add_key(self, tenant: str, public_key: str | bytes) -> str:
        """Register a public key for a tenant; return its hex."""
        key_hex = parse_public_key(public_key).hex()
        with self._editing() as data:
            entry = data["tenants"].get(tenant)
            if entry is None:
                raise InvalidRequestError(f"no tenant {tenant!r}")
            if key_hex not in entry["keys"]:
                entry["keys"].append(key_hex)
        return key_hex

    def remove_key(self, tenant: str, public_key: str | bytes) -> None:
        """Revoke a public key (sessions already open keep running until they close)."""
        key_hex = parse_public_key(public_key).hex()
        with self._editing() as data:
            entry = data["tenants"].get(tenant)
            if entry is None or key_hex not in entry["keys"]:
                raise InvalidRequestError(f"key not registered for tenant {tenant!r}")
            entry["keys"].remove(key_hex)

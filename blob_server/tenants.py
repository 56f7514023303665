"""Tenants and the secp256k1 public keys allowed to log in as each of them.

The registry is a small JSON file (``--tenants PATH``), replaced atomically on every
change and re-read by the running server when its modification time changes, so
``zerodb-server add-key`` takes effect without a restart. Read-modify-write cycles hold
an advisory lock on ``PATH.lock`` so two admin commands cannot lose each other's change.

The file holds public keys only; nothing in it lets anyone log in.
"""

from __future__ import annotations

import contextlib
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

from coincurve import PublicKey

from blob_server.exceptions import InvalidRequestError

FORMAT_VERSION = 1
PUBLIC_KEY_BYTES = 33  # compressed secp256k1
TENANT_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")


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

    def tenants(self) -> dict[str, list[str]]:
        """Return {tenant: [public key hex, ...]}."""
        with self._lock:
            return {name: list(entry["keys"]) for name, entry in sorted(self._tenants.items())}

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

    def add_tenant(self, name: str) -> None:
        """Create a tenant with no keys; raise ``InvalidRequestError`` if it exists."""
        check_tenant_name(name)
        with self._editing() as data:
            if name in data["tenants"]:
                raise InvalidRequestError(f"tenant {name!r} already exists")
            data["tenants"][name] = {"keys": [], "created": int(time.time())}

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

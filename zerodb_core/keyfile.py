"""The key file: a random blob-server login key, wrapped under a passphrase.

The login key is a random secp256k1 secret (never derived from the passphrase alone, so
knowing the passphrase without the file gets nobody in); the file also names the tenant
and, optionally, the server address. It is sealed like the keyring: Argon2id KEK from the
passphrase, XChaCha20-Poly1305, the whole header as associated data.

Layout (integers big-endian)::

    offset  size  field
    0       3     magic b"ZDF"
    3       1     format version (1)
    4       1     cipher suite (1 = XChaCha20-Poly1305-IETF)
    5       1     KDF algorithm (1 = Argon2id v1.3)
    6       8     opslimit (u64)
    14      8     memlimit (u64, bytes)
    22      16    salt
    38      24    nonce
    62      ...   ciphertext of msgpack {"login_key", "tenant", "server"[, "server_id"]}
                  + 16-byte tag

Fail closed: a wrong passphrase or any change to the file raises ``WrongPassphraseError``;
a malformed file raises ``IntegrityError``.

**Server pinning**: ``server_id`` is the id of the one blob server this key logs in to.
It is given at creation (``--server-id``, printed by ``zerodb-server list-tenants``) or
recorded at the first successful login (``DB`` rewrites the file, atomically, sealed
again under the same passphrase and KDF costs). From then on a login to a server with
another id fails with ``AuthenticationError`` before anything is signed, so a client
redirected to another server (DNS, routing, a copied address) does not log in to it.
*Why in the sealed file:* beside it, anyone who can write the client's directory could
unpin it silently; inside, changing it needs the passphrase. ``pin`` changes it on
purpose (a server that was rebuilt with a new tenants file has a new id).

Create one and print the public key to register with ``zerodb-server add-key``::

    python -m zerodb_core.keyfile create --tenant acme --out acme.zdbkey
"""

from __future__ import annotations

import argparse
import contextlib
import getpass
import os
import sys
import tempfile
import warnings
from pathlib import Path
from typing import Any, Final, NoReturn

import msgpack
from coincurve import PrivateKey

from zerodb_core.crypto.envelope import HEADER_BYTES, TAG_BYTES, open_envelope, seal_envelope
from zerodb_core.crypto.kdf import DEFAULT_PRESET, KdfParams
from zerodb_core.crypto.keyring import _valid_login_key
from zerodb_core.exceptions import AuthenticationError, IntegrityError

MAGIC: Final = b"ZDF"
FORMAT_VERSION: Final = 1
MAX_FILE_BYTES: Final = 4096
MAX_SERVER_ID_LENGTH: Final = 256
PASSPHRASE_ENV: Final = "ZERODB_PASSPHRASE"
_FIELDS: Final = frozenset({"login_key", "tenant", "server"})
_PINNED_FIELDS: Final = _FIELDS | {"server_id"}


def _check_server_id(value: object) -> str | None:
    if value is not None and (
        not isinstance(value, str) or not 0 < len(value) <= MAX_SERVER_ID_LENGTH
    ):
        raise ValueError(f"server_id must be None or a str of 1-{MAX_SERVER_ID_LENGTH} chars")
    return value


class KeyFile:
    """A login key with its tenant, (optional) server ``host:port`` and (optional) pinned
    server id.

    ``repr`` shows the tenant and public key only; the secret never appears.
    """

    __slots__ = ("_opened", "login_key", "server", "server_id", "tenant")

    def __init__(
        self,
        login_key: bytes,
        tenant: str,
        server: str | None = None,
        server_id: str | None = None,
    ) -> None:
        if not _valid_login_key(login_key):
            raise ValueError("login_key must be a 32-byte secp256k1 secret key")
        if not isinstance(tenant, str) or not tenant:
            raise ValueError("tenant must be a non-empty str")
        if server is not None and not isinstance(server, str):
            raise ValueError("server must be a str 'host:port' or None")
        self.login_key = login_key
        self.tenant = tenant
        self.server = server
        self.server_id = _check_server_id(server_id)
        # (sealed bytes, KDF parameters) as last read from or written to disk, so that
        # pinning can tell whether the file changed since and reuse its KDF costs.
        self._opened: tuple[bytes, KdfParams] | None = None

    @classmethod
    def create(
        cls, tenant: str, server: str | None = None, *, server_id: str | None = None
    ) -> KeyFile:
        """Return a key file with a fresh random login key (pinned to ``server_id`` if
        given)."""
        while True:
            secret = os.urandom(32)
            if _valid_login_key(secret):
                return cls(secret, tenant, server, server_id)

    @property
    def public_key(self) -> bytes:
        """The 33-byte compressed public key to register with the server."""
        return PrivateKey(self.login_key).public_key.format(compressed=True)

    def seal(
        self, passphrase: str | bytes, *, kdf: str = DEFAULT_PRESET, params: KdfParams | None = None
    ) -> bytes:
        """Return the file's bytes, wrapped under ``passphrase`` (fresh nonce; fresh salt
        too unless ``params`` gives the KDF parameters to reuse)."""
        fields: dict[str, Any] = {
            "login_key": self.login_key,
            "tenant": self.tenant,
            "server": self.server,
        }
        if self.server_id is not None:  # unpinned files stay readable by older versions
            fields["server_id"] = self.server_id
        plaintext = msgpack.packb(fields, use_bin_type=True)
        return seal_envelope(MAGIC, passphrase, params or KdfParams.from_preset(kdf), plaintext)

    @classmethod
    def open(cls, sealed: bytes, passphrase: str | bytes) -> KeyFile:
        """Unwrap a key file; raise ``WrongPassphraseError`` or ``IntegrityError``."""
        if type(sealed) is not bytes or not HEADER_BYTES + TAG_BYTES < len(sealed) <= (
            MAX_FILE_BYTES
        ):
            raise IntegrityError("not a zerodb key file (wrong size)")
        plaintext, params = open_envelope(
            MAGIC,
            sealed,
            passphrase,
            b"",
            what="key file",
            wrong="the key file did not open: wrong passphrase, or the file was changed",
        )
        try:
            data: Any = msgpack.unpackb(plaintext, raw=False)
        except Exception:
            raise IntegrityError("key file: contents do not decode") from None
        if not isinstance(data, dict) or set(data) not in (_FIELDS, _PINNED_FIELDS):
            raise IntegrityError("key file: malformed contents")
        try:
            keyfile = cls(data["login_key"], data["tenant"], data["server"], data.get("server_id"))
        except ValueError as exc:
            raise IntegrityError(f"key file: {exc}") from None
        keyfile._opened = (sealed, params)
        return keyfile

    def save(
        self,
        path: str | os.PathLike[str],
        passphrase: str | bytes,
        *,
        kdf: str = DEFAULT_PRESET,
        replace: bool = False,
    ) -> None:
        """Write the sealed file (mode 0600), refusing to overwrite an existing one.

        With ``replace`` an existing file is replaced atomically (temporary file, fsync,
        rename): a crash leaves the old key or the new one, never half of either.
        """
        data = self.seal(passphrase, kdf=kdf)
        if replace:
            _replace_file(Path(path), data)
            return
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())

    @classmethod
    def load(cls, path: str | os.PathLike[str], passphrase: str | bytes) -> KeyFile:
        """Read and unwrap the key file at ``path``."""
        with open(path, "rb") as fh:
            return cls.open(fh.read(MAX_FILE_BYTES + 1), passphrase)

    def pin(
        self,
        path: str | os.PathLike[str],
        passphrase: str | bytes,
        server_id: str | None,
        *,
        replace: bool = False,
    ) -> None:
        """Record ``server_id`` in the key file at ``path`` (and in this object).

        The file is re-sealed under the same passphrase and KDF costs and replaced
        atomically (temporary file, fsync, rename): a crash leaves the old or the new
        file, never half of one. It must still hold this login key and tenant. If it is
        already pinned to another id (another process pinned it meanwhile) the pin is
        refused with ``AuthenticationError`` unless ``replace`` (then ``None`` unpins).
        """
        _check_server_id(server_id)
        if server_id is None and not replace:
            raise ValueError("server_id is required unless replace=True")
        with open(path, "rb") as fh:
            sealed = fh.read(MAX_FILE_BYTES + 1)
        if self._opened is not None and self._opened[0] == sealed:
            current, params = self, self._opened[1]  # unchanged since we read it
        else:
            current = KeyFile.open(sealed, passphrase)
            assert current._opened is not None
            params = current._opened[1]
        if (current.login_key, current.tenant) != (self.login_key, self.tenant):
            raise IntegrityError(f"{path} now holds another login key or tenant; not pinned")
        if not replace and current.server_id not in (None, server_id):
            raise AuthenticationError(
                f"{path} is pinned to server id {current.server_id!r}, not {server_id!r}"
            )
        if current.server_id == server_id:  # nothing to write
            self.server, self.server_id, self._opened = current.server, server_id, (sealed, params)
            return
        pinned = KeyFile(self.login_key, self.tenant, current.server, server_id)
        data = pinned.seal(passphrase, params=params)
        _replace_file(Path(path), data)
        self.server = current.server
        self.server_id = server_id
        self._opened = (data, params)

    def __repr__(self) -> str:
        return f"<KeyFile tenant={self.tenant!r} public_key={self.public_key.hex()}>"

    __str__ = __repr__

    def __reduce__(self) -> NoReturn:
        raise TypeError("key material must not be pickled or copied out of process")


def pin_server(
    keyfile: KeyFile,
    path: str | os.PathLike[str] | None,
    passphrase: str | bytes,
    server_id: str | None,
) -> None:
    """Pin an unpinned key file to the id its first login saw (``DB`` calls this).

    With a ``path`` the file is re-sealed with the pin; without one (a ``KeyFile`` passed
    in) only the object is pinned. A file that cannot be written (a read-only mount)
    stays unpinned with a warning: the session is already pinned in memory, and failing
    would lock such deployments out; they should create keys with ``--server-id``.
    """
    if server_id is None or keyfile.server_id is not None:
        return
    if path is None:
        keyfile.server_id = server_id
        return
    try:
        keyfile.pin(path, passphrase, server_id)
    except OSError as exc:
        keyfile.server_id = server_id
        warnings.warn(
            f"could not record server id {server_id!r} in the key file {path}: {exc}; "
            "create key files with --server-id where they cannot be written",
            RuntimeWarning,
            stacklevel=3,
        )


def _replace_file(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` atomically (mode 0600) and make the rename durable."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:  # mkstemp creates the file with mode 0600
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def _passphrase(confirm: bool) -> str:
    env = os.environ.get(PASSPHRASE_ENV)
    if env:
        return env
    first = getpass.getpass("Key file passphrase: ")
    if confirm and getpass.getpass("Again: ") != first:
        raise SystemExit("error: the passphrases differ")
    if not first:
        raise SystemExit("error: an empty passphrase is not allowed")
    return first


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m zerodb_core.keyfile",
        description="Create or inspect a blob-server key file (a random login key wrapped "
        f"under a passphrase, asked for or read from ${PASSPHRASE_ENV}).",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    create = sub.add_parser(
        "create",
        help="create a key file and print its public key",
        description="Create a key file with a new random login key and print the public key "
        "to register with `zerodb-server add-key TENANT PUBKEY`.",
    )
    create.add_argument("--tenant", required=True, help="the tenant this key logs in as")
    create.add_argument("--out", required=True, type=Path, help="where to write the key file")
    create.add_argument("--server", help="HOST:PORT of the blob server (informational)")
    create.add_argument(
        "--server-id",
        help="pin the key to this server id (`zerodb-server list-tenants` prints it); "
        "default: the id the first login sees",
    )
    create.add_argument(
        "--kdf",
        default=DEFAULT_PRESET,
        choices=["sensitive", "moderate", "interactive", "fast"],
        help="Argon2id cost preset (default: moderate; 'fast' is for tests only)",
    )
    show = sub.add_parser(
        "show",
        help="print a key file's tenant and public key",
        description="Open a key file and print its tenant, server and public key.",
    )
    show.add_argument("path", type=Path)
    pin = sub.add_parser(
        "pin",
        help="change the server id a key file is pinned to",
        description="Pin a key file to another server id (after the server was rebuilt "
        "with a new tenants file), or unpin it with --clear (the next login pins again).",
    )
    pin.add_argument("path", type=Path)
    which = pin.add_mutually_exclusive_group(required=True)
    which.add_argument("--server-id", help="the new server id")
    which.add_argument("--clear", action="store_true", help="remove the pin")
    args = parser.parse_args(argv)
    if args.command == "create":
        try:
            keyfile = KeyFile.create(args.tenant, args.server, server_id=args.server_id)
        except ValueError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 1
        try:
            keyfile.save(args.out, _passphrase(confirm=True), kdf=args.kdf)
        except FileExistsError:
            print(f"error: {args.out} exists; refusing to overwrite a key", file=sys.stderr)
            return 1
        print(keyfile.public_key.hex())
        return 0
    passphrase = _passphrase(confirm=False)
    keyfile = KeyFile.load(args.path, passphrase)
    if args.command == "pin":
        try:
            keyfile.pin(args.path, passphrase, None if args.clear else args.server_id, replace=True)
        except ValueError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 1
        print(f"server id: {keyfile.server_id or '- (pinned at the next login)'}")
        return 0
    print(f"tenant: {keyfile.tenant}\nserver: {keyfile.server or '-'}")
    print(f"server id: {keyfile.server_id or '- (pinned at the first login)'}")
    print(f"public key: {keyfile.public_key.hex()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

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
    62      ...   ciphertext of msgpack {"login_key", "tenant", "server"} + 16-byte tag

Fail closed: a wrong passphrase or any change to the file raises ``WrongPassphraseError``;
a malformed file raises ``IntegrityError``.

Create one and print the public key to register with ``zerodb-server add-key``::

    python -m zerodb_core.keyfile create --tenant acme --out acme.zdbkey
"""

from __future__ import annotations

import argparse
import getpass
import os
import sys
from pathlib import Path
from typing import Any, Final

import msgpack
from coincurve import PrivateKey

from zerodb_core.crypto.envelope import HEADER_BYTES, TAG_BYTES, open_envelope, seal_envelope
from zerodb_core.crypto.kdf import DEFAULT_PRESET, KdfParams
from zerodb_core.crypto.keyring import _valid_login_key
from zerodb_core.exceptions import IntegrityError

MAGIC: Final = b"ZDF"
FORMAT_VERSION: Final = 1
MAX_FILE_BYTES: Final = 4096
PASSPHRASE_ENV: Final = "ZERODB_PASSPHRASE"
_FIELDS: Final = frozenset({"login_key", "tenant", "server"})


class KeyFile:
    """A login key with its tenant and (optional) server ``host:port``.

    ``repr`` shows the tenant and public key only; the secret never appears.
    """

    __slots__ = ("login_key", "server", "tenant")

    def __init__(self, login_key: bytes, tenant: str, server: str | None = None) -> None:
        if not _valid_login_key(login_key):
            raise ValueError("login_key must be a 32-byte secp256k1 secret key")
        if not isinstance(tenant, str) or not tenant:
            raise ValueError("tenant must be a non-empty str")
        if server is not None and not isinstance(server, str):
            raise ValueError("server must be a str 'host:port' or None")
        self.login_key = login_key
        self.tenant = tenant
        self.server = server

    @classmethod
    def create(cls, tenant: str, server: str | None = None) -> KeyFile:
        """Return a key file with a fresh random login key."""
        while True:
            secret = os.urandom(32)
            if _valid_login_key(secret):
                return cls(secret, tenant, server)

    @property
    def public_key(self) -> bytes:
        """The 33-byte compressed public key to register with the server."""
        return PrivateKey(self.login_key).public_key.format(compressed=True)

    def seal(self, passphrase: str | bytes, *, kdf: str = DEFAULT_PRESET) -> bytes:
        """Return the file's bytes, wrapped under ``passphrase`` (fresh salt and nonce)."""
        plaintext = msgpack.packb(
            {"login_key": self.login_key, "tenant": self.tenant, "server": self.server},
            use_bin_type=True,
        )
        return seal_envelope(MAGIC, passphrase, KdfParams.from_preset(kdf), plaintext)

    @classmethod
    def open(cls, sealed: bytes, passphrase: str | bytes) -> KeyFile:
        """Unwrap a key file; raise ``WrongPassphraseError`` or ``IntegrityError``."""
        if type(sealed) is not bytes or not HEADER_BYTES + TAG_BYTES < len(sealed) <= (
            MAX_FILE_BYTES
        ):
            raise IntegrityError("not a zerodb key file (wrong size)")
        plaintext, _ = open_envelope(
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
        if not isinstance(data, dict) or set(data) != _FIELDS:
            raise IntegrityError("key file: malformed contents")
        try:
            return cls(data["login_key"], data["tenant"], data["server"])
        except ValueError as exc:
            raise IntegrityError(f"key file: {exc}") from None

    def save(self, path: str | os.PathLike, passphrase: str | bytes, *, kdf: str = DEFAULT_PRESET):
        """Write the sealed file (mode 0600), refusing to overwrite an existing one."""
        data = self.seal(passphrase, kdf=kdf)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())

    @classmethod
    def load(cls, path: str | os.PathLike, passphrase: str | bytes) -> KeyFile:
        """Read and unwrap the key file at ``path``."""
        with open(path, "rb") as fh:
            return cls.open(fh.read(MAX_FILE_BYTES + 1), passphrase)

    def __repr__(self) -> str:
        return f"<KeyFile tenant={self.tenant!r} public_key={self.public_key.hex()}>"

    __str__ = __repr__

    def __reduce__(self) -> object:
        raise TypeError("key material must not be pickled or copied out of process")


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
    args = parser.parse_args(argv)
    if args.command == "create":
        keyfile = KeyFile.create(args.tenant, args.server)
        try:
            keyfile.save(args.out, _passphrase(confirm=True), kdf=args.kdf)
        except FileExistsError:
            print(f"error: {args.out} exists; refusing to overwrite a key", file=sys.stderr)
            return 1
        print(keyfile.public_key.hex())
        return 0
    keyfile = KeyFile.load(args.path, _passphrase(confirm=False))
    print(f"tenant: {keyfile.tenant}\nserver: {keyfile.server or '-'}")
    print(f"public key: {keyfile.public_key.hex()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

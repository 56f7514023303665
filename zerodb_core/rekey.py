"""Changing the passphrase of a database, and rotating its key epoch.

**What a passphrase change does**: the keyring (the random master keys of the database,
kept in the store's keyring slot of one user) is re-wrapped under a key derived from the
new passphrase, and swapped in by compare-and-swap; for a blob-server store the key file
(sealed under the same passphrase) is re-sealed too. **What it does not do**: no blob is
re-encrypted and the master keys do not change, so anyone who already holds them (an
old copy of the keyring slot together with the old passphrase, or a memory dump of a
running client) can still read everything, old and new. A passphrase change protects
against a passphrase that leaked *without* the keyring having been opened with it.

**Key epoch rotation** (:func:`rotate_epoch`) adds a new random master key; new blobs
are sealed under it, old ones stay readable under theirs. Running clients learn the new
epoch when they first meet a blob sealed under it: ``DB`` reloads the keyring once on an
unknown epoch (an epoch still unknown after that is an integrity failure).
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from zerodb_core.crypto import KdfParams, Keyring, slot_name
from zerodb_core.crypto.kdf import SALT_BYTES
from zerodb_core.exceptions import ConflictError, QueryError

if TYPE_CHECKING:
    from zerodb_core.db import DB


def rotate_epoch(db: DB, passphrase: str | bytes, *, username: str = "root") -> int:
    """Start a new key epoch: a fresh random master key that every blob written from
    now on is sealed under; return the new epoch.

    The keyring slot of ``username`` is re-wrapped (same passphrase, same Argon2id costs)
    with the new epoch added and swapped in by compare-and-swap (``ConflictError`` if it
    changed meanwhile). This ``db`` seals with the new epoch at once; other running
    clients learn it the first time they meet a blob sealed under it (``DB`` reloads the
    keyring once on an unknown epoch). Old blobs stay under their epochs until a commit
    rewrites them: rotation limits what a leaked *future* key opens, it re-encrypts
    nothing. Other users' keyring slots of the database are not touched (their
    passphrases are not known here): they must be rotated by their owners.
    """
    tenant = getattr(db.transport, "tenant", "local")
    where = {"tenant": tenant, "database": db.database, "name": username}
    slot = slot_name(tenant, db.database, username)
    sealed = db.transport.get_keyring(db.database, slot)
    if sealed is None:
        raise QueryError(f"database {db.database!r} has no keyring for user {username!r}")
    keyring = Keyring.open(sealed, passphrase, **where)
    epoch = keyring.rotate()
    if not db.transport.put_keyring(
        db.database, slot, keyring.seal(passphrase, **where), expected=sealed
    ):
        raise ConflictError(
            f"the keyring of {username!r} in {db.database!r} changed while it was rotated; "
            "nothing was changed, try again"
        )
    db.reload_keyring()
    return epoch


def change_passphrase(
    db: DB,
    old: str | bytes,
    new: str | bytes,
    *,
    username: str = "root",
    key_file: str | os.PathLike[str] | None = None,
    kdf: str | None = None,
) -> dict[str, object]:
    """Re-wrap the keyring of ``username`` in ``db`` (and re-seal ``key_file``, a path,
    if given) under ``new``; return what changed.

    ``kdf`` is an Argon2id preset for the new wrapping (default: the costs of the old
    one). The new key file is written beside the old one first, the keyring slot is then
    swapped by compare-and-swap (``ConflictError`` if it changed since it was read, and
    the key file is left alone), and the key file is renamed into place last.
    """
    if not new:
        raise QueryError("the new passphrase must not be empty")
    if new == old:
        raise QueryError("the new passphrase is the same as the old one")
    tenant = getattr(db.transport, "tenant", "local")
    where = {"tenant": tenant, "database": db.database, "name": username}
    slot = slot_name(tenant, db.database, username)
    sealed = db.transport.get_keyring(db.database, slot)
    if sealed is None:
        raise QueryError(f"database {db.database!r} has no keyring for user {username!r}")
    keyring = Keyring.open(sealed, old, **where)  # WrongPassphraseError if old is wrong
    rewrapped = keyring.seal(new, kdf=kdf, **where)
    path = None if key_file is None else Path(key_file)
    staged = _stage_key_file(path, old, new, kdf) if path is not None else None
    try:
        if not db.transport.put_keyring(db.database, slot, rewrapped, expected=sealed):
            raise ConflictError(
                f"the keyring of {username!r} in {db.database!r} changed while it was "
                "re-wrapped; nothing was changed, try again"
            )
    except BaseException:
        if staged is not None:
            with contextlib.suppress(OSError):
                os.unlink(staged)
        raise
    if staged is not None and path is not None:  # (a file is staged for a path only)
        os.replace(staged, path)
        _fsync_dir(path.parent)
    return {
        "database": db.database,
        "username": username,
        "keyring": True,
        "key_file": None if key_file is None else os.fspath(key_file),
        "epochs": list(keyring.epochs),
    }


def _stage_key_file(path: Path, old: str | bytes, new: str | bytes, kdf: str | None) -> str:
    """Write the key file re-sealed under ``new`` to a temporary file beside it (mode
    0600); return its path."""
    from zerodb_core.keyfile import KeyFile

    keyfile = KeyFile.load(path, old)
    if kdf is not None:
        params = KdfParams.from_preset(kdf)
    else:
        opened = keyfile._opened
        assert opened is not None
        params = KdfParams(opened[1].opslimit, opened[1].memlimit, os.urandom(SALT_BYTES))
    data = keyfile.seal(new, params=params)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return tmp


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)

"""The keyring: random master keys, wrapped under a passphrase-derived key.

Data is never encrypted under the passphrase: a random 32-byte master key per epoch
is, and the keyring wraps those under the Argon2id KEK. Changing the passphrase or
rotating re-wraps the keyring only.

Sealed as a passphrase envelope (``zerodb_core.crypto.envelope``, magic ``b"ZDK"``) whose
associated data also binds the u16-length-prefixed UTF-8 tenant, database and keyring
name, so a keyring cannot be moved to another user, database or tenant.

Plaintext: msgpack ``{"epochs": {epoch: master_key}, "current": epoch,
"login_key": bytes | None}``, padded to a size class (hides how many epochs exist).
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Mapping
from typing import Any, Final, NoReturn

import msgpack

from zerodb_core.crypto._wire import length_prefixed
from zerodb_core.crypto.envelope import HEADER_BYTES, TAG_BYTES, open_envelope, seal_envelope
from zerodb_core.crypto.kdf import DEFAULT_PRESET, PRESETS, SALT_BYTES, KdfParams
from zerodb_core.crypto.keys import KEY_BYTES, MAX_EPOCH, KeyHierarchy, check_epoch
from zerodb_core.crypto.padding import is_size_class, pad, unpad
from zerodb_core.exceptions import IntegrityError

MAGIC: Final = b"ZDK"

# Order of the secp256k1 group: a valid secret key is an integer in [1, N - 1].
SECP256K1_N: Final = 0xFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFEBAAEDCE6AF48A03BBFD25E8CD0364141
_FIELDS: Final = frozenset({"epochs", "current", "login_key"})


def _valid_login_key(value: object) -> bool:
    return (
        isinstance(value, bytes)
        and len(value) == 32
        and 0 < int.from_bytes(value, "big") < SECP256K1_N
    )


class Keyring:
    """Master keys by epoch, the current epoch, and an optional store login key.

    ``repr`` shows epochs only; master keys never appear in ``repr``/``str``.
    """

    __slots__ = ("_costs", "_current", "_masters", "login_key")

    def __init__(
        self,
        masters: Mapping[int, bytes],
        current: int,
        login_key: bytes | None = None,
        *,
        kdf: str = DEFAULT_PRESET,
    ) -> None:
        # KeyHierarchy validates epochs and key lengths (ValueError on misuse).
        KeyHierarchy(masters, current)
        if login_key is not None and not _valid_login_key(login_key):
            raise ValueError("login_key must be a 32-byte secp256k1 secret key")
        if kdf not in PRESETS:
            raise ValueError(f"unknown KDF preset {kdf!r}")
        self._masters = dict(masters)
        self._current = current
        self.login_key = login_key
        # Argon2id costs used by ``seal`` when no preset is given: the creating preset,
        # or the costs read from the keyring this one was opened from.
        self._costs: tuple[int, int] = PRESETS[kdf]

    @classmethod
    def create(cls, kdf: str = DEFAULT_PRESET) -> Keyring:
        """Return a new keyring: one random master key, epoch 1."""
        return cls({1: os.urandom(KEY_BYTES)}, 1, kdf=kdf)

    @property
    def current_epoch(self) -> int:
        """The epoch new blobs are sealed under."""
        return self._current

    @property
    def epochs(self) -> tuple[int, ...]:
        """All epochs held, ascending."""
        return tuple(sorted(self._masters))

    def rotate(self) -> int:
        """Start a new epoch with a fresh random master key; return it.

        Old epochs are kept so their blobs stay readable. Re-``seal`` the keyring and
        rebuild ``hierarchy()`` (and sealers) afterwards.
        """
        epoch = max(self._masters) + 1
        if epoch > MAX_EPOCH:
            raise ValueError("no key epochs left")
        self._masters[epoch] = os.urandom(KEY_BYTES)
        self._current = epoch
        return epoch

    def hierarchy(self) -> KeyHierarchy:
        """Return the derived keys for sealing and opening blobs."""
        return KeyHierarchy(self._masters, self._current)

    def seal(
        self,
        passphrase: str | bytes,
        *,
        tenant: str,
        database: str,
        name: str,
        kdf: str | None = None,
    ) -> bytes:
        """Return this keyring wrapped under ``passphrase`` for (tenant, database, name).

        ``kdf`` is a preset name; by default the costs this keyring was created or
        opened with. Salt and nonce are fresh on every call.
        """
        if kdf is None:
            params = KdfParams(*self._costs, salt=os.urandom(SALT_BYTES))
        else:
            params = KdfParams.from_preset(kdf)
        plaintext = msgpack.packb(
            {"epochs": self._masters, "current": self._current, "login_key": self.login_key},
            use_bin_type=True,
        )
        bound = length_prefixed(tenant, database, name)
        return seal_envelope(MAGIC, passphrase, params, pad(plaintext), bound)

    @classmethod
    def open(
        cls, sealed: bytes, passphrase: str | bytes, *, tenant: str, database: str, name: str
    ) -> Keyring:
        """Unwrap a sealed keyring; raise ``WrongPassphraseError`` or ``IntegrityError``."""
        if type(sealed) is not bytes:
            raise IntegrityError(f"keyring {name!r}: not bytes but {type(sealed).__name__}")
        aad_suffix = length_prefixed(tenant, database, name)
        size = len(sealed)
        if size < HEADER_BYTES + TAG_BYTES or not is_size_class(size - HEADER_BYTES - TAG_BYTES):
            raise IntegrityError(f"keyring {name!r}: length {size} is not a sealed keyring size")
        padded, params = open_envelope(
            MAGIC,
            sealed,
            passphrase,
            aad_suffix,
            what=f"keyring {name!r}",
            wrong=f"keyring {name!r} did not open: wrong passphrase, or the keyring was "
            "tampered with or belongs to another user, database or tenant",
        )
        keyring = cls._from_plaintext(unpad(padded), name)
        keyring._costs = (params.opslimit, params.memlimit)
        return keyring

    @classmethod
    def _from_plaintext(cls, plaintext: bytes, name: str) -> Keyring:
        """Decode and strictly validate the keyring map before building anything."""
        try:
            data: Any = msgpack.unpackb(plaintext, raw=False, strict_map_key=False, use_list=False)
        except Exception:
            raise IntegrityError(f"keyring {name!r}: contents do not decode") from None

        def bad(why: str) -> IntegrityError:
            return IntegrityError(f"keyring {name!r}: malformed contents ({why})")

        if not isinstance(data, dict) or set(data) != _FIELDS:
            raise bad("fields")
        epochs, current, login_key = data["epochs"], data["current"], data["login_key"]
        if not isinstance(epochs, dict) or not epochs:
            raise bad("epochs")
        for epoch, master in epochs.items():
            try:
                check_epoch(epoch)
            except ValueError:
                raise bad("epoch number") from None
            if not isinstance(master, bytes) or len(master) != KEY_BYTES:
                raise bad("master key length")
        if not isinstance(current, int) or isinstance(current, bool) or current not in epochs:
            raise bad("current epoch")
        if login_key is not None and not _valid_login_key(login_key):
            raise bad("login key")
        return cls(epochs, current, login_key)

    def __repr__(self) -> str:
        login = "set" if self.login_key is not None else "none"
        return f"<Keyring epochs={list(self.epochs)} current={self._current} login_key={login}>"

    __str__ = __repr__

    def __reduce__(self) -> NoReturn:
        raise TypeError("key material must not be pickled or copied out of process")


def slot_name(tenant: str, database: str, username: str) -> str:
    """The name of a user's keyring slot in the store: an unkeyed hash, so the store does
    not hold usernames in clear (nothing is unlocked yet when the slot is looked up, so it
    cannot be keyed; a guessable username can still be confirmed by guessing)."""
    digest = hashlib.blake2b(
        length_prefixed(tenant, database, username), digest_size=16, person=b"zerodb:slot:v1"
    )
    return digest.hexdigest()

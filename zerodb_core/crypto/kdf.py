"""Passphrase -> Argon2id -> 32-byte key-encryption key (KEK).

The KEK only wraps the keyring (the random master keys); it never encrypts data, so a
passphrase change re-wraps the keyring without touching a single blob.

Passphrases: ``bytes`` are used as given. ``str`` is normalised to Unicode NFC and
encoded as UTF-8 (the RFC 8265 "OpaqueString" rule), so "é" typed as one code point or
as "e" + combining accent opens the same keyring on every OS and keyboard. We do not
use NFKC: it would silently fold distinct characters (fullwidth digits, ligatures,
superscripts) into one another, which shrinks the passphrase space for no benefit. This
rule is part of keyring format 1 and must never change, or existing keyrings stop
opening.

An empty passphrase raises ``ValueError``: it is a programmer error (callers such as
``DB`` check for a missing passphrase first and raise their own error), never a
condition read from the store.

The preset is chosen by the caller (``DB`` reads ``ZERODB_KDF``); this module reads no
environment.
"""

from __future__ import annotations

import os
import unicodedata
from dataclasses import dataclass
from typing import Final

from nacl.pwhash import argon2id

from zerodb_core.exceptions import IntegrityError

KEY_BYTES: Final = 32
SALT_BYTES: Final = argon2id.SALTBYTES  # 16

#: Named (opslimit, memlimit) presets. "fast" is libsodium's minimum: INSECURE, it
#: exists so tests do not spend a second per keyring. Never use it for real data.
PRESETS: Final[dict[str, tuple[int, int]]] = {
    "sensitive": (argon2id.OPSLIMIT_SENSITIVE, argon2id.MEMLIMIT_SENSITIVE),
    "moderate": (argon2id.OPSLIMIT_MODERATE, argon2id.MEMLIMIT_MODERATE),
    "interactive": (argon2id.OPSLIMIT_INTERACTIVE, argon2id.MEMLIMIT_INTERACTIVE),
    "fast": (argon2id.OPSLIMIT_MIN, argon2id.MEMLIMIT_MIN),
}
DEFAULT_PRESET: Final = "moderate"

# Bounds accepted when parameters come from the store (an untrusted keyring header).
# Nothing this code writes is outside [MIN, SENSITIVE]; anything else is tampering, and a
# hostile server must not be able to make a client burn minutes or allocate 100 GiB.
OPSLIMIT_BOUNDS: Final = (argon2id.OPSLIMIT_MIN, argon2id.OPSLIMIT_SENSITIVE)
MEMLIMIT_BOUNDS: Final = (argon2id.MEMLIMIT_MIN, argon2id.MEMLIMIT_SENSITIVE)


@dataclass(frozen=True, slots=True)
class KdfParams:
    """Argon2id cost parameters and salt: everything needed to re-derive a KEK."""

    opslimit: int
    memlimit: int
    salt: bytes

    def __post_init__(self) -> None:
        if not isinstance(self.salt, bytes) or len(self.salt) != SALT_BYTES:
            raise ValueError(f"salt must be {SALT_BYTES} bytes")
        for name in ("opslimit", "memlimit"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ValueError(f"{name} must be a non-negative int")

    @classmethod
    def from_preset(cls, preset: str = DEFAULT_PRESET, salt: bytes | None = None) -> KdfParams:
        """Return the parameters of a named preset with ``salt`` (default: a fresh random one)."""
        try:
            opslimit, memlimit = PRESETS[preset]
        except KeyError:
            names = ", ".join(sorted(PRESETS))
            raise ValueError(f"unknown KDF preset {preset!r} (one of: {names})") from None
        return cls(opslimit, memlimit, os.urandom(SALT_BYTES) if salt is None else salt)

    def check_bounds(self) -> None:
        """Raise ``IntegrityError`` if these (untrusted) costs are outside what we write."""
        lo, hi = OPSLIMIT_BOUNDS
        if not lo <= self.opslimit <= hi:
            raise IntegrityError(f"keyring KDF opslimit {self.opslimit} outside [{lo}, {hi}]")
        lo, hi = MEMLIMIT_BOUNDS
        if not lo <= self.memlimit <= hi:
            raise IntegrityError(f"keyring KDF memlimit {self.memlimit} outside [{lo}, {hi}]")


def normalize_passphrase(passphrase: str | bytes) -> bytes:
    """Return the passphrase bytes Argon2id sees (NFC + UTF-8 for ``str``)."""
    if isinstance(passphrase, str):
        raw = unicodedata.normalize("NFC", passphrase).encode("utf-8")
    elif isinstance(passphrase, bytes | bytearray | memoryview):
        raw = bytes(passphrase)
    else:
        raise TypeError(f"passphrase must be str or bytes, not {type(passphrase).__name__}")
    if not raw:
        raise ValueError("passphrase must not be empty")
    return raw


def derive_kek(passphrase: str | bytes, params: KdfParams) -> bytes:
    """Return the 32-byte key-encryption key for ``passphrase`` under ``params``."""
    return argon2id.kdf(
        KEY_BYTES,
        normalize_passphrase(passphrase),
        params.salt,
        opslimit=params.opslimit,
        memlimit=params.memlimit,
    )

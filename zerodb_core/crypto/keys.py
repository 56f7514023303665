"""The key hierarchy: master keys -> per-epoch data keys -> one subkey per purpose.

Derivation (BLAKE2b-256 keyed, ``person`` = domain-separation label, all labels
distinct, so no two purposes can ever share a key)::

    master[e]             32 random bytes, one per epoch (from the keyring)
    data[e]             = BLAKE2b(u32be(e), key=master[e], person="zerodb:data:v1")
    subkey[e, purpose]  = BLAKE2b(b"",      key=data[e],   person=<purpose label>)
        "blob"          -> "zerodb:blob:v1"   XChaCha20-Poly1305 key of blobs sealed in e
        "opaque-name"   -> "zerodb:name:v1"   keyed hash turning names into opaque ids

Blob keys exist for every epoch (old blobs stay readable after a rotation; new blobs
use the current epoch). Opaque names are derived from the *first* epoch instead of the
current one: names the server sees (sequence counters, ...) must stay the same across
a rotation, or a rotation would silently reset ID counters. Dropping old epochs must
therefore keep the first one (or migrate the names).
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from types import MappingProxyType
from typing import Final, NoReturn

from zerodb_core.crypto._wire import length_prefixed

KEY_BYTES: Final = 32
MAX_EPOCH: Final = 0xFFFFFFFF

_DATA_PERSON: Final = b"zerodb:data:v1"
PURPOSES: Final[Mapping[str, bytes]] = MappingProxyType(
    {
        "blob": b"zerodb:blob:v1",
        "opaque-name": b"zerodb:name:v1",
    }
)
OPAQUE_NAME_BYTES: Final = 16  # 32 hex characters


def _kdf(key: bytes, person: bytes, message: bytes = b"") -> bytes:
    return hashlib.blake2b(message, digest_size=KEY_BYTES, key=key, person=person).digest()


def check_epoch(epoch: object) -> int:
    """Return ``epoch`` if it is an int in 1..2**32-1, else raise ``ValueError``."""
    if not isinstance(epoch, int) or isinstance(epoch, bool) or not 1 <= epoch <= MAX_EPOCH:
        raise ValueError(f"key epoch must be an int in 1..{MAX_EPOCH}, got {epoch!r}")
    return epoch


class KeyHierarchy:
    """Every key derived from a keyring's master keys; holds no master key itself.

    ``repr`` and ``str`` show epochs only, never key material.
    """

    __slots__ = ("_blob_keys", "_current", "_name_key")

    def __init__(self, masters: Mapping[int, bytes], current: int) -> None:
        if not masters:
            raise ValueError("a key hierarchy needs at least one master key")
        for epoch, master in masters.items():
            check_epoch(epoch)
            if not isinstance(master, bytes) or len(master) != KEY_BYTES:
                raise ValueError(f"master key of epoch {epoch} must be {KEY_BYTES} bytes")
        first = min(masters)
        blob_keys: dict[int, bytes] = {}
        for epoch, master in masters.items():
            data = _kdf(master, _DATA_PERSON, epoch.to_bytes(4, "big"))
            blob_keys[epoch] = _kdf(data, PURPOSES["blob"])
            if epoch == first:
                self._name_key = _kdf(data, PURPOSES["opaque-name"])
        if check_epoch(current) not in blob_keys:
            raise ValueError(f"current epoch {current} has no master key")
        self._blob_keys = blob_keys
        self._current = current

    @property
    def current_epoch(self) -> int:
        """The epoch new blobs are sealed under."""
        return self._current

    @property
    def epochs(self) -> tuple[int, ...]:
        """Every epoch whose blobs can be opened, ascending."""
        return tuple(sorted(self._blob_keys))

    def blob_key(self, epoch: int) -> bytes:
        """Return the blob encryption key of ``epoch``; ``KeyError`` if it is unknown."""
        return self._blob_keys[epoch]

    def opaque_name(self, purpose: str, name: str) -> str:
        """Return 32 hex characters naming ``name`` to the server without revealing it.

        ``purpose`` separates namespaces ("sequence", "model", ...): the same ``name``
        under two purposes gives unrelated strings. Deterministic and stable across
        key rotations (see module docstring).
        """
        if not purpose:
            raise ValueError("opaque_name needs a non-empty purpose")
        message = length_prefixed(purpose, name)
        return hashlib.blake2b(
            message, digest_size=OPAQUE_NAME_BYTES, key=self._name_key
        ).hexdigest()

    def __repr__(self) -> str:
        return f"<KeyHierarchy epochs={list(self.epochs)} current={self._current}>"

    __str__ = __repr__

    def __reduce__(self) -> NoReturn:
        raise TypeError("key material must not be pickled or copied out of process")

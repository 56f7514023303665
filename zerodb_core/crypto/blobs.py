"""The sealed blob format: every node, record and root the server stores.

Wire layout (all integers big-endian)::

    offset  size  field
    0       3     magic b"ZDB"
    3       1     format version (1)
    4       1     cipher suite (1 = XChaCha20-Poly1305-IETF)
    5       1     kind (BlobKind)
    6       4     key epoch (u32)
    10      16    blob id
    26      24    nonce (random per seal)
    50      ...   ciphertext of the padded payload, then the 16-byte tag

Associated data = bytes 0..26 (magic through blob id) + u16-length-prefixed UTF-8
tenant + u16-length-prefixed UTF-8 database. The server therefore cannot swap two
blobs, replay a blob under another id, or move it to another database or tenant: the
tag only verifies under the exact (kind, epoch, id, tenant, database) it was sealed for.

``open`` checks cheap, specific things first and decrypts last; nothing is unpadded,
let alone deserialised, before the tag verifies (fail closed).
"""

from __future__ import annotations

import hashlib
import os
import struct
from enum import IntEnum
from typing import Final

from nacl.bindings import (
    crypto_aead_xchacha20poly1305_ietf_decrypt,
    crypto_aead_xchacha20poly1305_ietf_encrypt,
)
from nacl.exceptions import CryptoError

from zerodb_core.crypto._wire import length_prefixed
from zerodb_core.crypto.keys import KeyHierarchy
from zerodb_core.crypto.padding import is_size_class, pad, unpad
from zerodb_core.exceptions import IntegrityError, UnknownEpochError


class BlobKind(IntEnum):
    """What a blob holds; sealed into the header so one kind cannot pass for another."""

    KEYRING = 1
    ROOT = 2
    NODE = 3
    RECORD = 4


MAGIC: Final = b"ZDB"
FORMAT_VERSION: Final = 1
SUITE_XCHACHA20POLY1305: Final = 1
SUITES: Final = frozenset({SUITE_XCHACHA20POLY1305})
BLOB_ID_BYTES: Final = 16
NONCE_BYTES: Final = 24
TAG_BYTES: Final = 16

HEADER: Final = struct.Struct(">3sBBBI16s")  # magic .. blob id: the authenticated header
HEADER_BYTES: Final = HEADER.size  # 26
CIPHERTEXT_OFFSET: Final = HEADER_BYTES + NONCE_BYTES  # 50
OVERHEAD: Final = CIPHERTEXT_OFFSET + TAG_BYTES  # 66: sealed size = OVERHEAD + size class


def new_blob_id() -> bytes:
    """Return a fresh random 128-bit blob id."""
    return os.urandom(BLOB_ID_BYTES)


def digest(sealed: bytes) -> bytes:
    """Return the unkeyed BLAKE2b-256 of a sealed blob (used for root freshness).

    It covers ciphertext only, so the server may know it; it reveals nothing the server
    does not already hold.
    """
    return hashlib.blake2b(sealed, digest_size=32).digest()


def _check_blob_id(blob_id: bytes) -> bytes:
    if not isinstance(blob_id, bytes) or len(blob_id) != BLOB_ID_BYTES:
        raise ValueError(f"blob id must be {BLOB_ID_BYTES} bytes")
    return blob_id


class BlobSealer:
    """Seal and open blobs of one (tenant, database) with a key hierarchy."""

    __slots__ = ("_aad_suffix", "_keys", "database", "tenant")

    def __init__(self, keys: KeyHierarchy, tenant: str, database: str) -> None:
        self._keys = keys
        self.tenant = tenant
        self.database = database
        self._aad_suffix = length_prefixed(tenant, database)

    def use_keys(self, keys: KeyHierarchy) -> None:
        """Seal and open with a newer key hierarchy (after a key epoch rotation)."""
        self._keys = keys

    def seal(self, kind: BlobKind, blob_id: bytes, payload: bytes) -> bytes:
        """Pad, encrypt and authenticate ``payload`` as blob ``blob_id`` of ``kind``."""
        kind = BlobKind(kind)
        epoch = self._keys.current_epoch
        header = HEADER.pack(
            MAGIC, FORMAT_VERSION, SUITE_XCHACHA20POLY1305, kind, epoch, _check_blob_id(blob_id)
        )
        nonce = os.urandom(NONCE_BYTES)
        ciphertext = crypto_aead_xchacha20poly1305_ietf_encrypt(
            pad(payload), header + self._aad_suffix, nonce, self._keys.blob_key(epoch)
        )
        return header + nonce + ciphertext

    def open(
        self,
        kind: BlobKind,
        blob_id: bytes,
        sealed: bytes,
        *,
        unknown_epoch: type[IntegrityError] = UnknownEpochError,
    ) -> bytes:
        """Return the payload of ``sealed``, which must be blob ``blob_id`` of ``kind``.

        Raise ``IntegrityError`` naming the first check that failed: length, magic,
        version, suite, kind, blob id, key epoch, authentication, padding.
        """
        kind = BlobKind(kind)
        _check_blob_id(blob_id)
        if type(sealed) is not bytes:
            # Never bytes(x): a hostile integer would become a request for x zero bytes.
            raise IntegrityError(f"blob {blob_id.hex()}: not bytes but {type(sealed).__name__}")
        size = len(sealed)
        if size < OVERHEAD or not is_size_class(size - OVERHEAD):
            raise IntegrityError(f"blob {blob_id.hex()}: length {size} is not a sealed size")
        magic, version, suite, got_kind, epoch, got_id = HEADER.unpack_from(sealed)
        if magic != MAGIC:
            raise IntegrityError(f"blob {blob_id.hex()}: bad magic {magic!r}")
        if version != FORMAT_VERSION:
            raise IntegrityError(f"blob {blob_id.hex()}: unknown format version {version}")
        if suite not in SUITES:
            raise IntegrityError(f"blob {blob_id.hex()}: unknown cipher suite {suite}")
        if got_kind != kind:
            raise IntegrityError(
                f"blob {blob_id.hex()}: kind {got_kind} where {kind.name} was expected"
            )
        if got_id != blob_id:
            raise IntegrityError(
                f"blob {blob_id.hex()}: header names blob {got_id.hex()} (swapped or moved)"
            )
        try:
            key = self._keys.blob_key(epoch)
        except KeyError:
            # UnknownEpochError lets the caller reload the keyring and try once more;
            # that second try passes IntegrityError: then it is a forged header.
            raise unknown_epoch(f"blob {blob_id.hex()}: unknown key epoch {epoch}") from None
        try:
            padded = crypto_aead_xchacha20poly1305_ietf_decrypt(
                sealed[CIPHERTEXT_OFFSET:],
                sealed[:HEADER_BYTES] + self._aad_suffix,
                sealed[HEADER_BYTES:CIPHERTEXT_OFFSET],
                key,
            )
        except CryptoError:
            raise IntegrityError(
                f"blob {blob_id.hex()}: authentication failed (tampered, moved to another "
                "database or tenant, or sealed with another key)"
            ) from None
        return unpad(padded)

    def __repr__(self) -> str:
        return f"<BlobSealer tenant={self.tenant!r} database={self.database!r}>"

"""Passphrase envelopes: a small plaintext sealed under a key derived from a passphrase.

The keyring (kept in the store) and the key file (kept on the client's disk) are both
such envelopes, told apart by their magic. Layout (all integers big-endian)::

    offset  size  field
    0       3     magic (b"ZDK" keyring, b"ZDF" key file)
    3       1     format version (1)
    4       1     cipher suite (1 = XChaCha20-Poly1305-IETF)
    5       1     KDF algorithm (1 = Argon2id v1.3)
    6       8     opslimit (u64)
    14      8     memlimit (u64, bytes)
    22      16    salt
    38      24    nonce
    62      ...   ciphertext, then the 16-byte tag

Associated data = the 62 header bytes + whatever the caller binds (the keyring: tenant,
database and user), so no header field can change without failing authentication.

The header is untrusted until the tag verifies, yet the KDF must run first: its costs are
bounds-checked before Argon2id runs (a hostile store must not make us allocate 100 GiB).
A failed tag raises ``WrongPassphraseError``: a wrong passphrase and a tampered envelope
are indistinguishable by design.
"""

from __future__ import annotations

import os
import struct
from typing import Final

from nacl.bindings import (
    crypto_aead_xchacha20poly1305_ietf_decrypt,
    crypto_aead_xchacha20poly1305_ietf_encrypt,
)
from nacl.exceptions import CryptoError

from zerodb_core.crypto.kdf import KdfParams, derive_kek
from zerodb_core.exceptions import IntegrityError, WrongPassphraseError

FORMAT_VERSION: Final = 1
SUITE_XCHACHA20POLY1305: Final = 1
KDF_ARGON2ID13: Final = 1
NONCE_BYTES: Final = 24
TAG_BYTES: Final = 16

HEADER: Final = struct.Struct(">3sBBBQQ16s24s")
HEADER_BYTES: Final = HEADER.size  # 62


def seal_envelope(
    magic: bytes, passphrase: str | bytes, params: KdfParams, plaintext: bytes, bound: bytes = b""
) -> bytes:
    """Seal ``plaintext`` under ``passphrase`` with ``params`` (fresh nonce), binding
    ``bound`` as extra associated data."""
    kek = derive_kek(passphrase, params)
    nonce = os.urandom(NONCE_BYTES)
    header = HEADER.pack(
        magic,
        FORMAT_VERSION,
        SUITE_XCHACHA20POLY1305,
        KDF_ARGON2ID13,
        params.opslimit,
        params.memlimit,
        params.salt,
        nonce,
    )
    ciphertext = crypto_aead_xchacha20poly1305_ietf_encrypt(plaintext, header + bound, nonce, kek)
    return header + ciphertext


def open_envelope(
    magic: bytes, sealed: bytes, passphrase: str | bytes, bound: bytes, *, what: str, wrong: str
) -> tuple[bytes, KdfParams]:
    """Return the plaintext and KDF parameters of an envelope, checking the header field
    by field (``IntegrityError`` naming ``what``) and the tag (``WrongPassphraseError``
    with the message ``wrong``). The caller has checked the length."""
    magic_, version, suite, kdf_alg, opslimit, memlimit, salt, nonce = HEADER.unpack_from(sealed)
    if magic_ != magic:
        raise IntegrityError(f"{what}: bad magic {magic_!r}")
    if version != FORMAT_VERSION:
        raise IntegrityError(f"{what}: unknown format version {version}")
    if suite != SUITE_XCHACHA20POLY1305:
        raise IntegrityError(f"{what}: unknown cipher suite {suite}")
    if kdf_alg != KDF_ARGON2ID13:
        raise IntegrityError(f"{what}: unknown KDF algorithm {kdf_alg}")
    params = KdfParams(opslimit, memlimit, salt)
    params.check_bounds()  # before Argon2id allocates anything
    kek = derive_kek(passphrase, params)
    try:
        plaintext = crypto_aead_xchacha20poly1305_ietf_decrypt(
            sealed[HEADER_BYTES:], sealed[:HEADER_BYTES] + bound, nonce, kek
        )
    except CryptoError:
        raise WrongPassphraseError(wrong) from None
    return plaintext, params

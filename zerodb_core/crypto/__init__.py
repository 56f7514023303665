"""Client-side cryptography: keys, the keyring and the sealed blob format.

Everything the server stores passes through here, and nothing the server returns is
decoded before this package has authenticated it.
"""

from zerodb_core.crypto.blobs import (
    BLOB_ID_BYTES,
    OVERHEAD,
    BlobKind,
    BlobSealer,
    digest,
    new_blob_id,
)
from zerodb_core.crypto.kdf import (
    DEFAULT_PRESET,
    PRESETS,
    KdfParams,
    derive_kek,
    normalize_passphrase,
)
from zerodb_core.crypto.keyring import Keyring, slot_name
from zerodb_core.crypto.keys import KeyHierarchy
from zerodb_core.crypto.padding import is_size_class, padded_size

__all__ = [
    "BLOB_ID_BYTES",
    "DEFAULT_PRESET",
    "OVERHEAD",
    "PRESETS",
    "BlobKind",
    "BlobSealer",
    "KdfParams",
    "KeyHierarchy",
    "Keyring",
    "derive_kek",
    "digest",
    "is_size_class",
    "new_blob_id",
    "normalize_passphrase",
    "padded_size",
    "slot_name",
]

"""The sealed blob format: round trips, padding classes, and every way to tamper."""

from __future__ import annotations

import os
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from nacl.bindings import sodium_pad, sodium_unpad

from zerodb_core.crypto import (
    OVERHEAD,
    BlobKind,
    BlobSealer,
    KeyHierarchy,
    digest,
    new_blob_id,
    padded_size,
)
from zerodb_core.crypto.blobs import HEADER_BYTES
from zerodb_core.crypto.padding import pad, unpad
from zerodb_core.exceptions import IntegrityError

MASTER = {1: bytes(range(32))}
KEYS = KeyHierarchy(MASTER, 1)
SEALER = BlobSealer(KEYS, "acme", "main")
BLOB_ID = bytes(range(100, 116))
SEALED = SEALER.seal(BlobKind.RECORD, BLOB_ID, b"hello, encrypted world")


def reference_class(length: int) -> int:
    """Size classes as documented, computed the slow obvious way."""
    classes = [256, 512, 1024, 2048, 4096, 8192, 16384]
    for size in classes:
        if length < size:
            return size
    size = 16384
    while size <= length:
        size += 16384
    return size


def rewrite(sealed: bytes, offset: int, value: bytes) -> bytes:
    return sealed[:offset] + value + sealed[offset + len(value) :]


@pytest.mark.parametrize("kind", list(BlobKind))
@pytest.mark.parametrize("size", [0, 1, 255, 256, 5000, 16383, 16384, 70000])
def test_round_trip_every_kind(kind, size):
    payload = os.urandom(size)
    blob_id = new_blob_id()
    sealed = SEALER.seal(kind, blob_id, payload)
    assert SEALER.open(kind, blob_id, sealed) == payload
    assert len(sealed) == OVERHEAD + reference_class(size)


def test_padding_sizes_are_the_classes():
    for length in [*range(0, 600), 16382, 16383, 16384, 32767, 32768, 100_000]:
        assert padded_size(length) == reference_class(length), length


def test_padding_hides_exact_length():
    a = SEALER.seal(BlobKind.NODE, new_blob_id(), b"x")
    b = SEALER.seal(BlobKind.NODE, new_blob_id(), b"x" * 200)
    assert len(a) == len(b) == OVERHEAD + 256


def test_nonces_differ_between_seals_of_the_same_payload():
    one = SEALER.seal(BlobKind.NODE, BLOB_ID, b"same")
    two = SEALER.seal(BlobKind.NODE, BLOB_ID, b"same")
    assert one[HEADER_BYTES : HEADER_BYTES + 24] != two[HEADER_BYTES : HEADER_BYTES + 24]
    assert one != two
    assert SEALER.open(BlobKind.NODE, BLOB_ID, one) == SEALER.open(BlobKind.NODE, BLOB_ID, two)


def test_new_blob_ids_are_random_128_bit():
    ids = {new_blob_id() for _ in range(100)}
    assert len(ids) == 100 and all(len(i) == 16 for i in ids)


def test_digest_is_blake2b_256_of_the_sealed_bytes():
    assert len(digest(SEALED)) == 32
    assert digest(SEALED) != digest(SEALED[:-1] + b"\0")


@settings(max_examples=300, deadline=None)
@given(position=st.integers(0, len(SEALED) - 1), bit=st.integers(0, 7))
def test_any_flipped_bit_is_rejected(position, bit):
    tampered = bytearray(SEALED)
    tampered[position] ^= 1 << bit
    with pytest.raises(IntegrityError):
        SEALER.open(BlobKind.RECORD, BLOB_ID, bytes(tampered))


def test_every_truncation_is_rejected():
    big = SEALER.seal(BlobKind.NODE, BLOB_ID, os.urandom(40000))
    for length in range(len(SEALED)):
        with pytest.raises(IntegrityError, match="length"):
            SEALER.open(BlobKind.RECORD, BLOB_ID, SEALED[:length])
    # Truncated exactly onto a smaller size class: the length passes, the tag does not.
    for size_class in [256, 512, 1024, 2048, 4096, 8192, 16384, 32768]:
        with pytest.raises(IntegrityError, match="authentication"):
            SEALER.open(BlobKind.NODE, BLOB_ID, big[: OVERHEAD + size_class])


def test_extended_blob_is_rejected():
    with pytest.raises(IntegrityError, match="length"):
        SEALER.open(BlobKind.RECORD, BLOB_ID, SEALED + b"\0")


def test_swapped_blobs_are_rejected():
    id_a, id_b = new_blob_id(), new_blob_id()
    sealed_b = SEALER.seal(BlobKind.NODE, id_b, b"B")
    with pytest.raises(IntegrityError, match="swapped or moved"):
        SEALER.open(BlobKind.NODE, id_a, sealed_b)


def test_blob_moved_to_another_id_with_rewritten_header_is_rejected():
    other = new_blob_id()
    moved = rewrite(SEALED, 10, other)
    with pytest.raises(IntegrityError, match="authentication"):
        SEALER.open(BlobKind.RECORD, other, moved)


@pytest.mark.parametrize(("tenant", "database"), [("acme", "other"), ("evil", "main")])
def test_blob_moved_to_another_database_or_tenant_is_rejected(tenant, database):
    with pytest.raises(IntegrityError, match="authentication"):
        BlobSealer(KEYS, tenant, database).open(BlobKind.RECORD, BLOB_ID, SEALED)


def test_length_prefixing_keeps_tenant_and_database_apart():
    a = BlobSealer(KEYS, "ab", "c").seal(BlobKind.NODE, BLOB_ID, b"x")
    with pytest.raises(IntegrityError):
        BlobSealer(KEYS, "a", "bc").open(BlobKind.NODE, BLOB_ID, a)


def test_wrong_kind_is_rejected():
    with pytest.raises(IntegrityError, match="kind"):
        SEALER.open(BlobKind.NODE, BLOB_ID, SEALED)


def test_kind_rewritten_in_header_fails_authentication():
    relabelled = rewrite(SEALED, 5, bytes([BlobKind.NODE]))
    with pytest.raises(IntegrityError, match="authentication"):
        SEALER.open(BlobKind.NODE, BLOB_ID, relabelled)


def test_bad_magic_is_rejected():
    with pytest.raises(IntegrityError, match="magic"):
        SEALER.open(BlobKind.RECORD, BLOB_ID, rewrite(SEALED, 0, b"ZDX"))


def test_unknown_version_is_rejected():
    with pytest.raises(IntegrityError, match="version"):
        SEALER.open(BlobKind.RECORD, BLOB_ID, rewrite(SEALED, 3, b"\x02"))


def test_unknown_suite_is_rejected():
    with pytest.raises(IntegrityError, match="suite"):
        SEALER.open(BlobKind.RECORD, BLOB_ID, rewrite(SEALED, 4, b"\x09"))


def test_unknown_epoch_is_rejected():
    with pytest.raises(IntegrityError, match="epoch"):
        SEALER.open(BlobKind.RECORD, BLOB_ID, rewrite(SEALED, 6, struct.pack(">I", 7)))


def test_wrong_key_is_rejected():
    other = BlobSealer(KeyHierarchy({1: os.urandom(32)}, 1), "acme", "main")
    with pytest.raises(IntegrityError, match="authentication"):
        other.open(BlobKind.RECORD, BLOB_ID, SEALED)


def test_rotated_hierarchy_reads_old_epochs_and_writes_the_new_one():
    rotated = KeyHierarchy({**MASTER, 2: os.urandom(32)}, 2)
    sealer = BlobSealer(rotated, "acme", "main")
    assert sealer.open(BlobKind.RECORD, BLOB_ID, SEALED) == b"hello, encrypted world"
    fresh = sealer.seal(BlobKind.RECORD, BLOB_ID, b"new")
    assert struct.unpack(">I", fresh[6:10]) == (2,)
    with pytest.raises(IntegrityError, match="epoch"):
        SEALER.open(BlobKind.RECORD, BLOB_ID, fresh)


def test_opaque_names_are_stable_separated_and_hex():
    name = KEYS.opaque_name("sequence", "main/Employee")
    assert len(name) == 32 and int(name, 16) >= 0
    assert name == KeyHierarchy(MASTER, 1).opaque_name("sequence", "main/Employee")
    assert name != KEYS.opaque_name("model", "main/Employee")
    assert name != KeyHierarchy({1: os.urandom(32)}, 1).opaque_name("sequence", "main/Employee")
    # Stable across rotation: server-side names (id counters) must not change.
    rotated = KeyHierarchy({**MASTER, 2: os.urandom(32)}, 2)
    assert rotated.opaque_name("sequence", "main/Employee") == name


def test_purpose_keys_are_distinct():
    keys = {KEYS.blob_key(1), KEYS._name_key, MASTER[1]}
    assert len(keys) == 3


def test_hierarchy_repr_hides_keys():
    text = repr(KEYS) + str(KEYS)
    assert MASTER[1].hex() not in text and "epochs=[1]" in text
    assert KEYS.blob_key(1).hex() not in text


def test_programmer_errors_are_value_errors():
    with pytest.raises(ValueError):
        SEALER.seal(BlobKind.NODE, b"short", b"")
    with pytest.raises(ValueError):
        SEALER.seal(99, BLOB_ID, b"")
    with pytest.raises(ValueError):
        KeyHierarchy({1: b"short"}, 1)
    with pytest.raises(ValueError):
        KeyHierarchy(MASTER, 2)


@pytest.mark.parametrize("size", [0, 1, 100, 255, 256, 4095, 16383, 16384, 40000])
def test_padding_is_byte_for_byte_libsodium_iso7816(size):
    payload = os.urandom(size)
    block = min(padded_size(size), 16384)
    assert pad(payload) == sodium_pad(payload, block)
    assert unpad(pad(payload)) == sodium_unpad(pad(payload), block) == payload


@pytest.mark.parametrize(
    "padded",
    [
        bytes(256),  # no marker
        b"\x01" * 256,  # no marker, no zeros
        b"x" * 100 + b"\x80" + bytes(155 + 256),  # canonical class is 256, not 512
        b"x" * 100 + b"\x80" + bytes(100),  # not a size class
    ],
)
def test_malformed_padding_is_rejected(padded):
    with pytest.raises(IntegrityError):
        unpad(padded)


def test_payload_may_end_in_zero_bytes():
    payload = b"abc" + bytes(300)
    assert SEALER.open(BlobKind.NODE, BLOB_ID, SEALER.seal(BlobKind.NODE, BLOB_ID, payload)) == (
        payload
    )


def test_bytes_like_payloads_seal_but_only_bytes_open():
    payload = bytearray(b"mutable")
    sealed = SEALER.seal(BlobKind.NODE, BLOB_ID, memoryview(payload))
    assert SEALER.open(BlobKind.NODE, BLOB_ID, sealed) == b"mutable"
    # What comes from the store must be bytes: never bytes(x) of a hostile value.
    for other in (memoryview(sealed), bytearray(sealed), 10**12, "text"):
        with pytest.raises(IntegrityError, match="not bytes"):
            SEALER.open(BlobKind.NODE, BLOB_ID, other)

"""The wrapped keyring: round trip, wrong passphrase, tampered or hostile headers."""

from __future__ import annotations

import copy
import struct

import nacl.pwhash.argon2id
import pytest

from zerodb_core.crypto import BlobKind, BlobSealer, KdfParams, Keyring, normalize_passphrase
from zerodb_core.crypto.keyring import HEADER_BYTES
from zerodb_core.exceptions import IntegrityError, WrongPassphraseError

WHERE = {"tenant": "acme", "database": "main", "name": "root"}
PASSPHRASE = "correct horse battery staple"


@pytest.fixture(scope="module")
def keyring() -> Keyring:
    return Keyring.create(kdf="fast")


@pytest.fixture(scope="module")
def sealed(keyring) -> bytes:
    return keyring.seal(PASSPHRASE, **WHERE)


def rewrite(sealed: bytes, offset: int, value: bytes) -> bytes:
    return sealed[:offset] + value + sealed[offset + len(value) :]


def test_round_trip(keyring, sealed):
    opened = Keyring.open(sealed, PASSPHRASE, **WHERE)
    assert opened.epochs == keyring.epochs == (1,)
    assert opened.current_epoch == 1
    assert opened._masters == keyring._masters
    assert opened.login_key is None


def test_round_trip_with_login_key_and_bytes_passphrase():
    keyring = Keyring.create(kdf="fast")
    keyring.login_key = b"\x01" * 32
    sealed = keyring.seal(b"\xffraw bytes", **WHERE)
    assert Keyring.open(sealed, b"\xffraw bytes", **WHERE).login_key == b"\x01" * 32


def test_passphrase_is_nfc_normalised():
    composed, decomposed = "caf\u00e9", "cafe\u0301"
    assert normalize_passphrase(composed) == normalize_passphrase(decomposed)
    # NFKC is deliberately not applied: fullwidth digits stay distinct.
    assert normalize_passphrase("\uff11") != normalize_passphrase("1")
    keyring = Keyring.create(kdf="fast")
    assert Keyring.open(keyring.seal(composed, **WHERE), decomposed, **WHERE).epochs == (1,)


def test_empty_passphrase_is_a_programmer_error(keyring):
    with pytest.raises(ValueError):
        keyring.seal("", **WHERE)


def test_wrong_passphrase(sealed):
    with pytest.raises(WrongPassphraseError, match="wrong passphrase"):
        Keyring.open(sealed, "wrong", **WHERE)


@pytest.mark.parametrize("field", ["tenant", "database", "name"])
def test_keyring_moved_elsewhere_does_not_open(sealed, field):
    with pytest.raises(WrongPassphraseError):
        Keyring.open(sealed, PASSPHRASE, **{**WHERE, field: "other"})


@pytest.mark.parametrize(
    ("offset", "value"),
    [
        (6, struct.pack(">Q", 2)),  # opslimit (still within bounds)
        (14, struct.pack(">Q", 16384)),  # memlimit (still within bounds)
        (22, b"\xaa" * 16),  # salt
        (38, b"\xbb" * 24),  # nonce
        (HEADER_BYTES + 5, b"\x00"),  # ciphertext
    ],
)
def test_tampered_header_fields(sealed, offset, value):
    with pytest.raises(IntegrityError):  # WrongPassphraseError is an IntegrityError
        Keyring.open(rewrite(sealed, offset, value), PASSPHRASE, **WHERE)


@pytest.mark.parametrize(
    ("offset", "value", "message"),
    [
        (0, b"ZDB", "magic"),
        (3, b"\x02", "version"),
        (4, b"\x02", "suite"),
        (5, b"\x02", "KDF algorithm"),
    ],
)
def test_malformed_header_is_an_integrity_error(sealed, offset, value, message):
    with pytest.raises(IntegrityError, match=message) as info:
        Keyring.open(rewrite(sealed, offset, value), PASSPHRASE, **WHERE)
    assert not isinstance(info.value, WrongPassphraseError)


@pytest.mark.parametrize("length", [0, 3, HEADER_BYTES, HEADER_BYTES + 100, -1])
def test_truncated_keyring_is_an_integrity_error(sealed, length):
    with pytest.raises(IntegrityError, match="length"):
        Keyring.open(sealed[:length], PASSPHRASE, **WHERE)


@pytest.mark.parametrize(
    ("offset", "value", "message"),
    [
        (14, struct.pack(">Q", 100 * 2**30), "memlimit"),  # 100 GiB
        (14, struct.pack(">Q", 2**64 - 1), "memlimit"),
        (14, struct.pack(">Q", 1024), "memlimit"),  # below libsodium's minimum
        (6, struct.pack(">Q", 10**9), "opslimit"),
        (6, struct.pack(">Q", 0), "opslimit"),
    ],
)
def test_hostile_kdf_params_are_refused_before_argon2_runs(
    sealed, monkeypatch, offset, value, message
):
    calls = []
    monkeypatch.setattr(nacl.pwhash.argon2id, "kdf", lambda *a, **k: calls.append((a, k)))
    with pytest.raises(IntegrityError, match=message) as info:
        Keyring.open(rewrite(sealed, offset, value), PASSPHRASE, **WHERE)
    assert not isinstance(info.value, WrongPassphraseError)
    assert calls == []


def test_rotation_keeps_old_epochs_readable():
    keyring = Keyring.create(kdf="fast")
    old = BlobSealer(keyring.hierarchy(), "acme", "main")
    blob = old.seal(BlobKind.RECORD, b"\x01" * 16, b"written in epoch 1")
    assert keyring.rotate() == 2
    reopened = Keyring.open(keyring.seal(PASSPHRASE, **WHERE), PASSPHRASE, **WHERE)
    assert reopened.epochs == (1, 2) and reopened.current_epoch == 2
    new = BlobSealer(reopened.hierarchy(), "acme", "main")
    assert new.open(BlobKind.RECORD, b"\x01" * 16, blob) == b"written in epoch 1"
    assert new.seal(BlobKind.RECORD, b"\x02" * 16, b"x")[6:10] == b"\x00\x00\x00\x02"


def test_reseal_keeps_costs_and_uses_fresh_salt(sealed):
    opened = Keyring.open(sealed, PASSPHRASE, **WHERE)
    again = opened.seal(PASSPHRASE, **WHERE)
    assert again[6:22] == sealed[6:22]  # same opslimit and memlimit
    assert again[22:38] != sealed[22:38]  # fresh salt


def test_master_keys_are_not_in_repr(keyring):
    text = repr(keyring) + str(keyring) + repr(keyring.hierarchy())
    for master in keyring._masters.values():
        assert master.hex() not in text and repr(master) not in text
    assert "epochs=[1]" in text


def test_keys_refuse_to_be_serialised_by_reduce(keyring):
    # __reduce__ is what pickle (banned here) and copy both go through.
    with pytest.raises(TypeError):
        copy.copy(keyring)
    with pytest.raises(TypeError):
        copy.deepcopy(keyring.hierarchy())


def test_moderate_is_the_default():
    params = KdfParams.from_preset()
    assert (params.opslimit, params.memlimit) == (
        nacl.pwhash.argon2id.OPSLIMIT_MODERATE,
        nacl.pwhash.argon2id.MEMLIMIT_MODERATE,
    )
    sealed = Keyring.create().seal(PASSPHRASE, **WHERE)  # runs Argon2id MODERATE once
    ops, mem = struct.unpack(">QQ", sealed[6:22])
    assert (ops, mem) == (params.opslimit, params.memlimit)


def test_unknown_preset_is_rejected():
    with pytest.raises(ValueError, match="preset"):
        KdfParams.from_preset("turbo")

"""The key file: a random login key wrapped under a passphrase, failing closed."""

from __future__ import annotations

import pytest
from coincurve import PrivateKey

from zerodb_core import IntegrityError, WrongPassphraseError
from zerodb_core.keyfile import KeyFile, main

PASS = "key file passphrase"


def test_round_trip_and_randomness(tmp_path):
    a, b = KeyFile.create("acme", "127.0.0.1:8001"), KeyFile.create("acme")
    assert a.login_key != b.login_key  # random, not derived from anything
    a.save(tmp_path / "k", PASS, kdf="fast")
    opened = KeyFile.load(tmp_path / "k", PASS)
    assert (opened.login_key, opened.tenant, opened.server) == (a.login_key, "acme", a.server)
    assert opened.public_key == PrivateKey(a.login_key).public_key.format()
    assert a.login_key.hex() not in repr(opened)
    with pytest.raises(FileExistsError):
        a.save(tmp_path / "k", PASS, kdf="fast")
    assert (tmp_path / "k").stat().st_mode & 0o777 == 0o600


def test_same_passphrase_gives_different_files():
    key = KeyFile.create("acme")
    assert key.seal(PASS, kdf="fast") != key.seal(PASS, kdf="fast")


def test_fails_closed():
    sealed = KeyFile.create("acme").seal(PASS, kdf="fast")
    with pytest.raises(WrongPassphraseError):
        KeyFile.open(sealed, "wrong")
    for i in (0, 5, 30, 50, len(sealed) - 1):
        tampered = bytearray(sealed)
        tampered[i] ^= 1
        with pytest.raises(IntegrityError):  # WrongPassphraseError is an IntegrityError
            KeyFile.open(bytes(tampered), PASS)
    with pytest.raises(IntegrityError):
        KeyFile.open(sealed[:40], PASS)
    raised = bytearray(sealed)
    raised[14:22] = (2**40).to_bytes(8, "big")  # memlimit of 1 TiB: refused before Argon2id
    with pytest.raises(IntegrityError):
        KeyFile.open(bytes(raised), PASS)


def test_command_prints_the_public_key(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("ZERODB_PASSPHRASE", PASS)
    out = tmp_path / "acme.key"
    assert main(["create", "--tenant", "acme", "--out", str(out), "--kdf", "fast"]) == 0
    public = capsys.readouterr().out.strip()
    assert bytes.fromhex(public) == KeyFile.load(out, PASS).public_key
    assert main(["create", "--tenant", "acme", "--out", str(out), "--kdf", "fast"]) == 1

"""How many times a commit that keeps meeting concurrent commits is replayed, and that
docs/settings.md says the same number (it said 16 while the code did 32).

A real second client commits just before every commit attempt of the first one (a
transport that lets it in first: every attempt then meets a newer root), so the first
one replays its transaction ``MAX_COMMIT_RETRIES`` times and gives up with
``ConflictError``, having committed nothing. The rival takes no part in commit leases
(as a client of an older version): the first client's lease cannot hold it back.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import zerodb_core.db as db_module
from blob_server.storage import MemoryStorage
from tests.core.hr import Employee
from zerodb_core import DB, ConflictError
from zerodb_core.db import MAX_COMMIT_RETRIES
from zerodb_core.transport import LocalTransport

SETTINGS = Path(__file__).resolve().parents[2] / "docs" / "settings.md"
PASSWORD = "retries passphrase"


class RivalFirst(LocalTransport):
    """A transport whose every commit attempt comes right after a rival's commit."""

    def __init__(self, storage: MemoryStorage) -> None:
        super().__init__(storage)
        self.rival: DB | None = None
        self.attempts = 0

    def _commit(self, database, **kwargs):
        if self.rival is not None:
            self.attempts += 1
            self.rival.add(Employee(name="rival", surname=f"r{self.attempts}", salary=1))
        return super()._commit(database, **kwargs)


def test_settings_md_states_the_number_of_retries_the_code_makes():
    row = re.search(r"^\| commit retries on conflict \| ([0-9,]+)\b", SETTINGS.read_text(), re.M)
    assert row is not None, "docs/settings.md lost its row on commit retries"
    assert int(row.group(1).replace(",", "")) == MAX_COMMIT_RETRIES == 32


def test_a_commit_that_always_meets_a_newer_root_gives_up_after_the_retries(monkeypatch):
    monkeypatch.setattr(db_module, "CONFLICT_BACKOFF_MAX", 0.0)  # no sleeping between
    storage = MemoryStorage()
    transport = RivalFirst(storage)
    victim = DB(transport, password=PASSWORD, kdf="fast")
    rival = DB(LocalTransport(storage, leases=False), password=PASSWORD, kdf="fast")
    victim.add(Employee(name="victim", surname="v0", salary=0))  # uncontested
    transport.rival = rival
    with pytest.raises(ConflictError, match=f"{MAX_COMMIT_RETRIES} times"):
        victim.add(Employee(name="victim", surname="v1", salary=0))
    assert transport.attempts == MAX_COMMIT_RETRIES
    transport.rival = None
    names = sorted(e.surname for e in victim[Employee].all())
    assert names == sorted(["v0", *(f"r{i}" for i in range(1, MAX_COMMIT_RETRIES + 1))])

"""Canary: no plaintext reaches the store file, in any encoding a leak would take.

Records carry random marker strings in every field, in the model and field names, in an
undeclared attribute, in a full-text field (so the markers also become index tokens), in
a unique index, and in a record large enough to spill to a blob of its own; salaries are
unique 62-bit integers. Then the bytes of everything the embedded store writes -- the
SQLite file, its write-ahead log and shared-memory index, and the freshness file -- are
searched for each marker as UTF-8, UTF-16 (both byte orders), base64 (standard and
URL-safe, at each of the three alignments the marker could have inside a larger encoded
buffer), hex (both cases) and, for the integers, decimal text, 8-byte big- and
little-endian (msgpack writes big-endian), and the index key encoding.

The scan runs twice: while the database is open and its commits still sit in the WAL
(SQLite has not checkpointed them into the main file), and after closing. The database
*name* is deliberately a marker too: the server must know it (it keys the rows), so it
*is* in the file, and finding it in the WAL (then in the main file) proves the scanner
reads what it claims to (a positive control).
"""

from __future__ import annotations

import base64
import secrets
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from zerodb_core import DB
from zerodb_core.encoding import encode_key
from zerodb_core.models import Field, Model, Text
from zerodb_core.query import Contains

N_RECORDS = 200
HEAD = 8  # every needle is at least this long; the scanner indexes needles by prefix
STORE_FILES = ("", "-wal", "-shm", ".fresh")


def marker(tag: str) -> str:
    """A fresh random word: lowercase letters and digits, so the tokenizer keeps it whole
    and casefolding leaves it as is; long enough that a chance match is out of reach."""
    return f"zq{tag}{secrets.token_hex(7)}"


def b64_fragments(raw: bytes) -> Iterator[bytes]:
    """The base64 characters determined by ``raw`` alone, at each byte alignment.

    Inside a larger buffer, ``raw`` may start 0, 1 or 2 bytes into a 3-byte group; the
    characters straddling its edges depend on the neighbours, so they are dropped.
    """
    for shift in range(3):
        encoded = base64.b64encode(bytes(shift) + raw + bytes(3))
        start = -(-8 * shift // 6)  # ceil: first character made of marker bits only
        end = 8 * (shift + len(raw)) // 6  # floor: last such character, exclusive
        fragment = encoded[start:end]
        yield fragment
        yield fragment.translate(bytes.maketrans(b"+/", b"-_"))  # URL-safe alphabet


def text_needles(text: str) -> dict[bytes, str]:
    raw = text.encode()
    needles = {
        raw: "utf-8",
        text.encode("utf-16-le"): "utf-16-le",
        text.encode("utf-16-be"): "utf-16-be",
        raw.hex().encode(): "hex",
        raw.hex().upper().encode(): "HEX",
    }
    needles.update(dict.fromkeys(b64_fragments(raw), "base64"))
    return {needle: f"{text!r} as {how}" for needle, how in needles.items()}


def int_needles(value: int) -> dict[bytes, str]:
    needles = text_needles(str(value))
    needles[value.to_bytes(8, "big")] = f"{value} as 8 bytes big-endian"
    needles[value.to_bytes(8, "little")] = f"{value} as 8 bytes little-endian"
    needles[encode_key(value)] = f"{value} as its index key"
    return needles


class Scanner:
    """Find any of many needles in a haystack in one pass.

    Thousands of ``needle in data`` searches over a megabyte take seconds; indexing the
    needles by their first ``HEAD`` bytes and sliding one window over the data takes one
    dictionary lookup per byte.
    """

    def __init__(self, needles: dict[bytes, str]) -> None:
        self.by_head: dict[bytes, list[tuple[bytes, str]]] = defaultdict(list)
        for needle, label in needles.items():
            assert len(needle) >= HEAD, f"needle too short to scan for: {label}"
            self.by_head[needle[:HEAD]].append((needle, label))

    def find(self, data: bytes) -> list[str]:
        by_head = self.by_head
        hits = []
        for i in range(len(data) - HEAD + 1):
            candidates = by_head.get(data[i : i + HEAD])
            if candidates:
                hits += [label for needle, label in candidates if data.startswith(needle, i)]
        return hits


@dataclass
class Canary:
    path: Path
    db: DB
    username: str
    password: str
    database: str
    secrets: dict[bytes, str] = field(default_factory=dict)  # needle -> what it reveals

    def files(self) -> dict[str, bytes]:
        out = {}
        for suffix in STORE_FILES:
            p = Path(str(self.path) + suffix)
            if p.exists():
                out[p.name] = p.read_bytes()
        return out

    def leaks(self, needles: dict[bytes, str]) -> list[str]:
        scanner = Scanner(needles)
        return [
            f"{name}: {hit}" for name, data in self.files().items() for hit in scanner.find(data)
        ]


@pytest.fixture
def canary(tmp_path) -> Iterator[Canary]:
    """A store full of markers, left open (its last commits still in the WAL)."""
    names = {role: marker(role[:2]) for role in ("name", "surname", "description", "pay", "uq")}
    model_name = "Zq" + secrets.token_hex(7)
    extra = marker("ex")  # an attribute the model does not declare (stored, not indexed)
    model = type(
        model_name,
        (Model,),
        {
            "__module__": __name__,
            names["name"]: Field(),
            names["surname"]: Field(),
            names["description"]: Text(),
            names["pay"]: Field(),
            names["uq"]: Field(unique=True),
        },
    )
    values: list[str] = []
    salaries: list[int] = []

    def record(words: int = 3):
        fields = {role: marker(role[:2]) for role in ("name", "surname", "uq")}
        fields["description"] = " ".join(marker("de") for _ in range(words))
        salary = secrets.randbits(62) | 1 << 61
        values.extend(fields.values())
        values.extend(fields["description"].split())
        salaries.append(salary)
        obj = model(**{names[role]: value for role, value in fields.items()})
        setattr(obj, names["pay"], salary)
        value = marker("xv")
        values.append(value)
        setattr(obj, extra, value)
        return obj

    c = Canary(
        path=tmp_path / "canary.zdb",
        db=None,  # type: ignore[arg-type]
        username=marker("user"),
        password=marker("pass"),
        database=marker("db"),
    )
    c.db = DB(
        f"sqlite:///{c.path}",
        username=c.username,
        password=c.password,
        database=c.database,
        kdf="fast",
        node_bytes=2048,
    )
    with c.db.transaction():
        c.db.add(*(record() for _ in range(N_RECORDS - 9)))
    for _ in range(8):  # separate commits: several roots and node versions in the WAL
        c.db.add(record())
    big = record(words=400)  # ~7 KiB: spills to a RECORD blob of its own
    c.db.add(big)
    changed = c.db[model].get(big.pk)
    setattr(changed, names["name"], marker("re"))
    values.append(getattr(changed, names["name"]))
    c.db.add(changed)  # an update: the old record version becomes garbage
    # Read back, so the freshness file is written and queries have run.
    word = getattr(big, names["description"]).split()[7]
    assert [o.pk for o in c.db[model].query(Contains(names["description"], word))] == [big.pk]
    assert len(c.db[model]) == N_RECORDS

    for text in [model_name, extra, *names.values(), *values]:
        c.secrets.update(text_needles(text))
    for salary in salaries:
        c.secrets.update(int_needles(salary))
    yield c
    c.db.close()


def test_scanner_finds_every_encoding():
    """The scanner is only as good as its needles: plant each one in noise and find it."""
    text, number = marker("t"), secrets.randbits(62) | 1 << 61
    for needles in (text_needles(text), int_needles(number)):
        scanner = Scanner(needles)
        for needle, label in needles.items():
            hay = secrets.token_bytes(1000) + needle + secrets.token_bytes(1000)
            assert label in scanner.find(hay)
    # A base64 fragment is found whatever the marker's alignment in the encoded buffer.
    for shift in range(3):
        encoded = base64.b64encode(secrets.token_bytes(30 + shift) + text.encode() + b"tail")
        assert Scanner(text_needles(text)).find(encoded), shift


def test_no_marker_before_checkpoint(canary):
    """While the DB is open, recent commits live only in the WAL: scan it too."""
    wal = Path(str(canary.path) + "-wal")
    assert wal.exists() and wal.stat().st_size > 100_000, "expected uncheckpointed commits"
    control = canary.leaks(text_needles(canary.database))
    assert any(hit.startswith(wal.name) for hit in control), "positive control: WAL not read?"
    assert canary.leaks(canary.secrets) == []


def test_no_marker_after_close(canary):
    canary.db.close()
    assert not Path(str(canary.path) + "-wal").exists()  # checkpointed into the main file
    assert any(
        hit.startswith(canary.path.name) for hit in canary.leaks(text_needles(canary.database))
    )
    assert canary.leaks(canary.secrets) == []


def test_passphrase_is_not_in_the_store(canary):
    assert canary.leaks(text_needles(canary.password)) == []
    canary.db.close()
    assert canary.leaks(text_needles(canary.password)) == []


def test_username_is_not_in_the_store(canary):
    """The username is the keyring slot's name; the server should see an opaque name.

    Found: it is stored as is (``keyrings.name``). See the report / threat model.
    """
    canary.db.close()
    assert canary.leaks(text_needles(canary.username)) == []

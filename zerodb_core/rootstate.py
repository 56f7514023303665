"""The root record: the one mutable thing of a database.

Its plaintext lists the runs of every log-structured tree (newest first), the catalog and
the text-index statistics, plus
``seq`` and the digest of the previous root so a client can tell a rollback or a fork
(see :mod:`zerodb_core.freshness`). It is sealed like every blob, with ``seq`` as its blob
id, so the server cannot serve an old root under a new sequence number.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from zerodb_core.btree import RunRef
from zerodb_core.exceptions import IntegrityError, NotSupportedError
from zerodb_core.schema import Catalog

# Format 2: every tree is a list of runs. Format 1 (one copy-on-write tree each, and a
# full-text index of one entry per posting) is not read: see parse_payload.
ROOT_FORMAT = 2


def root_blob_id(seq: int) -> bytes:
    """The blob id a root is sealed under: its sequence number."""
    return seq.to_bytes(16, "big")


@dataclass(frozen=True, slots=True)
class RootState:
    """An opened, verified root: what a snapshot reads from."""

    seq: int
    digest: bytes | None
    trees: dict[str, tuple[RunRef, ...]] = field(default_factory=dict)
    catalog: Catalog = field(default_factory=Catalog)
    text_stats: dict[str, tuple[int, int]] = field(default_factory=dict)
    time: float = 0.0


EMPTY_STATE = RootState(0, None)


def build_payload(
    seq: int,
    prev_digest: bytes | None,
    trees: dict[str, tuple[RunRef, ...]],
    catalog: Catalog,
    text_stats: dict[str, tuple[int, int]],
) -> dict[str, Any]:
    """Return the plaintext of a new root (empty trees are left out)."""
    return {
        "v": ROOT_FORMAT,
        "seq": seq,
        "prev": prev_digest,
        "time": time.time(),
        "trees": {name: [run.to_payload() for run in runs] for name, runs in trees.items() if runs},
        "catalog": catalog.to_payload(),
        "text": {name: list(v) for name, v in text_stats.items() if v[0]},
    }


def parse_payload(payload: Any, seq: int, digest: bytes) -> tuple[RootState, bytes | None]:
    """Check and unpack a root plaintext; return the state and the previous root's digest."""
    try:
        version = payload["v"]
        if version == 1:
            raise NotSupportedError(
                "this database was written in format 1 (copy-on-write trees, before the "
                "log-structured format 2 of this version): move its data with the version "
                "that wrote it (Django: manage.py dumpdata, then loaddata with this one)"
            )
        if version != ROOT_FORMAT or payload["seq"] != seq:
            raise IntegrityError(f"root record does not describe seq {seq}")
        prev = payload["prev"]
        if prev is not None and type(prev) is not bytes:
            raise TypeError
        trees = {
            str(name): tuple(RunRef.from_payload(run) for run in runs)
            for name, runs in payload["trees"].items()
        }
        if not all(trees.values()):
            raise TypeError
        text = {}
        for name, value in payload["text"].items():
            docs, total = value
            if type(docs) is not int or type(total) is not int:
                raise TypeError
            text[str(name)] = (docs, total)
        state = RootState(
            seq,
            digest,
            trees,
            Catalog.from_payload(payload["catalog"]),
            text,
            float(payload["time"]),
        )
    except (KeyError, TypeError, ValueError, AttributeError):
        raise IntegrityError("malformed root record") from None
    return state, prev

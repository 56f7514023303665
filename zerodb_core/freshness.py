"""Rollback and fork detection for root records.

The store could serve an old root (rollback: undo recent commits) or show different
clients different histories (fork). Every root names its ``seq`` and the digest of its
predecessor, so the client keeps the highest ``(seq, digest)`` it has seen per database,
in trusted storage of its own, and refuses anything that contradicts it.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import threading
from collections.abc import Iterator
from pathlib import Path

from zerodb_core.exceptions import FreshnessError


class FreshnessTracker:
    """Highest ``(seq, digest)`` seen per database; kept in memory (lost at exit)."""

    def __init__(self) -> None:
        self._seen: dict[str, tuple[int, bytes | None]] = {}
        self._lock = threading.Lock()

    def load(self) -> dict[str, tuple[int, bytes | None]]:
        return self._seen

    def save(self, seen: dict[str, tuple[int, bytes | None]]) -> None:
        self._seen = seen

    @contextlib.contextmanager
    def _exclusive(self) -> Iterator[None]:
        """Hold the tracker against other threads (and, for a file, other processes)."""
        with self._lock:
            yield

    def check(self, database: str, seq: int, digest: bytes | None, prev: bytes | None) -> None:
        """Accept the root ``(seq, digest)`` whose predecessor has digest ``prev``, or raise
        :class:`FreshnessError`; remember it when it is newer than what was seen."""
        with self._exclusive():
            seen = self.load()
            known = seen.get(database)
            if known is not None:
                known_seq, known_digest = known
                if seq < known_seq:
                    raise FreshnessError(
                        f"database {database!r}: store served root seq {seq}, but seq "
                        f"{known_seq} was already seen (rollback)"
                    )
                if seq == known_seq and digest != known_digest:
                    raise FreshnessError(
                        f"database {database!r}: two different roots with seq {seq} (fork)"
                    )
                if seq == known_seq + 1 and known_digest is not None and prev != known_digest:
                    raise FreshnessError(
                        f"database {database!r}: root seq {seq} does not follow the root "
                        f"seq {known_seq} seen before (fork)"
                    )
                if seq == known_seq:
                    return
            seen = dict(seen)
            seen[database] = (seq, digest)
            self.save(seen)


class FileFreshnessTracker(FreshnessTracker):
    """The same, kept in a small JSON file so a restarted process still knows.

    The file is replaced atomically (write, fsync, rename); it holds sequence numbers and
    digests of ciphertext, nothing secret.
    """

    def __init__(self, path: str | os.PathLike) -> None:
        super().__init__()
        self.path = Path(path)

    @contextlib.contextmanager
    def _exclusive(self) -> Iterator[None]:
        # Two processes on one store must not overwrite a newer seq with an older one:
        # read-compare-write happens under an advisory lock on a file beside it.
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self._lock, open(self.path.with_name(self.path.name + ".lock"), "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)

    def load(self) -> dict[str, tuple[int, bytes | None]]:
        try:
            raw = json.loads(self.path.read_text())
        except FileNotFoundError:
            return {}
        except (OSError, ValueError) as exc:
            raise FreshnessError(f"cannot read freshness file {self.path}: {exc}") from None
        try:
            return {
                db: (int(v["seq"]), bytes.fromhex(v["digest"]) if v["digest"] else None)
                for db, v in raw.items()
            }
        except (TypeError, KeyError, ValueError, AttributeError):
            raise FreshnessError(f"freshness file {self.path} is malformed") from None

    def save(self, seen: dict[str, tuple[int, bytes | None]]) -> None:
        data = {
            db: {"seq": seq, "digest": digest.hex() if digest else None}
            for db, (seq, digest) in seen.items()
        }
        tmp = self.path.with_name(self.path.name + ".tmp")
        with open(tmp, "w") as f:
            json.dump(data, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.path)

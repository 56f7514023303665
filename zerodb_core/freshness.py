"""Rollback and fork detection for root records.

The store could serve an old root (rollback: undo recent commits) or show different
clients different histories (fork). Every root names its ``seq`` and the digest of its
predecessor, so the client keeps the highest ``(seq, digest)`` it has seen per database,
in trusted storage of its own, and refuses anything that contradicts it.
"""

from __future__ import annotations

import fcntl
import json
import os
import threading
from pathlib import Path

from zerodb_core.exceptions import FreshnessError


class FreshnessTracker:
    """Highest ``(seq, digest)`` seen per database by this process; kept in memory.

    Checks compare against what *this process* has seen (plus, for a file, what earlier
    runs had seen when it started): another process on the same store may see a newer
    root at any moment, and a root this process read just before that is no rollback.
    """

    def __init__(self) -> None:
        self._seen: dict[str, tuple[int, bytes | None]] | None = None
        self._lock = threading.Lock()

    def load(self) -> dict[str, tuple[int, bytes | None]]:
        """What was seen before this process started (nothing, in memory)."""
        return {}

    def remember(self, database: str, seq: int, digest: bytes | None) -> None:
        """Keep a newly seen root for later runs (nothing to do in memory)."""

    def seen_seq(self, database: str) -> int | None:
        """The highest seq seen so far for ``database`` (None if none)."""
        with self._lock:
            if self._seen is None:
                self._seen = self.load()
            known = self._seen.get(database)
            return known[0] if known is not None else None

    def check(
        self,
        database: str,
        seq: int,
        digest: bytes | None,
        prev: bytes | None,
        *,
        floor: int | None = None,
    ) -> None:
        """Accept the root ``(seq, digest)`` whose predecessor has digest ``prev``, or raise
        :class:`FreshnessError`; remember it when it is newer than what was seen.

        ``floor`` is :meth:`seen_seq` taken just before the request that returned this
        root: a root older than what was seen *since* (another thread's commit landed
        meanwhile) but not older than ``floor`` was current when asked for; no rollback.
        """
        with self._lock:
            if self._seen is None:
                self._seen = self.load()
            known = self._seen.get(database)
            if known is not None:
                known_seq, known_digest = known
                if seq < known_seq and floor is not None and seq >= floor:
                    return
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
            self._seen[database] = (seq, digest)
            self.remember(database, seq, digest)


class FileFreshnessTracker(FreshnessTracker):
    """The same, kept in a small JSON file so a restarted process still knows.

    The file is read once, at the first check: it is the floor earlier runs (and other
    processes, before this one started) had reached. Newer roots are merged into it under
    an advisory lock, keeping the higher seq, and the file is replaced atomically (write,
    fsync, rename). It holds sequence numbers and digests of ciphertext, nothing secret.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        super().__init__()
        self.path = Path(path)

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

    def remember(self, database: str, seq: int, digest: bytes | None) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path.with_name(self.path.name + ".lock"), "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                seen = self.load()
                if seen.get(database, (-1, None))[0] >= seq:
                    return  # another process got further: keep the higher floor
                seen[database] = (seq, digest)
                self._write(seen)
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)

    def _write(self, seen: dict[str, tuple[int, bytes | None]]) -> None:
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

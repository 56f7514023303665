"""A least-recently-used cache of decrypted immutable blobs, bounded by bytes.

Blobs are write-once, so a cached node is never stale: the cache needs no invalidation,
only a bound. The bound is in bytes (the sealed size of each entry) because nodes vary
from a few hundred bytes to tens of KiB and an entry count would bound nothing useful.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Any

DEFAULT_CACHE_BYTES = 64 * 1024 * 1024


class BlobCache:
    """Map blob id -> decoded object, evicting the least recently used past ``max_bytes``.

    Thread-safe: one engine (and its cache) serves every thread of a Django process.
    """

    def __init__(self, max_bytes: int = DEFAULT_CACHE_BYTES) -> None:
        self.max_bytes = max_bytes
        self.bytes = 0
        self.hits = 0
        self.misses = 0
        self._entries: OrderedDict[bytes, tuple[Any, int]] = OrderedDict()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, blob_id: bytes) -> Any | None:
        """Return the cached object (counting a hit) or None (counting a miss)."""
        with self._lock:
            entry = self._entries.get(blob_id)
            if entry is None:
                self.misses += 1
                return None
            self._entries.move_to_end(blob_id)
            self.hits += 1
            return entry[0]

    def put(self, blob_id: bytes, obj: Any, size: int) -> None:
        """Remember ``obj`` as costing ``size`` bytes; evict old entries to stay bounded."""
        with self._lock:
            old = self._entries.pop(blob_id, None)
            if old is not None:
                self.bytes -= old[1]
            if size > self.max_bytes:
                return
            self._entries[blob_id] = (obj, size)
            self.bytes += size
            while self.bytes > self.max_bytes:
                _, (_, evicted) = self._entries.popitem(last=False)
                self.bytes -= evicted

    def clear(self) -> None:
        """Forget everything (counters are kept)."""
        with self._lock:
            self._entries.clear()
            self.bytes = 0

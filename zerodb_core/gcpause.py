"""Pausing Python's cyclic garbage collector while the engine builds many objects.

A bulk write makes millions of small containers (postings, keys, node lists) that live
until the commit. CPython's cyclic collector runs every few hundred allocations and
walks every container still alive, so each pass grows with everything already built: a
10,000-record commit on a 30,000-record table spent more than half its time collecting,
and the cost grew with the table. The engine's structures hold no reference cycles
(lists of bytes, tuples, dicts of them), so reference counting frees them all; the
collector is paused for the duration of such work and resumed after (once the last of
several threads doing it is done), as long-running services such as Instagram's do
around their own bulk work.
"""

from __future__ import annotations

import contextlib
import gc
import threading
from collections.abc import Iterator

_lock = threading.Lock()
_depth = 0
_was_enabled = False


@contextlib.contextmanager
def paused() -> Iterator[None]:
    """Run the block with the cyclic collector off (nested and threaded uses count)."""
    global _depth, _was_enabled
    with _lock:
        if _depth == 0:
            _was_enabled = gc.isenabled()
            gc.disable()
        _depth += 1
    try:
        yield
    finally:
        with _lock:
            _depth -= 1
            if _depth == 0 and _was_enabled:
                gc.enable()

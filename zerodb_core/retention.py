"""Tell a snapshot that outlived the garbage retention from a blob withheld.

A commit names the blobs it replaced as garbage, and the store deletes them once the
garbage retention has passed (``zerodb-server serve --garbage-retention``, 600 s by
default; ``DB.collect_garbage(retention=)`` in an embedded store). A transaction still
reading an older snapshot then meets missing blobs: an ordinary failure, fixed by
starting again on a new snapshot, that must not raise the tamper alarm
(``IntegrityError``) an operator pages on.

It can only happen when both hold:

1. the store's root has moved past the snapshot: garbage is named by later commits only;
2. the snapshot was taken at least the retention ago: the commit that named the blob
   came after the snapshot was known to be current, and the store waited the retention
   after that commit.

Anything else (a blob missing from the current root, or from a snapshot younger than the
retention) stays an ``IntegrityError``. A store that lies gains nothing from this rule: by
withholding blobs of old snapshots it does only what garbage collection does, and a blob
withheld from the current root is still caught, at the latest by the retry on a new
snapshot.
"""

from __future__ import annotations

import time

from zerodb_core.exceptions import MissingBlobError, SnapshotTooOldError, ZeroDBError
from zerodb_core.transport import Transport

#: Seconds by which a snapshot's age may be underestimated: it is measured from when the
#: client had the root in hand, while the store may have moved on while the answer (or a
#: change notice) was on its way.
CLOCK_SLACK = 1.0

#: The setting that widens the window, named by every ``SnapshotTooOldError``.
WIDEN = (
    "`zerodb-server serve --garbage-retention SECONDS` (embedded store: "
    "`DB.collect_garbage(retention=)`)"
)


def explain_missing(
    transport: Transport, database: str, seq: int, taken: float, error: MissingBlobError
) -> ZeroDBError:
    """Return the error a read of the snapshot at ``seq`` (in hand at ``taken``, a
    ``time.monotonic()``) should raise for ``error``: ``SnapshotTooOldError`` when the
    snapshot is older than the retention and the store's root has moved on (one root
    read, on this failure path only), else ``error`` itself."""
    age = time.monotonic() - taken
    retention = transport.garbage_retention
    if age + CLOCK_SLACK < retention:
        return error
    current = transport.get_root(database).seq
    if current <= seq:
        return error  # missing from the current root: withheld or lost
    return SnapshotTooOldError(
        f"the snapshot of {database!r} at seq {seq}, taken {age:.0f} s ago, is older than "
        f"the store's garbage retention ({retention:g} s) and the store is at seq "
        f"{current} now: blob {error.blob_id.hex()} it reads was replaced by a later "
        "commit and deleted. Start a new transaction (retry it); to let transactions "
        f"stay open longer, raise the retention: {WIDEN}"
    )

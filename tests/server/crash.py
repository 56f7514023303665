"""What the kill-and-restart tests share, on one Redis and on a Redis Cluster alike.

The deployment under test is ``aof_store`` (``tests/server/conftest.py``): a
``PrivateRedis`` or a ``LocalCluster``, both with ``kill``, ``start``, ``serve_args``,
``storage`` and ``node_clients``. After the crashes the tests check, besides the
records, that the books balance: once garbage collection has run as if every operation a
crash left open had timed out, the usage the storage reports is exactly what its nodes
hold. A commit aborted by a crash between its reservation and its root swap (the
cluster's two-slot commit) would otherwise keep counting against the tenant's quota, or
leave blobs nobody counts.
"""

from __future__ import annotations

import re
import time
from collections import defaultdict
from pathlib import Path

from blob_server.storage.cluster import OP_TIMEOUT
from blob_server.wire.storage import TenantUsage
from tests.server.test_server_e2e import ServerProcess

#: A blob key: ``zdb:{S}:b:<id>`` on one Redis, ``zdb:b:S:<id>`` on a cluster.
BLOB_KEY = re.compile(rb"zdb:(?:\{([0-9a-f]+)\}:b:|b:([0-9a-f]+):)[0-9a-f]+")

#: What a server logs when its storage failed a request or is re-sending a step.
OUTAGE = re.compile(rb"event=storage_unavailable|; retrying")


def server_on(store, tenants: Path, log: Path, *flags: str) -> ServerProcess:
    """``zerodb-server serve`` (not started) on ``store`` (``--redis`` or
    ``--redis-cluster``), with ``flags``."""
    server = ServerProcess("", tenants, log)
    at = server.args.index("--storage")
    server.args[at : at + 2] = store.serve_args()
    server.args += flags
    return server


def outages_logged(server: ServerProcess) -> int:
    """How often ``server`` met its storage's outage so far: a request answered
    unavailable, or (on a cluster, which re-sends idempotent steps for a while before
    giving up) a step being re-sent."""
    return len(OUTAGE.findall(server.log.read_bytes()))


def stored(store) -> tuple[dict[str, tuple[int, int]], int]:
    """What the nodes really hold: blobs and blob bytes per scope (labelled as
    ``usage(detail=True)`` labels them), and the bytes of roots and keyrings."""
    blobs: defaultdict[str, list[int]] = defaultdict(lambda: [0, 0])
    other = 0
    for client in store.node_clients():
        for key in client.scan_iter(count=1000):
            found = BLOB_KEY.fullmatch(key)
            if found:
                figures = blobs["tag:" + (found.group(1) or found.group(2)).decode()]
                figures[0] += 1
                figures[1] += client.strlen(key)
            elif key.endswith(b":root"):
                other += len(client.hget(key, "data") or b"")
            elif key.endswith(b":k"):
                other += sum(len(value) for value in client.hvals(key))
        client.close()
    return {label: (n, size) for label, (n, size) in blobs.items()}, other


def left_open(store) -> int:
    """Two-slot operations (a cluster's ``zdb:{S}:o``) and journal entries
    (``zdb:{T}:j``) that nobody finished yet: what a crash left for the collector."""
    count = 0
    for client in store.node_clients():
        for key in client.scan_iter(count=1000):
            if key.endswith((b":o", b":j")) and not BLOB_KEY.fullmatch(key):
                count += client.hlen(key)
        client.close()
    return count


def collect_as_if_timed_out(store, tenant: str) -> tuple[TenantUsage, int]:
    """Collect garbage with the storage's clock past ``OP_TIMEOUT`` (every operation a
    crash left open is aborted, every journal entry settled) and with no retention or
    staging timeout (all garbage and orphans go); return the tenant's usage then, after
    checking that it is what the nodes hold, and how many operations and journal entries
    were left open before. The deployment must hold this tenant only."""
    found_open = left_open(store)
    storage = store.storage(clock=lambda: time.time() + OP_TIMEOUT + 1)
    try:
        storage.collect_garbage(retention=0, staging_timeout=0)
        usage = storage.usage(tenant, detail=True)
    finally:
        storage.close()
    assert left_open(store) == 0, "the collection left operations open"
    per_scope, other = stored(store)
    counted = {d.label: (d.blobs, d.bytes) for d in usage.per_database if d.blobs or d.bytes}
    assert counted == per_scope, "the usage per database is not what is stored"
    assert usage.blobs == sum(n for n, _ in per_scope.values())
    assert usage.bytes == sum(size for _, size in per_scope.values()) + other
    assert all(d.garbage == 0 and d.staged == 0 for d in usage.per_database), usage
    return usage, found_open

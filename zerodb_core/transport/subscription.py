"""Root pushes: what the primary connection's subscriptions know of each database's root.

The first root read of a database on the primary connection is sent as ``subscribe`` +
``get_root`` pipelined (one round trip). From then on the server pushes
``[0, "root", {database, seq}]`` after every commit through it by another connection of
this tenant; pushes are read wherever they turn up: between answers inside an exchange,
and before every request and every ``known_root_seq`` question (a non-blocking look at
the socket). Per database the subscription keeps the highest seq it knows from pushes,
root reads and commit answers since it subscribed; the ``DB`` skips the root read while
it equals the root it last verified. The root seqs that pooled connections see (root
reads, commit answers) are folded in too, but only once the subscription is established:
one read elsewhere while it is under way may predate commits it missed.

Guarantee: a read reflects every commit whose push has arrived before the read began
(and every commit this client made). A commit by someone else whose acknowledgement has
reached them but whose push has not reached us yet may be missed by a read started in
that window (like any snapshot read taken a moment earlier); it is never missed once its
push has been read, and nothing older than a processed push is ever returned. A lost
connection drops every guarantee (``clear``: no subscription on a new connection until
the next root read subscribes again). A server started with pushes off, or whose feed of
other processes' commits is down, answers the subscription with ``subscribed: False``:
every query reads the root, and a root read at least ``RETRY_REFUSED`` seconds later
asks again in the same round trip (the feed may be back; the connection may live for
hours).
"""

from __future__ import annotations

import threading
import time

from blob_server.wire import protocol
from zerodb_core.transport.base import MAX_SEQ

#: Seconds after a refused subscription before a root read asks again.
RETRY_REFUSED = 30.0


class Subscriptions:
    """Per subscribed database, the highest root seq known since subscribing (None:
    subscription under way, nothing known yet), and the databases whose subscription the
    server refused. Thread-safe; its lock is never held during I/O."""

    def __init__(self) -> None:
        self._known: dict[str, int | None] = {}
        self._refused: dict[str, float] = {}  # database -> when (monotonic)
        self._lock = threading.Lock()
        self.pushes = 0  # pushes taken in

    def clear(self) -> None:
        """Forget everything: the primary connection was lost (a new one has no
        subscription)."""
        with self._lock:
            self._known.clear()
            self._refused.clear()

    def pushed(self, push: protocol.Push) -> None:
        """Take in a root push (ignored unless subscribed to its database)."""
        self.pushes += 1
        self.note(push.database, push.seq, pending=True)

    def note(self, database: str, seq: int, *, pending: bool = False) -> None:
        """Remember a root seq the store is known to have reached, if subscribed to
        ``database``. Only the subscribing root read itself, and the pushes taken in
        meanwhile (``pending``), may fill in an entry whose subscription is still under
        way: an older seq seen elsewhere must not stand for a root that commits made
        before the subscription took effect may already have replaced."""
        if type(seq) is not int or not 0 <= seq < MAX_SEQ:
            return
        with self._lock:
            if database not in self._known:
                return
            known = self._known[database]
            if known is None:
                if pending:
                    self._known[database] = seq
            else:
                self._known[database] = max(known, seq)

    def subscribed(self, database: str) -> bool:
        """Whether a subscription to ``database`` exists or is under way."""
        with self._lock:
            return database in self._known

    def known(self, database: str) -> int | None:
        """The highest root seq known for ``database`` (None: not subscribed, or nothing
        known yet)."""
        with self._lock:
            return self._known.get(database)

    def settled(self, database: str) -> bool:
        """Whether subscribing to ``database`` is over: established with a seq known, or
        refused. Then any connection may read its root."""
        with self._lock:
            return type(self._known.get(database)) is int or database in self._refused

    def begin(self, database: str) -> bool:
        """Start subscribing to ``database`` unless subscribed already, or refused less
        than ``RETRY_REFUSED`` seconds ago; return whether it started. The entry exists
        before the exchange so that a push arriving between its two answers is kept."""
        with self._lock:
            if database in self._known:
                return False
            refused = self._refused.get(database)
            if refused is not None and time.monotonic() - refused < RETRY_REFUSED:
                return False
            self._refused.pop(database, None)
            self._known[database] = None
            return True

    def abandon(self, database: str) -> None:
        """Forget a subscription whose exchange failed (the next root read tries again)."""
        with self._lock:
            self._known.pop(database, None)

    def refuse(self, database: str) -> None:
        """The server would not subscribe (pushes off, its feed down, an old server, or
        too many subscriptions): root reads of ``database`` read the root, and ask again
        after ``RETRY_REFUSED`` seconds."""
        with self._lock:
            self._known.pop(database, None)
            self._refused[database] = time.monotonic()

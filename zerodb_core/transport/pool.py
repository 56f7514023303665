"""The connections of one remote transport, and which thread uses which.

Threads sharing the transport run their requests at once on up to ``size``
connections. One is the *primary*: it alone subscribes and reads pushes
(``subscription``), and a thread uses it whenever it is free, so a single thread always
does. A thread that finds it busy takes a free pooled connection, or a new one (opened
lazily by the transport, logged in with the same key and held to the same server id)
while fewer than ``size`` exist, or waits for one; it keeps it for one exchange. A
failed pooled connection is closed and reopened on its next use.
"""

from __future__ import annotations

import threading

from zerodb_core.transport.connection import Connection


class ConnectionPool:
    """The primary connection (guarded by ``lock``, held for a whole exchange and for a
    subscribing root read) and up to ``size - 1`` pooled ones."""

    def __init__(self, primary: Connection, size: int) -> None:
        self.primary = primary
        self.size = size
        self.lock = threading.RLock()
        self._free: list[Connection] = []
        self._pooled = 0  # pooled connections that exist, free or taken
        self._cond = threading.Condition(threading.Lock())
        self._epoch = 0  # close() calls so far: a pooled socket older than the last is closed

    def take(self) -> Connection:
        """The primary connection if it is free (or this thread holds it already), else a
        free pooled one, else a new pooled one (connected when first used) while fewer
        than ``size - 1`` exist; else wait for one. Give it back with ``give``."""
        if self.size == 1:
            self.lock.acquire()
            return self.primary
        while True:
            if self.lock.acquire(blocking=False):
                return self.primary
            with self._cond:
                if self._free:
                    return self._free.pop()
                if self._pooled < self.size - 1:
                    self._pooled += 1
                    return Connection(self._epoch)
                # Woken when a pooled connection comes back; the timeout looks at the
                # primary again (its lock cannot notify).
                self._cond.wait(0.05)

    def give(self, conn: Connection) -> None:
        """Give back a connection from ``take``."""
        if conn is self.primary:
            self.lock.release()
            with self._cond:
                self._cond.notify()
            return
        with self._cond:
            if conn.epoch != self._epoch:  # taken before close(): close it now
                conn.drop()
                conn.epoch = self._epoch
            self._free.append(conn)
            self._cond.notify()

    def close(self) -> None:
        """Close every connection (those in use as they come back); each is opened again
        when next used."""
        with self._cond:
            self._epoch += 1
            for conn in self._free:
                conn.drop()
                conn.epoch = self._epoch
        with self.lock:
            self.primary.drop()

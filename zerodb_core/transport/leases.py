"""Commit leases of embedded stores: whose turn it is to commit, among the clients (threads,
processes) that share one store without a blob server between them.

The blob server keeps its lease table in its process (``blob_server.leases``, which says
why leases exist). An embedded store has no such process, so its clients coordinate
directly:

* ``memory://`` lives in one process: ``ThreadLeases``, a FIFO per database behind a
  ``threading.Condition``, shared by every transport on the same ``MemoryStorage``.
* an SQLite file may be shared by processes: ``FileLeases``, two OS file locks beside it
  (``flock``, released by the kernel when a process dies, however it dies).
  ``<store>.lease`` is the lease itself (exclusive); ``<store>.queue`` is held shared by
  every client that waits for the lease or holds it, so a client about to commit sees
  with one non-blocking try whether anybody queues (then it queues too instead of
  racing). One lease covers every database of the file. Waiters poll the lease (at short,
  growing intervals): ``flock`` cannot wait with a timeout. The kernel does not hand the lease over
  in arrival order; every waiter polls alike, and the client that just committed must
  queue behind them like anyone else, so turns are shared evenly, if not in strict order.

Both bound a turn: a holder that keeps the lease longer than ``timeout`` seconds (it hangs)
no longer makes others wait (``ThreadLeases`` passes the lease on; a file lock cannot be
taken from a live process, so ``FileLeases`` waiters stop waiting for it and race, as
without leases, until it lets go). A waiter whose turn does not come within ``wait``
seconds races too. Racing is always safe: leases only decide who retries when, and the
storage's compare-and-swap decides every commit.
"""

from __future__ import annotations

import abc
import contextlib
import logging
import os
import struct
import threading
import time
from collections import deque
from dataclasses import dataclass, field

try:
    import fcntl
except ImportError:  # Windows: SQLite files get no commit leases there
    fcntl = None  # type: ignore[assignment]

#: Whether this platform has file locks, and SQLite files commit leases.
FILE_LOCKS = fcntl is not None

#: A holder that keeps the lease longer than this (seconds) stops making others wait.
LEASE_TIMEOUT = 2.0
#: A waiter waits at most this long (seconds) for its turn, then races.
LEASE_WAIT = 10.0
#: How often a waiter for a file lease tries it: from the first to the last, doubling.
POLL_FIRST = 0.0001
POLL_MAX = 0.001

_STAMP = struct.Struct(">d")  # when the holder took the file lease (time.time())
logger = logging.getLogger(__name__)


class LocalLeases(abc.ABC):
    """The commit leases of one embedded store (see the module docstring)."""

    def __init__(self, *, timeout: float = LEASE_TIMEOUT, wait: float = LEASE_WAIT) -> None:
        self.timeout = timeout
        self.wait = wait

    @abc.abstractmethod
    def busy(self, database: str, token: object | None) -> bool:
        """Whether a commit to ``database`` by the holder of ``token`` (None: no lease)
        must wait for its turn: somebody else holds the lease or queues for it."""

    @abc.abstractmethod
    def acquire(self, database: str) -> object | None:
        """Queue for the lease of ``database`` and wait for it (at most ``wait`` seconds);
        return the token that holds it, or None."""

    @abc.abstractmethod
    def release(self, database: str, token: object) -> None:
        """Give the lease back (a no-op if ``token`` does not hold it)."""

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release what the leases hold open (files)."""


@dataclass(slots=True)
class _Turns:
    holder: object | None = None
    since: float = 0.0  # time.monotonic() when the holder got the lease
    waiting: deque[object] = field(default_factory=deque)


class ThreadLeases(LocalLeases):
    """Leases of a store in this process: a FIFO of waiters per database."""

    def __init__(self, *, timeout: float = LEASE_TIMEOUT, wait: float = LEASE_WAIT) -> None:
        super().__init__(timeout=timeout, wait=wait)
        self._cond = threading.Condition()
        self._turns: dict[str, _Turns] = {}

    def busy(self, database: str, token: object | None) -> bool:
        with self._cond:
            turns = self._turns.get(database)
            if turns is None or turns.holder is None or turns.holder is token:
                return False
            self._expire(database, turns)
            return turns.holder is not None and turns.holder is not token

    def acquire(self, database: str) -> object | None:
        token = object()
        with self._cond:
            turns = self._turns.setdefault(database, _Turns())
            turns.waiting.append(token)
            self._advance(turns)
            deadline = time.monotonic() + self.wait
            while turns.holder is not token:
                self._expire(database, turns)
                if turns.holder is token:
                    break
                now = time.monotonic()
                if now >= deadline:
                    turns.waiting.remove(token)
                    self._tidy(database, turns)
                    return None
                self._cond.wait(min(deadline, turns.since + self.timeout) - now)
            return token

    def release(self, database: str, token: object) -> None:
        with self._cond:
            turns = self._turns.get(database)
            if turns is not None and turns.holder is token:
                turns.holder = None
                self._advance(turns)
                self._tidy(database, turns)
                self._cond.notify_all()

    def _advance(self, turns: _Turns) -> None:
        if turns.holder is None and turns.waiting:
            turns.holder = turns.waiting.popleft()
            turns.since = time.monotonic()

    def _expire(self, database: str, turns: _Turns) -> None:
        """Pass the lease on if its holder kept it past the timeout."""
        if turns.holder is not None and time.monotonic() - turns.since >= self.timeout:
            turns.holder = None
            self._advance(turns)
            self._tidy(database, turns)
            self._cond.notify_all()

    def _tidy(self, database: str, turns: _Turns) -> None:
        if turns.holder is None and not turns.waiting:
            self._turns.pop(database, None)


@dataclass(slots=True, eq=False)
class _FileHold:
    """A held file lease: the two descriptors whose locks make it."""

    queue_fd: int
    lease_fd: int
    held: bool = True


class FileLeases(LocalLeases):
    """Leases of an SQLite file shared by processes: ``flock`` on two files beside it."""

    def __init__(
        self, store_path: str, *, timeout: float = LEASE_TIMEOUT, wait: float = LEASE_WAIT
    ) -> None:
        if fcntl is None:
            raise OSError("file locks (fcntl) are not available on this platform")
        super().__init__(timeout=timeout, wait=wait)
        self.lease_path = f"{store_path}.lease"
        self.queue_path = f"{store_path}.queue"
        self._local = threading.local()  # per thread: (pid, queue fd, lease fd) to probe
        self._probes: list[int] = []
        self._probes_lock = threading.Lock()
        self._warned = False

    def _open(self, path: str) -> int:
        # Created like SQLite's own -wal and -shm files: whoever may use the store may
        # use its locks (the umask applies); they hold a time, nothing else.
        return os.open(path, os.O_RDWR | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), 0o666)

    def _unusable(self, exc: OSError) -> None:
        """Locks that cannot be opened or taken (a read-only directory, another user's
        files, a file system without ``flock``): this client races, as without leases."""
        if not self._warned:
            self._warned = True
            logger.warning(
                "commit leases of %s are off for this client (%s): it races other writers",
                self.lease_path,
                exc,
            )

    def _probe(self) -> tuple[int, int] | None:
        """This thread's descriptors for looking at the locks (reopened after a fork:
        a forked child shares its parent's open files, locks included); None when the
        lock files cannot be opened."""
        probe = getattr(self._local, "probe", None)
        if probe is not None and probe[0] == os.getpid():
            return probe[1], probe[2]
        try:
            queue_fd = self._open(self.queue_path)
        except OSError as exc:
            self._unusable(exc)
            return None
        try:
            lease_fd = self._open(self.lease_path)
        except OSError as exc:
            os.close(queue_fd)
            self._unusable(exc)
            return None
        self._local.probe = (os.getpid(), queue_fd, lease_fd)
        with self._probes_lock:
            self._probes += [queue_fd, lease_fd]
        return queue_fd, lease_fd

    def busy(self, database: str, token: object | None) -> bool:
        if isinstance(token, _FileHold) and token.held:
            return False
        fds = self._probe()
        if fds is None:
            return False
        queue_fd, lease_fd = fds
        try:
            fcntl.flock(queue_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:  # somebody waits for the lease or holds it
            return not self._overstayed(lease_fd)
        except OSError as exc:
            self._unusable(exc)
            return False
        fcntl.flock(queue_fd, fcntl.LOCK_UN)
        return False

    def _overstayed(self, lease_fd: int) -> bool:
        """Whether the lease is held by a client that took it over ``timeout`` ago."""
        stamp = os.pread(lease_fd, _STAMP.size, 0)
        if len(stamp) < _STAMP.size:
            return False
        since: float = _STAMP.unpack(stamp)[0]
        return since > 0 and time.time() - since > self.timeout

    def acquire(self, database: str) -> object | None:
        fds: list[int] = []
        try:
            fds.append(self._open(self.queue_path))
            fcntl.flock(fds[0], fcntl.LOCK_SH)  # a probe holds it exclusively for an instant
            fds.append(self._open(self.lease_path))
            if not self._wait_for(fds[1]):
                for fd in fds:
                    os.close(fd)
                return None
            os.pwrite(fds[1], _STAMP.pack(time.time()), 0)
        except OSError as exc:
            for fd in fds:
                os.close(fd)
            self._unusable(exc)
            return None
        except BaseException:
            for fd in fds:
                os.close(fd)
            raise
        return _FileHold(fds[0], fds[1])

    def _wait_for(self, lease_fd: int) -> bool:
        """Take the lease, polling; False when the wait ran out or its holder overstayed."""
        deadline = time.monotonic() + self.wait
        delay = POLL_FIRST
        while True:
            try:
                fcntl.flock(lease_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return True
            except BlockingIOError:
                pass
            if time.monotonic() >= deadline or self._overstayed(lease_fd):
                return False
            time.sleep(delay)
            delay = min(delay * 2, POLL_MAX)

    def release(self, database: str, token: object) -> None:
        if not isinstance(token, _FileHold) or not token.held:
            return
        token.held = False
        try:
            os.pwrite(token.lease_fd, _STAMP.pack(0.0), 0)
        finally:
            os.close(token.lease_fd)  # closing drops the locks
            os.close(token.queue_fd)

    def close(self) -> None:
        with self._probes_lock:
            probes, self._probes = self._probes, []
        for fd in probes:
            with contextlib.suppress(OSError):
                os.close(fd)

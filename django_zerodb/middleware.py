"""``RoundTripsMiddleware``: how many round trips to the encrypted store each request took.

Round trips are the unit of cost of this backend (every one is a request to the store,
over the network for a blob server), so the admin's "Encrypted store" page shows them for
the last requests. Add the middleware near the top of ``MIDDLEWARE``::

    MIDDLEWARE = [
        "django_zerodb.middleware.RoundTripsMiddleware",
        "django.middleware.security.SecurityMiddleware",
        ...
    ]

Each request leaves a :class:`RequestRecord` (method, path without the query string,
status, round trips, milliseconds) in a bounded in-memory deque of this process
(``settings.ZERODB_RECENT_REQUESTS``, default 100 records); :func:`recent_requests` reads
it. Nothing is written anywhere, and no query string is kept (it may hold search terms).

What is counted: the round trips of the engines that the request's connections use (the
engine is shared by every thread of the process, one per store). While requests overlap
in other threads (a threaded ``runserver``, a multi-threaded WSGI server) their round
trips land in the same counters, so such a record is marked ``concurrent`` and its count
is an upper bound. Opening an engine for the first time (unlocking the keyring) is not
counted. A request that never touches the encrypted database costs nothing: no engine is
opened for it.
"""

from __future__ import annotations

import datetime
import itertools
import threading
import time
from collections import deque
from dataclasses import dataclass, field

from django.conf import settings
from django.db import connections
from django.db.backends.signals import connection_created

DEFAULT_SIZE = 100


@dataclass(slots=True)
class RequestRecord:
    """One request as the store saw it."""

    method: str
    path: str
    status: int | None
    round_trips: int
    ms: float
    at: datetime.datetime
    concurrent: bool = False


@dataclass(slots=True)
class _Tracking:
    """What one request in progress has seen: engines and their counters at the start."""

    engines: dict[int, tuple[object, int]] = field(default_factory=dict)
    concurrent: bool = False

    def add(self, engine) -> None:
        key = id(engine)
        if key not in self.engines:
            self.engines[key] = (engine, _round_trips(engine))

    def round_trips(self) -> int:
        return sum(_round_trips(engine) - start for engine, start in self.engines.values())


_local = threading.local()
_lock = threading.Lock()
_active: dict[int, _Tracking] = {}
_ids = itertools.count()
_records: deque[RequestRecord] | None = None


def _round_trips(engine) -> int:
    return engine.transport.counters.round_trips


def _log() -> deque[RequestRecord]:
    global _records
    size = int(getattr(settings, "ZERODB_RECENT_REQUESTS", DEFAULT_SIZE))
    with _lock:
        if _records is None or _records.maxlen != size:
            _records = deque(_records or (), maxlen=size)
        return _records


def recent_requests(limit: int | None = 20) -> list[RequestRecord]:
    """The last ``limit`` requests recorded by this process, newest first."""
    records = list(_log())
    records.reverse()
    return records if limit is None else records[:limit]


def clear() -> None:
    """Forget every record (tests)."""
    _log().clear()


def _encrypted_aliases() -> list[str]:
    return [
        alias
        for alias, entry in settings.DATABASES.items()
        if entry.get("ENGINE") == "django_zerodb"
    ]


def _on_connection_created(sender, connection, **kwargs) -> None:
    """A connection opened during a tracked request: count its engine from now on."""
    tracking = getattr(_local, "tracking", None)
    if tracking is not None and connection.vendor == "zerodb":
        tracking.add(connection.connection.engine)


connection_created.connect(_on_connection_created, dispatch_uid="django_zerodb.round_trips")


class RoundTripsMiddleware:
    """Record the encrypted store's round trips of every request (see the module doc)."""

    def __init__(self, get_response) -> None:
        self.get_response = get_response

    def __call__(self, request):
        tracking = _Tracking()
        for alias in _encrypted_aliases():
            session = connections[alias].connection  # this thread's, if open already
            if session is not None and not getattr(session, "closed", False):
                tracking.add(session.engine)
        token = next(_ids)
        with _lock:
            if _active:
                tracking.concurrent = True
                for other in _active.values():
                    other.concurrent = True
            _active[token] = tracking
        _local.tracking = tracking
        started = time.perf_counter()
        status = None
        try:
            response = self.get_response(request)
            status = response.status_code
            return response
        finally:
            _local.tracking = None
            with _lock:
                _active.pop(token, None)
            _log().append(
                RequestRecord(
                    method=request.method,
                    path=request.path,
                    status=status,
                    round_trips=tracking.round_trips(),
                    ms=round((time.perf_counter() - started) * 1000, 1),
                    at=datetime.datetime.now(datetime.UTC),
                    concurrent=tracking.concurrent,
                )
            )

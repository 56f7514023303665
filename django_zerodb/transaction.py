"""Running Django code again when its commit is refused as a serialization failure.

At ``OPTIONS["ISOLATION_LEVEL"]`` ``"repeatable read"`` or ``"serializable"``, a
transaction that would overwrite (or, serializable, that read) something a concurrent
commit changed fails with :class:`~django_zerodb.exceptions.SerializationError`, a
``django.db.OperationalError``, as PostgreSQL's SQLSTATE 40001 does. The remedy is to
run the whole transaction again on the newer data::

    from django_zerodb.transaction import retry_on_conflict

    @retry_on_conflict(using="encrypted")
    def raise_salary(pk, amount):
        employee = Employee.objects.get(pk=pk)
        employee.salary += amount
        employee.save()

The function runs in ``transaction.atomic(using=...)``; inside an atomic block already,
it just runs (only the outermost block commits, so only it can retry).

A block of code rather than a function (Python cannot run a ``with`` block twice, so
each attempt is a block of its own; tenacity's ``for attempt in Retrying()`` shape)::

    for attempt in conflict_attempts(using="encrypted"):
        with attempt:
            employee = Employee.objects.get(pk=pk)
            employee.salary += amount
            employee.save()
"""

from __future__ import annotations

import functools
import random
import time
from collections.abc import Callable
from typing import Any

from django.db import connections, transaction

from django_zerodb.exceptions import SerializationError

#: Runs after the first, and the first wait's bound (doubled each time, up to the last).
RETRIES = 10
FIRST_BACKOFF = 0.002
MAX_BACKOFF = 0.256


def retry_on_conflict[T](
    func: Callable[..., T] | None = None,
    *,
    using: str | None = None,
    retries: int = RETRIES,
) -> Any:
    """Decorate ``func`` to run in ``transaction.atomic(using=using)``, and again (after a
    short random wait) when it raises ``SerializationError``, up to ``retries`` more
    times; then the error propagates. ``func`` must be safe to run again (mail sent
    from it would go once per attempt: use ``transaction.on_commit``)."""
    if func is None:
        return functools.partial(retry_on_conflict, using=using, retries=retries)

    @functools.wraps(func)
    def run(*args: Any, **kwargs: Any) -> T:
        if connections[using or "default"].in_atomic_block:
            return func(*args, **kwargs)
        for attempt in conflict_attempts(using=using, retries=retries):
            with attempt:
                result = func(*args, **kwargs)
        return result

    return run


class Attempt:
    """One run of a block in ``transaction.atomic``; a ``SerializationError`` at its end
    is kept (not raised) while attempts are left, and the loop runs the block again."""

    def __init__(self, using: str | None, last: bool) -> None:
        self.atomic = transaction.atomic(using=using)
        self.last = last
        self.failed = False

    def __enter__(self) -> Attempt:
        self.atomic.__enter__()
        return self

    def __exit__(self, exc_type: Any, exc: Any, traceback: Any) -> bool:
        try:
            self.atomic.__exit__(exc_type, exc, traceback)
        except SerializationError:
            if self.last:
                raise
            self.failed = True
            return True  # the commit was refused: swallowed, run again
        if exc_type is not None and issubclass(exc_type, SerializationError) and not self.last:
            self.failed = True
            return True
        return False


def conflict_attempts(*, using: str | None = None, retries: int = RETRIES):
    """Yield attempts (context managers) until one commits without a
    ``SerializationError``, at most ``retries + 1`` of them, waiting a short random time
    between them; the last one's error propagates."""
    for attempt in range(retries + 1):
        current = Attempt(using, last=attempt == retries)
        yield current
        if not current.failed:
            return
        bound = min(FIRST_BACKOFF * 2**attempt, MAX_BACKOFF)
        time.sleep(random.uniform(0, bound))

"""A DiscoverRunner that also writes every test's outcome, one JSON object per line.

Why not parse ``runtests.py -v 2``: its lines mix with whatever the tests print, a
docstring changes how a test is named, and subtests and class-level errors
(``setUpClass``) have shapes of their own. unittest already tells the result object
exactly what happened to each test, so this runner records it there.

The file is named by ``$CONFORMANCE_OUTCOMES`` and written as each test ends (flushed), so
a run that hangs or crashes still leaves the outcomes of the tests that did finish. With
``--parallel N`` the workers' events are replayed on the main process's result object,
so there is still one writer. Without the variable the runner is plain DiscoverRunner.
"""

from __future__ import annotations

import json
import os
import unittest
from typing import Any, TextIO

from django.test.runner import DiscoverRunner

ENV = "CONFORMANCE_OUTCOMES"
MESSAGE_CHARS = 300


def _message(err: Any) -> str:
    """``Type: first line of the message``, short: enough to group failures by cause."""
    if not err:
        return ""
    kind, value = err[0], err[1]
    text = str(value).strip().splitlines()
    name = getattr(kind, "__name__", str(kind))
    line = f"{name}: {text[0]}" if text else name
    return line[:MESSAGE_CHARS]


class RecordingMixin:
    """Mixed into the runner's result class; every ``add*`` hook records one line."""

    _sink: TextIO | None = None

    def _record(self, test: Any, outcome: str, message: str = "") -> None:
        path = os.environ.get(ENV)
        if not path:
            return
        if self._sink is None:
            self._sink = open(path, "a", encoding="utf-8")  # noqa: SIM115 (kept open)
        entry = {"test": test.id(), "outcome": outcome}
        if message:
            entry["message"] = message
        self._sink.write(json.dumps(entry) + "\n")
        self._sink.flush()

    def _is_failure(self, test: Any, err: Any) -> bool:
        return bool(err) and issubclass(err[0], test.failureException)

    def addSuccess(self, test):
        super().addSuccess(test)
        self._record(test, "passed")

    def addFailure(self, test, err):
        super().addFailure(test, err)
        self._record(test, "failed", _message(err))

    def addError(self, test, err):
        super().addError(test, err)
        self._record(test, "error", _message(err))

    def addSkip(self, test, reason):
        super().addSkip(test, reason)
        self._record(test, "skipped", str(reason)[:MESSAGE_CHARS])

    def addExpectedFailure(self, test, err):
        super().addExpectedFailure(test, err)
        self._record(test, "expected_failure", _message(err))

    def addUnexpectedSuccess(self, test):
        super().addUnexpectedSuccess(test)
        self._record(test, "unexpected_success")

    def addSubTest(self, test, subtest, err):
        # A failing subtest fails its test (unittest then never calls addSuccess for
        # it), so it is recorded under the test's own id; passing subtests say nothing.
        super().addSubTest(test, subtest, err)
        if err is not None:
            outcome = "failed" if self._is_failure(test, err) else "error"
            self._record(test, outcome, f"{subtest._subDescription()} {_message(err)}")

    def stopTestRun(self):
        super().stopTestRun()
        if self._sink is not None:
            self._sink.close()
            self._sink = None


class RecordingRunner(DiscoverRunner):
    """DiscoverRunner whose result class records outcomes (see the module docstring)."""

    def get_resultclass(self):
        base = super().get_resultclass() or unittest.TextTestResult
        return type(f"Recording{base.__name__}", (RecordingMixin, base), {})

"""The tests of Django's suite the backend expects to fail may only be ones whose
assertion is not about data (``django_zerodb/expected_failures.py``): every group
declares an allowed category and a reason, the feature flag is exactly their union, and
in the last recorded conformance run each listed test failed on an assertion (a
refusal or a crash would be an error, which must not hide in this list).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from django_zerodb.expected_failures import CATEGORIES, GROUPS
from django_zerodb.features import DatabaseFeatures

RESULTS = Path(__file__).resolve().parents[2] / "bench" / "results" / "conformance-zerodb.json"
TEST_ID = re.compile(r"[a-z_0-9]+(\.[a-z_0-9]+)+\.[A-Z]\w*\.test\w*")


def test_categories_are_the_allowed_ones():
    assert set(CATEGORIES) == {"sql_text", "query_count", "connection_internals"}
    for group in GROUPS:
        assert group.category in CATEGORIES, group
        assert group.reason.strip() and group.tests, group


def test_every_test_in_one_group_and_named_as_django_names_it():
    listed = [test for group in GROUPS for test in group.tests]
    assert len(listed) == len(set(listed))
    for test in listed:
        assert TEST_ID.fullmatch(test), test


def test_the_feature_flag_is_the_groups():
    assert DatabaseFeatures.django_test_expected_failures == {
        test for group in GROUPS for test in group.tests
    }


def test_listed_tests_failed_on_assertions_when_last_run():
    recorded: dict[str, tuple[str, str]] = {}
    for app in json.loads(RESULTS.read_text())["apps"].values():
        for test, outcome in app["tests"].items():
            recorded[test] = (outcome, app["messages"].get(test, ""))
    checked = 0
    for group in GROUPS:
        for test in group.tests & recorded.keys():
            outcome, message = recorded[test]
            assert outcome == "expected_failure", (test, outcome)
            assert message.startswith("AssertionError"), (test, message)
            checked += 1
    assert checked

"""Every URL of the example project, fed bad input: never a response >= 500.

The URLs come from the project's URLconf itself (a URL added later is swept too), their
parameters filled with a real pk, a missing one and garbage. Each URL gets every method,
query strings of wrong types and syntax, and bodies that are malformed, deeply nested,
large or of the wrong shape, as the superuser (who gets past every permission check) and
anonymously. The test client turns an uncaught exception into a 500 response here, so one
count covers both.
"""

from __future__ import annotations

import collections
import itertools
import json
import re
from collections.abc import Iterator

import pytest
from django.urls import URLPattern, URLResolver, get_resolver

from tests.example.site_tests.conftest import db

pytestmark = db

DEEP_LIST = "[" * 2000 + "]" * 2000
DEEP_FILTER = '{"filter": ' + '{"$not": ' * 500 + "{}" + "}" * 500 + "}"
BODIES = [
    ("application/json", DEEP_LIST),
    ("application/json", DEEP_FILTER),
    ("application/json", "{"),
    ("application/json", json.dumps({"filter": {"salary": {"$in": list(range(5000))}}})),
    ("application/json", json.dumps(["a list", {"not": "an object"}])),
    ("application/json", json.dumps({"name": "x" * 70_000, "budget": "1e999999"})),
    ("application/x-www-form-urlencoded", "name=%00&budget=abc&salary=-&hire_date=2026-13-45"),
    ("application/x-www-form-urlencoded", "post=yes&_selected_action=abc&action=delete_selected"),
    ("multipart/form-data; boundary=x", "--x\r\nContent-Disposition: form-data\r\n\r\n"),
    ("text/plain", "\xff\xfe not json"),
]
QUERY_STRINGS = [
    "page=-1&page_size=abc&ordering=__nope&search=%22&salary__gte=x&hire_date__lte=2026-02-30",
    "o=99.-3&q=((%22&department__id__exact=abc&is_active=maybe&_changelist_filters=%00",
    "format=xml&limit=1e99&offset=-5&cursor=%%%&p=999999999999999999999",
    "page=last&page_size=0&search=" + "x" * 5000,
]
METHODS = ["get", "head", "options", "post", "put", "patch", "delete"]


def url_patterns(patterns=None, prefix: str = "") -> Iterator[tuple[str, URLPattern]]:
    """(the route of every enclosing resolver, pattern) for each pattern of the URLconf."""
    for pattern in get_resolver().url_patterns if patterns is None else patterns:
        route = prefix + str(pattern.pattern)
        if isinstance(pattern, URLResolver):
            yield from url_patterns(pattern.url_patterns, route)
        else:
            yield route, pattern


PLACEHOLDER = re.compile(r"<(?:\w+:)?(\w+)>|\(\?P<(\w+)>[^)]*\)")


def concrete(route: str, values: dict[str, str]) -> str:
    """``route`` (route syntax or a regex) with its parameters replaced by ``values``."""
    path = PLACEHOLDER.sub(lambda m: values[m.group(1) or m.group(2)], route)
    return "/" + path.replace("^", "").replace("$", "").replace("\\.", ".").replace("/?", "/")


def urls(ids: list[str]) -> list[str]:
    """Every URL of the project, once per combination of parameter values."""
    values = {"pk": ids, "object_id": ids, "id": ids, "content_type_id": ids[:2]}
    values |= {"app_label": ["hr", "auth"], "format": ["json", "api", "yaml"], "url": ["x/y"]}
    found = set()
    for route, _ in url_patterns():
        names = [m.group(1) or m.group(2) for m in PLACEHOLDER.finditer(route)]
        for combination in itertools.product(*(values[name] for name in names)):
            found.add(concrete(route, dict(zip(names, combination))))
    return sorted(found)


@pytest.fixture
def superuser(django_user_model):
    """The user of the sweep, with a pk no other object of the sweep has (so that the
    sweep cannot delete it; it logs itself out, and is logged in again)."""
    return django_user_model.objects.create_superuser("sweeper", pk=987_654_321)


@pytest.fixture
def targets(staff, django_user_model):
    """Ids of real objects (a department with employees: deleting it is refused), of
    another user, and missing or malformed ones."""
    other = django_user_model.objects.create_user("someone", password="someone-password")
    department = staff.departments[0]
    return [str(department.pk), str(other.pk), "999999999999", "-1", "x'%25"]


def test_the_urlconf_is_covered(targets):
    paths = urls(targets)
    for expected in ["/api/departments/query/", "/admin/hr/employee/-1/change/", "/api/schema/"]:
        assert expected in paths
    assert not [path for path in paths if "<" in path or "(?" in path]


def test_no_bad_input_gets_a_server_error(client, superuser, targets):
    client.raise_request_exception = False
    bodies = itertools.cycle(BODIES)
    queries = itertools.cycle(QUERY_STRINGS)
    failures = []
    statuses = collections.Counter()
    for path in urls(targets):
        for method in METHODS:
            client.force_login(superuser)
            kwargs = {}
            if method in {"post", "put", "patch"}:
                kwargs["content_type"], kwargs["data"] = next(bodies)
            url = f"{path}?{next(queries)}" if method in {"get", "delete"} else path
            response = getattr(client, method)(url, **kwargs)
            statuses[response.status_code] += 1
            if response.status_code >= 500:
                failures.append((method.upper(), url[:120], kwargs.get("data", "")[:40]))
        client.logout()
        response = client.get(f"{path}?{next(queries)}")
        statuses[response.status_code] += 1
        if response.status_code >= 500:
            failures.append(("GET (anonymous)", path, ""))
    assert failures == []
    # The sweep got past authentication, reached views and their refusals: pages, bad
    # requests, missing objects, wrong methods, the refused delete of a department.
    assert {200, 400, 401, 404, 405, 409} <= set(statuses)

"""``ZeroPageNumberPagination`` (counts from ``queryset.count()``) and
``ZeroCursorPagination`` (indexed, non-null orderings only)."""

from __future__ import annotations

import warnings

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.core.paginator import UnorderedObjectListWarning
from django.db.models import QuerySet
from rest_framework.request import Request
from rest_framework.test import APIRequestFactory

from django_zerodb.rest.pagination import (
    ZeroCursorPagination,
    ZeroPageNumberPagination,
    ZeroPaginator,
)
from tests.django.rest.api import EmailCursorPagination
from tests.django.rest.helpers import db, ids, pks
from tests.django.testapp.models import Employee, Tag

pytestmark = db


def _request(**params):
    return Request(APIRequestFactory().get("/", params))


def walk(client, url, params=None):
    """Every page of a paginated list, following the ``next`` links."""
    pages = []
    response = client.get(url, params)
    while True:
        assert response.status_code == 200, response.json()
        pages.append(ids(response))
        link = response.json()["next"]
        if link is None:
            return pages
        response = client.get(link)


# -- page numbers ---------------------------------------------------------------------------


def test_pages_and_counts(api, hr):
    params = {"salary__gte": "35000", "ordering": "-salary", "page_size": 4}
    expected = pks(Employee.objects.filter(salary__gte=35_000).order_by("-salary"))
    first = api.get("/api/employees/", params).json()
    assert first["count"] == len(expected)
    assert first["previous"] is None and "page=2" in first["next"]
    pages = walk(api, "/api/employees/", params)
    assert [pk for page in pages for pk in page] == expected
    assert [len(p) for p in pages[:-1]] == [4] * (len(pages) - 1)
    last = api.get("/api/employees/", {**params, "page": "last"}).json()
    assert [row["id"] for row in last["results"]] == pages[-1]


def test_count_is_the_querysets_count(api, hr, monkeypatch):
    """The count is ``queryset.count()``, which the backend answers from its indexes."""
    counted = []
    count = QuerySet.count

    def spy(self):
        counted.append(self.query.where.children[0].lookup_name)
        return count(self)

    monkeypatch.setattr(QuerySet, "count", spy)
    response = api.get("/api/employees/", {"salary__gte": "40000", "page_size": 2})
    assert counted == ["gte"]
    assert response.json()["count"] == Employee.objects.filter(salary__gte=40_000).count()


def test_page_size_is_capped():
    paginator = ZeroPageNumberPagination()
    assert paginator.get_page_size(_request()) == 50
    assert paginator.get_page_size(_request(page_size="7")) == 7
    assert paginator.get_page_size(_request(page_size="100000")) == paginator.max_page_size


def test_unordered_querysets_are_paged_by_pk(api, hr):
    ada, alan = hr.employees[0], hr.employees[1]
    for label in ["c", "a", "b"]:
        Tag.objects.create(label=label).employees.set([ada, alan])
    assert not Tag.objects.all().ordered
    with warnings.catch_warnings():
        warnings.simplefilter("error", UnorderedObjectListWarning)
        pages = walk(api, "/api/tags/", {"page_size": 2})
    assert pages == [pks(Tag.objects.order_by("pk"))[:2], pks(Tag.objects.order_by("pk"))[2:]]


def test_page_out_of_range_is_404(api, hr):
    assert api.get("/api/employees/", {"page": 99}).status_code == 404


def test_ranked_search_pages(api, hr):
    ranked = pks(Employee.objects.search("kernel panic"))
    with warnings.catch_warnings():
        warnings.simplefilter("error", UnorderedObjectListWarning)
        pages = walk(api, "/api/employees/", {"search": "kernel panic", "page_size": 3})
    assert [pk for page in pages for pk in page] == ranked


def test_unordered_querysets_still_warn(hr):
    with pytest.warns(UnorderedObjectListWarning):
        ZeroPaginator(Employee.objects.order_by(), 5)
    with warnings.catch_warnings():
        warnings.simplefilter("error", UnorderedObjectListWarning)
        ZeroPaginator(Employee.objects.search("kernel"), 5)
        ZeroPaginator([1, 2, 3], 5)


# -- cursors --------------------------------------------------------------------------------


def test_cursor_pages(api, hr):
    pages = walk(api, "/api/employees-by-email/")
    assert [pk for page in pages for pk in page] == pks(Employee.objects.order_by("email"))
    assert all(len(page) == EmailCursorPagination.page_size for page in pages[:-1])
    assert len(pages) == -(-len(hr.employees) // EmailCursorPagination.page_size)
    first = api.get("/api/employees-by-email/").json()
    assert first["previous"] is None and "count" not in first
    second = api.get(first["next"]).json()
    assert [row["id"] for row in api.get(second["previous"]).json()["results"]] == pages[0]


def test_cursor_pages_with_filters(api, hr):
    pages = walk(api, "/api/employees-by-email/", {"is_active": "true", "page_size": 3})
    expected = pks(Employee.objects.filter(is_active=True).order_by("email"))
    assert [pk for page in pages for pk in page] == expected


@pytest.mark.parametrize("ordering", ["-email", "first_name", "-first_name", "id", "-id"])
def test_cursor_ordering_from_the_request(api, hr, ordering):
    pages = walk(api, "/api/employees-by-email/", {"ordering": ordering})
    assert [pk for page in pages for pk in page] == pks(Employee.objects.order_by(ordering))


def test_cursor_stable_under_inserts(api, hr):
    first = api.get("/api/employees-by-email/").json()
    Employee.objects.create(first_name="A", last_name="A", email="a-first@example.com")
    rest = walk(api, first["next"])
    seen = [row["id"] for row in first["results"]] + [pk for page in rest for pk in page]
    expected = pks(Employee.objects.exclude(email="a-first@example.com").order_by("email"))
    assert seen == expected


@pytest.mark.parametrize(
    "ordering, message",
    [("last_name", "has no single-field index"), ("salary", "is nullable")],
)
def test_cursor_ordering_from_the_request_must_be_indexed(api, hr, ordering, message):
    response = api.get("/api/employees-by-email/", {"ordering": ordering})
    assert response.status_code == 400
    assert response.json()["path"] == "ordering"
    assert message in response.json()["detail"]


class View:
    filter_backends = []


@pytest.mark.parametrize("ordering", ["-pk", "pk", "email", "-first_name", ("email", "pk")])
def test_cursor_configured_ordering(hr, ordering):
    paginator = ZeroCursorPagination()
    paginator.ordering = ordering
    page = paginator.paginate_queryset(Employee.objects.all(), _request(), View())
    key = ordering if isinstance(ordering, str) else ordering[0]
    assert [e.pk for e in page] == pks(Employee.objects.order_by(key)[: paginator.page_size])


@pytest.mark.parametrize(
    "ordering, message",
    [
        ("last_name", "Employee.last_name has no single-field index"),
        ("-title", "has no single-field index"),
        ("bio", "has no single-field index"),  # a TextIndex does not order
        ("hire_date", "Employee.hire_date is nullable"),
        ("department", "nullable"),
        ("nope", "has no field 'nope'"),
    ],
)
def test_cursor_configured_ordering_must_be_indexed(hr, ordering, message):
    paginator = ZeroCursorPagination()
    paginator.ordering = ordering
    with pytest.raises(ImproperlyConfigured, match=message):
        paginator.paginate_queryset(Employee.objects.all(), _request(), View())

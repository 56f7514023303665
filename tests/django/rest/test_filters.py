"""``RankedSearchFilter`` (``?search=``), ``ZeroFilterSet`` and ``ZeroFilterBackend``."""

from __future__ import annotations

import pytest
from django.core.exceptions import ImproperlyConfigured
from django_filters import rest_framework as django_filters
from rest_framework.request import Request
from rest_framework.test import APIRequestFactory

from django_zerodb.rest.filters import (
    IndexedFilterSet,
    RankedSearchFilter,
    ZeroFilterBackend,
    ZeroFilterSet,
    ZeroSearchFilter,
    unindexed,
)
from tests.django.rest.api import EmployeeViewSet
from tests.django.rest.helpers import db, ids, pks
from tests.django.testapp.models import Contact, Department, Employee

pytestmark = db


# -- RankedSearchFilter ---------------------------------------------------------------------


def test_search_is_ranked_best_first(api, hr):
    response = api.get("/api/employees/", {"search": "kernel panic"})
    assert response.status_code == 200
    ranked = pks(Employee.objects.search("kernel panic"))
    assert ids(response) == ranked
    assert response.json()["count"] == len(ranked) == 10
    # "kernel panic at dawn" beats "Kernel hacker; panic is a state of mind", whatever
    # the pks: the order is the rank's, not the pk's.
    assert ranked != sorted(ranked)
    best = Employee.objects.get(pk=ranked[0])
    assert best.bio == "kernel panic at dawn"


def test_search_with_ordering(api, hr):
    response = api.get("/api/employees/", {"search": "kernel panic", "ordering": "-salary"})
    expected = Employee.objects.filter(bio__search="kernel panic").order_by("-salary")
    assert ids(response) == pks(expected)


def test_search_with_filters(api, hr):
    response = api.get("/api/employees/", {"search": "kernel", "is_active": "true"})
    assert ids(response) == pks(Employee.objects.search("kernel").filter(is_active=True))


def test_search_phrase(api, hr):
    response = api.get("/api/employees/", {"search": '"panic at"'})
    expected = pks(Employee.objects.search('"panic at"'))
    assert ids(response) == expected
    assert len(expected) == 5


def test_empty_search_is_no_search(api, hr):
    response = api.get("/api/employees/", {"search": "  "})
    assert ids(response) == pks(Employee.objects.all())


def test_search_without_text_index_is_400(api, hr):
    response = api.get("/api/departments/", {"search": "R&D"})
    assert response.status_code == 400
    assert response.json() == {
        "detail": "search is not available: Department has no full-text index (TextIndex)",
        "path": "search",
    }


def _request(**params):
    return Request(APIRequestFactory().get("/", params))


def test_search_field_of_the_view(hr):
    class View:
        search_field = "bio"

    queryset = RankedSearchFilter().filter_queryset(
        _request(search="compilers"), Employee.objects.all(), View()
    )
    assert pks(queryset) == pks(Employee.objects.search("compilers"))
    View.search_field = "first_name"
    with pytest.raises(ImproperlyConfigured, match="no TextIndex"):
        RankedSearchFilter().filter_queryset(_request(search="x"), Employee.objects.all(), View())


def test_zero_search_filter_is_served_by_lower_and_trigram_indexes(hr):
    from django_zerodb.rest.exceptions import BadQuery

    Contact.objects.bulk_create(
        [
            Contact(last_name="Curry", email="a@x.org", bio="kernel hacker"),
            Contact(last_name="curry", email="B@x.org", bio="writes compilers"),
            Contact(last_name="Ng", email="c@x.org", bio="KERNELS and more"),
        ]
    )

    class View:
        search_fields = ["^last_name", "=email", "bio"]

    def search(text):
        found = ZeroSearchFilter().filter_queryset(
            _request(search=text), Contact.objects.all(), View()
        )
        return sorted(c.email for c in found)

    assert search("CURRY") == ["B@x.org", "a@x.org"]
    assert search("b@X.org") == ["B@x.org"]
    assert search("kernel") == ["a@x.org", "c@x.org"]
    assert search("kernel ng") == ["c@x.org"]
    plan = ZeroSearchFilter().filter_queryset(
        _request(search="kernel"), Contact.objects.all(), View()
    )
    assert "TrigramScan" in plan.explain()
    with pytest.raises(BadQuery, match="at most"):
        search(" ".join(["x"] * (ZeroSearchFilter.max_search_words + 1)))


def test_search_schema_parameter():
    (param,) = RankedSearchFilter().get_schema_operation_parameters(EmployeeViewSet())

    assert param["name"] == "search" and param["in"] == "query"

    class DepartmentView:
        def get_queryset(self):
            return Department.objects.all()

    assert RankedSearchFilter().get_schema_operation_parameters(DepartmentView()) == []


# -- ZeroFilterSet ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "field, lookup",
    [
        ("salary", "gte"),
        ("salary", "range"),
        ("first_name", "startswith"),
        ("email", "exact"),
        ("department", "in"),
        ("hire_date", "isnull"),
        ("id", "lt"),
        ("bio", "search"),
        ("department__name", "exact"),
    ],
)
def test_indexed(field, lookup):
    assert unindexed(Employee, field, lookup) is None


@pytest.mark.parametrize(
    "field, lookup, reason",
    [
        ("last_name", "exact", "no single-field index"),
        ("salary", "year", "checked on decrypted rows"),
        ("first_name", "icontains", "checked on decrypted rows"),
        ("first_name", "search", "no TextIndex"),
        ("department__budget", "gte", "Department.budget has no single-field index"),
        ("salary__department", "exact", "not a relation"),
        ("nope", "exact", "no single-field index"),
    ],
)
def test_unindexed(field, lookup, reason):
    assert reason in unindexed(Employee, field, lookup)


def test_indexed_filterset_accepts_indexed_filters(hr):
    class Filters(IndexedFilterSet):
        no_index = django_filters.CharFilter(method="by_last_name")  # not checked

        class Meta:
            model = Employee
            fields = {"salary": ["gte", "lte"], "bio": ["search"], "department__name": ["exact"]}

        def by_last_name(self, queryset, name, value):
            return queryset.filter(last_name=value)

    data = {"salary__gte": "40000", "bio__search": "kernel", "no_index": "Turing"}
    filterset = Filters(data, queryset=Employee.objects.all())
    assert filterset.is_valid(), filterset.errors
    expected = Employee.objects.filter(salary__gte=40_000, bio__search="kernel", last_name="Turing")
    assert pks(filterset.qs) == pks(expected)


@pytest.mark.parametrize(
    "fields", [{"last_name": ["exact"]}, {"title": ["icontains"]}, {"hire_date": ["year"]}]
)
def test_indexed_filterset_refuses_scans(fields):
    meta = type("Meta", (), {"model": Employee, "fields": fields})
    with pytest.raises(ImproperlyConfigured, match="not served by an index"):
        type("Filters", (IndexedFilterSet,), {"Meta": meta})


def test_zero_filterset_allows_scans_by_default(hr):
    class Filters(ZeroFilterSet):
        class Meta:
            model = Employee
            fields = {"title": ["icontains"]}

    filterset = Filters({"title__icontains": "engineer"}, queryset=Employee.objects.all())
    assert pks(filterset.qs) == pks(Employee.objects.filter(title__icontains="engineer"))


def test_backend_builds_zero_filtersets(hr):
    class View:
        filterset_fields = {"last_name": ["exact"]}

    backend = ZeroFilterBackend()
    filterset_class = backend.get_filterset_class(View(), Employee.objects.all())
    assert issubclass(filterset_class, ZeroFilterSet)
    queryset = backend.filter_queryset(_request(last_name="Turing"), Employee.objects.all(), View())
    assert pks(queryset) == pks(Employee.objects.filter(last_name="Turing"))

    View.filterset_indexed_only = True
    with pytest.raises(ImproperlyConfigured, match="'last_name' is not served by an index"):
        ZeroFilterBackend().get_filterset_class(View(), Employee.objects.all())
    View.filterset_fields = {"first_name": ["exact"]}
    filterset_class = ZeroFilterBackend().get_filterset_class(View(), Employee.objects.all())
    assert issubclass(filterset_class, IndexedFilterSet)

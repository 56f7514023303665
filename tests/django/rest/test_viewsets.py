"""``ZeroModelViewSet``: the ModelViewSet actions on encrypted models, its defaults, the
fields of its query endpoint and throttling."""

from __future__ import annotations

import datetime
import decimal
import html
import json
import re

import pytest
from django.core.cache import cache
from rest_framework.authentication import SessionAuthentication, TokenAuthentication
from rest_framework.filters import OrderingFilter
from rest_framework.permissions import IsAuthenticated
from rest_framework.test import APIRequestFactory, force_authenticate
from rest_framework.throttling import ScopedRateThrottle

from django_zerodb.rest.filters import RankedSearchFilter, ZeroFilterBackend
from django_zerodb.rest.pagination import ZeroPageNumberPagination
from django_zerodb.rest.permissions import ZeroModelPermissions
from django_zerodb.rest.query import QueryParser
from django_zerodb.rest.viewsets import ZeroModelViewSet
from tests.django.rest.api import EmployeeHRViewSet, EmployeeSerializer, EmployeeViewSet
from tests.django.rest.helpers import db, ids, pks
from tests.django.testapp.models import Department, Employee

pytestmark = db


def test_defaults():
    assert ZeroModelViewSet.authentication_classes == [
        TokenAuthentication,
        SessionAuthentication,
    ]
    assert ZeroModelViewSet.permission_classes == [IsAuthenticated, ZeroModelPermissions]
    assert ZeroModelViewSet.filter_backends == [
        ZeroFilterBackend,
        OrderingFilter,
        RankedSearchFilter,
    ]
    assert ZeroModelViewSet.pagination_class is ZeroPageNumberPagination


# -- list -----------------------------------------------------------------------------------


def test_list(api, hr):
    response = api.get("/api/employees/")
    assert response.status_code == 200
    data = response.json()
    assert data["count"] == Employee.objects.count() == len(hr.employees)
    assert ids(response) == pks(Employee.objects.all())  # Meta.ordering: id
    first = Employee.objects.get(pk=data["results"][0]["id"])
    assert data["results"][0] == EmployeeSerializer(first).data


@pytest.mark.parametrize(
    "params, orm",
    [
        ({"salary__gte": "40000"}, {"salary__gte": 40_000}),
        ({"salary__gte": "40000", "salary__lte": "60000"}, {"salary__range": (40_000, 60_000)}),
        ({"first_name": "Ada"}, {"first_name": "Ada"}),
        ({"first_name__startswith": "A"}, {"first_name__startswith": "A"}),
        ({"department__isnull": "true"}, {"department__isnull": True}),
        ({"is_active": "false"}, {"is_active": False}),
        ({"hire_date__gte": "2018-01-01"}, {"hire_date__gte": datetime.date(2018, 1, 1)}),
        ({"bio__search": "kernel"}, {"bio__search": "kernel"}),
    ],
)
def test_list_filters(api, hr, params, orm):
    response = api.get("/api/employees/", params)
    assert response.status_code == 200, response.json()
    expected = Employee.objects.filter(**orm)
    assert response.json()["count"] == expected.count() > 0
    assert ids(response) == pks(expected)


def test_list_filter_on_a_foreign_key(api, hr):
    rd = hr.departments["R&D"].pk
    response = api.get("/api/employees/", {"department": rd, "salary__gte": 30_000})
    assert ids(response) == pks(Employee.objects.filter(department=rd, salary__gte=30_000))


def test_list_filter_errors_are_400(api, hr):
    response = api.get("/api/employees/", {"salary__gte": "lots"})
    assert response.status_code == 400
    assert "salary__gte" in response.json()


@pytest.mark.parametrize("ordering", ["-salary", "salary", "first_name", "-hire_date", "email"])
def test_list_ordering(api, hr, ordering):
    response = api.get("/api/employees/", {"ordering": ordering})
    assert ids(response) == pks(Employee.objects.order_by(ordering))


def test_list_ordering_on_two_fields(api, hr):
    response = api.get("/api/employees/", {"ordering": "first_name,-salary"})
    assert ids(response) == pks(Employee.objects.order_by("first_name", "-salary"))


# -- retrieve, create, update, partial_update, destroy ------------------------------------


def test_retrieve(api, hr):
    employee = hr.employees[5]
    response = api.get(f"/api/employees/{employee.pk}/")
    assert response.status_code == 200
    assert response.json() == EmployeeSerializer(Employee.objects.get(pk=employee.pk)).data
    assert response.json()["surname"] == employee.last_name


def test_retrieve_missing(api, hr):
    missing = max(e.pk for e in hr.employees) + 1000
    assert api.get(f"/api/employees/{missing}/").status_code == 404


def test_create(api, hr):
    body = {
        "first_name": "Edsger",
        "surname": "Dijkstra",
        "email": "ewd@example.com",
        "salary": 99_000,
        "department": hr.departments["R&D"].pk,
        "hire_date": "1972-05-01",
        "bio": "goto considered harmful",
    }
    response = api.post("/api/employees/", body)
    assert response.status_code == 201, response.json()
    created = Employee.objects.get(pk=response.json()["id"])
    assert (created.first_name, created.last_name, created.salary) == ("Edsger", "Dijkstra", 99_000)
    assert created.department == hr.departments["R&D"]
    assert created.hire_date == datetime.date(1972, 5, 1)
    assert response.json() == EmployeeSerializer(created).data
    # Indexed and searchable at once.
    assert pks(Employee.objects.search("harmful")) == [created.pk]


def test_create_validates(api, hr):
    response = api.post("/api/employees/", {"first_name": "X", "surname": "Y", "email": "bad"})
    assert response.status_code == 400
    assert "email" in response.json()
    # The unique validator queries the encrypted database.
    taken = {"first_name": "X", "surname": "Y", "email": hr.employees[0].email}
    response = api.post("/api/employees/", taken)
    assert response.status_code == 400
    assert "email" in response.json()
    assert Employee.objects.count() == len(hr.employees)


def test_update(api, hr):
    employee = hr.employees[2]
    body = {
        "first_name": "Grace",
        "surname": "Brewster",
        "email": "grace@example.com",
        "title": "Rear Admiral",
        "salary": 123_456,
        "department": None,
        "hire_date": None,
        "is_active": False,
        "bio": "found a moth",
        "updated": "2025-01-02T03:04:05Z",
    }
    response = api.put(f"/api/employees/{employee.pk}/", body)
    assert response.status_code == 200, response.json()
    employee.refresh_from_db()
    assert employee.last_name == "Brewster" and employee.salary == 123_456
    assert employee.department is None and not employee.is_active
    assert employee.updated == datetime.datetime(2025, 1, 2, 3, 4, 5, tzinfo=datetime.UTC)
    assert response.json() == EmployeeSerializer(employee).data
    assert pks(Employee.objects.filter(salary=123_456)) == [employee.pk]


def test_partial_update(api, hr):
    employee = hr.employees[3]
    response = api.patch(f"/api/employees/{employee.pk}/", {"salary": 77_777})
    assert response.status_code == 200, response.json()
    employee.refresh_from_db()
    assert employee.salary == 77_777
    assert employee.first_name == hr.employees[3].first_name
    assert pks(Employee.objects.filter(salary__gte=77_777, salary__lte=77_777)) == [employee.pk]


def test_destroy(api, hr):
    employee = hr.employees[4]
    response = api.delete(f"/api/employees/{employee.pk}/")
    assert response.status_code == 204
    assert not Employee.objects.filter(pk=employee.pk).exists()
    assert api.get(f"/api/employees/{employee.pk}/").status_code == 404
    assert api.get("/api/employees/").json()["count"] == len(hr.employees) - 1


def test_destroy_cascades(api, hr):
    sales = hr.departments["Sales"]
    assert Employee.objects.filter(department=sales).exists()
    assert api.delete(f"/api/departments/{sales.pk}/").status_code == 204
    assert not Employee.objects.filter(department=sales.pk).exists()


def test_decimal_fields(api, hr):
    response = api.post("/api/departments/", {"name": "Legal", "budget": "1234.56"})
    assert response.status_code == 201, response.json()
    assert Department.objects.get(name="Legal").budget == decimal.Decimal("1234.56")
    assert response.json()["budget"] == "1234.56"


# -- the query endpoint's fields ------------------------------------------------------------


def _view(cls):
    view = cls()
    view.request = None
    view.format_kwarg = None
    view.action = "query"
    return view


def test_query_fields_come_from_the_serializer():
    fields = _view(EmployeeViewSet).get_query_fields()
    assert fields == {
        "id": "id",
        "first_name": "first_name",
        "surname": "last_name",  # the serializer's name, the model's field
        "email": "email",
        "title": "title",
        "salary": "salary",
        "department": "department",
        "hire_date": "hire_date",
        "is_active": "is_active",
        "bio": "bio",
        "updated": "updated",
    }  # not "display": no model field behind it


def test_query_fields_allow_list():
    fields = _view(EmployeeHRViewSet).get_query_fields()
    assert fields["department_name"] == "department__name"
    assert "surname" not in fields


def test_query_fields_as_a_list_of_paths():
    class ViewSet(EmployeeViewSet):
        query_fields = ["salary", "department__name"]

    assert _view(ViewSet).get_query_fields() == {
        "salary": "salary",
        "department__name": "department__name",
    }


def test_query_fields_skip_write_only_fields():
    class Serializer(EmployeeSerializer):
        class Meta(EmployeeSerializer.Meta):
            extra_kwargs = {"salary": {"write_only": True}}

    class ViewSet(EmployeeViewSet):
        serializer_class = Serializer

    assert "salary" not in _view(ViewSet).get_query_fields()


# -- throttling -----------------------------------------------------------------------------


class QueryThrottle(ScopedRateThrottle):
    THROTTLE_RATES = {"employees-query": "2/min"}


class ThrottledViewSet(EmployeeViewSet):
    """The pattern of docs/rest.md: a scope for the query endpoint alone."""

    throttle_classes = [QueryThrottle]
    throttle_scope = "employees-query"

    def get_throttles(self):
        if self.action != "query":
            self.throttle_scope = None  # ScopedRateThrottle lets it through
        return super().get_throttles()


def test_throttling(staff, hr):
    cache.clear()
    query = ThrottledViewSet.as_view({"post": "query"})
    listing = ThrottledViewSet.as_view({"get": "list"})
    factory = APIRequestFactory()
    try:
        codes = []
        for _ in range(3):
            request = factory.post("/api/employees/query/", {"limit": 1}, format="json")
            force_authenticate(request, user=staff)
            codes.append(query(request).status_code)
            request = factory.get("/api/employees/")
            force_authenticate(request, user=staff)
            codes.append(listing(request).status_code)
        assert codes == [200, 200, 200, 200, 429, 200]
    finally:
        cache.clear()


# -- the query endpoint as the browsable API and OPTIONS describe it ------------------------


def test_options_describe_the_query_body(api):
    post = api.options("/api/employees/query/").json()["actions"]["POST"]
    assert set(post) == {"filter", "order_by", "limit", "offset"}
    assert post["limit"]["max_value"] == QueryParser.max_limit
    assert "`" not in api.options("/api/employees/query/").json()["description"]


def test_the_browsable_form_is_prefilled_with_a_body_that_works(api, hr):
    page = api.get("/api/employees/query/", HTTP_ACCEPT="text/html").content.decode()
    [prefilled] = re.findall(r'<textarea[^>]*name="_content"[^>]*>(.*?)</textarea>', page, re.S)
    body = json.loads(html.unescape(prefilled))
    assert set(body) == {"filter", "order_by", "limit", "offset"}
    response = api.post("/api/employees/query/", body, format="json")
    assert response.status_code == 200
    assert response.json()["count"] == Employee.objects.count()

"""Authentication (token, session) and ``ZeroModelPermissions`` on every endpoint."""

from __future__ import annotations

import pytest
from rest_framework.authtoken.models import Token
from rest_framework.test import APIClient

from django_zerodb.rest.permissions import ZeroModelPermissions
from tests.django.rest.helpers import client_for, db, ids, pks
from tests.django.testapp.models import Employee

pytestmark = db


def requests(hr):
    """(method, url, body) of every endpoint of the employees resource."""
    pk = hr.employees[0].pk
    new = {"first_name": "N", "surname": "N", "email": "n@example.com"}
    return [
        ("get", "/api/employees/", None),
        ("get", f"/api/employees/{pk}/", None),
        ("post", "/api/employees/query/", {"filter": {}}),
        ("post", "/api/employees/", new),
        ("put", f"/api/employees/{pk}/", {**new, "email": "m@example.com"}),
        ("patch", f"/api/employees/{pk}/", {"salary": 1}),
        ("delete", f"/api/employees/{pk}/", None),
    ]


def call(client, method, url, body):
    return getattr(client, method)(url, body, format="json")


def test_401_without_credentials(anonymous, hr):
    for method, url, body in requests(hr):
        response = call(anonymous, method, url, body)
        assert response.status_code == 401, (method, url)
        assert response["WWW-Authenticate"] == "Token"
    assert Employee.objects.count() == len(hr.employees)


def test_401_with_a_wrong_token(hr):
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION="Token " + "0" * 40)
    assert client.get("/api/employees/").status_code == 401


def test_token_authentication(staff, hr):
    token = Token.objects.create(user=staff)
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {token.key}")
    response = client.get("/api/employees/")
    assert response.status_code == 200
    assert ids(response) == pks(Employee.objects.all())
    response = client.post("/api/employees/query/", {"filter": {"first_name": "Ada"}})
    assert ids(response) == pks(Employee.objects.filter(first_name="Ada"))
    response = client.patch(f"/api/employees/{hr.employees[0].pk}/", {"salary": 5})
    assert response.status_code == 200
    assert Employee.objects.get(pk=hr.employees[0].pk).salary == 5


def test_session_authentication(staff, hr):
    client = APIClient()
    assert client.login(username="staff", password="staff-password")
    assert client.get("/api/employees/").status_code == 200


def test_session_authentication_enforces_csrf(staff, hr):
    client = APIClient(enforce_csrf_checks=True)
    client.force_login(staff)
    assert client.get("/api/employees/").status_code == 200
    response = client.post("/api/employees/query/", {}, format="json")
    assert response.status_code == 403
    assert "CSRF" in response.json()["detail"]


def test_403_without_model_permissions(nobody, hr):
    client = client_for(nobody)
    for method, url, body in requests(hr):
        assert call(client, method, url, body).status_code == 403, (method, url)
    assert Employee.objects.count() == len(hr.employees)


def test_readers_read_and_query_only(reader, hr):
    client = client_for(reader)
    codes = [call(client, *r).status_code for r in requests(hr)]
    assert codes == [200, 200, 200, 403, 403, 403, 403]
    assert Employee.objects.count() == len(hr.employees)


def test_staff_does_everything(api, hr):
    codes = [call(api, *r).status_code for r in requests(hr)]
    assert codes == [200, 200, 200, 201, 200, 200, 204]


@pytest.mark.parametrize(
    "method, action, wanted",
    [
        ("GET", "list", ["testapp.view_employee"]),
        ("HEAD", "retrieve", ["testapp.view_employee"]),
        ("POST", "create", ["testapp.add_employee"]),
        ("POST", "query", ["testapp.view_employee"]),
        ("PUT", "update", ["testapp.change_employee"]),
        ("PATCH", "partial_update", ["testapp.change_employee"]),
        ("DELETE", "destroy", ["testapp.delete_employee"]),
        ("OPTIONS", "metadata", []),
    ],
)
def test_required_permissions(method, action, wanted):
    class View:
        read_only_actions = ("query",)

    class Request:
        pass

    view, request = View(), Request()
    view.action, request.method = action, method
    permission = ZeroModelPermissions()
    got = permission.get_required_permissions(permission.get_method(request, view), Employee)
    assert got == wanted

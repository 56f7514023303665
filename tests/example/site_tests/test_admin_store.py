"""The admin's "Encrypted store" page (``django_zerodb.admin.urls``) and the round trips
middleware (``django_zerodb.middleware.RoundTripsMiddleware``).

The page reads the store's committed root, so these tests commit their data
(``transaction=True``): in a test transaction the root would not show it yet.
"""

from __future__ import annotations

import threading

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Permission
from django.test import RequestFactory, override_settings

from django_zerodb import middleware
from tests.example.site_tests.conftest import DATABASES

pytestmark = pytest.mark.django_db(databases=DATABASES, transaction=True)

URL = "/admin/zerodb/"
PASSPHRASE = "tests-only passphrase"


@pytest.fixture(autouse=True)
def fresh_log():
    middleware.clear()
    yield
    middleware.clear()


@pytest.fixture
def superuser_client(client):
    user = get_user_model().objects.create_superuser("root", "root@example.com", "pw")
    client.force_login(user)
    return client


def staff_client(client, *permissions: str):
    user = get_user_model().objects.create_user("staff", "staff@example.com", "pw", is_staff=True)
    for codename in permissions:
        user.user_permissions.add(Permission.objects.get(codename=codename))
    client.force_login(user)
    return client


def test_anonymous_users_are_sent_to_the_login_page(client):
    response = client.get(URL)
    assert response.status_code == 302
    assert response["Location"] == f"/admin/login/?next={URL}"
    response = client.post(URL + "verify/")
    assert response.status_code == 302 and response["Location"].startswith("/admin/login/")


def test_users_who_are_not_staff_are_sent_to_the_login_page(client):
    user = get_user_model().objects.create_user("clerk", "clerk@example.com", "pw")
    client.force_login(user)
    response = client.get(URL)
    assert response.status_code == 302 and response["Location"].startswith("/admin/login/")
    response = client.post(URL + "verify/")
    assert response.status_code == 302 and response["Location"].startswith("/admin/login/")


def test_the_page_shows_the_store_from_its_root(superuser_client, staff):
    response = superuser_client.get(URL)
    assert response.status_code == 200
    status = response.context["status"]
    assert status["store"] == "memory://" and status["alias"] == "encrypted"
    assert status["seq"] > 0
    models = {m["table"]: m for m in status["models"]}
    employees = models["hr_employee"]
    assert employees["label"] == "hr.Employee"
    assert employees["records"] == 45 and employees["height"] >= 1
    indexes = {i["name"]: i for i in employees["indexes"]}
    assert indexes["u:email"]["entries"] == 45 and indexes["u:email"]["kind"] == "unique"
    assert indexes["t:bio"]["documents"] == 45 and indexes["t:bio"]["kind"] == "text"
    assert models["hr_department"]["records"] == 3
    assert status["usage"]["available"] is True
    assert status["usage"]["blobs"] > 0 and status["usage"]["bytes"] > 0
    assert status["cache_hit_rate"] is None or 0 <= status["cache_hit_rate"] <= 100

    html = response.content.decode()
    assert "<title>Encrypted store" in html
    assert '<code id="zerodb-address">memory://</code>' in html
    assert f'<td id="zerodb-seq">{status["seq"]}</td>' in html
    assert "hr.Employee" in html and "u:email" in html and "t:bio" in html
    assert "Client cache hit rate" in html
    assert 'id="zerodb-verify-form"' in html
    assert PASSPHRASE not in html
    assert "tests-only" not in html


def test_a_store_that_cannot_tell_its_usage(superuser_client, monkeypatch):
    from django_zerodb.admin import views

    monkeypatch.setattr(
        views, "blob_usage", lambda engine: {"available": False, "reason": "nope, embedded"}
    )
    html = superuser_client.get(URL).content.decode()
    assert "not available: nope, embedded" in html


def test_an_unreadable_store_is_an_error_note_not_a_500(superuser_client, monkeypatch):
    from django_zerodb.admin import views
    from zerodb_core.exceptions import StoreUnavailableError

    def fail(alias):
        raise StoreUnavailableError("connection refused")

    monkeypatch.setattr(views, "store_status", fail)
    response = superuser_client.get(URL)
    assert response.status_code == 200
    assert "could not be read: StoreUnavailableError: connection refused" in (
        response.content.decode()
    )


def test_unknown_database_is_404(superuser_client):
    assert superuser_client.get(URL, {"database": "default"}).status_code == 404
    assert superuser_client.post(URL + "verify/", {"database": "nope"}).status_code == 404


def test_verify_button(superuser_client, staff):
    response = superuser_client.post(URL + "verify/", {"database": "encrypted"})
    assert response.status_code == 303
    assert response["Location"] == f"{URL}?database=encrypted"
    response = superuser_client.get(response["Location"])
    result = response.context["verify"]
    assert result["ok"] is True and result["problem_count"] == 0
    status = response.context["status"]
    assert result["records"] == sum(m["records"] for m in status["models"])
    assert result["seq"] == status["seq"]
    assert result["blobs"] > 0 and result["index_entries"] > 0
    html = response.content.decode()
    assert "Verified &#x27;encrypted&#x27;: no problems found." in html
    assert "<strong>No problems found.</strong>" in html
    assert f"{result['records']} records" in html


def test_verify_reports_problems(superuser_client, staff, monkeypatch):
    from django_zerodb.admin import views
    from zerodb_core.verify import Problem, VerifyReport

    def broken(engine):
        report = VerifyReport("hr", seq=7, blobs=3, trees=2, records=1)
        report.problems = [Problem(f"hr_employee/u:email #{i}", "no record") for i in range(60)]
        return report

    monkeypatch.setattr(views, "verify", broken)
    response = superuser_client.post(URL + "verify/", follow=True)
    assert response.status_code == 200
    html = response.content.decode()
    assert "60 problem(s) found." in html
    assert "hr_employee/u:email #49: no record" in html
    assert "#50: no record" not in html  # 50 problems are kept
    assert response.context["verify"]["problem_count"] == 60


def test_the_verify_button_needs_csrf(client, staff):
    from django.test import Client

    user = get_user_model().objects.create_superuser("root", "root@example.com", "pw")
    strict = Client(enforce_csrf_checks=True)
    strict.force_login(user)
    assert strict.post(URL + "verify/").status_code == 403
    page = strict.get(URL)
    token = page.context["csrf_token"]
    assert strict.post(URL + "verify/", {"csrfmiddlewaretoken": str(token)}).status_code == 303


def test_staff_without_the_permission_see_the_page_but_cannot_verify(client, staff):
    staff_client(client)
    response = client.get(URL)
    assert response.status_code == 200
    html = response.content.decode()
    assert 'id="zerodb-verify-form"' not in html
    assert "needs the <code>django_zerodb.change_seenroot</code> permission" in html
    assert client.post(URL + "verify/").status_code == 403
    assert client.get(URL + "verify/").status_code == 405


def test_staff_with_the_permission_can_verify(client, staff):
    staff_client(client, "change_seenroot")
    assert 'id="zerodb-verify-form"' in client.get(URL).content.decode()
    assert client.post(URL + "verify/").status_code == 303


@override_settings(ZERODB_ADMIN_VERIFY_PERMISSION="hr.view_employee")
def test_the_verify_permission_is_a_setting(client, staff):
    staff_client(client, "view_employee")
    assert client.post(URL + "verify/").status_code == 303


# -- the round trips middleware ----------------------------------------------------------


def test_the_middleware_records_round_trips(superuser_client, staff):
    superuser_client.get("/employees/", {"q": "payroll", "page": 1})
    superuser_client.post(URL + "verify/")  # reads every blob from the store
    records = middleware.recent_requests()
    verify, employees = records[0], records[1]
    assert (verify.method, verify.path, verify.status) == ("POST", URL + "verify/", 303)
    assert verify.round_trips > 10 and verify.ms > 0
    assert (employees.method, employees.path, employees.status) == ("GET", "/employees/", 200)
    assert "payroll" not in employees.path  # no query string is kept
    assert not verify.concurrent and not employees.concurrent

    html = superuser_client.get(URL).content.decode()
    assert "Round trips of the last 20 requests" in html
    row = html[html.index(f"<code>{URL}verify/</code>") :]
    cells = row.split("</tr>")[0]
    assert f'<td class="num">{verify.round_trips}</td>' in cells
    assert "<code>/employees/</code>" in html


def test_a_request_without_the_store_costs_no_round_trip(client):
    client.get("/admin/login/")
    (record,) = middleware.recent_requests()
    assert record.path == "/admin/login/" and record.round_trips == 0


def test_a_new_connection_is_counted(staff):
    """A request whose thread opens its connection during the request counts it."""
    from django.db import connections
    from hr.models import Employee

    def view(request):
        connections["encrypted"].close()
        engine_cache = connections["encrypted"].session.engine.cache
        engine_cache.clear()
        list(Employee.objects.all()[:5])
        from django.http import HttpResponse

        return HttpResponse("ok")

    connections["encrypted"].close()
    handler = middleware.RoundTripsMiddleware(view)
    handler(RequestFactory().get("/x/"))
    (record,) = middleware.recent_requests()
    assert record.round_trips > 0


@override_settings(ZERODB_RECENT_REQUESTS=5)
def test_the_log_is_bounded(client):
    for i in range(8):
        client.get(f"/admin/login/?i={i}")
    assert len(middleware.recent_requests(None)) == 5


def test_overlapping_requests_are_marked_concurrent():
    from django.http import HttpResponse

    inner_done = threading.Event()

    def inner_view(request):
        return HttpResponse("inner")

    inner = middleware.RoundTripsMiddleware(inner_view)

    def outer_view(request):
        thread = threading.Thread(target=lambda: (inner(RequestFactory().get("/b/")),))
        thread.start()
        thread.join()
        inner_done.set()
        return HttpResponse("outer")

    middleware.RoundTripsMiddleware(outer_view)(RequestFactory().get("/a/"))
    assert inner_done.is_set()
    records = {r.path: r for r in middleware.recent_requests()}
    assert records["/a/"].concurrent and records["/b/"].concurrent
    middleware.RoundTripsMiddleware(inner_view)(RequestFactory().get("/c/"))
    assert not middleware.recent_requests()[0].concurrent


@override_settings(
    MIDDLEWARE=[
        "django.contrib.sessions.middleware.SessionMiddleware",
        "django.middleware.csrf.CsrfViewMiddleware",
        "django.contrib.auth.middleware.AuthenticationMiddleware",
        "django.contrib.messages.middleware.MessageMiddleware",
    ]
)
def test_the_page_says_when_the_middleware_is_missing(superuser_client):
    html = superuser_client.get(URL).content.decode()
    assert "Not recorded: add <code>django_zerodb.middleware.RoundTripsMiddleware</code>" in html

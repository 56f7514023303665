"""The employee list and detail pages through Django's test client: each filter, the
orderings, pagination, bad input (a normal page with errors, never a 500) and 404s."""

from __future__ import annotations

import datetime

import pytest

from tests.example.site_tests.conftest import db

pytestmark = db

NAME_ORDER = lambda e: (e.last_name, e.first_name, e.pk)  # noqa: E731


def listing(client, **params):
    response = client.get("/employees/", params)
    assert response.status_code == 200, response.content[:2000]
    return response


def all_pks(client, **params) -> list[int]:
    """The pks listed on every page, in order."""
    first = listing(client, **params)
    pks = [e.pk for e in first.context["page"].object_list]
    for number in range(2, first.context["paginator"].num_pages + 1):
        page = listing(client, **params, page=number).context["page"]
        assert page.number == number
        pks += [e.pk for e in page.object_list]
    assert len(pks) == first.context["paginator"].count
    return pks


def pks(employees, key=NAME_ORDER, reverse=False) -> list[int]:
    return [e.pk for e in sorted(employees, key=key, reverse=reverse)]


def test_home_redirects_to_the_list(client):
    response = client.get("/")
    assert response.status_code == 302
    assert response["Location"] == "/employees/"


def test_unfiltered_list_first_page(client, staff):
    response = listing(client)
    page = response.context["page"]
    assert response.context["paginator"].count == 45
    assert response.context["paginator"].num_pages == 3
    assert [e.pk for e in page.object_list] == pks(staff.employees)[:20]
    html = response.content.decode()
    assert "45 employees" in html
    assert "page 1 of 3" in html
    assert "Page 1 of 3" in html  # the pagination bar
    assert "?page=2" in html
    first = sorted(staff.employees, key=NAME_ORDER)[0]
    assert f'href="/employees/{first.pk}/"' in html
    assert first.department.name in html


def test_every_page_in_name_order(client, staff):
    assert all_pks(client) == pks(staff.employees)


@pytest.mark.parametrize("name", ["jo", "JO", "Jo", "t", "Hop", "zzz"])
def test_name_filter_matches_first_or_last_name_prefix(client, staff, name):
    n = name.lower()
    expected = staff.matching(
        lambda e: e.first_name.lower().startswith(n) or e.last_name.lower().startswith(n)
    )
    assert all_pks(client, name=name) == pks(expected)


def test_salary_range(client, staff):
    expected = staff.matching(lambda e: 60_000 <= e.salary <= 100_000)
    assert 0 < len(expected) < 45
    assert all_pks(client, salary_min=60_000, salary_max=100_000) == pks(expected)
    assert all_pks(client, salary_min=100_001) == pks(staff.matching(lambda e: e.salary >= 100_001))
    assert all_pks(client, salary_max=59_999) == pks(staff.matching(lambda e: e.salary < 60_000))


def test_department(client, staff):
    legal = staff.departments[2]
    expected = staff.matching(lambda e: e.department_id == legal.pk)
    assert all_pks(client, department=legal.pk) == pks(expected)
    html = listing(client).content.decode()
    for department in staff.departments:
        assert f'<option value="{department.pk}">{department.name}</option>' in html


def test_hire_date_range(client, staff):
    start, end = datetime.date(2013, 6, 1), datetime.date(2018, 12, 31)
    expected = staff.matching(lambda e: start <= e.hire_date <= end)
    assert 0 < len(expected) < 45
    assert all_pks(client, hired_from="2013-06-01", hired_to="2018-12-31") == pks(expected)
    assert all_pks(client, hired_from="2023-01-01") == pks(
        staff.matching(lambda e: e.hire_date >= datetime.date(2023, 1, 1))
    )


@pytest.mark.parametrize(
    ("active", "predicate"),
    [("yes", lambda e: e.is_active), ("no", lambda e: not e.is_active), ("", lambda e: True)],
)
def test_active(client, staff, active, predicate):
    assert all_pks(client, active=active) == pks(staff.matching(predicate))


def test_full_text_search(client, staff):
    expected = staff.matching(lambda e: "payroll" in e.bio)
    found = all_pks(client, q="payroll")
    assert sorted(found) == sorted(e.pk for e in expected)
    assert "matching the search" in listing(client, q="payroll").content.decode()
    # Every word must occur.
    assert sorted(all_pks(client, q="payroll audits")) == sorted(e.pk for e in expected)
    assert all_pks(client, q="payroll kubernetes") == []
    # "Quoted phrases" match in order.
    assert all_pks(client, q='"panic drills"') != []
    assert all_pks(client, q='"drills panic"') == []


def test_full_text_search_with_filters_and_ordering(client, staff):
    expected = staff.matching(lambda e: "kubernetes" in e.bio and e.salary >= 70_000)
    assert expected
    found = all_pks(client, q="kubernetes", salary_min=70_000, ordering="-salary")
    assert found == pks(expected, key=lambda e: (e.salary, e.pk), reverse=True)


@pytest.mark.parametrize(
    ("ordering", "key", "reverse"),
    [
        ("name", NAME_ORDER, False),
        ("-salary", lambda e: (e.salary, e.pk), True),
        ("salary", lambda e: (e.salary, e.pk), False),
        ("hire_date", lambda e: (e.hire_date, e.pk), False),
        ("-hire_date", lambda e: (e.hire_date, e.pk), True),
    ],
)
def test_ordering(client, staff, ordering, key, reverse):
    assert all_pks(client, ordering=ordering) == pks(staff.employees, key, reverse)


def test_filters_combine(client, staff):
    engineering = staff.departments[0]
    expected = staff.matching(
        lambda e: (
            e.department_id == engineering.pk
            and e.is_active
            and e.salary >= 50_000
            and e.hire_date >= datetime.date(2012, 1, 1)
        )
    )
    found = all_pks(
        client,
        department=engineering.pk,
        active="yes",
        salary_min=50_000,
        hired_from="2012-01-01",
        ordering="salary",
    )
    assert found == pks(expected, key=lambda e: (e.salary, e.pk))


def test_pagination_keeps_the_filters(client, staff):
    html = listing(client, active="yes", ordering="-salary").content.decode()
    assert "active=yes&amp;ordering=-salary&amp;page=2" in html


@pytest.mark.parametrize("page", ["999", "4"])
def test_page_past_the_end_or_last_gives_the_last_page(client, staff, page):
    response = listing(client, page=page)
    assert response.context["page"].number == 3
    assert [e.pk for e in response.context["page"].object_list] == pks(staff.employees)[40:]
    assert "page 3 of 3" in response.content.decode()


@pytest.mark.parametrize("page", ["abc", "0", "-1", "", "1.5", "last"])
def test_page_that_is_not_a_page_number(client, staff, page):
    response = listing(client, page=page)
    assert response.context["page"].number in (1, 3)
    assert len(response.context["page"].object_list) in (20, 5)


@pytest.mark.parametrize(
    ("params", "field", "message"),
    [
        ({"salary_min": "abc"}, "salary_min", "Enter a whole number."),
        ({"salary_max": "1e9"}, "salary_max", "Enter a whole number."),
        ({"salary_min": "-5"}, "salary_min", "greater than or equal to 0"),
        ({"ordering": "evil"}, "ordering", "Select a valid choice."),
        ({"ordering": "-bio"}, "ordering", "Select a valid choice."),
        ({"department": "zzz"}, "department", "Select a valid choice."),
        ({"department": "999999"}, "department", "Select a valid choice."),
        ({"hired_from": "2020-13-45"}, "hired_from", "Enter a valid date."),
        ({"active": "maybe"}, "active", "Select a valid choice."),
        ({"salary_min": "90000", "salary_max": "10"}, "salary_max", "Must not be lower"),
        ({"hired_from": "2020-01-01", "hired_to": "2019-01-01"}, "hired_to", "Must not be"),
        ({"name": "x" * 51}, "name", "at most 50 characters"),
        ({"q": "kernel\x00"}, "q", "Null characters are not allowed."),
        ({"department": "9" * 30}, "department", "Select a valid choice."),
    ],
)
def test_bad_input_gives_a_page_with_form_errors(client, staff, params, field, message):
    response = listing(client, **params)
    form = response.context["form"]
    assert field in form.errors
    assert message in " ".join(form.errors[field])
    html = response.content.decode()
    assert 'class="error"' in html
    assert "Some filters were not understood" in html
    # The valid part of the query still applies; the invalid field is ignored.
    assert response.context["paginator"].count >= 1


def test_bad_input_together_with_a_page_past_the_end(client, staff):
    response = listing(client, salary_min="abc", page="999", ordering="evil", active="yes")
    assert set(response.context["form"].errors) == {"salary_min", "ordering"}
    expected = staff.matching(lambda e: e.is_active)
    page = response.context["page"]
    assert page.number == response.context["paginator"].num_pages
    assert response.context["paginator"].count == len(expected)


@pytest.mark.parametrize(
    "params",
    [
        {"salary_min": "9" * 30},
        {"salary_max": "9" * 30},
        {"salary_min": str(2**63)},
        {"hired_from": "0001-01-01", "hired_to": "9999-12-31"},
        {"page": "9" * 30},
        {"name": "%"},
        {"name": "_"},
    ],
)
def test_extreme_values_give_a_normal_page(client, staff, params):
    response = listing(client, **params)
    assert not response.context["form"].errors


def test_search_syntax_oddities_do_not_break_the_page(client, staff):
    for q in ['"', '""', "   ", "*", "payroll)", "a" * 200, "OR AND NOT", "ünïcödé"]:
        listing(client, q=q)


def test_no_match(client, staff):
    response = listing(client, name="Nobody")
    assert response.context["paginator"].count == 0
    assert "No employee matches these filters." in response.content.decode()


def test_empty_database(client):
    response = listing(client)
    assert response.context["paginator"].count == 0
    assert "page 1 of 1" in response.content.decode()


def test_detail(client, staff):
    employee = staff.employees[7]
    response = client.get(f"/employees/{employee.pk}/")
    assert response.status_code == 200
    html = response.content.decode()
    assert employee.email in html
    assert employee.department.name in html
    assert f"{employee.salary:,}" in html
    assert employee.bio in html
    assert f"?department={employee.department_id}" in html


@pytest.mark.parametrize("path", ["/employees/999999/", "/employees/0/", "/employees/abc/"])
def test_detail_missing(client, staff, path):
    assert client.get(path).status_code == 404


def test_api_needs_credentials(client):
    assert client.get("/api/employees/").status_code == 401


def test_api_lists_and_queries_the_encrypted_employees(admin_client, staff):
    from hr.models import Employee

    listed = admin_client.get("/api/employees/?ordering=-salary").json()
    assert listed["count"] == Employee.objects.count()
    salaries = [e["salary"] for e in listed["results"]]
    assert salaries == sorted(salaries, reverse=True)
    department = Employee.objects.order_by("pk").first().department
    answer = admin_client.post(
        "/api/employees/query/",
        {"filter": {"department_name": department.name}, "order_by": ["-salary"], "limit": 5},
        content_type="application/json",
    ).json()
    assert answer["count"] == Employee.objects.filter(department=department).count()
    expected = Employee.objects.filter(department=department).order_by("-salary", "-pk")[:5]
    assert [e["id"] for e in answer["results"]] == [e.pk for e in expected]
    bad = admin_client.post(
        "/api/employees/query/",
        {"filter": {"salary": {"$gte": "x"}}},
        content_type="application/json",
    )
    assert bad.status_code == 400 and bad.json()["path"] == "filter.salary.$gte"
    assert admin_client.get("/api/schema/").status_code == 200


def test_api_refuses_to_delete_a_department_with_employees(admin_client, staff):
    from hr.models import Department, Employee

    department = staff.departments[0]
    headcount = Employee.objects.filter(department=department).count()
    response = admin_client.delete(f"/api/departments/{department.pk}/")
    assert response.status_code == 409
    assert response.json()["detail"] == (
        f"Other objects still refer to this one ({headcount} employees); nothing was deleted."
    )
    assert Department.objects.filter(pk=department.pk).exists()
    Employee.objects.filter(department=department).delete()
    assert admin_client.delete(f"/api/departments/{department.pk}/").status_code == 204


@pytest.mark.parametrize("url", ["/api/employees/query/", "/api/employees/", "/api/departments/"])
def test_api_refuses_deeply_nested_json(admin_client, url):
    response = admin_client.post(url, "[" * 2000 + "]" * 2000, content_type="application/json")
    assert response.status_code == 400


@pytest.mark.parametrize("url, dist", [("/api/docs/", "swagger-ui-dist"), ("/api/redoc/", "redoc")])
def test_api_documentation_pages(client, url, dist):
    """Swagger UI and Redoc on the schema, their files served by the site (no CDN)."""
    page = client.get(url)
    assert page.status_code == 200
    html = page.content.decode()
    assert "/api/schema/" in html
    assert f"/static/drf_spectacular_sidecar/{dist}/" in html
    assert "cdn.jsdelivr.net" not in html

"""The admin of the encrypted models: changelists with filters, search, the date
hierarchy, sorting, the change pages (the department's employee inline) and saving."""

from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model

from tests.example.site_tests.conftest import db

pytestmark = db


@pytest.fixture
def admin_client(client):
    user = get_user_model().objects.create_superuser("admin", "admin@example.com", "pw")
    client.force_login(user)
    return client


def changelist(admin_client, model, **params):
    response = admin_client.get(f"/admin/hr/{model}/", params)
    assert response.status_code == 200, response.content[:3000]
    return response.context["cl"]


def test_admin_index_lists_the_hr_models(admin_client):
    html = admin_client.get("/admin/").content.decode()
    assert "/admin/hr/employee/" in html
    assert "/admin/hr/department/" in html


def test_employee_changelist(admin_client, staff):
    cl = changelist(admin_client, "employee")
    assert cl.result_count == 45
    assert len(cl.result_list) == 45  # list_per_page is 50


def test_employee_changelist_filters(admin_client, staff):
    sales = staff.departments[1]
    cl = changelist(admin_client, "employee", department__id__exact=sales.pk, is_active__exact=0)
    expected = staff.matching(lambda e: e.department_id == sales.pk and not e.is_active)
    assert sorted(e.pk for e in cl.result_list) == sorted(e.pk for e in expected)


def test_employee_changelist_search(admin_client, staff):
    cl = changelist(admin_client, "employee", q="jo")
    expected = staff.matching(
        lambda e: "jo" in e.first_name.lower() or "jo" in e.last_name.lower() or "jo" in e.email
    )
    assert sorted(e.pk for e in cl.result_list) == sorted(e.pk for e in expected)
    cl = changelist(admin_client, "employee", q="person7@example.com")
    assert [e.email for e in cl.result_list] == ["person7@example.com"]


def test_employee_date_hierarchy(admin_client, staff):
    response = admin_client.get("/admin/hr/employee/")
    assert "hire_date__year=2010" in response.content.decode()
    cl = changelist(admin_client, "employee", hire_date__year=2012)
    expected = staff.matching(lambda e: e.hire_date.year == 2012)
    assert sorted(e.pk for e in cl.result_list) == sorted(e.pk for e in expected)
    month = expected[0].hire_date.month
    cl = changelist(admin_client, "employee", hire_date__year=2012, hire_date__month=month)
    assert {e.hire_date.month for e in cl.result_list} == {month}


def test_employee_changelist_sorted_by_salary(admin_client, staff):
    # The column index of salary in list_display (1-based): -6 is descending.
    cl = changelist(admin_client, "employee", o="-6")
    salaries = [e.salary for e in cl.result_list]
    assert salaries == sorted(salaries, reverse=True)


def test_department_changelist_with_headcount(admin_client, staff):
    cl = changelist(admin_client, "department")
    assert {d.name: d.headcount for d in cl.result_list} == {
        "Engineering": 15,
        "Sales": 15,
        "Legal": 15,
    }


def test_department_change_page_has_the_employee_inline(admin_client, staff):
    legal = staff.departments[2]
    response = admin_client.get(f"/admin/hr/department/{legal.pk}/change/")
    assert response.status_code == 200
    html = response.content.decode()
    for employee in staff.matching(lambda e: e.department_id == legal.pk):
        assert employee.email in html


def test_employee_change_and_save(admin_client, staff):

    employee = staff.employees[3]
    url = f"/admin/hr/employee/{employee.pk}/change/"
    assert admin_client.get(url).status_code == 200
    response = admin_client.post(
        url,
        {
            "first_name": employee.first_name,
            "last_name": "Renamed",
            "email": employee.email,
            "title": employee.title,
            "department": employee.department_id,
            "salary": 123_456,
            "hire_date": employee.hire_date.isoformat(),
            "is_active": "on",
            "bio": employee.bio,
        },
    )
    assert response.status_code == 302, response.content[:3000]
    employee.refresh_from_db()
    assert (employee.last_name, employee.salary) == ("Renamed", 123_456)


def test_employee_add_rejects_a_duplicate_email(admin_client, staff):
    from hr.models import Employee

    response = admin_client.post(
        "/admin/hr/employee/add/",
        {
            "first_name": "Dup",
            "last_name": "Licate",
            "email": staff.employees[0].email,
            "title": "",
            "department": staff.departments[0].pk,
            "salary": 1,
            "hire_date": "2020-01-01",
            "bio": "",
        },
    )
    assert response.status_code == 200
    assert "Employee with this Email already exists." in response.content.decode()
    assert Employee.objects.count() == 45


def test_a_department_with_employees_is_protected(admin_client, staff):
    from hr.models import Department

    department = staff.departments[0]
    url = f"/admin/hr/department/{department.pk}/delete/"
    response = admin_client.get(url)
    assert response.status_code == 200
    assert "Cannot delete department" in response.content.decode()
    assert admin_client.post(url, {"post": "yes"}).status_code == 200
    assert Department.objects.count() == 3


def test_delete_selected_employees(admin_client, staff):
    from hr.models import Employee

    pks = [e.pk for e in staff.employees[:5]]
    data = {"action": "delete_selected", "_selected_action": pks}
    response = admin_client.post("/admin/hr/employee/", data)
    assert "Are you sure" in response.content.decode()
    response = admin_client.post("/admin/hr/employee/", {**data, "post": "yes"})
    assert response.status_code == 302
    assert Employee.objects.count() == 40
    assert not Employee.objects.filter(pk__in=pks).exists()

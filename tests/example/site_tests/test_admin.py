"""The admin of the encrypted models (``ZeroModelAdmin``) through Django's test client:
changelists (columns, filters, search, the date hierarchy, sorting by every column,
pagination), add, change, delete, the bulk delete action, the department's employee
inline and the history (whose log lives in the plaintext ``default`` database)."""

from __future__ import annotations

import datetime
import re

import pytest
from django.contrib.auth import get_user_model

from tests.example.site_tests.conftest import DATABASES, db

pytestmark = db

COLUMNS = [  # list_display of EmployeeAdmin, in order (the "o" parameter is 1-based)
    "last_name",
    "first_name",
    "email",
    "title",
    "department",
    "salary",
    "hire_date",
    "is_active",
]


@pytest.fixture
def admin_client(client):
    user = get_user_model().objects.create_superuser("admin", "admin@example.com", "pw")
    client.force_login(user)
    return client


@pytest.fixture
def per_page(monkeypatch):
    """Set the employee changelist's page size for one test."""
    from django.contrib import admin
    from hr.models import Employee

    def set_size(size: int) -> None:
        monkeypatch.setattr(admin.site._registry[Employee], "list_per_page", size)

    return set_size


def changelist(admin_client, model, **params):
    response = admin_client.get(f"/admin/hr/{model}/", params)
    assert response.status_code == 200, response.content[:3000]
    return response.context["cl"]


def pks(objects) -> list[int]:
    return [o.pk for o in objects]


def all_pages(admin_client, **params) -> list[int]:
    """The pks of every page of the employee changelist, in order."""
    cl = changelist(admin_client, "employee", **params)
    found = pks(cl.result_list)
    for page in range(2, cl.paginator.num_pages + 1):
        found += pks(changelist(admin_client, "employee", **params, p=page).result_list)
    assert len(found) == cl.result_count
    return found


def employee_form(employee, **changes) -> dict:
    data = {
        "first_name": employee.first_name,
        "last_name": employee.last_name,
        "email": employee.email,
        "title": employee.title,
        "department": employee.department_id,
        "salary": employee.salary,
        "hire_date": employee.hire_date.isoformat(),
        "bio": employee.bio,
    }
    if employee.is_active:
        data["is_active"] = "on"
    data.update(changes)
    return {k: v for k, v in data.items() if v is not None}


def add_employees(staff, count: int, **fields) -> list:
    from hr.models import Employee

    made = [
        Employee(
            first_name=fields.get("first_name", f"Extra{i}"),
            last_name=fields.get("last_name", f"Person{i:03d}"),
            email=f"extra{i}@example.com",
            salary=50_000 + i,
            department=staff.departments[i % 3],
            hire_date=datetime.date(2021, 1 + i % 12, 1 + i % 28),
            bio=fields.get("bio", ""),
        )
        for i in range(count)
    ]
    Employee.objects.bulk_create(made)
    return list(Employee.objects.filter(email__startswith="extra").order_by("pk"))


# -- the index and the changelist --------------------------------------------------------


def test_admin_index_lists_the_hr_models_and_the_store(admin_client):
    html = admin_client.get("/admin/").content.decode()
    assert "/admin/hr/employee/" in html
    assert "/admin/hr/department/" in html
    assert 'href="/admin/zerodb/"' in html and "Encrypted store" in html


def test_employee_changelist_columns(admin_client, staff):
    response = admin_client.get("/admin/hr/employee/")
    cl = response.context["cl"]
    assert cl.result_count == 45 and cl.full_result_count == 45
    assert len(cl.result_list) == 45  # list_per_page is 50
    assert cl.list_per_page == 50
    html = response.content.decode()
    for header in ["Last name", "First name", "Email", "Title", "Department", "Salary"]:
        assert f">{header}</a>" in html, header
    employee = staff.employees[7]
    assert f"/admin/hr/employee/{employee.pk}/change/" in html
    assert employee.email in html and employee.department.name in html
    assert "45 employees" in html
    # The default order is the newest first: paged from the primary key tree.
    assert pks(cl.result_list) == sorted(pks(staff.employees), reverse=True)


def test_employee_changelist_related_and_boolean_filters(admin_client, staff):
    sales = staff.departments[1]
    response = admin_client.get("/admin/hr/employee/")
    html = response.content.decode()
    for department in staff.departments:
        assert f"department__id__exact={department.pk}" in html
    cl = changelist(admin_client, "employee", department__id__exact=sales.pk, is_active__exact=0)
    expected = staff.matching(lambda e: e.department_id == sales.pk and not e.is_active)
    assert 0 < len(expected) < 15
    assert sorted(pks(cl.result_list)) == sorted(pks(expected))
    assert cl.result_count == len(expected) and cl.full_result_count == 45


def test_employee_changelist_date_filter(admin_client, staff):
    html = admin_client.get("/admin/hr/employee/").content.decode()
    assert "hire_date__gte=" in html  # the filter's choices: today, past 7 days, ...
    cl = changelist(
        admin_client, "employee", hire_date__gte="2015-01-01", hire_date__lt="2018-01-01"
    )
    start, end = datetime.date(2015, 1, 1), datetime.date(2018, 1, 1)
    expected = staff.matching(lambda e: start <= e.hire_date < end)
    assert 0 < len(expected) < 45
    assert sorted(pks(cl.result_list)) == sorted(pks(expected))


def test_filter_facets(admin_client, staff):
    response = admin_client.get("/admin/hr/employee/", {"_facets": "True"})
    assert response.status_code == 200
    html = response.content.decode()
    inactive = len(staff.matching(lambda e: not e.is_active))
    assert f"No ({inactive})" in html
    assert "Engineering (15)" in html


def test_date_hierarchy_drill_down(admin_client, staff):
    response = admin_client.get("/admin/hr/employee/")
    assert "hire_date__year=2010" in response.content.decode()
    cl = changelist(admin_client, "employee", hire_date__year=2012)
    expected = staff.matching(lambda e: e.hire_date.year == 2012)
    assert sorted(pks(cl.result_list)) == sorted(pks(expected))
    month = expected[0].hire_date.month
    response = admin_client.get("/admin/hr/employee/", {"hire_date__year": 2012})
    assert f"hire_date__month={month}" in response.content.decode()
    cl = changelist(admin_client, "employee", hire_date__year=2012, hire_date__month=month)
    in_month = [e for e in expected if e.hire_date.month == month]
    assert sorted(pks(cl.result_list)) == sorted(pks(in_month))
    day = in_month[0].hire_date.day
    response = admin_client.get(
        "/admin/hr/employee/", {"hire_date__year": 2012, "hire_date__month": month}
    )
    assert f"hire_date__day={day}" in response.content.decode()
    cl = changelist(
        admin_client, "employee", hire_date__year=2012, hire_date__month=month, hire_date__day=day
    )
    assert sorted(pks(cl.result_list)) == sorted(pks(e for e in in_month if e.hire_date.day == day))


def sort_key(column):
    if column == "department":
        return lambda e: e.department.name
    return lambda e: getattr(e, column)


@pytest.mark.parametrize("descending", [False, True], ids=["asc", "desc"])
@pytest.mark.parametrize("column", COLUMNS)
def test_sorting_by_every_column(admin_client, staff, column, descending):
    index = COLUMNS.index(column) + 1
    cl = changelist(admin_client, "employee", o=f"-{index}" if descending else str(index))
    # Ties are broken by the primary key in the column's direction.
    key = sort_key(column)
    expected = sorted(staff.employees, key=lambda e: (key(e), e.pk), reverse=descending)
    assert pks(cl.result_list) == pks(expected)
    assert cl.get_ordering_field_columns() == {index: "desc" if descending else "asc"}


def test_sorting_by_two_columns(admin_client, staff):
    cl = changelist(admin_client, "employee", o="5.-6")  # department, then salary descending
    expected = sorted(staff.employees, key=lambda e: (e.department.name, -e.salary, e.pk))
    assert pks(cl.result_list) == pks(expected)


def test_pagination_to_the_last_page(admin_client, staff):
    extra = add_employees(staff, 60)  # 105 employees: pages of 50, 50 and 5
    everyone = staff.employees + extra
    cl = changelist(admin_client, "employee")
    assert cl.result_count == 105 and cl.paginator.num_pages == 3
    last = changelist(admin_client, "employee", p=3)
    assert pks(last.result_list) == sorted(pks(everyone), reverse=True)[100:]
    html = admin_client.get("/admin/hr/employee/", {"p": 3}).content.decode()
    assert "105 employees" in html
    assert all_pages(admin_client) == sorted(pks(everyone), reverse=True)
    assert all_pages(admin_client, o="6") == pks(sorted(everyone, key=lambda e: (e.salary, e.pk)))
    # Past the last page: Django's admin answers with the first page and ?e=1.
    response = admin_client.get("/admin/hr/employee/", {"p": 9})
    assert response.status_code == 302 and "e=1" in response["Location"]
    # "Show all" (up to list_max_show_all).
    assert len(changelist(admin_client, "employee", all="").result_list) == 105


# -- search ------------------------------------------------------------------------------


def search(admin_client, q, **params) -> list[int]:
    return pks(changelist(admin_client, "employee", q=q, **params).result_list)


def test_search_help_text_describes_the_lookups(admin_client, staff):
    html = admin_client.get("/admin/hr/employee/").content.decode()
    assert "Finds rows where last name starts with, or first name starts with, " in html
    assert "or email is, or bio contains every word" in html


def test_search_last_name_prefix_is_case_insensitive(admin_client, staff):
    # ^last_name has a Lower index: istartswith, served by it; first_name has no index
    # and keeps Django's istartswith (a scan). Both ignore case.
    hoppers = staff.matching(lambda e: e.last_name.lower().startswith("hop"))
    assert hoppers
    assert sorted(search(admin_client, "Hop")) == sorted(pks(hoppers))
    assert sorted(search(admin_client, "hOP")) == sorted(pks(hoppers))
    either = staff.matching(
        lambda e: e.first_name.lower().startswith("jo") or e.last_name.lower().startswith("jo")
    )
    assert {e.first_name for e in either} >= {"Joan", "John", "jonas"}
    assert sorted(search(admin_client, "jo")) == sorted(pks(either))
    assert sorted(search(admin_client, "JO")) == sorted(pks(either))


def test_search_email_ignores_case(admin_client, staff):
    assert search(admin_client, "person7@example.com") == [staff.employees[7].pk]
    assert search(admin_client, "PERSON7@Example.com") == [staff.employees[7].pk]
    assert search(admin_client, "person7@example") == []


def test_search_has_a_cap_on_words(admin_client, staff):
    from django.contrib import admin
    from hr.models import Employee

    cap = admin.site._registry[Employee].max_search_words
    words = " ".join(["payroll"] * (cap + 1))
    response = admin_client.get("/admin/hr/employee/", {"q": words})
    assert response.context["cl"].result_count == 0
    assert f"at most {cap} words" in response.content.decode()
    assert search(admin_client, " ".join(["payroll"] * cap))


def test_search_words_must_all_match(admin_client, staff):
    # Each word must match one field: a first name and a last name.
    expected = staff.matching(lambda e: e.first_name == "Ada" and e.last_name == "Lovelace")
    assert sorted(search(admin_client, "Ada Lovelace")) == sorted(pks(expected))
    assert search(admin_client, "Ada Zzz") == []


def test_full_text_search_of_the_bios(admin_client, staff):
    from hr.models import Employee

    payroll = staff.matching(lambda e: "payroll" in e.bio)
    assert 0 < len(payroll) < 45
    assert sorted(search(admin_client, "payroll")) == sorted(pks(payroll))
    assert sorted(search(admin_client, "PAYROLL audits")) == sorted(pks(payroll))
    # "quoted phrases" must occur in order.
    panic = staff.matching(lambda e: "kernel panic" in e.bio)
    assert sorted(search(admin_client, '"kernel panic"')) == sorted(pks(panic))
    assert search(admin_client, '"panic kernel"') == []
    # Ranked (the engine's BM25 order) when no column is sorted ...
    ranked = pks(Employee.objects.search("payroll"))
    assert search(admin_client, "payroll") == ranked
    # ... and in the column's order when one is.
    salary = search(admin_client, "payroll", o="6")
    assert salary == pks(sorted(payroll, key=lambda e: (e.salary, e.pk)))


def test_full_text_results_are_ranked_before_the_other_matches(admin_client, staff, per_page):
    from hr.models import Employee

    # Bios of different lengths, so that rank order is not key order; and last names
    # that the prefix search finds without the bio matching.
    add_employees(staff, 3, bio="")
    texts = [
        "Long bio: compilers, databases, networks, storage and the kernel of it all.",
        "kernel",
        "kernel kernel hacker",
    ]
    for i, text in enumerate(texts):
        Employee.objects.create(
            first_name="Text",
            last_name=f"Match{i}",
            email=f"text{i}@example.com",
            salary=1,
            department=staff.departments[0],
            hire_date=datetime.date(2020, 1, 1),
            bio=text,
        )
    Employee.objects.filter(email__startswith="extra").update(last_name="Kernighan")
    ranked = pks(Employee.objects.search("kernel"))
    assert len(ranked) == 3 + len(staff.matching(lambda e: "kernel" in e.bio))
    assert ranked != sorted(ranked) and ranked != sorted(ranked, reverse=True)
    others = pks(Employee.objects.filter(last_name="Kernighan").order_by("-pk"))
    assert len(others) == 3

    # "Kern" is a prefix of last names only; "kernel" a word of the bios only.
    assert search(admin_client, "Kern") == others
    assert search(admin_client, "kernel") == ranked
    # "Kernighan" finds the last names; the bios that say it would come first.
    assert search(admin_client, "Kernighan") == others
    Employee.objects.filter(email="text0@example.com").update(bio="Kernighan and Ritchie")
    text0 = Employee.objects.get(email="text0@example.com").pk
    assert search(admin_client, "Kernighan") == [text0, *others]
    # Pages cut across the ranked matches and the others alike.
    per_page(2)
    assert all_pages(admin_client, q="Kernighan") == [text0, *others]
    cl = changelist(admin_client, "employee", q="Kernighan", p=2)
    assert cl.result_count == 4 and pks(cl.result_list) == others[1:]
    # A filter applies to both parts.
    engineering = staff.departments[0].pk
    expected = [
        pk for pk in [text0, *others] if Employee.objects.get(pk=pk).department_id == engineering
    ]
    assert all_pages(admin_client, q="Kernighan", department__id__exact=engineering) == expected
    # With a column sorted, no ranking: the column's order.
    assert all_pages(admin_client, q="Kernighan", o="-1") == pks(
        Employee.objects.filter(pk__in=[text0, *others]).order_by("-last_name", "-pk")
    )


def test_search_with_nothing_to_look_for(admin_client, staff):
    assert len(search(admin_client, "  ")) == 45
    assert len(search(admin_client, '""')) == 45  # as in Django: "" is a prefix of all
    assert search(admin_client, "the") == []  # no field starts with it, no bio word


def test_department_search_prefix(admin_client, staff):
    cl = changelist(admin_client, "department", q="Sal")
    assert [d.name for d in cl.result_list] == ["Sales"]
    assert list(changelist(admin_client, "department", q="sal").result_list) == []


# -- departments and the inline ----------------------------------------------------------


def test_department_changelist_with_headcount(admin_client, staff):
    cl = changelist(admin_client, "department")
    assert [(d.name, d.headcount) for d in cl.result_list] == [
        ("Engineering", 15),
        ("Legal", 15),
        ("Sales", 15),
    ]
    cl = changelist(admin_client, "department", o="-3")
    assert len(cl.result_list) == 3


def test_department_change_page_has_the_employee_inline(admin_client, staff):
    legal = staff.departments[2]
    response = admin_client.get(f"/admin/hr/department/{legal.pk}/change/")
    assert response.status_code == 200
    html = response.content.decode()
    for employee in staff.matching(lambda e: e.department_id == legal.pk):
        assert employee.email in html


def formset_data(response) -> dict:
    """The POST data of a change page as it was rendered: the form and every inline."""
    data = {}
    forms = [response.context["adminform"].form]
    for inline in response.context["inline_admin_formsets"]:
        formset = inline.formset
        management = formset.management_form
        for name in management.fields:
            data[management.add_prefix(name)] = management[name].value()
        forms += list(formset.forms)
    for form in forms:
        for name in form.fields:
            value = form[name].value()
            if value is None or value is False:
                continue
            if value is True:
                value = "on"
            elif isinstance(value, datetime.date):
                value = value.isoformat()
            data[form.add_prefix(name)] = value
    return data


def test_department_inline_edits_and_adds_employees(admin_client, staff):
    from hr.models import Employee

    legal = staff.departments[2]
    url = f"/admin/hr/department/{legal.pk}/change/"
    response = admin_client.get(url)
    data = formset_data(response)
    prefix = response.context["inline_admin_formsets"][0].formset.prefix
    first = response.context["inline_admin_formsets"][0].formset.forms[0].instance
    data[f"{prefix}-0-salary"] = "99999"
    total = int(data[f"{prefix}-TOTAL_FORMS"])
    new = f"{prefix}-{total}-"
    data.update(
        {
            f"{prefix}-TOTAL_FORMS": str(total + 1),
            new + "first_name": "Inline",
            new + "last_name": "Added",
            new + "email": "inline@example.com",
            new + "title": "Clerk",
            new + "salary": "42000",
            new + "hire_date": "2024-02-29",
            new + "is_active": "on",
        }
    )
    response = admin_client.post(url, data)
    assert response.status_code == 302, response.context and [
        f.errors for f in response.context["inline_admin_formsets"][0].formset.forms
    ]
    assert Employee.objects.get(pk=first.pk).salary == 99999
    added = Employee.objects.get(email="inline@example.com")
    assert added.department_id == legal.pk and added.hire_date == datetime.date(2024, 2, 29)
    assert Employee.objects.filter(department=legal).count() == 16


# -- add, change, delete, history --------------------------------------------------------


def test_employee_add(admin_client, staff):
    from django.contrib.admin.models import ADDITION, LogEntry
    from hr.models import Employee

    response = admin_client.get("/admin/hr/employee/add/")
    assert response.status_code == 200
    response = admin_client.post(
        "/admin/hr/employee/add/",
        {
            "first_name": "Grace",
            "last_name": "Added",
            "email": "grace.added@example.com",
            "title": "Admiral",
            "department": staff.departments[0].pk,
            "salary": 150_000,
            "hire_date": "2024-05-01",
            "is_active": "on",
            "bio": "Wrote the first compiler.",
        },
    )
    assert response.status_code == 302, response.content[:3000]
    added = Employee.objects.get(email="grace.added@example.com")
    assert (added.last_name, added.salary) == ("Added", 150_000)
    assert Employee.objects.count() == 46
    assert pks(Employee.objects.search("compiler")) == [added.pk]
    # The admin log is in the plaintext database.
    entry = LogEntry.objects.using("default").get(object_id=str(added.pk))
    assert entry.action_flag == ADDITION and entry.object_repr == "Grace Added"


def test_employee_change_and_save(admin_client, staff):
    employee = staff.employees[3]
    url = f"/admin/hr/employee/{employee.pk}/change/"
    assert admin_client.get(url).status_code == 200
    response = admin_client.post(url, employee_form(employee, last_name="Renamed", salary=123_456))
    assert response.status_code == 302, response.content[:3000]
    employee.refresh_from_db()
    assert (employee.last_name, employee.salary) == ("Renamed", 123_456)


def test_employee_history(admin_client, staff):
    from django.contrib.admin.models import CHANGE, LogEntry

    employee = staff.employees[5]
    url = f"/admin/hr/employee/{employee.pk}/"
    admin_client.post(url + "change/", employee_form(employee, title="Director"))
    response = admin_client.get(url + "history/")
    assert response.status_code == 200
    html = response.content.decode()
    assert "Changed Title." in html
    entry = LogEntry.objects.using("default").get(object_id=str(employee.pk))
    assert entry.action_flag == CHANGE and entry.user.username == "admin"


def test_employee_add_rejects_a_duplicate_email(admin_client, staff):
    from hr.models import Employee

    data = employee_form(staff.employees[1], first_name="Dup", last_name="Licate")
    response = admin_client.post("/admin/hr/employee/add/", data)
    assert response.status_code == 200
    assert "Employee with this Email already exists." in response.content.decode()
    assert Employee.objects.count() == 45


def test_employee_delete(admin_client, staff):
    from django.contrib.admin.models import DELETION, LogEntry
    from hr.models import Employee

    employee = staff.employees[9]
    url = f"/admin/hr/employee/{employee.pk}/delete/"
    response = admin_client.get(url)
    assert response.status_code == 200 and "Are you sure" in response.content.decode()
    response = admin_client.post(url, {"post": "yes"})
    assert response.status_code == 302
    assert not Employee.objects.filter(pk=employee.pk).exists()
    assert Employee.objects.count() == 44
    assert LogEntry.objects.using("default").get(object_id=str(employee.pk)).action_flag == (
        DELETION
    )
    assert pks(changelist(admin_client, "employee").result_list).count(employee.pk) == 0


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

    pks_ = pks(staff.employees[:5])
    data = {"action": "delete_selected", "_selected_action": pks_}
    response = admin_client.post("/admin/hr/employee/", data)
    assert "Are you sure" in response.content.decode()
    response = admin_client.post("/admin/hr/employee/", {**data, "post": "yes"})
    assert response.status_code == 302
    assert Employee.objects.count() == 40
    assert not Employee.objects.filter(pk__in=pks_).exists()
    html = admin_client.get(response["Location"]).content.decode()
    assert re.search(r"Successfully deleted 5 employees", html)


def test_delete_selected_on_a_search(admin_client, staff):
    """The action applies to the rows of a ranked search too."""
    from hr.models import Employee

    payroll = staff.matching(lambda e: "payroll" in e.bio)
    data = {"action": "delete_selected", "select_across": "1", "index": "0", "post": "yes"}
    data["_selected_action"] = pks(payroll[:1])
    response = admin_client.post("/admin/hr/employee/?q=payroll", data)
    assert response.status_code == 302
    assert Employee.objects.count() == 45 - len(payroll)
    assert not Employee.objects.search("payroll").exists()


@pytest.mark.parametrize(
    "spec, lookup, indexed",
    [
        ("^last_name", "istartswith", True),  # a Lower("last_name") index
        ("^first_name", "istartswith", False),  # no index: Django's lookup
        ("=email", "iexact", True),  # a Lower("email") index
        ("=title", "iexact", False),
        ("=salary", "exact", True),
        ("@bio", "search", True),
        ("title", "icontains", False),
        ("bio", "icontains", True),  # a TrigramIndex
        ("^department__name", "startswith", True),  # across the relation: a unique index
        ("department__name__exact", "exact", True),  # an explicit lookup is kept
        ("=pk", "exact", True),
    ],
)
def test_search_lookups(spec, lookup, indexed):
    from hr.models import Employee

    from django_zerodb.admin import search_lookup

    found = search_lookup(Employee, spec)
    assert (found.lookup, found.indexed) == (lookup, indexed)


def test_search_values_that_cannot_match_a_field_are_skipped(admin_client, staff):
    from hr.models import Employee

    from django_zerodb.admin import search_lookup

    salary = search_lookup(Employee, "=salary")
    assert salary.value("abc", False) is None and salary.value("42", False) == 42
    assert search_lookup(Employee, "@bio").value('kernel "panic" drills', True) == (
        '"kernel panic drills"'
    )
    # In the admin: "=salary" searched for a word skips the field instead of failing.
    from django.contrib import admin

    employee_admin = admin.site._registry[Employee]
    fields = [*employee_admin.search_fields, "=salary"]
    from unittest import mock

    with mock.patch.object(type(employee_admin), "search_fields", fields):
        assert sorted(search(admin_client, "Hop")) == sorted(
            pks(staff.matching(lambda e: e.last_name.startswith("Hop")))
        )
        paid = staff.employees[4]
        assert paid.pk in search(admin_client, str(paid.salary))


@pytest.mark.django_db(databases=DATABASES, transaction=True)
def test_a_change_that_loses_a_race_says_so(admin_client, staff):
    """The example project runs at "repeatable read": a save that another connection's
    commit overtakes is not saved, and the change page says why (no server error)."""
    from concurrent.futures import ThreadPoolExecutor

    from django.db import connections
    from django.db.models.signals import pre_save
    from hr.models import Employee

    assert connections["encrypted"].settings_dict["OPTIONS"]["ISOLATION_LEVEL"] == (
        "repeatable read"
    )
    employee = staff.employees[2]
    fired = []

    def update_elsewhere():
        try:
            Employee.objects.filter(pk=employee.pk).update(salary=1)
        finally:
            connections.close_all()

    def overtake(sender, instance, **kwargs):
        if instance.pk == employee.pk and not fired:
            fired.append(True)
            with ThreadPoolExecutor(1) as pool:
                pool.submit(update_elsewhere).result(timeout=60)

    url = f"/admin/hr/employee/{employee.pk}/change/"
    pre_save.connect(overtake, sender=Employee)
    try:
        response = admin_client.post(url, employee_form(employee, salary=123_456), follow=True)
    finally:
        pre_save.disconnect(overtake, sender=Employee)
    assert fired and response.status_code == 200
    assert response.redirect_chain == [(url, 302)]
    assert "changed by someone else while you edited it" in response.content.decode()
    employee.refresh_from_db()
    assert employee.salary == 1


def test_a_large_department_inlines_its_first_employees_and_links_to_all(admin_client, staff):
    from hr.admin import FirstEmployeesFormSet
    from hr.models import Employee

    legal = staff.departments[2]
    template = staff.matching(lambda e: e.department_id == legal.pk)[0]
    Employee.objects.bulk_create(
        Employee(
            first_name="Extra",
            last_name=f"Person{i:03}",
            email=f"extra{i}@example.com",
            salary=template.salary,
            department=legal,
            hire_date=template.hire_date,
        )
        for i in range(FirstEmployeesFormSet.max_shown + 5)
    )
    headcount = Employee.objects.filter(department=legal).count()
    assert headcount > FirstEmployeesFormSet.max_shown
    response = admin_client.get(f"/admin/hr/department/{legal.pk}/change/")
    assert response.status_code == 200
    [inline] = response.context["inline_admin_formsets"]
    shown = [form.instance for form in inline.formset.forms]
    first = Employee.objects.filter(department=legal).order_by("last_name", "first_name", "pk")
    assert [e.pk for e in shown] == [e.pk for e in first[: FirstEmployeesFormSet.max_shown]]
    html = response.content.decode()
    assert f"?department__id__exact={legal.pk}" in html and f"all {headcount} employees" in html

"""The example site in a real browser (headless Chromium through Playwright): a person
logs in to the admin, lists, searches, filters and pages the encrypted employees, edits
one and sees the change after a reload, deletes one, looks at the "Encrypted store" page
and verifies the store, then filters the site's own employee list.

The site runs as a subprocess on a temporary store (see conftest.py); each step leaves a
screenshot in ``tests/e2e/artifacts/<test>/``.
"""

from __future__ import annotations

import re

import pytest

from tests.e2e.conftest import ADMIN_PASSWORD, SEED_EMPLOYEES

pytestmark = pytest.mark.xdist_group("e2e")

PER_PAGE = 50


def expect_text(page, selector: str, pattern: str) -> str:
    """The text of ``selector``, after waiting for it to match ``pattern``."""
    from playwright.sync_api import expect

    locator = page.locator(selector).first
    expect(locator).to_contain_text(re.compile(pattern))
    return locator.inner_text()


def log_in(page) -> None:
    page.goto("/admin/")
    assert "/admin/login/" in page.url
    page.steps.shot("login")
    page.fill("#id_username", "admin")
    page.fill("#id_password", ADMIN_PASSWORD)
    page.click("input[type=submit]")
    page.wait_for_url("**/admin/")
    expect_text(page, "#site-name", "Django administration")


def rows(page) -> int:
    return page.locator("#result_list tbody tr").count()


def test_admin_in_a_browser(page, site):
    facts = site.facts
    log_in(page)
    assert page.locator("#zerodb-store-module").is_visible()
    page.steps.shot("admin-index")

    # The employee list: 300 encrypted rows, 50 a page, counted from the indexes.
    page.click("text=Employees")
    page.wait_for_url(re.compile(r"/admin/hr/employee/(\?.*)?$"))
    expect_text(page, ".paginator", f"{SEED_EMPLOYEES} employees")
    assert rows(page) == PER_PAGE
    page.steps.shot("employee-list")

    # Full-text search of the bios (@bio): ranked, counted.
    page.fill("#searchbar", "kubernetes")
    page.press("#searchbar", "Enter")
    page.wait_for_url("**q=kubernetes**")
    expect_text(page, "#changelist-search", f"{facts['kubernetes']} results? \\({SEED_EMPLOYEES}")
    assert 0 < facts["kubernetes"] < SEED_EMPLOYEES
    page.steps.shot("search-kubernetes")

    # Filter the search by department (the related filter in the sidebar).
    page.locator("#changelist-filter a", has_text="Engineering").first.click()
    page.wait_for_url("**department__id__exact=**")
    expect_text(page, "#changelist-search", f"{facts['engineering_kubernetes']} results?")
    page.steps.shot("search-and-department-filter")

    # Only the department filter.
    page.goto("/admin/hr/employee/")
    page.locator("#changelist-filter a", has_text="Engineering").first.click()
    page.wait_for_url("**department__id__exact=**")
    engineering = facts["departments"]["Engineering"]
    expect_text(page, ".paginator", f"{engineering} employees")
    page.steps.shot("department-filter")

    # The last page.
    page.goto("/admin/hr/employee/")
    pages = -(-SEED_EMPLOYEES // PER_PAGE)
    page.locator(".paginator a", has_text=re.compile(rf"^{pages}$")).click()
    page.wait_for_url(f"**p={pages}**")
    assert page.locator('.paginator a[aria-current="page"]').inner_text().strip() == str(pages)
    assert rows(page) == SEED_EMPLOYEES - (pages - 1) * PER_PAGE
    page.steps.shot("last-page")

    # Edit an employee of the last page; the change is there after a reload. (Not one of
    # Engineering, whose counts the other test checks.)
    first = (
        page.locator("#result_list tbody tr")
        .filter(has_not=page.locator("td.field-department", has_text="Engineering"))
        .first
    )
    email = first.locator("td.field-email").inner_text()
    first.locator("th a").click()
    page.wait_for_url(re.compile(r"/change/"))
    page.fill("#id_title", "Chief Browser Officer")
    page.fill("#id_salary", "123457")
    page.steps.shot("edit-employee")
    page.click("input[name=_continue]")
    page.wait_for_url(re.compile(r"/change/"))
    expect_text(page, ".messagelist", "was changed successfully")
    page.reload()
    assert page.input_value("#id_title") == "Chief Browser Officer"
    assert page.input_value("#id_salary") == "123457"
    assert page.input_value("#id_email") == email
    page.steps.shot("edited-after-reload")

    # Find it again by its exact email (=email: the unique index).
    page.goto("/admin/hr/employee/")
    page.fill("#searchbar", email)
    page.press("#searchbar", "Enter")
    expect_text(page, "#changelist-search", "1 result")
    expect_text(page, "#result_list", "Chief Browser Officer")

    # Delete it.
    page.locator("#result_list tbody tr th a").first.click()
    page.wait_for_url(re.compile(r"/change/"))
    page.click("a.deletelink")
    page.wait_for_url(re.compile(r"/delete/"))
    expect_text(page, "#content", "Are you sure")
    page.steps.shot("delete-confirmation")
    page.click("input[type=submit]")
    page.wait_for_url(re.compile(r"/admin/hr/employee/(\?.*)?$"))
    expect_text(page, ".messagelist", "was deleted successfully")
    expect_text(page, ".paginator", "0 employees")  # the search is kept: it is gone
    page.goto("/admin/hr/employee/")
    expect_text(page, ".paginator", f"{SEED_EMPLOYEES - 1} employees")
    page.steps.shot("after-delete")

    # The "Encrypted store" page: counts from the root, round trips, and verification.
    page.goto("/admin/")
    page.click("#zerodb-store-module caption a")
    page.wait_for_url("**/admin/zerodb/")
    expect_text(page, "#zerodb-model-hr_employee", f"{SEED_EMPLOYEES - 1}")
    expect_text(page, "#zerodb-requests", "/admin/hr/employee/")
    assert "hr.zdb" in page.inner_text("#zerodb-address")
    page.steps.shot("encrypted-store")
    page.click("#zerodb-verify-form input[type=submit]")
    page.wait_for_url("**/admin/zerodb/?database=encrypted")
    expect_text(page, "#zerodb-verify-result", "No problems found.")
    page.steps.shot("verified")


def test_site_employee_list_in_a_browser(page, site):
    facts = site.facts
    page.goto("/employees/")
    expect_text(page, "p.summary", r"\d+ employees")
    page.steps.shot("employee-list")

    page.select_option("#id_department", label="Engineering")
    page.fill("#id_q", "kubernetes")
    page.click("form.filters button[type=submit]")
    page.wait_for_url("**q=kubernetes**")
    expected = facts["engineering_kubernetes"]
    expect_text(page, "p.summary", rf"{expected} employees?\s+matching the search")
    assert page.locator("table.employees tbody tr").count() == min(expected, 20)
    departments = page.locator("table.employees tbody td:nth-child(3)").all_inner_texts()
    assert set(departments) == {"Engineering"}
    page.steps.shot("filtered")

    # Add a salary floor, ordered by salary: every salary shown is at least that.
    page.fill("#id_salary_min", "150000")
    page.select_option("#id_ordering", value="-salary")
    page.click("form.filters button[type=submit]")
    page.wait_for_url("**salary_min=150000**")
    expect_text(page, "p.summary", r"\d+ employees?\s+matching the search")
    salaries = [
        int(text.strip("$").replace(",", ""))
        for text in page.locator("table.employees tbody td.num").all_inner_texts()
    ]
    assert salaries and all(s >= 150_000 for s in salaries)
    assert salaries == sorted(salaries, reverse=True)
    page.steps.shot("salary-floor")

"""Fixtures of the example site's tests: a small, fully known staff."""

from __future__ import annotations

import dataclasses
import datetime
import decimal
import os

import pytest

from tests.example.conftest import SETTINGS

if os.environ.get("DJANGO_SETTINGS_MODULE") != SETTINGS:
    raise pytest.UsageError(
        f"tests/example/site_tests need the example project's settings: "
        f"python -m pytest tests/example/site_tests --ds={SETTINGS}"
    )

# Every test may touch both databases (users in default, HR data in encrypted).
DATABASES = ["default", "encrypted"]
db = pytest.mark.django_db(databases=DATABASES)

FIRST = ["Ada", "Alan", "Grace", "Joan", "Linus", "Barbara", "John", "Margaret", "jonas"]
LAST = ["Lovelace", "Turing", "Hopper", "Clarke", "Torvalds", "Liskov", "Jones", "Hamilton"]
TOPICS = ["kubernetes and compilers", "payroll audits", "GDPR contracts", "kernel panic drills"]


@dataclasses.dataclass
class Staff:
    departments: list  # Department objects
    employees: list  # Employee objects, as saved

    def matching(self, predicate) -> list:
        return [e for e in self.employees if predicate(e)]


@pytest.fixture
def staff():
    """3 departments, 45 employees with spread-out salaries, dates, names and bios."""
    from hr.models import Department, Employee

    departments = [
        Department.objects.create(name=name, budget=decimal.Decimal(budget))
        for name, budget in [("Engineering", "900000.00"), ("Sales", "250000.50"), ("Legal", "1")]
    ]
    employees = []
    for i in range(45):
        employees.append(
            Employee(
                first_name=FIRST[i % len(FIRST)],
                last_name=LAST[i % len(LAST)],
                email=f"person{i}@example.com",
                title=["Engineer", "Manager", "Counsel"][i % 3],
                salary=40_000 + (i * 7_919) % 120_000,
                department=departments[i % 3],
                hire_date=datetime.date(2010 + i % 15, 1 + i % 12, 1 + i % 28),
                is_active=i % 4 != 1,
                bio=f"Employee number {i}. Works on {TOPICS[i % len(TOPICS)]}.",
            )
        )
    Employee.objects.bulk_create(employees)
    return Staff(departments, list(Employee.objects.order_by("pk")))

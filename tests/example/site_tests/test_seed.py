"""``manage.py seed_hr``: departments then employees, deterministic with --seed,
``--if-empty``, and a progress bar only when stderr is a terminal."""

from __future__ import annotations

import io

import pytest
from django.core.management import CommandError, call_command

from tests.example.site_tests.conftest import db

pytestmark = db


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def seed(*args, stderr=None, **options) -> tuple[str, str]:
    out, err = io.StringIO(), stderr or io.StringIO()
    call_command("seed_hr", *args, stdout=out, stderr=err, **options)
    return out.getvalue(), err.getvalue()


def snapshot() -> list[tuple]:
    from hr.models import Employee

    return list(
        Employee.objects.order_by("pk").values_list(
            "first_name",
            "last_name",
            "email",
            "title",
            "salary",
            "department__name",
            "hire_date",
            "is_active",
            "bio",
        )
    )


def test_seed_fills_the_database(settings):
    from hr.models import Department, Employee

    out, err = seed(employees=130, seed=7, batch_size=50)
    assert "Seeded 130 employees in 12 departments" in out
    assert err == ""  # not a terminal: no progress bar
    assert Department.objects.count() == 12
    names = list(Department.objects.values_list("name", flat=True))
    assert len(set(names)) == 12
    assert Employee.objects.count() == 130
    emails = list(Employee.objects.values_list("email", flat=True))
    assert len(set(emails)) == 130
    for first, last, email, title, salary, department, hired, _, bio in snapshot():
        assert first and last and title and department and bio
        assert email.endswith("@example.com")
        assert 30_000 <= salary <= 330_000
        assert 2006 <= hired.year <= 2025
        assert first in bio
    # The data is searchable: each bio names three of the department's topics.
    assert Employee.objects.search("payroll").count() > 0


def test_progress_bar_on_a_terminal():
    terminal = Terminal()
    out, err = seed(employees=40, seed=1, batch_size=15, stderr=terminal)
    assert "Seeded 40 employees" in out
    assert "seeding" in err
    assert "40/40" in err


def test_same_seed_same_data():
    from hr.models import Department, Employee

    seed(employees=25, seed=42)
    first = snapshot()
    Employee.objects.all().delete()
    Department.objects.all().delete()
    seed(employees=25, seed=42)
    assert snapshot() == first
    Employee.objects.all().delete()
    seed(employees=25, seed=43)
    assert snapshot() != first


def test_if_empty():
    from hr.models import Department, Employee

    seed(employees=10, seed=1)
    out, _ = seed(employees=10, seed=2, if_empty=True)
    assert "10 employees already there: not seeding." in out
    assert Employee.objects.count() == 10
    # Without --if-empty, more are added, with fresh emails; departments are reused.
    seed(employees=15, seed=1)
    assert Employee.objects.count() == 25
    assert len(set(Employee.objects.values_list("email", flat=True))) == 25
    assert Department.objects.count() == 12


def test_if_empty_on_an_empty_database_seeds():
    from hr.models import Employee

    out, _ = seed(employees=5, if_empty=True)
    assert Employee.objects.count() == 5
    assert "Seeded 5 employees" in out


def test_bad_arguments():
    with pytest.raises(CommandError):
        seed(employees=-1)
    with pytest.raises(CommandError):
        seed(employees=1, batch_size=0)

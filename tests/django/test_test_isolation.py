"""A test that did not ask for the encrypted database cannot read or write it.

pytest-django's plain ``@pytest.mark.django_db`` (like Django's ``TestCase`` without
``databases``) allows ``default`` only: Django replaces ``cursor()`` and ``connect()`` on
the other connections. The backend's compilers reach the store through ``cursor()``
(``DatabaseWrapper.session``), so the guard holds also once the encrypted connection is
open, which it is after any earlier test that used it: before, such a test could write to
the encrypted test database, and its row outlived it (only ``default`` is rolled back).
"""

from __future__ import annotations

import pytest
from django.db import connections
from django.test import TestCase
from django.test.testcases import DatabaseOperationForbidden

from tests.django.conftest import MEMORY, db
from tests.django.testapp.models import Department


@pytest.fixture(scope="module")
def encrypted_connection_open(django_db_setup, django_db_blocker):
    """The encrypted test database's connection, opened before the test's guard is set."""
    with django_db_blocker.unblock():
        Department.objects.using(MEMORY).exists()
    assert connections[MEMORY].connection is not None


@pytest.mark.django_db
@pytest.mark.usefixtures("encrypted_connection_open")
@pytest.mark.parametrize(
    "query",
    [
        lambda: Department.objects.create(name="leaked"),
        lambda: Department.objects.count(),
        lambda: list(Department.objects.filter(name="x")),
        lambda: Department.objects.filter(name="x").update(name="y"),
    ],
    ids=["create", "count", "select", "update"],
)
def test_a_default_only_test_is_refused(query):
    with pytest.raises(DatabaseOperationForbidden, match="'encrypted' are not allowed"):
        query()


@db
@pytest.mark.usefixtures("encrypted_connection_open")
def test_nothing_leaked():
    assert not Department.objects.filter(name="leaked").exists()


class DefaultOnly(TestCase):
    """Django's own test case: the same refusal."""

    def test_refused(self):
        Department.objects.using(MEMORY).none()  # building a queryset is no query
        with self.assertRaises(DatabaseOperationForbidden):
            Department.objects.create(name="leaked")


class BothDatabases(TestCase):
    databases = {"default", MEMORY}

    def test_allowed_and_rolled_back(self):
        Department.objects.create(name="kept inside this test")
        self.assertEqual(Department.objects.filter(name__startswith="kept").count(), 1)
        self.assertFalse(Department.objects.filter(name="leaked").exists())

"""A test case that did not ask for the encrypted database cannot query it: its writes
would not be rolled back (only the databases in ``databases`` are), and would leak into
the next test."""

from django.contrib.auth.models import User
from django.test import TestCase
from django.test.testcases import DatabaseOperationForbidden

from hr.models import Department


class DefaultOnlyTests(TestCase):
    def test_default_is_allowed(self):
        User.objects.create_user("someone")
        self.assertEqual(User.objects.count(), 1)

    def test_the_encrypted_database_is_refused(self):
        with self.assertRaises(DatabaseOperationForbidden):
            Department.objects.create(name="would leak")
        with self.assertRaises(DatabaseOperationForbidden):
            Department.objects.count()

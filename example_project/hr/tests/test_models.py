"""The HR models on the encrypted database, with Django's ``TestCase``.

A test case that touches encrypted models lists the encrypted alias in ``databases``
(each is wrapped in a transaction and rolled back after each test, as ``default`` is);
one that does not, cannot query them (``test_isolation.py``).
"""

import datetime
from decimal import Decimal

from django.db.models import ProtectedError
from django.test import TestCase

from hr.models import Department, Employee


class EncryptedTestCase(TestCase):
    databases = {"default", "encrypted"}

    @classmethod
    def setUpTestData(cls):
        cls.kernel = Department.objects.create(name="Kernel", budget=Decimal("100000.00"))
        cls.people = [
            Employee.objects.create(
                first_name=first,
                last_name=last,
                email=f"{first.lower()}@example.com",
                title="Engineer",
                salary=salary,
                department=cls.kernel,
                hire_date=datetime.date(2020, 1, 1),
                bio=bio,
            )
            for first, last, salary, bio in [
                ("Ada", "Lovelace", 120_000, "analytical engines and kernel panic drills"),
                ("Linus", "Torvalds", 90_000, "writes kernels, reviews patches"),
                ("Grace", "Hopper", 150_000, "compilers and nanoseconds"),
            ]
        ]


class EmployeeTests(EncryptedTestCase):
    def test_index_served_queries(self):
        high = Employee.objects.filter(salary__gte=100_000).order_by("-salary")
        self.assertEqual([e.first_name for e in high], ["Grace", "Ada"])
        self.assertEqual(Employee.objects.filter(last_name__startswith="To").count(), 1)

    def test_ranked_search(self):
        found = list(Employee.objects.search("kernel panic"))
        self.assertEqual(found[0].first_name, "Ada")

    def test_rolled_back_between_tests(self):
        # setUpTestData's rows, and nothing another test created.
        self.assertEqual(Employee.objects.count(), len(self.people))
        Employee.objects.filter(first_name="Ada").delete()
        self.assertEqual(Employee.objects.count(), len(self.people) - 1)

    def test_a_department_with_employees_is_protected(self):
        with self.assertRaises(ProtectedError):
            self.kernel.delete()

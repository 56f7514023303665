"""A write through the API that loses a race: at ``ISOLATION_LEVEL`` "repeatable read"
the viewset answers 409 Conflict and saves nothing (at "read committed" the later write
simply wins, as on PostgreSQL).

The race is made deterministic: while the API request saves, a ``pre_save`` receiver
has another connection (another thread) change the same row and commit.
"""

from __future__ import annotations

import pytest
from django.db import connections
from django.db.models.signals import pre_save

from tests.django.test_transactions import elsewhere
from tests.django.testapp.models import Employee

pytestmark = pytest.mark.django_db(databases=["default", "encrypted"], transaction=True)


@pytest.fixture(params=["read committed", "repeatable read"])
def isolation(request):
    options = connections["encrypted"].settings_dict["OPTIONS"]
    before = options.get("ISOLATION_LEVEL")
    options["ISOLATION_LEVEL"] = request.param
    connections["encrypted"].close()
    yield request.param
    options.pop("ISOLATION_LEVEL")
    if before is not None:
        options["ISOLATION_LEVEL"] = before
    connections["encrypted"].close()


@pytest.fixture
def overtaken():
    """An employee whose next save is overtaken, once, by another connection's update."""
    employee = Employee.objects.create(first_name="Ada", last_name="L", email="a@x", salary=10)
    fired = []

    def overtake(sender, instance, **kwargs):
        if instance.pk == employee.pk and not fired:
            fired.append(True)
            elsewhere(lambda: Employee.objects.filter(pk=employee.pk).update(salary=1))

    pre_save.connect(overtake, sender=Employee)
    yield employee
    pre_save.disconnect(overtake, sender=Employee)
    assert fired


def test_an_update_that_loses_a_race(api, isolation, overtaken):
    response = api.patch(f"/api/employees/{overtaken.pk}/", {"salary": 99}, format="json")
    stored = Employee.objects.get(pk=overtaken.pk).salary
    if isolation == "read committed":
        assert response.status_code == 200 and stored == 99  # the later write wins
    else:
        assert response.status_code == 409, response.content
        assert response.json()["detail"].startswith("The resource was changed")
        assert stored == 1  # nothing of the refused request was saved

"""``BadQuery``: 400 answers naming the path of the problem."""

from __future__ import annotations

import pytest
from django.db.models import ProtectedError, RestrictedError
from rest_framework.views import exception_handler

from django_zerodb.rest.exceptions import BadQuery, join
from tests.django.rest.api import EmployeeViewSet
from tests.django.testapp.models import Employee, Tag


def test_body():
    exc = BadQuery("unknown operator '$foo'", "filter.salary.$foo")
    assert exc.status_code == 400
    assert (exc.error, exc.path) == ("unknown operator '$foo'", "filter.salary.$foo")
    response = exception_handler(exc, {})
    assert response.status_code == 400
    assert response.data == {"detail": "unknown operator '$foo'", "path": "filter.salary.$foo"}
    assert exc.get_codes() == {"detail": "bad_query", "path": "bad_query"}


def test_whole_body_path():
    assert BadQuery("not an object").detail == {"detail": "not an object", "path": ""}


def test_join():
    assert join("", "filter") == "filter"
    assert join("filter", "salary") == "filter.salary"
    assert join("filter.$or", 2) == "filter.$or[2]"
    assert join(join(join("filter", "$and"), 0), "$gte") == "filter.$and[0].$gte"


@pytest.mark.parametrize("error", [ProtectedError, RestrictedError])
def test_deletes_refused_by_references_are_409(error):
    """Both refusals of ``on_delete``, by model; the objects themselves are not shown."""
    referring = {Employee(pk=1), Employee(pk=2), Tag(pk=3)}
    view = EmployeeViewSet(request=None, args=(), kwargs={}, format_kwarg=None)
    response = view.handle_exception(error("refused", referring))
    assert response.status_code == 409
    assert response.data["detail"] == (
        "Other objects still refer to this one (2 employees, 1 tag); nothing was deleted."
    )
    assert response.data["detail"].code == "protected"

"""``BadQuery``: 400 answers naming the path of the problem."""

from __future__ import annotations

from rest_framework.views import exception_handler

from django_zerodb.rest.exceptions import BadQuery, join


def test_body():
    exc = BadQuery("unknown operator '$foo'", "filter.salary.$foo")
    assert exc.status_code == 400
    assert (exc.error, exc.path) == ("unknown operator '$foo'", "filter.salary.$foo")
    response = exception_handler(exc, {})
    assert response.status_code == 400
    assert response.data == {"error": "unknown operator '$foo'", "path": "filter.salary.$foo"}
    assert exc.get_codes() == {"error": "bad_query", "path": "bad_query"}


def test_whole_body_path():
    assert BadQuery("not an object").detail == {"error": "not an object", "path": ""}


def test_join():
    assert join("", "filter") == "filter"
    assert join("filter", "salary") == "filter.salary"
    assert join("filter.$or", 2) == "filter.$or[2]"
    assert join(join(join("filter", "$and"), 0), "$gte") == "filter.$and[0].$gte"

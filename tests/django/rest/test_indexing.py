"""What the REST layer knows of the indexes (``django_zerodb/rest/indexing.py``)."""

from __future__ import annotations

import types

import pytest
from django.db.models import Q

from django_zerodb.indexes import TextIndex
from django_zerodb.rest.indexing import (
    has_text_index,
    is_ranked,
    is_sortable,
    model_field,
    text_field,
    text_fields,
)
from tests.django.testapp.models import Department, Employee, Tag


def test_text_fields():
    assert text_fields(Employee) == ["bio"]
    assert text_field(Employee) == "bio"
    assert text_fields(Department) == []
    with pytest.raises(LookupError, match="Department has no full-text index"):
        text_field(Department)
    two = types.SimpleNamespace(
        _meta=types.SimpleNamespace(
            object_name="Doc",
            indexes=[TextIndex(fields=["a"], name="a"), TextIndex(fields=["b"], name="b")],
        )
    )
    assert text_fields(two) == ["a", "b"]
    with pytest.raises(LookupError, match="several full-text indexes"):
        text_field(two)


def test_has_text_index():
    assert has_text_index(Employee._meta.get_field("bio"))
    assert not has_text_index(Employee._meta.get_field("first_name"))
    assert not has_text_index(Department._meta.get_field("name"))


@pytest.mark.parametrize(
    "name, sortable",
    [
        ("pk", True),
        ("-pk", True),
        ("id", True),
        ("first_name", True),  # db_index
        ("-email", True),  # unique
        ("department", True),  # ForeignKey
        ("salary", True),
        ("hire_date", True),
        ("last_name", False),
        ("title", False),
        ("bio", False),  # a TextIndex does not order
        ("updated", False),
        ("tags", False),  # not a concrete field
        ("nope", False),
    ],
)
def test_is_sortable(name, sortable):
    assert is_sortable(Employee, name) is sortable


def test_model_field():
    assert model_field(Employee, "pk") is Employee._meta.pk
    assert model_field(Employee, "salary").name == "salary"
    assert model_field(Employee, "assignments") is None
    assert model_field(Tag, "employees") is None
    assert model_field(Employee, "nope") is None


def test_is_ranked():
    E = Employee.objects
    assert is_ranked(E.search("kernel"))
    assert is_ranked(E.search("kernel").filter(salary__gte=5))
    assert is_ranked(E.filter(Q(salary=1) & Q(bio__search="kernel")).order_by())
    assert not is_ranked(E.filter(bio__search="kernel"))  # Meta.ordering applies
    assert not is_ranked(E.search("kernel").order_by("salary"))
    assert not is_ranked(E.filter(Q(bio__search="kernel") | Q(salary=1)).order_by())
    assert not is_ranked(E.exclude(bio__search="kernel").order_by())
    assert not is_ranked(E.order_by())

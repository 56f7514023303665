"""JSONField on both databases: SQL NULL, JSON null and a missing key kept apart; key
paths through objects and arrays (``has_key`` with nested, list and numeric keys, a key
transform naming the path on the right); ``__in`` with expressions; key transforms
compared with key transforms, wrapped, grouped and counted; JSON null written by
``update()`` and ``bulk_update()``. SQLite (Django's own JSON1 SQL) is the reference.
"""

from __future__ import annotations

import operator
import warnings

import django
import pytest
from django.db.models import Count, ExpressionWrapper, F, IntegerField, JSONField, Q, Value
from django.db.models.fields.json import KT, KeyTransform
from django.db.models.functions import Cast

from django_zerodb.compat import JSON_NONE_DEPRECATION, JSONNull
from tests.django.difftest import support
from tests.django.difftest.models import Doc
from tests.django.difftest.test_differential import ENC, PLAIN

pytestmark = pytest.mark.django_db(databases=["default", ENC, PLAIN])

DOCS = [
    None,
    [],
    {},
    {"a": "b", "c": 14},
    {"a": "b", "c": 14, "d": ["e", {"f": "g"}], "h": True, "j": None, "o": '"quoted"'},
    [1, [2]],
    [{"a": 1}, {"b": "x"}],
    {"foo": "bar", "baz": {"a": "b", "c": "d"}, "bar": ["foo", "bar"], "bax": {"foo": "bar"}},
    {"123": "v", "nested": {"456": "w"}, "array": [{"789": "z"}], "000": "y"},
    {"0": "zero", "d": ["e", "e"], "target": 5, "comparison": 2},
    {"target": 2, "comparison": 5, "d": [{"f": "g"}]},
    True,
    7,
    "yes",
]


@pytest.fixture
def docs():
    for using in (PLAIN, ENC):
        Doc.objects.using(using).bulk_create(
            [Doc(value=v, n=i % 3) for i, v in enumerate(DOCS)]
            + [Doc(value=Value(None, JSONField()), n=9)]
        )


def both(make):
    """Plain equality: the answers hold no floats nor SQLite-rounded decimals."""
    return support.both(make, compare=operator.eq)


def ids(condition) -> list:
    """The documents (by position in DOCS) a filter finds, on both databases."""
    return both(lambda using: found(using, condition))


def found(using: str, condition: Q) -> list:
    pks = list(Doc.objects.using(using).order_by("pk").values_list("pk", flat=True))
    matches = Doc.objects.using(using).filter(condition).values_list("pk", flat=True)
    return sorted(pks.index(pk) for pk in matches)


# Django 6.0 and older cannot compile some key lookups on SQLite, the reference: a key
# compared with a key (KeyTransformNumericLookupMixin json.loads() the other key's path)
# and a dict in a key's __in (not JSON-encoded). Django 6.1 fixed both.
SQLITE_COMPILES_KEY_OPERANDS = django.VERSION >= (6, 1)


@pytest.mark.parametrize(
    "condition",
    [
        Q(value__isnull=True),
        Q(value=Value(None, JSONField())),
        Q(value__j=None),
        Q(value__j__isnull=True),
        Q(value__j__isnull=False),
        Q(value__o='"quoted"'),
        Q(value__c=14),
        Q(value__h=True),
        Q(value__0__isnull=False),
        Q(value__1__b="x"),
        Q(value__d__1__f="g"),
        Q(value__baz__has_key="a"),
        Q(value__has_key=KeyTransform("a", KeyTransform("baz", "value"))),
        Q(value__has_key=F("value__baz__c")),
        Q(value__has_key=F("value__d__1__f")),
        Q(value__has_key=KeyTransform("b", KeyTransform(1, "value"))),
        Q(value__has_key="0"),
        Q(value__has_key="123"),
        Q(value__nested__has_key="456"),
        Q(value__array__0__has_keys=["789"]),
        Q(value__has_any_keys=["000", "nonexistent"]),
        Q(value__has_keys=["a", "c"]),
        Q(value__foo__in=[F("value__bax__foo"), "baz"]),
        Q(value__foo__in=[KeyTransform("foo", KeyTransform("bax", "value"))]),
        Q(value__in=[[1, [2]], "yes", {"a": "b", "c": 14}]),
        Q(value__c__gte=14),
        Q(value__a__startswith="b"),
    ],
    ids=repr,
)
def test_filter(docs, condition):
    ids(condition)


@pytest.mark.parametrize(
    "condition, keys, holds",
    [
        (
            Q(value__target__gt=F("value__comparison")),
            {"target", "comparison"},
            lambda doc: doc["target"] > doc["comparison"],
        ),
        (
            Q(value__target__lte=F("value__comparison")),
            {"target", "comparison"},
            lambda doc: doc["target"] <= doc["comparison"],
        ),
        (
            Q(value__bar__in=[Value(["foo", "bar"], JSONField()), {"a": "b"}]),
            {"bar"},
            lambda doc: doc["bar"] in (["foo", "bar"], {"a": "b"}),
        ),
    ],
    ids=["key-gt-key", "key-lte-key", "key-in-list-and-dict"],
)
def test_key_operands(docs, condition, keys, holds):
    """What these find is computed from DOCS, and checked against SQLite too from Django
    6.1 (SQLITE_COMPILES_KEY_OPERANDS)."""
    expected = [
        i
        for i, doc in enumerate(DOCS)
        if isinstance(doc, dict) and keys <= doc.keys() and holds(doc)
    ]
    assert expected
    if SQLITE_COMPILES_KEY_OPERANDS:
        assert ids(condition) == expected
    assert found(ENC, condition) == expected


@pytest.mark.skipif(JSONNull is None, reason="JSONNull() is new in Django 6.1")
def test_filter_json_null(docs):
    for condition in (
        Q(value=JSONNull()),
        Q(value__j__in=[JSONNull(), 0]),
        Q(value__in=[JSONNull(), [1, [2]], "yes"]),
    ):
        ids(condition)


def test_key_compared_with_key(docs):
    """A key transform on the right of a key transform; one through a JSON cast."""
    ids(
        Q(value__d__0__isnull=False)
        & Q(value__d__0=KeyTransform("0", Cast(KeyTransform("d", "value"), JSONField())))
    )


def test_key_in_annotations(docs):
    def run(using):
        return list(
            Doc.objects.using(using)
            .annotate(
                key=F("value__d"),
                first=F("key__0"),
                wrapped=ExpressionWrapper(KeyTransform("c", "value"), IntegerField()),
                text=KT("value__a"),
            )
            .order_by("pk")
            .values_list("key", "first", "wrapped", "text")
        )

    both(run)


def test_group_by_key(docs):
    def run(using):
        return list(
            Doc.objects.using(using)
            .filter(value__isnull=False)
            .values("value__d__0")
            .annotate(count=Count("value__d__0"))
            .order_by("count")
            .values_list("count", flat=True)
        )

    both(run)


def test_json_null_written_by_update_and_bulk_update(docs):
    """JSON null is ``JSONNull()`` from Django 6.1, ``Value(None, JSONField())`` before."""
    json_null = Value(None, JSONField()) if JSONNull is None else JSONNull()

    def run(using):
        manager = Doc.objects.using(using)
        manager.filter(n=0).update(value=Value(None, JSONField()))
        changed = list(manager.filter(n=1))
        for doc in changed:
            doc.value = json_null
        manager.bulk_update(changed, ["value"])
        emptied = list(manager.filter(n=2))
        for doc in emptied:
            doc.value = None  # SQL NULL, also through bulk_update's CASE
        manager.bulk_update(emptied, ["value"])
        return (
            manager.filter(value=json_null).count(),
            manager.filter(value__isnull=True).count(),
        )

    both(run)


def test_exact_none_warns_as_django_does(docs):
    """Django 6.1 deprecates ``json_field=None`` (JSON null); older versions say nothing."""
    given = {}
    for using in (PLAIN, ENC):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            list(Doc.objects.using(using).filter(value=None))
        given[using] = [type(w.message) for w in caught if "JSONNull" in str(w.message)]
    assert given[ENC] == given[PLAIN]
    assert given[ENC] == ([] if JSON_NONE_DEPRECATION is None else [JSON_NONE_DEPRECATION])


def test_json_array_and_object(docs):
    from django.db.models.functions import JSONArray, JSONObject, Lower

    def run(using):
        return list(
            Doc.objects.using(using)
            .annotate(
                a=JSONArray("n", Lower(Value("X")), Value(1.5), JSONArray("n", Value(None))),
                o=JSONObject(n="n", nested=JSONObject(k=Value("v"), empty=JSONArray())),
            )
            .order_by("pk")
            .values_list("a", "o")
        )

    both(run)


def test_json_field_inside_json_array_refused(docs):
    """SQLite embeds the column's text as a string, PostgreSQL its document."""
    from django.db import NotSupportedError
    from django.db.models.functions import JSONArray

    with pytest.raises(NotSupportedError, match="JSONArray"):
        list(Doc.objects.using(ENC).annotate(a=JSONArray("value")))

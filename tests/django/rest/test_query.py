"""The JSON query endpoint (``POST <resource>/query/``) and its language
(``django_zerodb/rest/query.py``).

The results of every query are compared with the same query written with the ORM,
computed directly on the encrypted database; every 400 names its JSON path.
"""

from __future__ import annotations

import datetime
import decimal
import json

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.db.models import Q

from django_zerodb.rest.exceptions import BadQuery
from django_zerodb.rest.parsers import ZeroJSONParser, nesting_depth
from django_zerodb.rest.query import QueryParser
from tests.django.rest.helpers import db, ids, pks
from tests.django.testapp.models import Department, Employee, Tag

pytestmark = db


def query(client, body, resource="employees"):
    return client.post(f"/api/{resource}/query/", body, format="json")


def salary(hr, i):
    return hr.employees[i].salary


def first_pks(hr):
    return [e.pk for e in hr.employees[:3]]


def dept(hr, name):
    return hr.departments[name].pk


# (name, the body's filter, the same filter as a Q): functions of the data set.
EQUIVALENT = [
    ("everything", lambda hr: ({}, Q())),
    ("bare value", lambda hr: ({"first_name": "Ada"}, Q(first_name="Ada"))),
    (
        "range and equality",
        lambda hr: (
            {"salary": {"$gte": 40_000, "$lte": 60_000}, "first_name": "Grace"},
            Q(salary__gte=40_000, salary__lte=60_000, first_name="Grace"),
        ),
    ),
    ("null", lambda hr: ({"salary": None}, Q(salary=None))),
    ("not null", lambda hr: ({"salary": {"$ne": None}}, ~Q(salary=None))),
    ("$eq", lambda hr: ({"salary": {"$eq": salary(hr, 1)}}, Q(salary=salary(hr, 1)))),
    ("$ne", lambda hr: ({"salary": {"$ne": salary(hr, 1)}}, ~Q(salary=salary(hr, 1)))),
    ("$lt", lambda hr: ({"salary": {"$lt": 45_000}}, Q(salary__lt=45_000))),
    ("$gt", lambda hr: ({"salary": {"$gt": 45_000}}, Q(salary__gt=45_000))),
    ("integral float", lambda hr: ({"salary": {"$gte": 45_000.0}}, Q(salary__gte=45_000))),
    (
        "$in",
        lambda hr: ({"first_name": {"$in": ["Ada", "Ken"]}}, Q(first_name__in=["Ada", "Ken"])),
    ),
    (
        "$nin",
        lambda hr: ({"first_name": {"$nin": ["Ada", "Ken"]}}, ~Q(first_name__in=["Ada", "Ken"])),
    ),
    ("empty $in", lambda hr: ({"salary": {"$in": []}}, Q(pk__in=[]))),
    (
        "$range",
        lambda hr: ({"salary": {"$range": [40_000, 60_000]}}, Q(salary__range=(40_000, 60_000))),
    ),
    (
        "field $not",
        lambda hr: ({"salary": {"$not": {"$gte": 50_000}}}, ~Q(salary__gte=50_000)),
    ),
    (
        "$and",
        lambda hr: (
            {"$and": [{"salary": {"$gte": 40_000}}, {"is_active": True}]},
            Q(salary__gte=40_000) & Q(is_active=True),
        ),
    ),
    (
        "$or",
        lambda hr: (
            {"$or": [{"first_name": "Ada"}, {"salary": {"$gt": 70_000}}]},
            Q(first_name="Ada") | Q(salary__gt=70_000),
        ),
    ),
    ("$not", lambda hr: ({"$not": {"first_name": "Ada"}}, ~Q(first_name="Ada"))),
    (
        "nested",
        lambda hr: (
            {
                "$or": [
                    {"$and": [{"salary": {"$gt": 50_000}}, {"is_active": True}]},
                    {"$not": {"department": {"$ne": None}}},
                ]
            },
            (Q(salary__gt=50_000) & Q(is_active=True)) | ~~Q(department=None),
        ),
    ),
    ("foreign key", lambda hr: ({"department": dept(hr, "R&D")}, Q(department=dept(hr, "R&D")))),
    ("foreign key null", lambda hr: ({"department": None}, Q(department=None))),
    (
        "foreign key $in",
        lambda hr: (
            {"department": {"$in": [dept(hr, "R&D"), dept(hr, "Support")]}},
            Q(department__in=[dept(hr, "R&D"), dept(hr, "Support")]),
        ),
    ),
    (
        "date",
        lambda hr: (
            {"hire_date": {"$gte": "2018-01-01"}},
            Q(hire_date__gte=datetime.date(2018, 1, 1)),
        ),
    ),
    (
        "datetime",
        lambda hr: (
            {"updated": {"$lt": "2024-06-01T00:00:00Z"}},
            Q(updated__lt=datetime.datetime(2024, 6, 1, tzinfo=datetime.UTC)),
        ),
    ),
    ("boolean", lambda hr: ({"is_active": False}, Q(is_active=False))),
    ("renamed field", lambda hr: ({"surname": "Turing"}, Q(last_name="Turing"))),
    ("id", lambda hr: ({"id": {"$in": first_pks(hr)}}, Q(pk__in=first_pks(hr)))),
    ("email", lambda hr: ({"email": "person5@example.com"}, Q(email="person5@example.com"))),
    (
        "$text under $or",
        lambda hr: (
            {"$or": [{"$text": "kernel"}, {"salary": {"$gte": 70_000}}]},
            Q(bio__search="kernel") | Q(salary__gte=70_000),
        ),
    ),
    ("$not $text", lambda hr: ({"$not": {"$text": "kernel"}}, ~Q(bio__search="kernel"))),
    ("$icontains", lambda hr: ({"bio": {"$icontains": "KERN"}}, Q(bio__icontains="KERN"))),
    (
        "$istartswith",
        lambda hr: ({"surname": {"$istartswith": "tu"}}, Q(last_name__istartswith="tu")),
    ),
    (
        "field $not $text",
        lambda hr: ({"bio": {"$not": {"$text": "panic"}}}, ~Q(bio__search="panic")),
    ),
]


@pytest.mark.parametrize("case", [c for _, c in EQUIVALENT], ids=[n for n, _ in EQUIVALENT])
def test_results_equal_the_orm_query(api, hr, case):
    body, q = case(hr)
    response = query(api, {"filter": body})
    assert response.status_code == 200, response.json()
    expected = Employee.objects.filter(q).order_by("pk")
    assert response.json()["count"] == expected.count()
    assert ids(response) == pks(expected)
    assert expected.exists() or body.get("salary") == {"$in": []}


def test_results_are_serialized_like_the_list(api, hr):
    body = query(api, {"filter": {"first_name": "Ada"}}).json()
    listed = api.get("/api/employees/", {"first_name": "Ada"}).json()
    assert body["results"] == listed["results"]
    assert set(body) == {"count", "results"}


@pytest.mark.parametrize(
    "order_by, orm",
    [
        (["-salary"], ("-salary", "-pk")),
        (["salary"], ("salary", "pk")),
        (["first_name", "-hire_date"], ("first_name", "-hire_date", "-pk")),
        (["surname"], ("last_name", "pk")),
        (["-id"], ("-pk",)),
    ],
)
def test_order_by(api, hr, order_by, orm):
    body = {"filter": {"salary": {"$gte": 35_000}}, "order_by": order_by}
    response = query(api, body)
    assert response.status_code == 200, response.json()
    assert ids(response) == pks(Employee.objects.filter(salary__gte=35_000).order_by(*orm))


@pytest.mark.parametrize("limit, offset", [(5, 0), (5, 5), (7, 20), (100, 3), (3, 50)])
def test_limit_and_offset(api, hr, limit, offset):
    body = {"filter": {"is_active": True}, "order_by": ["-salary"], "limit": limit}
    response = query(api, {**body, "offset": offset})
    expected = Employee.objects.filter(is_active=True).order_by("-salary", "-pk")
    assert ids(response) == pks(expected[offset : offset + limit])
    assert response.json()["count"] == expected.count()


def test_limit_zero_counts_only(api, hr):
    response = query(api, {"filter": {"salary": {"$gte": 40_000}}, "limit": 0})
    assert response.json() == {
        "count": Employee.objects.filter(salary__gte=40_000).count(),
        "results": [],
    }


def test_default_limit(api, hr):
    for i in range(QueryParser.max_limit + 1 - len(hr.employees)):
        Employee.objects.create(first_name="Extra", last_name="X", email=f"extra{i}@example.com")
    response = query(api, {})
    assert response.json()["count"] == QueryParser.max_limit + 1
    assert ids(response) == pks(Employee.objects.order_by("pk")[: QueryParser.max_limit])


@pytest.mark.parametrize(
    "body",
    [
        {"$text": "kernel panic"},
        {"bio": {"$text": "kernel panic"}},
        {"$and": [{"bio": {"$text": "kernel panic"}}, {"salary": {"$gte": 0}}]},
    ],
)
def test_text_is_ranked_best_first(api, hr, body):
    response = query(api, {"filter": body})
    expected = Employee.objects.search("kernel panic")
    if "$and" in body:
        expected = expected.filter(salary__gte=0)
    assert ids(response) == pks(expected)
    # The rank order is not the pk order: the short bio matches better.
    assert ids(response) != sorted(ids(response))


def test_text_rank_pages(api, hr):
    ranked = pks(Employee.objects.search("kernel panic"))
    pages = [
        ids(query(api, {"filter": {"$text": "kernel panic"}, "limit": 3, "offset": offset}))
        for offset in range(0, len(ranked), 3)
    ]
    assert [pk for page in pages for pk in page] == ranked


def test_text_with_order_by(api, hr):
    response = query(api, {"filter": {"$text": "kernel panic"}, "order_by": ["-salary"]})
    expected = Employee.objects.filter(bio__search="kernel panic").order_by("-salary", "-pk")
    assert ids(response) == pks(expected)


def test_related_paths_from_the_allow_list(api, hr):
    response = query(api, {"filter": {"department_name": "R&D"}}, "employees-hr")
    assert ids(response) == pks(Employee.objects.filter(department__name="R&D").order_by("pk"))
    response = query(api, {"filter": {"department_budget": {"$gt": "1000.5"}}}, "employees-hr")
    expected = Employee.objects.filter(department__budget__gt=decimal.Decimal("1000.5"))
    assert ids(response) == pks(expected.order_by("pk"))
    response = query(api, {"order_by": ["department_name", "-salary"]}, "employees-hr")
    expected = Employee.objects.order_by("department__name", "-salary", "-pk")
    assert ids(response) == pks(expected)


@pytest.mark.parametrize(
    "body, q",
    [
        ({"budget": {"$gt": 1000.5}}, Q(budget__gt=decimal.Decimal("1000.5"))),
        ({"budget": {"$lte": "250000.50"}}, Q(budget__lte=decimal.Decimal("250000.50"))),
        ({"budget": None}, Q(budget=None)),
        ({"name": {"$in": ["R&D", "Empty"]}}, Q(name__in=["R&D", "Empty"])),
    ],
)
def test_other_models(api, hr, body, q):
    response = query(api, {"filter": body}, "departments")
    assert ids(response) == pks(Department.objects.filter(q).order_by("pk"))


# -- errors: (body, the JSON path, a part of the message) ---------------------------------

N = QueryParser.max_depth
ERRORS = [
    ([], "", "JSON object"),
    ("filter", "", "JSON object"),
    ({"where": {}}, "where", "unknown member"),
    ({"filter": []}, "filter", "must be an object"),
    ({"filter": {"nope": 1}}, "filter.nope", "unknown field 'nope'"),
    ({"filter": {"display": "x"}}, "filter.display", "unknown field"),
    ({"filter": {"last_name": "x"}}, "filter.last_name", "unknown field"),
    ({"filter": {"department__name": "R&D"}}, "filter.department__name", "unknown field"),
    ({"filter": {"salary__gte": 5}}, "filter.salary__gte", "unknown field"),
    ({"filter": {"salary": {"$foo": 1}}}, "filter.salary.$foo", "unknown operator '$foo'"),
    ({"filter": {"salary": {"gte": 1}}}, "filter.salary.gte", "unknown operator"),
    ({"filter": {"$foo": 1}}, "filter.$foo", "unknown operator '$foo'"),
    ({"filter": {"$gte": 1}}, "filter.$gte", "put it inside a field"),
    ({"filter": {"salary": {}}}, "filter.salary", "empty condition"),
    ({"filter": {"salary": [1, 2]}}, "filter.salary", "needs an operator"),
    ({"filter": {"salary": "abc"}}, "filter.salary", "expected a number"),
    ({"filter": {"salary": {"$gte": "195000"}}}, "filter.salary.$gte", "not a string"),
    ({"filter": {"salary": {"$gte": True}}}, "filter.salary.$gte", "boolean"),
    ({"filter": {"salary": {"$gte": 1.5}}}, "filter.salary.$gte", "integer"),
    ({"filter": {"salary": {"$gte": 2**70}}}, "filter.salary.$gte", "out of range"),
    ({"filter": {"salary": {"$gt": None}}}, "filter.salary.$gt", "null"),
    ({"filter": {"hire_date": {"$gte": "2020-13-45"}}}, "filter.hire_date.$gte", "invalid"),
    ({"filter": {"hire_date": "yesterday"}}, "filter.hire_date", "invalid value"),
    ({"filter": {"hire_date": 20200101}}, "filter.hire_date", "expected a string"),
    ({"filter": {"updated": {"$lt": "noon"}}}, "filter.updated.$lt", "invalid value"),
    ({"filter": {"is_active": 1}}, "filter.is_active", "expected a boolean"),
    ({"filter": {"is_active": "yes"}}, "filter.is_active", "expected a boolean"),
    ({"filter": {"first_name": 5}}, "filter.first_name", "expected a string"),
    ({"filter": {"first_name": {"$eq": {"a": 1}}}}, "filter.first_name.$eq", "an object"),
    ({"filter": {"department": "R&D"}}, "filter.department", "expected a number"),
    ({"filter": {"salary": {"$in": 5}}}, "filter.salary.$in", "list of values"),
    ({"filter": {"salary": {"$in": [1, "x"]}}}, "filter.salary.$in[1]", "not a string"),
    ({"filter": {"salary": {"$in": [1, None]}}}, "filter.salary.$in[1]", "null"),
    (
        {"filter": {"salary": {"$nin": list(range(QueryParser.max_list_length + 1))}}},
        "filter.salary.$nin",
        "at most",
    ),
    ({"filter": {"salary": {"$range": [1]}}}, "filter.salary.$range", "two values"),
    ({"filter": {"salary": {"$range": [1, "x"]}}}, "filter.salary.$range[1]", "string"),
    ({"filter": {"first_name": {"$text": "ada"}}}, "filter.first_name.$text", "TextIndex"),
    ({"filter": {"bio": {"$text": 5}}}, "filter.bio.$text", "takes a string"),
    ({"filter": {"bio": {"$text": "   "}}}, "filter.bio.$text", "at least one word"),
    ({"filter": {"$text": ["kernel"]}}, "filter.$text", "takes a string"),
    ({"filter": {"salary": {"$icontains": "1"}}}, "filter.salary.$icontains", "text fields"),
    ({"filter": {"bio": {"$istartswith": ""}}}, "filter.bio.$istartswith", "non-empty"),
    ({"filter": {"$and": {}}}, "filter.$and", "non-empty list"),
    ({"filter": {"$or": []}}, "filter.$or", "non-empty list"),
    ({"filter": {"$or": [{"salary": 1}, 5]}}, "filter.$or[1]", "filter object"),
    ({"filter": {"$or": [{"salary": 1}, {"nope": 1}]}}, "filter.$or[1].nope", "unknown"),
    ({"filter": {"$not": [{"salary": 1}]}}, "filter.$not", "filter object"),
    (
        {"filter": {"$and": [{"$or": [{"salary": {"$foo": 1}}]}]}},
        "filter.$and[0].$or[0].salary.$foo",
        "unknown operator",
    ),
    (
        {"filter": json.loads('{"$not": ' * (N + 1) + '{"salary": 1}' + "}" * (N + 1))},
        "filter" + ".$not" * (N + 1),
        "nest at most",
    ),
    (
        {"filter": {"salary": json.loads('{"$not": ' * (N + 1) + "1" + "}" * (N + 1))}},
        "filter.salary" + ".$not" * (N + 1),
        "nest at most",
    ),
    (
        {"filter": {"$or": [{"salary": i} for i in range(QueryParser.max_conditions + 1)]}},
        f"filter.$or[{QueryParser.max_conditions}].salary",
        "conditions",
    ),
    ({"order_by": "salary"}, "order_by", "must be a list"),
    ({"order_by": [5]}, "order_by[0]", "field name"),
    ({"order_by": ["salary", "-nope"]}, "order_by[1]", "unknown field 'nope'"),
    ({"order_by": ["-display"]}, "order_by[0]", "unknown field"),
    ({"order_by": ["id", "salary", "email", "title"]}, "order_by", "at most"),
    ({"limit": QueryParser.max_limit + 1}, "limit", "between 0 and"),
    ({"limit": -1}, "limit", "between 0 and"),
    ({"limit": "10"}, "limit", "integer"),
    ({"limit": True}, "limit", "integer"),
    ({"limit": 1.5}, "limit", "integer"),
    ({"offset": -1}, "offset", "between 0 and"),
    ({"offset": QueryParser.max_offset + 1}, "offset", "between 0 and"),
]


@pytest.mark.parametrize("body, path, message", ERRORS, ids=[e[1] or "(body)" for e in ERRORS])
def test_errors_name_their_path(api, hr, body, path, message):
    response = query(api, body)
    assert response.status_code == 400
    data = response.json()
    assert set(data) == {"detail", "path"}
    assert data["path"] == path
    assert message in data["detail"]


@pytest.mark.parametrize(
    "resource, body, path, message",
    [
        ("departments", {"filter": {"$text": "x"}}, "filter.$text", "no full-text index"),
        ("departments", {"filter": {"budget": {"$gt": "lots"}}}, "filter.budget.$gt", "invalid"),
        ("departments", {"filter": {"budget": True}}, "filter.budget", "boolean"),
        ("employees-hr", {"filter": {"surname": "x"}}, "filter.surname", "unknown field"),
        ("employees-hr", {"filter": {"department_name": 5}}, "filter.department_name", "string"),
        ("employees-hr", {"order_by": ["email"]}, "order_by[0]", "unknown field"),
    ],
)
def test_errors_of_other_resources(api, hr, resource, body, path, message):
    response = query(api, body, resource)
    assert response.status_code == 400
    assert response.json()["path"] == path
    assert message in response.json()["detail"]


def test_malformed_json(api):
    response = api.post("/api/employees/query/", "{", content_type="application/json")
    assert response.status_code == 400
    assert response.json()["path"] == ""
    assert "not valid JSON" in response.json()["detail"]


@pytest.mark.parametrize("url", ["/api/employees/query/", "/api/employees/", "/api/departments/"])
@pytest.mark.parametrize(
    "body",
    ["[" * 2000 + "]" * 2000, '{"filter": ' + '{"$not": ' * 40 + "{}" + "}" * 41],
    ids=["beyond-json", "beyond-the-limit"],
)
def test_deeply_nested_json(api, url, body):
    response = api.post(url, body, content_type="application/json")
    assert response.status_code == 400
    detail = response.json()["detail"]
    assert f"deeper than {ZeroJSONParser.max_depth} levels" in detail


def test_nesting_depth():
    assert [nesting_depth(v) for v in (1, [], {}, [[]], {"a": [1, {"b": None}]})] == [0, 1, 1, 2, 3]
    deep: list = []
    for _ in range(100_000):  # far beyond the recursion limit
        deep = [deep]
    assert nesting_depth(deep) == 100_001


def test_body_size(api):
    text = "x" * QueryParser.max_body_size
    response = query(api, {"filter": {"$text": text}})
    assert response.status_code == 400
    assert response.json() == {
        "detail": f"the body is larger than {QueryParser.max_body_size} bytes",
        "path": "",
    }


def test_empty_body_is_everything(api, hr):
    response = api.post("/api/employees/query/", b"", content_type="application/json")
    assert response.status_code == 200
    assert ids(response) == pks(Employee.objects.order_by("pk"))


def test_json_only(api):
    response = api.post("/api/employees/query/", {"limit": "1"}, format="multipart")
    assert response.status_code == 415


# -- the parser itself ------------------------------------------------------------------


def test_parser_builds_q_objects():
    parser = QueryParser(Employee, {"salary": "salary", "name": "first_name"})
    parsed = parser.parse({"filter": {"salary": {"$gte": 5, "$lt": 9}, "name": "Ada"}})
    assert parsed.q == Q(salary__gte=5) & Q(salary__lt=9) & Q(first_name="Ada")
    assert parsed.order_by == () and parsed.limit == QueryParser.max_limit
    assert parsed.offset == 0 and not parsed.ranked


def test_parser_limits_are_attributes():
    class Small(QueryParser):
        max_limit = 5
        max_conditions = 2

    parser = Small(Employee, {"salary": "salary"})
    assert parser.parse({}).limit == 5
    with pytest.raises(BadQuery) as exc:
        parser.parse({"limit": 6})
    assert exc.value.path == "limit"
    with pytest.raises(BadQuery) as exc:
        parser.parse({"filter": {"salary": {"$gte": 1, "$lte": 5, "$ne": 3}}})
    assert exc.value.path == "filter.salary.$ne"


@pytest.mark.parametrize("path", ["nope", "salary__gte", "salary__department", "department__x"])
def test_allow_list_must_name_fields(path):
    with pytest.raises(ImproperlyConfigured, match="query field"):
        QueryParser(Employee, {"x": path})


def test_text_field_must_be_queryable():
    parser = QueryParser(Employee, {"salary": "salary"})
    with pytest.raises(BadQuery) as exc:
        parser.parse({"filter": {"$text": "kernel"}})
    assert exc.value.path == "filter.$text"
    assert "not queryable" in exc.value.error


def test_many_valued_relations_give_distinct_objects(api, hr):
    ada, alan = hr.employees[0], hr.employees[1]
    for label, members in [("x", [ada, alan]), ("y", [alan]), ("z", [])]:
        Tag.objects.create(label=label).employees.set(members)
    body = {"filter": {"employees": {"$in": [ada.pk, alan.pk]}}}
    response = query(api, body, "tags")
    expected = Tag.objects.filter(employees__in=[ada.pk, alan.pk]).distinct().order_by("pk")
    assert ids(response) == pks(expected)
    assert response.json()["count"] == expected.count() == 2
    for body, q in [
        ({"employees": {"$ne": ada.pk}}, ~Q(employees=ada.pk)),
        ({"employees": None}, Q(employees=None)),
        ({"label": {"$in": ["x", "z"]}}, Q(label__in=["x", "z"])),
    ]:
        response = query(api, {"filter": body}, "tags")
        assert ids(response) == pks(Tag.objects.filter(q).order_by("pk"))


@pytest.mark.parametrize(
    "body, q",
    [
        ({"department_name": {"$ne": "R&D"}}, ~Q(department__name="R&D")),
        ({"department_name": None}, Q(department__name=None)),
        (
            {"department_name": {"$nin": ["R&D", "Sales"]}},
            ~Q(department__name__in=["R&D", "Sales"]),
        ),
        (
            {"$or": [{"department_name": "R&D"}, {"salary": {"$lt": 40_000}}]},
            Q(department__name="R&D") | Q(salary__lt=40_000),
        ),
    ],
)
def test_negations_across_relations(api, hr, body, q):
    response = query(api, {"filter": body}, "employees-hr")
    assert ids(response) == pks(Employee.objects.filter(q).order_by("pk"))


def test_pk_and_related_paths(hr):
    parser = QueryParser(Employee, {"key": "pk", "dept": "department__pk"})
    rd = hr.departments["R&D"].pk
    parsed = parser.parse({"filter": {"key": {"$gt": 0}, "dept": rd}})
    assert parsed.q == Q(pk__gt=0) & Q(department__pk=rd)
    with pytest.raises(BadQuery) as exc:
        parser.parse({"filter": {"dept": "R&D"}})
    assert exc.value.path == "filter.dept"


def test_search_field():
    parser = QueryParser(Employee, {"bio": "bio", "name": "first_name"}, search_field="bio")
    assert parser.parse({"filter": {"$text": "kernel"}}).q == Q(bio__search="kernel")

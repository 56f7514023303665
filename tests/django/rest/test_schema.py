"""The OpenAPI schema (drf-spectacular) of ``ZeroModelViewSet``s, query endpoint included."""

from __future__ import annotations

import pytest
from drf_spectacular.validation import validate_schema

from django_zerodb.rest.query import QueryParser
from tests.django.rest.helpers import db

pytestmark = db


@pytest.fixture
def schema(anonymous):
    response = anonymous.get("/api/schema/", {"format": "json"})
    assert response.status_code == 200
    return response.json()


def test_schema_is_valid_openapi(schema):
    validate_schema(schema)  # raises on an invalid document
    assert schema["openapi"].startswith("3.")


def test_yaml_by_default(anonymous):
    response = anonymous.get("/api/schema/")
    assert response.status_code == 200
    assert response["Content-Type"].startswith("application/vnd.oai.openapi")
    assert b"/api/employees/query/:" in response.content


@pytest.mark.parametrize(
    "resource, component",
    [
        ("employees", "Employee"),
        ("departments", "Department"),
        ("employees-hr", "Employee"),
        ("tags", "Tag"),
    ],
)
def test_every_viewset_has_a_query_endpoint(schema, resource, component):
    operation = schema["paths"][f"/api/{resource}/query/"]["post"]
    body = operation["requestBody"]["content"]["application/json"]
    assert body["schema"] == {"$ref": "#/components/schemas/QueryRequest"}
    ok = operation["responses"]["200"]["content"]["application/json"]["schema"]
    assert ok == {"$ref": f"#/components/schemas/{component}QueryResponse"}
    bad = operation["responses"]["400"]["content"]["application/json"]["schema"]
    assert bad == {"$ref": "#/components/schemas/QueryError"}
    assert list(schema["paths"][f"/api/{resource}/query/"]) == ["post"]


def test_query_endpoint_documentation(schema):
    operation = schema["paths"]["/api/employees/query/"]["post"]
    assert operation["summary"] == "Query with a JSON filter"
    for operator in ("$eq", "$ne", "$lt", "$gte", "$in", "$nin", "$range", "$text", "$or"):
        assert f"`{operator}`" in operation["description"]
    assert {"tokenAuth": []} in operation["security"]
    assert {"cookieAuth": []} in operation["security"]


def test_query_components(schema):
    components = schema["components"]["schemas"]
    request = components["QueryRequest"]["properties"]
    assert set(request) == {"filter", "order_by", "limit", "offset"}
    assert request["filter"]["type"] == "object"
    assert request["limit"]["maximum"] == QueryParser.max_limit
    assert request["order_by"]["maxItems"] == QueryParser.max_order_by
    response = components["EmployeeQueryResponse"]
    assert response["required"] == ["count", "results"]
    assert response["properties"]["results"]["items"] == {"$ref": "#/components/schemas/Employee"}
    assert set(components["QueryError"]["properties"]) == {"detail", "path"}


def test_list_parameters(schema):
    def parameters(resource):
        operation = schema["paths"][f"/api/{resource}/"]["get"]
        return {p["name"] for p in operation["parameters"]}

    employees = parameters("employees")
    assert {"search", "ordering", "page", "page_size", "salary__gte", "bio__search"} <= employees
    # No TextIndex, no ?search=.
    assert "search" not in parameters("departments")
    assert "ordering" in parameters("departments")
    listed = schema["paths"]["/api/employees/"]["get"]["responses"]["200"]["content"]
    paginated = listed["application/json"]["schema"]
    assert paginated == {"$ref": "#/components/schemas/PaginatedEmployeeList"}


def test_every_action_is_documented(schema):
    assert set(schema["paths"]["/api/employees/"]) == {"get", "post"}
    assert set(schema["paths"]["/api/employees/{id}/"]) == {"get", "put", "patch", "delete"}


@pytest.mark.parametrize("resource", ["employees", "departments", "employees-hr", "tags"])
def test_query_examples_are_bodies_the_endpoint_answers(schema, api, hr, resource):
    """The examples are made from each API's own query fields (not one model's for all),
    so every one of them is a body its endpoint accepts."""
    operation = schema["paths"][f"/api/{resource}/query/"]["post"]
    examples = operation["requestBody"]["content"]["application/json"]["examples"]
    assert examples
    for example in examples.values():
        response = api.post(f"/api/{resource}/query/", example["value"], format="json")
        assert response.status_code == 200, (example, response.json())


def test_query_examples_follow_the_model(schema):
    """A range and order on a number or date field and an equality on a text field; a
    full-text search where the model has a TextIndex (Employee's description)."""

    def examples(resource):
        operation = schema["paths"][f"/api/{resource}/query/"]["post"]
        content = operation["requestBody"]["content"]["application/json"]
        return {name: e["value"] for name, e in content["examples"].items()}

    employee = examples("employees")
    assert {"filter": {"$text": "two words"}} in employee.values()
    (conditions,) = [v for v in employee.values() if "order_by" in v]
    ((ranged, bounds),) = [(k, v) for k, v in conditions["filter"].items() if isinstance(v, dict)]
    assert conditions["order_by"] == [f"-{ranged}"] and set(bounds) == {"$gte", "$lte"}
    assert not any("$text" in v["filter"] for v in examples("tags").values())

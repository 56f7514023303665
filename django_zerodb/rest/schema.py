"""The OpenAPI schema of ``ZeroModelViewSet`` (drf-spectacular).

``ZeroAutoSchema`` documents the JSON query endpoint: its request body
(``QueryRequestSerializer``, attached with ``extend_schema`` on the action), its answer
(``{"count": ..., "results": [<the view's serializer>]}``) and its 400 answer
(``QueryErrorSerializer``). Serve the schema with drf-spectacular's views::

    path("api/schema/", SpectacularAPIView.as_view(), name="schema")
"""

from __future__ import annotations

import functools

from drf_spectacular.openapi import AutoSchema
from drf_spectacular.utils import OpenApiExample, OpenApiResponse, inline_serializer
from rest_framework import serializers

from django_zerodb.rest.query import QueryParser

QUERY_DESCRIPTION = f"""\
Objects matching a JSON filter, with their count (served by the indexes).

`filter` maps field names to conditions, all of which must hold. A bare value means
`$eq` (`null` matches NULL). Field operators: `$eq`, `$ne`, `$lt`, `$lte`, `$gt`, `$gte`,
`$in` and `$nin` (a list), `$range` (`[low, high]`, both included), `$text` (full-text
search on a field with a TextIndex), `$not` (a condition). Filter operators: `$and` and
`$or` (lists of filters), `$not` (a filter), `$text` (search the model's TextIndex).

`order_by` lists field names, `-` first for descending; without it, a `$text` search
comes best match first, anything else in the default order. `limit` (default and maximum
{QueryParser.max_limit}) and `offset` page the results.

Every problem is a 400 whose body names its JSON path:
`{{"detail": "unknown operator '$foo'", "path": "filter.salary.$foo"}}`.
"""

QUERY_EXAMPLES = [
    OpenApiExample(
        "Range and equality",
        value={
            "filter": {"salary": {"$gte": 195000, "$lte": 200000}, "first_name": "John"},
            "order_by": ["-salary"],
            "limit": 20,
            "offset": 0,
        },
        request_only=True,
    ),
    OpenApiExample(
        "Full-text search or a department",
        value={"filter": {"$or": [{"$text": "kernel panic"}, {"department": 3}]}},
        request_only=True,
    ),
]


class QueryRequestSerializer(serializers.Serializer):
    """The body of the query endpoint; every member is optional."""

    # Documentation only: the view validates the body with QueryParser, which names the
    # JSON path of every problem.

    filter = serializers.DictField(
        child=serializers.JSONField(),
        required=False,
        help_text='Field names (or "$and", "$or", "$not", "$text") to conditions.',
    )
    order_by = serializers.ListField(
        child=serializers.CharField(),
        required=False,
        max_length=QueryParser.max_order_by,
        help_text='Field names, "-name" for descending.',
    )
    limit = serializers.IntegerField(
        required=False,
        min_value=0,
        max_value=QueryParser.max_limit,
        default=QueryParser.max_limit,
        initial=QueryParser.max_limit,
    )
    offset = serializers.IntegerField(
        required=False, min_value=0, max_value=QueryParser.max_offset, default=0, initial=0
    )


class QueryErrorSerializer(serializers.Serializer):
    detail = serializers.CharField(help_text="What is wrong.")
    path = serializers.CharField(
        help_text='Where: a JSON path in the body ("filter.salary.$gte", "" for the whole '
        "body) or a query parameter name."
    )


@functools.cache
def query_response_serializer(serializer_class: type[serializers.BaseSerializer]):
    """``{"count": ..., "results": [...]}`` of ``serializer_class`` (one per class, so that
    the schema holds one component for it)."""
    name = serializer_class.__name__.removesuffix("Serializer") + "QueryResponse"
    return inline_serializer(
        name,
        fields={
            "count": serializers.IntegerField(help_text="Number of matching objects."),
            "results": serializer_class(many=True),
        },
    )


class ZeroAutoSchema(AutoSchema):
    query_actions = ("query",)

    def get_response_serializers(self):
        if getattr(self.view, "action", None) in self.query_actions:
            serializer_class = self.view.get_object_serializer_class()
            return {
                200: OpenApiResponse(
                    query_response_serializer(serializer_class),
                    description="The number of matching objects and one page of them.",
                ),
                400: OpenApiResponse(
                    QueryErrorSerializer, description="What is wrong with the query, and where."
                ),
            }
        return super().get_response_serializers()

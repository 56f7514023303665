"""The OpenAPI schema of ``ZeroModelViewSet`` (drf-spectacular).

``ZeroAutoSchema`` documents the JSON query endpoint: its request body
(``QueryRequestSerializer``, attached with ``extend_schema`` on the action), its answer
(``{"count": ..., "results": [<the view's serializer>]}``) and its 400 answer
(``QueryErrorSerializer``). Serve the schema with drf-spectacular's views::

    path("api/schema/", SpectacularAPIView.as_view(), name="schema")
"""

from __future__ import annotations

import functools

from django.db import models
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
`{{"detail": "unknown operator '$foo'", "path": "filter.<field>.$foo"}}`.
"""

# Bounds of the range example, by the kind of field (a DateTimeField is a DateField).
_SAMPLE_RANGES: tuple[tuple[type[models.Field], tuple[object, object]], ...] = (
    (models.DateTimeField, ("2025-01-01T00:00:00Z", "2025-12-31T23:59:59Z")),
    (models.DateField, ("2025-01-01", "2025-12-31")),
    (models.DecimalField, ("0", "1000")),
    (models.IntegerField, (1, 1000)),
    (models.FloatField, (0, 1000)),
)


def _sample_range(field: models.Field) -> tuple[object, object] | None:
    if field.is_relation or field.primary_key or isinstance(field, models.BooleanField):
        return None
    return next((pair for kind, pair in _SAMPLE_RANGES if isinstance(field, kind)), None)


def _is_text(field: models.Field) -> bool:
    return isinstance(field, models.CharField | models.TextField) and not field.choices


def query_examples(parser: QueryParser) -> list[OpenApiExample]:
    """Request bodies on the view's own query fields, so that each API's schema shows
    bodies its endpoint accepts: a range on its first number or date field with an
    equality on its first text field (ordered by the range's field), and a full-text
    search when the model has a TextIndex the endpoint may search."""
    ranges = ((n, _sample_range(parser.field(n))) for n in parser.fields)
    ranged, bounds = next(((n, r) for n, r in ranges if r is not None), (None, None))
    text = next((n for n in parser.fields if _is_text(parser.field(n))), None)
    examples = []
    condition: dict[str, object] = {}
    body: dict[str, object] = {"filter": condition}
    if ranged is not None and bounds is not None:
        low, high = bounds
        condition[ranged] = {"$gte": low, "$lte": high}
        body["order_by"] = [f"-{ranged}"]
    if text is not None:
        condition[text] = "example"
    if condition:
        body |= {"limit": 20, "offset": 0}
        examples.append(OpenApiExample("Conditions", value=body, request_only=True))
    if parser.searchable():
        examples.append(
            OpenApiExample(
                "Full-text search", value={"filter": {"$text": "two words"}}, request_only=True
            )
        )
    return examples


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
        help_text='Where: a JSON path in the body ("filter.<field>.$gte", "" for the whole '
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

    def get_examples(self):
        if getattr(self.view, "action", None) in self.query_actions:
            return query_examples(self.view.get_query_parser())
        return super().get_examples()

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

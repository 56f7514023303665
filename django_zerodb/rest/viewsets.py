"""``ZeroModelViewSet``: a ``ModelViewSet`` for encrypted models, with a query endpoint.

    class EmployeeViewSet(ZeroModelViewSet):
        queryset = Employee.objects.all()
        serializer_class = EmployeeSerializer
        filterset_fields = {"salary": ["gte", "lte"], "department": ["exact"]}
        ordering_fields = ["salary", "hire_date"]

list, retrieve, create, update, partial_update and destroy are DRF's own: the backend
makes encrypted models behave like any other. The defaults are those of a trusted
internal API, each an attribute to override:

* authentication: token, then session (``authentication_classes``); token first, so
  that a request without credentials gets 401 with ``WWW-Authenticate: Token``.
* permissions: authenticated, with the model's Django permissions, ``view`` included
  (``ZeroModelPermissions``).
* filtering: django-filter (``filterset_fields`` / ``filterset_class``), ``?ordering=``
  and ``?search=`` (ranked, on the model's ``TextIndex``).
* pagination: page numbers with counts from the indexes (``ZeroPageNumberPagination``).
* ``POST <resource>/query/``: the JSON query language of ``django_zerodb.rest.query``,
  on the fields of ``get_query_fields()``.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping

from django.core.exceptions import FieldDoesNotExist
from django.db import router, transaction
from django.db.models import ProtectedError, RestrictedError
from drf_spectacular.utils import extend_schema
from rest_framework import viewsets
from rest_framework.authentication import SessionAuthentication, TokenAuthentication
from rest_framework.decorators import action
from rest_framework.exceptions import ParseError
from rest_framework.filters import OrderingFilter
from rest_framework.parsers import FormParser, MultiPartParser
from rest_framework.permissions import IsAuthenticated
from rest_framework.response import Response

from django_zerodb.exceptions import SerializationError
from django_zerodb.rest.exceptions import BadQuery, ChangedMeanwhile, Protected
from django_zerodb.rest.filters import RankedSearchFilter, ZeroFilterBackend
from django_zerodb.rest.pagination import ZeroPageNumberPagination
from django_zerodb.rest.parsers import ZeroJSONParser
from django_zerodb.rest.permissions import ZeroModelPermissions
from django_zerodb.rest.query import ParsedQuery, QueryParser
from django_zerodb.rest.schema import (
    QUERY_DESCRIPTION,
    QueryRequestSerializer,
    ZeroAutoSchema,
)


class ZeroModelViewSet(viewsets.ModelViewSet):
    authentication_classes = [TokenAuthentication, SessionAuthentication]
    permission_classes = [IsAuthenticated, ZeroModelPermissions]
    # RankedSearchFilter after OrderingFilter: it drops the default ordering to rank.
    filter_backends = [ZeroFilterBackend, OrderingFilter, RankedSearchFilter]
    pagination_class = ZeroPageNumberPagination
    # DRF's parsers, with JSON bodies nested too deeply answered 400 (rest/parsers.py).
    parser_classes = [ZeroJSONParser, FormParser, MultiPartParser]
    schema = ZeroAutoSchema()

    # Actions that only read although they are POSTs: they need the "view" permission.
    read_only_actions = ("query",)
    # The ``TextIndex`` field ``?search=`` and ``{"$text": ...}`` use, when the model
    # has several (None: the model's only one).
    search_field: str | None = None
    # The fields the query endpoint accepts: None for the serializer's model fields,
    # or a list of ORM paths (``"department__name"`` included), or a mapping of the
    # names clients use to ORM paths.
    query_fields: list[str] | Mapping[str, str] | None = None
    query_parser_class = QueryParser
    # The body of the query endpoint, as the browsable API, OPTIONS and the schema show it
    # (QueryParser validates it, naming the JSON path of each problem).
    query_serializer_class = QueryRequestSerializer

    # -- writes: one transaction each, a lost race answered 409 --------------------------

    def create(self, request, *args, **kwargs):
        with transaction.atomic(using=self.write_alias()):
            return super().create(request, *args, **kwargs)

    def update(self, request, *args, **kwargs):
        """DRF's, in one transaction: the object read and the object saved are one
        snapshot, so at "repeatable read" a concurrent change is a 409, not overwritten."""
        with transaction.atomic(using=self.write_alias()):
            return super().update(request, *args, **kwargs)

    def destroy(self, request, *args, **kwargs):
        with transaction.atomic(using=self.write_alias()):
            return super().destroy(request, *args, **kwargs)

    def write_alias(self) -> str:
        """The database the model is written to (the router's choice)."""
        return router.db_for_write(self.get_queryset().model)

    def handle_exception(self, exc: Exception) -> Response:
        """DRF's, with two more 409 Conflicts, after which nothing was saved: a write that
        met a concurrent change (``OPTIONS["ISOLATION_LEVEL"]`` "repeatable read" or
        "serializable"; read the resource again before retrying), and a delete of an
        object others still refer to (``on_delete=PROTECT`` or ``RESTRICT``)."""
        if isinstance(exc, SerializationError):
            exc = ChangedMeanwhile()
        elif isinstance(exc, ProtectedError | RestrictedError):
            exc = Protected(protected_detail(exc))
        return super().handle_exception(exc)

    # -- the query endpoint ----------------------------------------------------------------

    @extend_schema(
        summary="Query with a JSON filter",
        description=QUERY_DESCRIPTION,
        request=QueryRequestSerializer,
    )
    @action(
        detail=False,
        methods=["post"],
        url_path="query",
        url_name="query",
        parser_classes=[ZeroJSONParser],
        schema=ZeroAutoSchema(),
    )
    def query(self, request, *args, **kwargs):
        """Objects matching a JSON filter, and their count.

        The body has four members, all optional: filter (field names to conditions such
        as {"field": {"$gte": value}}), order_by (a list of field names, "-" first for
        descending), limit and offset. The answer is {"count": n, "results": [...]}. The
        schema (OpenAPI) documents the whole language; every problem is a 400 naming its
        JSON path."""
        parser = self.get_query_parser()
        parsed = parser.parse(self.get_query_body(request, parser))
        queryset = self.get_query_queryset(parsed)
        count = queryset.count()
        end = parsed.offset + parsed.limit
        rows = list(queryset[parsed.offset : end]) if parsed.limit else []
        serializer = self.get_object_serializer(rows, many=True)
        return Response({"count": count, "results": serializer.data})

    def get_serializer_class(self):
        """The query body's serializer on the query endpoint's route, whatever the method
        (so that the browsable API's form, ``OPTIONS`` and the schema show the body it
        takes), else DRF's."""
        if (getattr(self, "action_map", None) or {}).get("post") == "query":
            return self.query_serializer_class
        return self.get_object_serializer_class()

    def get_object_serializer_class(self):
        """The serializer of the objects themselves (DRF's ``serializer_class``), whatever
        the action: the query endpoint's results, and its fields."""
        return super().get_serializer_class()

    def get_object_serializer(self, *args, **kwargs):
        kwargs.setdefault("context", self.get_serializer_context())
        return self.get_object_serializer_class()(*args, **kwargs)

    def get_query_parser(self) -> QueryParser:
        return self.query_parser_class(
            self.get_queryset().model, self.get_query_fields(), search_field=self.search_field
        )

    def get_query_body(self, request, parser: QueryParser):
        """The parsed JSON body, once its size is checked."""
        try:
            length = int(request.META.get("CONTENT_LENGTH") or 0)
        except ValueError:
            length = 0
        if length > parser.max_body_size:
            raise BadQuery(f"the body is larger than {parser.max_body_size} bytes", "")
        try:
            return request.data
        except ParseError as exc:
            raise BadQuery(f"the body is not valid JSON: {exc.detail}", "") from None

    def get_query_fields(self) -> dict[str, str]:
        """Names clients may filter and order on → ORM paths.

        From ``query_fields`` when set; otherwise the readable fields of the serializer
        whose source is a field of the model itself (no relation is followed; a
        ForeignKey compares the related pk). Override to extend or restrict."""
        if self.query_fields is not None:
            if isinstance(self.query_fields, Mapping):
                return dict(self.query_fields)
            return {path: path for path in self.query_fields}
        model = self.get_queryset().model
        fields = {}
        for name, field in self.get_object_serializer().fields.items():
            if field.write_only or field.source == "*" or "." in field.source:
                continue
            source = field.source
            try:
                model_field = model._meta.pk if source == "pk" else model._meta.get_field(source)
            except FieldDoesNotExist:
                continue
            if model_field.concrete or model_field.many_to_many:
                fields[name] = "pk" if source == "pk" else model_field.name
        return fields

    def get_query_queryset(self, parsed: ParsedQuery):
        """``get_queryset()`` filtered and ordered as ``parsed`` says. Without
        ``order_by``: rank order for a full-text search, else the queryset's ordering
        (the pk when it has none). A tie-break on the pk, in the direction of the last
        key, makes offsets stable; the engine's index order already breaks ties so.
        Distinct objects when the filter follows a many-valued relation."""
        queryset = self.get_queryset().filter(parsed.q)
        if parsed.distinct:
            queryset = queryset.distinct()
        if parsed.order_by:
            return queryset.order_by(*self.tie_broken(parsed.order_by, queryset.model))
        if parsed.ranked:
            return queryset.order_by()
        return queryset if queryset.ordered else queryset.order_by("pk")

    @staticmethod
    def tie_broken(order_by: tuple[str, ...], model) -> tuple[str, ...]:
        keys = {key.removeprefix("-") for key in order_by}
        if keys & {"pk", model._meta.pk.name}:
            return order_by
        return (*order_by, "-pk" if order_by[-1].startswith("-") else "pk")


def protected_detail(exc: ProtectedError | RestrictedError) -> str:
    """What refers to the object, by model, most first ("3 employees, 1 tag"); never the
    objects themselves."""
    objects = exc.protected_objects if isinstance(exc, ProtectedError) else exc.restricted_objects
    counts = Counter(obj._meta for obj in objects)
    named = ", ".join(
        f"{n} {meta.verbose_name if n == 1 else meta.verbose_name_plural}"
        for meta, n in counts.most_common()
    )
    return f"Other objects still refer to this one ({named}); nothing was deleted."

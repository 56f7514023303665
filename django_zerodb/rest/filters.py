"""Filter backends: ranked full-text search, and django-filter on the indexes.

* ``RankedSearchFilter``: ``?search=kernel panic`` keeps the objects whose ``TextIndex``
  field holds every word (and "quoted phrase"), best BM25 match first, unless the
  request also gives ``?ordering=``. A model without a ``TextIndex`` answers 400.
* ``ZeroSearchFilter``: DRF's ``SearchFilter`` (``?search=`` on ``search_fields``,
  ``^`` istartswith, ``=`` iexact, plain icontains) with a cap on search words; the
  lookups are served by a field's ``Lower`` index or ``TrigramIndex`` when it has one.
* ``ZeroFilterSet``: a django-filter ``FilterSet`` that, with ``indexed_only = True``
  (``IndexedFilterSet``), refuses at class creation any filter the indexes cannot serve,
  so that no query parameter makes the server decrypt a whole model to filter it.
* ``ZeroFilterBackend``: django-filter's backend building ``ZeroFilterSet`` classes for
  ``filterset_fields`` (``IndexedFilterSet`` ones when the view sets
  ``filterset_indexed_only = True``).
"""

from __future__ import annotations

from django.core.exceptions import FieldDoesNotExist, ImproperlyConfigured
from django.db import models
from django_filters import rest_framework as django_filters
from rest_framework.filters import BaseFilterBackend, SearchFilter
from rest_framework.settings import api_settings

from django_zerodb.rest.exceptions import BadQuery
from django_zerodb.rest.indexing import (
    INDEXED_LOOKUPS,
    has_text_index,
    is_sortable,
    text_field,
    text_fields,
)


class RankedSearchFilter(BaseFilterBackend):
    """``?search=<words>`` on the model's ``TextIndex`` field (or ``view.search_field``).

    Put it after ``OrderingFilter`` in ``filter_backends``: without ``?ordering=`` it
    clears every ordering (the view's default and ``Meta.ordering`` included), which is
    what makes the engine return the matches in rank order.
    """

    search_param = api_settings.SEARCH_PARAM
    ordering_param = api_settings.ORDERING_PARAM
    search_description = (
        "Full-text search on the model's TextIndex: every word and every \"quoted "
        'phrase" must occur. Results come best match first (BM25) unless `ordering` is '
        "given."
    )

    def get_search_text(self, request) -> str | None:
        text = request.query_params.get(self.search_param, "")
        return text.strip() or None

    def get_search_field(self, view, model: type[models.Model]) -> str:
        """The field searched: ``view.search_field``, or the model's one TextIndex field."""
        field = getattr(view, "search_field", None)
        if field is not None:
            if field not in text_fields(model):
                raise ImproperlyConfigured(
                    f"{type(view).__name__}.search_field = {field!r}: "
                    f"{model._meta.label} has no TextIndex on it"
                )
            return field
        try:
            return text_field(model)
        except LookupError as exc:
            raise BadQuery(f"search is not available: {exc}", self.search_param) from None

    def is_ranked(self, request, view) -> bool:
        """Whether to return the matches in rank order (no ``?ordering=`` given)."""
        return not request.query_params.get(self.ordering_param, "").strip()

    def filter_queryset(self, request, queryset, view):
        text = self.get_search_text(request)
        if text is None:
            return queryset
        field = self.get_search_field(view, queryset.model)
        queryset = queryset.filter(**{f"{field}__search": text})
        if self.is_ranked(request, view):
            queryset = queryset.order_by()
        return queryset

    def get_schema_operation_parameters(self, view):
        try:
            model = view.get_queryset().model
        except Exception:  # a get_queryset() that needs a real request
            return []
        if getattr(view, "search_field", None) is None and len(text_fields(model)) != 1:
            return []
        return [
            {
                "name": self.search_param,
                "required": False,
                "in": "query",
                "description": self.search_description,
                "schema": {"type": "string"},
            }
        ]


class ZeroSearchFilter(SearchFilter):
    """DRF's ``SearchFilter``, refusing (400) a search of more than ``max_search_words``
    words: each word is a condition on every search field (an OR of index scans, or a
    scan of decrypted rows)."""

    max_search_words = 8

    def get_search_terms(self, request):
        terms = super().get_search_terms(request)
        if len(terms) > self.max_search_words:
            raise BadQuery(
                f"search for at most {self.max_search_words} words at a time", self.search_param
            )
        return terms


def unindexed(model: type[models.Model], field_name: str, lookup_expr: str) -> str | None:
    """Why filtering ``model`` on ``field_name__lookup_expr`` is not served by an index
    (None when it is)."""
    *relations, name = field_name.split("__")
    for part in relations:
        try:
            field = model._meta.get_field(part)
        except FieldDoesNotExist:
            return f"{model._meta.label} has no field {part!r}"
        if not field.is_relation:
            return f"{part!r} of {model._meta.label} is not a relation"
        model = field.related_model
    if lookup_expr == "search":
        try:
            field = model._meta.get_field(name)
        except FieldDoesNotExist:
            return f"{model._meta.label} has no field {name!r}"
        return None if has_text_index(field) else f"{name!r} has no TextIndex"
    if lookup_expr not in INDEXED_LOOKUPS:
        return f"the {lookup_expr!r} lookup is checked on decrypted rows"
    if not is_sortable(model, name):
        return f"{model._meta.label}.{name} has no single-field index"
    return None


class ZeroFilterSet(django_filters.FilterSet):
    """A ``FilterSet`` for encrypted models (``search`` lookups welcome:
    ``Meta.fields = {"bio": ["search"], "salary": ["gte", "lte"]}``).

    ``indexed_only = True`` makes the class refuse (``ImproperlyConfigured``) filters that
    the indexes do not serve: lookups other than exact, in, gt(e), lt(e), range, isnull,
    startswith on a field with a single-field index (or the pk), and search on a
    ``TextIndex`` field. Filters with a ``method`` are not checked.
    """

    indexed_only = False

    @classmethod
    def get_filters(cls):
        filters = super().get_filters()
        model = cls._meta.model
        if cls.indexed_only and model is not None:
            for name, f in filters.items():
                if f.method is not None or not f.field_name:
                    continue
                reason = unindexed(model, f.field_name, f.lookup_expr)
                if reason is not None:
                    raise ImproperlyConfigured(
                        f"{cls.__name__}: filter {name!r} is not served by an index "
                        f"({reason}); index the field or drop the filter"
                    )
        return filters


class IndexedFilterSet(ZeroFilterSet):
    indexed_only = True


class ZeroFilterBackend(django_filters.DjangoFilterBackend):
    filterset_base = ZeroFilterSet

    def get_filterset_class(self, view, queryset=None):
        if getattr(view, "filterset_indexed_only", False):
            self.filterset_base = IndexedFilterSet
        return super().get_filterset_class(view, queryset)

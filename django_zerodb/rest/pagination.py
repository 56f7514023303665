"""Pagination for encrypted models.

* ``ZeroPageNumberPagination``: ``?page=3&page_size=20`` with ``count``. The count is
  ``queryset.count()``, which the backend answers from its counted indexes when the
  filter is index-served (no row is decrypted to count), and the page is a slice the
  engine reads from the index order. Ranked search results (``?search=``) keep their rank
  order across pages; other unordered querysets are paged in pk order.
* ``ZeroCursorPagination``: opaque cursors on one indexed, non-null field (``-pk`` by
  default): constant cost per page however deep, stable under concurrent inserts. The
  ordering must be served by an index; anything else is ``ImproperlyConfigured`` (or a
  400 when the client chose it with ``?ordering=``).
"""

from __future__ import annotations

from django.core.exceptions import ImproperlyConfigured
from django.core.paginator import Paginator
from rest_framework.pagination import CursorPagination, PageNumberPagination

from django_zerodb.rest.exceptions import BadQuery
from django_zerodb.rest.indexing import is_ranked, is_sortable, model_field


class ZeroPaginator(Paginator):
    """Django's paginator, without the "unordered object list" warning for ranked search
    results (their order is the rank, which is deterministic)."""

    def _check_object_list_is_ordered(self):
        if hasattr(self.object_list, "query") and is_ranked(self.object_list):
            return
        super()._check_object_list_is_ordered()


class ZeroPageNumberPagination(PageNumberPagination):
    django_paginator_class = ZeroPaginator
    page_size = 50
    page_size_query_param = "page_size"
    max_page_size = 100

    def paginate_queryset(self, queryset, request, view=None):
        """Pages of an unordered queryset (no ``Meta.ordering``, no ``?ordering=``) are
        taken in pk order, so that they neither overlap nor miss rows; ranked search
        results keep their rank order."""
        if hasattr(queryset, "query") and not queryset.ordered and not is_ranked(queryset):
            queryset = queryset.order_by("pk")
        return super().paginate_queryset(queryset, request, view)


class ZeroCursorPagination(CursorPagination):
    ordering = "-pk"
    page_size = 50
    page_size_query_param = "page_size"
    max_page_size = 100

    def get_ordering(self, request, queryset, view):
        configured = self.ordering
        ordering = super().get_ordering(request, queryset, view)
        problem = self.ordering_problem(queryset.model, ordering)
        if problem is not None:
            param = self._ordering_param(view)
            if param is not None and request.query_params.get(param):
                raise BadQuery(f"cursor pagination cannot order this way: {problem}", param)
            raise ImproperlyConfigured(
                f"{type(self).__name__} on {type(view).__name__}: ordering {ordering!r} "
                f"(configured: {configured!r}): {problem}"
            )
        return ordering

    def ordering_problem(self, model, ordering: tuple[str, ...]) -> str | None:
        """Why ``ordering`` does not suit cursors on ``model`` (None when it does): its
        first field is what the cursor compares, so it must be served by an index and
        never NULL (a NULL position cannot be compared)."""
        first = ordering[0].removeprefix("-")
        field = model_field(model, first)
        if field is None:
            return f"{model._meta.label} has no field {first!r}"
        if not is_sortable(model, first):
            return (
                f"{model._meta.label}.{first} has no single-field index "
                "(db_index=True, unique=True or a ForeignKey)"
            )
        if field.null:
            return f"{model._meta.label}.{first} is nullable"
        return None

    @staticmethod
    def _ordering_param(view) -> str | None:
        for backend in getattr(view, "filter_backends", ()):
            if hasattr(backend, "get_ordering"):
                return getattr(backend, "ordering_param", None)
        return None

"""``django_zerodb.rest``: Django REST framework for encrypted models.

One module per concept, as in DRF itself:

* ``viewsets.ZeroModelViewSet``: a ``ModelViewSet`` with the defaults of a trusted
  internal API (token and session authentication, model permissions, filtering,
  ordering, ranked full-text search, counted pagination) and a JSON query endpoint
  (``POST <resource>/query/``).
* ``query.QueryParser``: the query language of that endpoint, translated to ``Q`` objects
  so that the backend's index planner serves it.
* ``filters``: ``RankedSearchFilter`` (``?search=``, served by the model's ``TextIndex``),
  ``ZeroSearchFilter`` (DRF's ``SearchFilter`` with a cap on words),
  ``ZeroFilterSet`` and ``ZeroFilterBackend`` (django-filter).
* ``pagination``: ``ZeroPageNumberPagination`` (counts from the indexes) and
  ``ZeroCursorPagination`` (on an indexed ordering).
* ``permissions.ZeroModelPermissions``: Django model permissions, reads included.
* ``schema.ZeroAutoSchema``: the OpenAPI schema (drf-spectacular), query endpoint included.
* ``routers.ZeroRouter``: ``register_model()`` for a model and a list of fields.

Nothing here is imported by the backend itself: the package needs
``djangorestframework``, ``django-filter`` and ``drf-spectacular``. See docs/rest.md.
"""

from typing import Any

# The names users import, resolved on first use (importing DRF needs configured settings).
_EXPORTS = {
    "ZeroModelViewSet": "django_zerodb.rest.viewsets",
    "ZeroRouter": "django_zerodb.rest.routers",
    "RankedSearchFilter": "django_zerodb.rest.filters",
    "ZeroSearchFilter": "django_zerodb.rest.filters",
    "ZeroPageNumberPagination": "django_zerodb.rest.pagination",
    "ZeroCursorPagination": "django_zerodb.rest.pagination",
    "ZeroModelPermissions": "django_zerodb.rest.permissions",
    "QueryParser": "django_zerodb.rest.query",
}


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module), name)


__all__ = sorted(_EXPORTS)

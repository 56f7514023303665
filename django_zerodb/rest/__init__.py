"""``django_zerodb.rest``: Django REST framework for encrypted models.

One module per concept, as in DRF itself:

* ``viewsets.ZeroModelViewSet``: a ``ModelViewSet`` with the defaults of a trusted
  internal API (token and session authentication, model permissions, filtering,
  ordering, ranked full-text search, counted pagination) and a JSON query endpoint
  (``POST <resource>/query/``).
* ``query.QueryParser``: the query language of that endpoint, translated to ``Q`` objects
  so that the backend's index planner serves it.
* ``filters``: ``RankedSearchFilter`` (``?search=``, served by the model's ``TextIndex``),
  ``ZeroFilterSet`` and ``ZeroFilterBackend`` (django-filter).
* ``pagination``: ``ZeroPageNumberPagination`` (counts from the indexes) and
  ``ZeroCursorPagination`` (on an indexed ordering).
* ``permissions.ZeroModelPermissions``: Django model permissions, reads included.
* ``schema.ZeroAutoSchema``: the OpenAPI schema (drf-spectacular), query endpoint included.
* ``routers.ZeroRouter``: ``register_model()`` for a model and a list of fields.

Nothing here is imported by the backend itself: the package needs
``djangorestframework``, ``django-filter`` and ``drf-spectacular``. See docs/rest.md.
"""

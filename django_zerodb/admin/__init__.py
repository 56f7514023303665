"""``django_zerodb.admin``: Django's admin on encrypted models.

* :class:`ZeroModelAdmin`: a ``ModelAdmin`` whose defaults and search lookups are served
  by the encrypted database's indexes (``options.py``).
* The "Encrypted store" page (``views.py``): the store's status, counts from the root,
  the cache, the round trips of the last requests
  (``django_zerodb.middleware.RoundTripsMiddleware``) and a button that verifies the
  whole database. Include its URLs before the admin's, and use the index template that
  links to it::

      # urls.py
      urlpatterns = [
          path("admin/zerodb/", include("django_zerodb.admin.urls")),
          path("admin/", admin.site.urls),
      ]
      # admin.py
      admin.site.index_template = "django_zerodb/admin/index.html"

Django's admin autodiscovery imports this module (``django_zerodb`` is an installed
app); it registers nothing.
"""

from django_zerodb.admin.options import (
    RankedResults,
    SearchLookup,
    ZeroChangeList,
    ZeroModelAdmin,
    search_lookup,
)

__all__ = ["RankedResults", "SearchLookup", "ZeroChangeList", "ZeroModelAdmin", "search_lookup"]

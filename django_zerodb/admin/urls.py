"""The URLs of the admin's "Encrypted store" page, under the default admin site.

Include them before the admin's own URLs (whose catch-all would answer first)::

    urlpatterns = [
        path("admin/zerodb/", include("django_zerodb.admin.urls")),
        path("admin/", admin.site.urls),
    ]

For another ``AdminSite``, include ``(get_urls(my_site), "zerodb_admin")`` instead. Every
view is wrapped by the site's ``admin_view``: staff only (others are sent to the admin's
login page), never cached, CSRF-protected.
"""

from __future__ import annotations

from functools import partial, update_wrapper

from django.contrib import admin
from django.urls import URLPattern, path

from django_zerodb.admin import views

app_name = "zerodb_admin"


def get_urls(site: admin.AdminSite = admin.site) -> list[URLPattern]:
    def wrap(view):
        bound = update_wrapper(partial(view, site=site), view)
        return site.admin_view(bound)

    return [
        path("", wrap(views.store_view), name="store"),
        path("verify/", wrap(views.verify_view), name="verify"),
    ]


urlpatterns = get_urls()

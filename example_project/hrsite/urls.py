from django.contrib import admin
from django.urls import include, path
from django.views.generic import RedirectView
from drf_spectacular.views import SpectacularAPIView
from hr.api import router

urlpatterns = [
    path("", RedirectView.as_view(pattern_name="hr:employee_list"), name="home"),
    path("", include("hr.urls")),
    # The admin's "Encrypted store" page; before admin.site.urls, whose catch-all would
    # answer first.
    path("admin/zerodb/", include("django_zerodb.admin.urls")),
    path("admin/", admin.site.urls),
    path("api/schema/", SpectacularAPIView.as_view(), name="schema"),
    path("api/", include(router.urls)),
]

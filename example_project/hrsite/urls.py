from django.contrib import admin
from django.urls import include, path
from django.views.generic import RedirectView
from drf_spectacular.views import SpectacularAPIView, SpectacularRedocView, SpectacularSwaggerView
from hr.api import router


class SwaggerView(SpectacularSwaggerView):
    # drf-spectacular's page views answer OPTIONS with a 500 (their HTML renderer has no
    # template for DRF's metadata): pages take GET only.
    http_method_names = ["get", "head"]


class RedocView(SpectacularRedocView):
    http_method_names = ["get", "head"]


urlpatterns = [
    path("", RedirectView.as_view(pattern_name="hr:employee_list"), name="home"),
    path("", include("hr.urls")),
    # The admin's "Encrypted store" page; before admin.site.urls, whose catch-all would
    # answer first.
    path("admin/zerodb/", include("django_zerodb.admin.urls")),
    path("admin/", admin.site.urls),
    path("api/schema/", SpectacularAPIView.as_view(), name="schema"),
    path("api/docs/", SwaggerView.as_view(url_name="schema"), name="swagger-ui"),
    path("api/redoc/", RedocView.as_view(url_name="schema"), name="redoc"),
    path("api/", include(router.urls)),
]

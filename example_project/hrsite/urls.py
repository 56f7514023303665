from django.contrib import admin
from django.http import JsonResponse
from django.urls import include, path
from django.views.generic import RedirectView


def api_placeholder(request):
    """/api/ until the REST API (Django REST framework) is built."""
    return JsonResponse(
        {
            "detail": "The REST API is not built yet.",
            "employees": request.build_absolute_uri("/employees/"),
            "admin": request.build_absolute_uri("/admin/"),
        },
        status=501,
    )


urlpatterns = [
    path("", RedirectView.as_view(pattern_name="hr:employee_list"), name="home"),
    path("", include("hr.urls")),
    # The admin's "Encrypted store" page; before admin.site.urls, whose catch-all would
    # answer first.
    path("admin/zerodb/", include("django_zerodb.admin.urls")),
    path("admin/", admin.site.urls),
    path("api/", api_placeholder, name="api"),
]

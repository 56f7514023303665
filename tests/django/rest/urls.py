from django.urls import include, path
from drf_spectacular.views import SpectacularAPIView

from tests.django.rest.api import router

urlpatterns = [
    path("schema/", SpectacularAPIView.as_view(), name="schema"),
    path("", include(router.urls)),
]

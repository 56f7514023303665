"""``ZeroRouter``: routes of ``ZeroModelViewSet``s and ``register_model()``."""

from __future__ import annotations

from django.urls import reverse

from django_zerodb.rest.routers import ZeroRouter
from django_zerodb.rest.viewsets import ZeroModelViewSet
from tests.django.rest.api import TagViewSet
from tests.django.rest.helpers import db, ids, pks
from tests.django.testapp.models import Department, Tag

pytestmark = db


def test_routes():
    assert reverse("employee-list") == "/api/employees/"
    assert reverse("employee-detail", args=[3]) == "/api/employees/3/"
    assert reverse("employee-query") == "/api/employees/query/"
    assert reverse("tag-query") == "/api/tags/query/"


def test_register_model_builds_a_viewset():
    assert issubclass(TagViewSet, ZeroModelViewSet)
    assert TagViewSet.__name__ == "TagViewSet"
    assert TagViewSet.queryset.model is Tag
    serializer = TagViewSet.serializer_class
    assert serializer.__name__ == "TagSerializer"
    assert list(serializer().fields) == ["id", "label", "employees"]


def test_register_model_options():
    router = ZeroRouter()
    viewset = router.register_model(
        Department,
        fields=["id", "name", "budget"],
        prefix="teams",
        basename="team",
        read_only_fields=["budget"],
        ordering_fields=["name"],
    )
    assert viewset.ordering_fields == ["name"]
    assert viewset.serializer_class().fields["budget"].read_only
    names = {url.name for url in router.urls}
    assert {"team-list", "team-detail", "team-query", "api-root"} <= names
    assert any(str(url.pattern) == "^teams/query/$" for url in router.urls)


def test_registered_model_api(api, hr):
    ada, alan = hr.employees[0], hr.employees[1]
    response = api.post("/api/tags/", {"label": "pioneer", "employees": [ada.pk, alan.pk]})
    assert response.status_code == 201, response.json()
    api.post("/api/tags/", {"label": "other", "employees": [alan.pk]})
    response = api.get("/api/tags/")
    assert ids(response) == pks(Tag.objects.order_by("pk"))
    response = api.post("/api/tags/query/", {"filter": {"employees": ada.pk}}, format="json")
    assert ids(response) == pks(Tag.objects.filter(employees=ada.pk).order_by("pk"))
    assert [row["label"] for row in response.json()["results"]] == ["pioneer"]

"""``ZeroRouter``: DRF's ``DefaultRouter``, plus ``register_model()``.

    router = ZeroRouter()
    router.register("employees", EmployeeViewSet)          # as with DefaultRouter
    router.register_model(Department, fields=["id", "name"])  # a serializer and a
                                                             # ZeroModelViewSet made for it
    urlpatterns = [path("api/", include(router.urls))]

Each ``ZeroModelViewSet`` gets ``<prefix>/query/`` (its ``query`` action) along with the
usual list and detail routes.
"""

from __future__ import annotations

from collections.abc import Sequence

from django.db import models
from django.utils.text import slugify
from rest_framework import serializers
from rest_framework.routers import DefaultRouter

from django_zerodb.rest.viewsets import ZeroModelViewSet


class ZeroRouter(DefaultRouter):
    viewset_class = ZeroModelViewSet

    def register_model(
        self,
        model: type[models.Model],
        *,
        fields: Sequence[str],
        prefix: str | None = None,
        basename: str | None = None,
        read_only_fields: Sequence[str] = (),
        **attrs,
    ) -> type[ZeroModelViewSet]:
        """Register a ``ZeroModelViewSet`` for ``model`` exposing ``fields`` (required:
        nothing is exposed by default), under ``prefix`` (the slug of the model's
        ``verbose_name_plural`` by default). ``attrs`` become attributes of the viewset
        (``filterset_fields``, ``ordering_fields``, ``query_fields`` ...)."""
        name = model._meta.object_name
        meta = type("Meta", (), {"model": model, "fields": list(fields)})
        if read_only_fields:
            meta.read_only_fields = list(read_only_fields)
        serializer = type(f"{name}Serializer", (serializers.ModelSerializer,), {"Meta": meta})
        viewset = type(
            f"{name}ViewSet",
            (self.viewset_class,),
            {
                "queryset": model._default_manager.all(),
                "serializer_class": serializer,
                "__module__": model.__module__,
                **attrs,
            },
        )
        prefix = prefix or slugify(str(model._meta.verbose_name_plural))
        self.register(prefix, viewset, basename=basename)
        return viewset

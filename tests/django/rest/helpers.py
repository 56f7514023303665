"""Helpers of the ``django_zerodb.rest`` tests."""

from __future__ import annotations

import pytest
from rest_framework.test import APIClient

# The plaintext database (users, permissions, tokens, sessions) and the encrypted one.
db = pytest.mark.django_db(databases=["default", "encrypted"])


def client_for(user) -> APIClient:
    """An API client with a session of ``user``."""
    client = APIClient()
    client.force_login(user)
    return client


def ids(response) -> list[int]:
    """The ids of a list, page or query response, in order."""
    data = response.json()
    results = data["results"] if isinstance(data, dict) else data
    return [row["id"] for row in results]


def pks(queryset) -> list[int]:
    return list(queryset.values_list("pk", flat=True))

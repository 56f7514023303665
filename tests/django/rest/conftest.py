"""Fixtures of the ``django_zerodb.rest`` tests: users with and without the testapp model
permissions (in the plaintext ``default`` database), and API clients logged in as them.

The HR data set (``hr``) comes from tests/django/conftest.py.
"""

from __future__ import annotations

import pytest
from rest_framework.test import APIClient


def _user(username, *codenames):
    from django.contrib.auth.models import Permission, User

    user = User.objects.create_user(username, password=f"{username}-password")
    perms = Permission.objects.filter(content_type__app_label="testapp", codename__in=codenames)
    assert perms.count() == len(codenames), codenames
    user.user_permissions.set(perms)
    return user


MODELS = ("employee", "department", "tag")


@pytest.fixture
def staff():
    """Every permission on the models of the API."""
    actions = ("view", "add", "change", "delete")
    return _user("staff", *(f"{a}_{m}" for a in actions for m in MODELS))


@pytest.fixture
def reader():
    """The view permissions only."""
    return _user("reader", *(f"view_{m}" for m in MODELS))


@pytest.fixture
def nobody():
    """Authenticated, without any permission."""
    return _user("nobody")


@pytest.fixture
def api(staff):
    """An API client logged in (session) as ``staff``."""
    client = APIClient()
    client.force_login(staff)
    return client


@pytest.fixture
def anonymous():
    return APIClient()

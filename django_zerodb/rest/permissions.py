"""``ZeroModelPermissions``: Django model permissions, reading included.

DRF's ``DjangoModelPermissions`` lets any authenticated user read. The data of an
encrypted model is what the encryption protects, so reading needs the model's ``view``
permission here (``testapp.view_employee``), as adding, changing and deleting need
``add``, ``change`` and ``delete``. Actions that read through a POST (the JSON query
endpoint) are listed in the view's ``read_only_actions`` and need ``view`` as well.
"""

from __future__ import annotations

from rest_framework.permissions import DjangoModelPermissions

VIEW = "%(app_label)s.view_%(model_name)s"


class ZeroModelPermissions(DjangoModelPermissions):
    perms_map = {
        **DjangoModelPermissions.perms_map,
        "GET": [VIEW],
        "HEAD": [VIEW],
    }

    def get_method(self, request, view) -> str:
        """The method whose permissions the request needs: ``GET`` for the view's
        ``read_only_actions``, the request's own method otherwise."""
        if getattr(view, "action", None) in getattr(view, "read_only_actions", ()):
            return "GET"
        return request.method

    def has_permission(self, request, view) -> bool:
        user = request.user
        if not user or (not user.is_authenticated and self.authenticated_users_only):
            return False
        if getattr(view, "_ignore_model_permissions", False):
            return True
        model = self._queryset(view).model
        return user.has_perms(self.get_required_permissions(self.get_method(request, view), model))

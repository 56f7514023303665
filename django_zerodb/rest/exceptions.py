"""``BadQuery``: a client error (400) that names where in the request it is.

Every problem of a query (the JSON query endpoint, ``?search=``, a cursor ordering) is
answered in DRF's shape for an error that is not about one field, ``{"detail": "<what is
wrong>"}``, plus where: ``{"detail": ..., "path": "<where>"}``. ``path`` is the JSON
path of the offending part of the body (``"filter.salary.$gte"``,
``"filter.$or[1].first_name"``, ``"order_by[0]"``; ``""`` for the body as a whole) or
the name of the query parameter (``"search"``, ``"ordering"``).
"""

from __future__ import annotations

from rest_framework import status
from rest_framework.exceptions import APIException


class BadQuery(APIException):
    status_code = status.HTTP_400_BAD_REQUEST
    default_detail = "Bad query."
    default_code = "bad_query"

    def __init__(self, error: str, path: str = "") -> None:
        super().__init__({"detail": error, "path": path}, code=self.default_code)
        self.error = error
        self.path = path


def join(path: str, key: str | int) -> str:
    """The JSON path of ``key`` (a member name or a list index) inside ``path``."""
    if isinstance(key, int):
        return f"{path}[{key}]"
    return f"{path}.{key}" if path else key


class ChangedMeanwhile(APIException):
    """A write met a concurrent change of what it wrote or read, and was not saved."""

    status_code = status.HTTP_409_CONFLICT
    default_detail = (
        "The resource was changed by someone else meanwhile; nothing was saved. "
        "Read it again, then retry."
    )
    default_code = "changed_meanwhile"


class Protected(APIException):
    """A delete refused because other objects still refer to the object (``on_delete=PROTECT``
    or ``RESTRICT``): nothing was deleted."""

    status_code = status.HTTP_409_CONFLICT
    default_detail = "Other objects still refer to this one; nothing was deleted."
    default_code = "protected"

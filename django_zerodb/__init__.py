"""django_zerodb: a Django database backend over the encrypted engine (``zerodb_core``).

``DATABASES = {"encrypted": {"ENGINE": "django_zerodb", "NAME": "hr", "OPTIONS": {...}}}``
with ``DATABASE_ROUTERS = ["django_zerodb.routers.ZeroDBRouter"]`` and ``ZERODB_APPS``.
"""

from __future__ import annotations

import django

from zerodb_core.api import __version__

# The Django versions this backend was tested with; it reaches into the ORM's compiler
# and query internals, which change between feature releases. What differs between
# them is in compat.py (and docs/known-issues.md).
TESTED_DJANGO = ((5, 2), (6, 0), (6, 1))

if django.VERSION[:2] not in TESTED_DJANGO:
    from django.core.exceptions import ImproperlyConfigured

    _tested = ", ".join(".".join(map(str, v)) for v in TESTED_DJANGO)
    raise ImproperlyConfigured(
        f"django_zerodb is tested with Django {_tested}, not {django.get_version()}: "
        "install a tested version"
    )

__all__ = ["__version__"]

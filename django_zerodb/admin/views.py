"""The admin's "Encrypted store" page: what an encrypted database holds, and a button
that verifies it.

Everything on the page but the blob usage comes from the root record (one root read, as
``manage.py zerodb_status``: ``zerodb_core.status.database_status``) and from this
process's counters: the store's address (never the passphrase), database name, root seq,
the records of each model and the entries and tree height of each index, the client
cache, and the round trips of the last requests (``RoundTripsMiddleware``). Blob count
and bytes are asked of the storage (the embedded store counts them; a blob server answers
its ``stats`` call).

The verify button (POST, CSRF-protected) runs ``zerodb_core.verify.verify``, the check of
``manage.py zerodb_verify``: every blob the root reaches is read from the store, decrypted
and checked, and every index is compared with the records. It reads the whole database,
so it needs a permission besides staff status: ``settings.ZERODB_ADMIN_VERIFY_PERMISSION``
(default ``"django_zerodb.change_seenroot"``: whoever may change the rollback-detection
floor is trusted with the store's integrity; superusers have it).
"""

from __future__ import annotations

import datetime
import time
from typing import Any

from django.conf import settings
from django.contrib import admin, messages
from django.core.exceptions import ImproperlyConfigured, PermissionDenied
from django.db import DatabaseError, connections
from django.http import Http404, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import reverse
from django.views.decorators.http import require_GET, require_POST

from django_zerodb.exceptions import Error as BackendError
from django_zerodb.exceptions import translated
from django_zerodb.freshness import describe_tracker
from django_zerodb.management.utils import model_labels
from django_zerodb.middleware import RoundTripsMiddleware, recent_requests
from django_zerodb.store import store_settings
from zerodb_core.api import ZeroDBError, database_status, verify

DEFAULT_VERIFY_PERMISSION = "django_zerodb.change_seenroot"
RECENT_SHOWN = 20
PROBLEMS_KEPT = 50
ERRORS = (DatabaseError, BackendError, ZeroDBError, ImproperlyConfigured, OSError)
MIDDLEWARE_PATH = f"{RoundTripsMiddleware.__module__}.{RoundTripsMiddleware.__name__}"


def verify_permission() -> str:
    return getattr(settings, "ZERODB_ADMIN_VERIFY_PERMISSION", DEFAULT_VERIFY_PERMISSION)


def encrypted_aliases() -> list[str]:
    """The ``DATABASES`` aliases whose ENGINE is django_zerodb, the router's first."""
    aliases = [a for a, e in settings.DATABASES.items() if e.get("ENGINE") == "django_zerodb"]
    chosen = getattr(settings, "ZERODB_DATABASE", None)
    if chosen in aliases:
        aliases.remove(chosen)
        aliases.insert(0, chosen)
    return aliases


def _alias(request) -> str:
    aliases = encrypted_aliases()
    if not aliases:
        raise Http404("no database in settings.DATABASES has ENGINE 'django_zerodb'")
    alias = request.POST.get("database") or request.GET.get("database") or aliases[0]
    if alias not in aliases:
        raise Http404(f"no encrypted database {alias!r}")
    return alias


def blob_usage(engine) -> dict[str, Any]:
    """Blob count and bytes of the engine's database, if its store can tell:
    ``{"available": True, "blobs": ..., "bytes": ..., "garbage": ...}``, else
    ``{"available": False, "reason": ...}``."""
    transport = engine.transport
    try:
        if hasattr(transport, "server_stats"):  # a blob server
            stats = transport.server_stats(engine.database)
        elif hasattr(transport, "storage"):  # an embedded store
            stats = transport.storage.stats(transport.tenant, engine.database)
        else:
            return {"available": False, "reason": "this store does not report its usage"}
    except ERRORS as exc:
        return {"available": False, "reason": f"the store did not answer: {exc}"}
    return {
        "available": True,
        "blobs": stats.get("blobs"),
        "bytes": stats.get("bytes"),
        "garbage": stats.get("garbage"),
    }


def store_status(alias: str) -> dict[str, Any]:
    """Everything the page shows about ``alias`` (may raise the backend's errors)."""
    connection = connections[alias]
    params = store_settings(connection.settings_dict)
    with translated():
        engine = connection.session.engine
        status = database_status(engine)
        usage = blob_usage(engine)
    labels = model_labels()
    models = []
    for name, model in status["models"].items():
        indexes = [{"name": index_name, **index} for index_name, index in model["indexes"].items()]
        models.append({"table": name, "label": labels.get(name), **model, "indexes": indexes})
    stats = status["engine"]
    lookups = stats["cache_hits"] + stats["cache_misses"]
    key_file = params["key_file"] if params["store"].startswith("zerodb://") else None
    committed = status["committed_at"]
    return {
        "alias": alias,
        "store": params["store"],  # never the passphrase
        "username": params["username"],
        "key_file": None if key_file is None else str(key_file),
        "database": status["database"],
        "tenant": status["tenant"],
        "seq": status["seq"],
        "committed_at": (
            datetime.datetime.fromtimestamp(committed, datetime.UTC) if committed else None
        ),
        "key_epochs": status["key_epochs"],
        "current_epoch": status["current_epoch"],
        "freshness": describe_tracker(engine.freshness),
        "models": models,
        "unowned_trees": status["unowned_trees"],
        "usage": usage,
        "engine": stats,
        # percent of blob reads served by the client cache of decrypted blobs
        "cache_hit_rate": None if not lookups else round(100 * stats["cache_hits"] / lookups, 1),
    }


def _session_key(alias: str) -> str:
    return f"django_zerodb.verify:{alias}"


@require_GET
def store_view(request, site: admin.AdminSite):
    alias = _alias(request)
    try:
        status, error = store_status(alias), None
    except ERRORS as exc:
        status, error = None, f"{type(exc).__name__}: {exc}"
    context = {
        **site.each_context(request),
        "title": "Encrypted store",
        "aliases": encrypted_aliases(),
        "alias": alias,
        "status": status,
        "error": error,
        "recent": recent_requests(RECENT_SHOWN),
        "recent_shown": RECENT_SHOWN,
        "middleware_installed": MIDDLEWARE_PATH in settings.MIDDLEWARE,
        "middleware_path": MIDDLEWARE_PATH,
        "can_verify": request.user.has_perm(verify_permission()),
        "verify_permission": verify_permission(),
        "verify": request.session.get(_session_key(alias)),
    }
    request.current_app = site.name
    return TemplateResponse(request, "django_zerodb/admin/store.html", context)


@require_POST
def verify_view(request, site: admin.AdminSite):
    alias = _alias(request)
    if not request.user.has_perm(verify_permission()):
        raise PermissionDenied(f"verifying the store needs the {verify_permission()} permission")
    started = time.perf_counter()
    try:
        with translated():
            report = verify(connections[alias].session.engine)
    except ERRORS as exc:
        result = {"ok": False, "error": f"{type(exc).__name__}: {exc}", "problems": []}
    else:
        result = report.to_dict()
        result["problem_count"] = len(result["problems"])
        result["problems"] = result["problems"][:PROBLEMS_KEPT]
    result["ms"] = round((time.perf_counter() - started) * 1000)
    result["at"] = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
    request.session[_session_key(alias)] = result
    if result["ok"]:
        messages.success(request, f"Verified {alias!r}: no problems found.")
    elif "error" in result:
        messages.error(request, f"Verifying {alias!r} failed: {result['error']}")
    else:
        messages.error(request, f"Verifying {alias!r}: {result['problem_count']} problem(s) found.")
    url = reverse("zerodb_admin:store", current_app=site.name)
    return HttpResponseRedirect(f"{url}?database={alias}", status=303)

"""Settings for a project's tests: the encrypted database in memory, a test passphrase.

In the test settings (docs/testing.md)::

    from django_zerodb.testing import in_memory
    from mysite.settings import *

    DATABASES["encrypted"] = in_memory(DATABASES["encrypted"])

The tests then never open the project's real store (not even ``manage.py check`` does),
the keyring is derived with the fast KDF (libsodium's minimum: milliseconds instead of
seconds; for tests only), and the real passphrase need not be known to the test run.
"""

from __future__ import annotations

import copy
from typing import Any

TEST_PASSPHRASE = "tests-only passphrase"


def in_memory(entry: dict[str, Any], passphrase: str = TEST_PASSPHRASE) -> dict[str, Any]:
    """Return a copy of the ``DATABASES`` entry ``entry`` on a ``memory://`` store, for
    tests: its test database is in memory too, unlocked with ``passphrase`` and the fast
    KDF. Every other option (``ISOLATION_LEVEL``, ``NAME`` ...) stays, so the tests run
    with the project's semantics; the options of a blob server are dropped."""
    entry = copy.deepcopy(entry)
    options = entry.setdefault("OPTIONS", {})
    for remote in ("KEY_FILE", "TLS", "CA_FILE", "TIMEOUT", "POOL_SIZE", "FRESHNESS_PATH"):
        options.pop(remote, None)
    if options.get("FRESHNESS") == "file":
        del options["FRESHNESS"]
    options.update(STORE="memory://", PASSPHRASE=passphrase, KDF="fast")
    entry.pop("HOST", None)
    entry.pop("PORT", None)
    entry.pop("PASSWORD", None)
    entry.setdefault("TEST", {})["STORE"] = "memory://"
    return entry

"""``make demo``: set up the example HR site (once) and run it.

1. ``migrate`` the plaintext ``default`` database (users, sessions, the admin log) and the
   ``encrypted`` one (the ``hr`` app);
2. seed 3,000 made-up employees, unless there are employees already;
3. create the superuser ``admin`` unless a superuser exists: its password comes from
   ``ZERODB_DEMO_ADMIN_PASSWORD``, or is generated, printed once and kept in
   ``var/admin-password`` (mode 0600);
4. print the URLs and run the development server (``--no-server`` stops before both).

A second run finds everything in place and only starts the server. Options:
``--addr 127.0.0.1:8000``, ``--employees 3000``, ``--no-server``.
"""

from __future__ import annotations

import argparse
import os
import secrets
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Set up and run the example HR site.")
    parser.add_argument("--addr", default="127.0.0.1:8000", help="host:port (%(default)s)")
    parser.add_argument(
        "--employees", type=int, default=3000, help="employees to seed (%(default)s)"
    )
    parser.add_argument("--no-server", action="store_true", help="set up, then exit")
    args = parser.parse_args(argv)

    sys.path.insert(0, str(HERE))
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "hrsite.settings")
    import django

    django.setup()
    from django.conf import settings
    from django.core.management import call_command

    started = time.perf_counter()
    store = settings.DATABASES["encrypted"]["OPTIONS"]["STORE"]
    print(f"encrypted store: {store}")
    if not os.environ.get("ZERODB_PASSPHRASE"):
        print(
            f"passphrase: {settings.VAR_DIR / 'passphrase'} (generated for the demo; "
            "set ZERODB_PASSPHRASE to use your own)"
        )
    print("unlocking the encrypted database (Argon2id key derivation: a few seconds) ...")
    sys.stdout.flush()
    call_command("migrate", verbosity=0, interactive=False)
    call_command("migrate", database="encrypted", verbosity=0, interactive=False)
    print("databases migrated (default: plaintext SQLite; encrypted: the hr app)")
    call_command("seed_hr", employees=args.employees, if_empty=True, seed=2026)
    ensure_admin(settings.VAR_DIR)
    print(f"ready in {time.perf_counter() - started:.1f}s")

    if args.no_server:
        print("set up; no server started (run without --no-server to serve the site)")
        return
    base = f"http://{args.addr}"
    print()
    print(f"  the site:   {base}/employees/")
    print(f"  the admin:  {base}/admin/   (user admin)")
    print(f"  the API:    {base}/api/   (its documentation: {base}/api/docs/)")
    print()
    sys.stdout.flush()
    # No autoreloader: one process, which already has the encrypted store open.
    call_command("runserver", args.addr, use_reloader=False)


def ensure_admin(var_dir: Path) -> None:
    """Create the superuser ``admin`` unless there is a superuser already."""
    from django.contrib.auth import get_user_model

    users = get_user_model()
    if users.objects.filter(is_superuser=True).exists():
        print("admin: a superuser exists already", end="")
        path = var_dir / "admin-password"
        print(f" (password in {path})" if path.exists() else "")
        return
    password = os.environ.get("ZERODB_DEMO_ADMIN_PASSWORD")
    if password:
        users.objects.create_superuser("admin", "admin@example.com", password)
        print("admin: created the superuser admin, password from ZERODB_DEMO_ADMIN_PASSWORD")
        return
    password = secrets.token_urlsafe(12)
    path = var_dir / "admin-password"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.unlink(missing_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(password + "\n")
    users.objects.create_superuser("admin", "admin@example.com", password)
    print(f"admin: created the superuser admin, password {password}")
    print(f"       (generated; shown only this once, and kept in {path}, mode 0600)")


if __name__ == "__main__":
    main()

"""``manage.py zerodb_init``: create the key file (blob-server store) and the keyring."""

from __future__ import annotations

import os
from pathlib import Path

from django.core.management.base import BaseCommand, CommandError

from django_zerodb.freshness import ModelFreshnessTracker
from django_zerodb.management.utils import (
    add_database_argument,
    command_errors,
    connection_params,
    encrypted_connection,
    unlocked_session,
)
from zerodb_core.api import PRESETS


class Command(BaseCommand):
    help = (
        "Set up an encrypted database. For a blob-server store (STORE 'zerodb://host:port') "
        "without a key file yet, create OPTIONS['KEY_FILE'] (a random login key sealed "
        "under the database passphrase) and print its public key: register it with "
        "`zerodb-server add-key TENANT PUBKEY`, then run this command again. With the key "
        "file in place (and for embedded stores, which need none), open the database: its "
        "keyring (random master keys wrapped under the passphrase) is created on first "
        "open. Never overwrites a key file without --force."
    )

    def add_arguments(self, parser) -> None:
        add_database_argument(parser)
        parser.add_argument(
            "--tenant", help="the tenant a new key file logs in as (required to create one)"
        )
        parser.add_argument(
            "--server-id",
            help="pin a new key file to this server id (`zerodb-server list-tenants` prints "
            "it); default: the id the first login sees",
        )
        parser.add_argument(
            "--kdf",
            choices=sorted(PRESETS),
            help="Argon2id preset sealing a new key file (default: OPTIONS['KDF'], else "
            "moderate; 'fast' is for tests only)",
        )
        parser.add_argument(
            "--force",
            action="store_true",
            help="replace an existing key file with a new key (the old key stops working "
            "once removed from the server: keep a copy)",
        )
        parser.add_argument(
            "--key-only",
            action="store_true",
            help="only create the key file; do not open the database",
        )
        parser.add_argument(
            "--reset-freshness",
            action="store_true",
            help="forget the highest root remembered for this database (in the default "
            "database's SeenRoot table), after restoring its store from a backup on "
            "purpose; processes already running keep their own memory until restarted",
        )

    def handle(self, *args, **options) -> None:
        connection = encrypted_connection(options["database"])
        params = connection_params(connection)
        remote = params["store"].startswith("zerodb://")
        if remote:
            created = self._key_file(params, options)
            if created or options["key_only"]:
                return
        elif options["key_only"] or options["tenant"] or options["server_id"] or options["force"]:
            raise CommandError(
                f"{params['store']!r} is an embedded store: it needs no key file "
                "(--tenant, --server-id, --force and --key-only apply to blob-server stores)"
            )
        with command_errors(f"opening {connection.alias!r}"):
            engine = unlocked_session(self, options, connection).engine
            if options["reset_freshness"]:
                self._reset_freshness(engine, params)
            seq = engine.read_root().seq
        state = "a new, empty database" if seq == 0 else f"an existing database at root seq {seq}"
        self.stdout.write(
            self.style.SUCCESS(
                f"Database {params['database']!r} of {params['store']} is open (keyring of "
                f"user {params['username']!r} unlocked, created if it did not exist): {state}."
            )
        )
        if seq == 0:
            self.stdout.write(f"Next: manage.py migrate --database {connection.alias}")

    def _key_file(self, params: dict, options: dict) -> bool:
        """Create the key file if it is missing (or --force); True if one was created."""
        from zerodb_core.api import KeyFile

        path = params["key_file"] or os.environ.get("ZERODB_KEY_FILE")
        if not path:
            raise CommandError(
                "a blob-server store needs OPTIONS['KEY_FILE'] (where the key file is, or "
                "is to be created)"
            )
        path = Path(path)
        if path.exists() and not options["force"]:
            if options["key_only"]:
                raise CommandError(f"{path} exists; refusing to overwrite a key (--force)")
            self.stdout.write(f"Key file {path} exists; opening the database with it.")
            return False
        if not options["tenant"]:
            raise CommandError(f"creating the key file {path} needs --tenant NAME")
        server = params["store"][len("zerodb://") :].rstrip("/")
        try:
            keyfile = KeyFile.create(options["tenant"], server, server_id=options["server_id"])
        except ValueError as exc:
            raise CommandError(str(exc)) from None
        kdf = options["kdf"] or params["kdf"] or "moderate"
        path.parent.mkdir(parents=True, exist_ok=True)
        if path.exists():  # --force: replace atomically, never leave half a key
            keyfile.save(path, params["passphrase"], kdf=kdf, replace=True)
        else:
            try:
                keyfile.save(path, params["passphrase"], kdf=kdf)
            except FileExistsError:
                raise CommandError(f"{path} exists; refusing to overwrite a key") from None
        public = keyfile.public_key.hex()
        self.stdout.write(f"Created key file {path} (tenant {options['tenant']!r}).")
        self.stdout.write(f"Public key: {public}")
        self.stdout.write(
            "Register it on the blob server, then run zerodb_init again to create the "
            f"keyring:\n  zerodb-server add-key {options['tenant']} {public} --tenants PATH"
        )
        return True

    def _reset_freshness(self, engine, params: dict) -> None:
        tracker = engine.freshness
        if not isinstance(tracker, ModelFreshnessTracker):
            raise CommandError(
                "--reset-freshness applies to OPTIONS['FRESHNESS'] = 'default'; with "
                "'file' delete the freshness file, 'memory' remembers nothing"
            )
        from django_zerodb.models import SeenRoot

        deleted, _ = (
            SeenRoot.objects.using(tracker.using)
            .filter(store=tracker.store, database=params["database"])
            .delete()
        )
        self.stdout.write(
            f"Forgot the highest root seen of {params['database']!r} ({deleted} row deleted)."
        )

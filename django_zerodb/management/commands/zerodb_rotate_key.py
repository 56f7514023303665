"""``manage.py zerodb_rotate_key``: start a new key epoch, or change the passphrase."""

from __future__ import annotations

import os

from django.core.management.base import BaseCommand, CommandError

from django_zerodb.management.utils import (
    add_database_argument,
    command_errors,
    connection_params,
    encrypted_connection,
    status,
    unlocked_session,
)
from zerodb_core.api import PRESETS, change_passphrase, rotate_epoch


class Command(BaseCommand):
    help = (
        "Change the passphrase of an encrypted database: its keyring (the random master "
        "keys, in the store) is re-wrapped under the new passphrase, read from the "
        "environment variable named by --new-passphrase-env, and swapped in atomically; "
        "for a blob-server store the key file is re-sealed too. Then set the PASSPHRASE "
        "setting to the new value: new processes need it, running ones keep working. "
        "WHAT IT DOES NOT DO: no data is re-encrypted and the master keys stay the same, "
        "so whoever already holds them (a copy of the old keyring with the old "
        "passphrase) can still read everything. A new key epoch (--new-epoch: new master "
        "key for new data) is not supported by the engine yet and is refused."
    )

    def add_arguments(self, parser) -> None:
        add_database_argument(parser)
        parser.add_argument(
            "--new-passphrase-env",
            metavar="VAR",
            help="name of the environment variable holding the new passphrase (never "
            "pass a passphrase on the command line: it would show in `ps` and shell history)",
        )
        parser.add_argument(
            "--kdf",
            choices=sorted(PRESETS),
            help="Argon2id preset of the new wrapping (default: the costs of the current one)",
        )
        parser.add_argument(
            "--keyring-only",
            action="store_true",
            help="re-wrap the keyring but leave the key file (blob-server store) under the "
            "old passphrase: for the other databases of a tenant that share one key file, "
            "before changing the last one without this flag",
        )
        parser.add_argument(
            "--new-epoch",
            action="store_true",
            help="start a new master-key epoch (new blobs are sealed under a new random "
            "master key; nothing is re-encrypted)",
        )

    def handle(self, *args, **options) -> None:
        if options["new_epoch"]:
            if options["new_passphrase_env"]:
                raise CommandError("--new-epoch and --new-passphrase-env: one at a time")
            connection = encrypted_connection(options["database"])
            params = connection_params(connection)
            with command_errors(f"rotating the key epoch of {connection.alias!r}"):
                epoch = rotate_epoch(
                    unlocked_session(self, options, connection).engine,
                    params["passphrase"],
                    username=params["username"],
                )
            self.stdout.write(
                self.style.SUCCESS(
                    f"Key epoch {epoch} started for user {params['username']!r}: new blobs "
                    "are sealed under a new master key. Old blobs keep their epochs."
                )
            )
            return
        var = options["new_passphrase_env"]
        if not var:
            raise CommandError("pass --new-passphrase-env VAR (the variable holding the new one)")
        new = os.environ.get(var)
        if not new:
            raise CommandError(f"the environment variable {var} is not set or is empty")
        connection = encrypted_connection(options["database"])
        params = connection_params(connection)
        key_file = None
        if params["store"].startswith("zerodb://") and not options["keyring_only"]:
            key_file = params["key_file"] or os.environ.get("ZERODB_KEY_FILE")
        with command_errors(f"changing the passphrase of {connection.alias!r}"):
            engine = unlocked_session(self, options, connection).engine
            rewrapped = "the keyring and the key file" if key_file else "the keyring"
            status(
                self,
                options,
                f"re-wrapping {rewrapped} under the new passphrase (Argon2id for each: "
                "a few seconds) ...",
            )
            done = change_passphrase(
                engine,
                params["passphrase"],
                new,
                username=params["username"],
                key_file=key_file,
                kdf=options["kdf"],
            )
        self.stdout.write(
            self.style.SUCCESS(
                f"The keyring of user {done['username']!r} in database {done['database']!r} "
                "is now wrapped under the new passphrase."
            )
        )
        if done["key_file"]:
            self.stdout.write(f"The key file {done['key_file']} is sealed under it too.")
        elif params["store"].startswith("zerodb://"):
            self.stdout.write("The key file was left under the old passphrase (--keyring-only).")
        self.stdout.write(
            f"Now set DATABASES[{connection.alias!r}] PASSPHRASE (or PASSWORD) to the new "
            "passphrase: processes started with the old one cannot open the database any "
            "more. No data was re-encrypted; the master keys are unchanged."
        )

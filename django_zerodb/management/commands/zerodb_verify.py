"""``manage.py zerodb_verify``: decrypt everything and check every index against the
records (``zerodb_core.verify``)."""

from __future__ import annotations

import json

from django.core.management.base import BaseCommand, CommandError

from django_zerodb.management.utils import (
    add_database_argument,
    add_progress_argument,
    catalog_names,
    command_errors,
    encrypted_connection,
    progress_bar,
    unlocked_session,
)
from zerodb_core.api import verify


class Command(BaseCommand):
    help = (
        "Verify an encrypted database end to end: read the current root and every blob it "
        "reaches from the store (bypassing the cache), decrypt and authenticate each, and "
        "check every tree (key order, node kinds, the counts kept in inner nodes) and "
        "every index against the records (each record has the entries its indexes should "
        "hold, each entry points to an existing record with the same value, unique "
        "indexes hold no duplicate, text statistics match). Nothing is written. Exits "
        "with status 1 if any problem is found. Reads the whole database: on a large one "
        "this takes a while and holds one model's records in memory."
    )

    def add_arguments(self, parser) -> None:
        parser.add_argument(
            "models",
            nargs="*",
            metavar="MODEL",
            help="only these models: app_label.ModelName or the table name (default: all, "
            "and trees no model owns are reported)",
        )
        add_database_argument(parser)
        add_progress_argument(parser)
        parser.add_argument(
            "--json", action="store_true", help="print the report as one JSON object"
        )
        parser.add_argument(
            "--limit",
            type=int,
            default=50,
            help="print at most this many problems (default 50; 0 prints all)",
        )

    def handle(self, *args, **options) -> None:
        connection = encrypted_connection(options["database"])
        with command_errors(f"verifying {connection.alias!r}"):
            engine = unlocked_session(self, options, connection).engine
            models = None
            if options["models"]:
                models = catalog_names(options["models"], engine.snapshot().catalog)
            bar = progress_bar(
                self, options, total=None, desc=f"verifying {connection.alias}", unit="entries"
            )
            with bar:

                def advance(done: int, total: int) -> None:
                    # No refresh() here: before the bar's first second it would draw a
                    # 0 % bar that tqdm then does not clear (it clears only bars it
                    # drew itself), left on the terminal.
                    if total:
                        bar.total = total
                    if done:
                        bar.update(done)

                report = verify(engine, models=models, progress=advance)
        if options["json"]:
            self.stdout.write(json.dumps(report.to_dict(), indent=2, default=str))
        else:
            self._print(report, options["limit"])
        if not report.ok:
            raise CommandError(
                f"{len(report.problems)} problem(s) found in {connection.alias!r}", returncode=1
            )

    def _print(self, report, limit: int) -> None:
        self.stdout.write(
            f"Verified database {report.database!r} at seq {report.seq}: {report.blobs} blobs "
            f"decrypted, {report.trees} trees, {report.records} records, "
            f"{report.index_entries} index entries."
        )
        if report.ok:
            self.stdout.write(self.style.SUCCESS("No problems found."))
            return
        shown = report.problems if limit <= 0 else report.problems[:limit]
        for problem in shown:
            self.stdout.write(self.style.ERROR(f"  {problem}"))
        if len(shown) < len(report.problems):
            self.stdout.write(f"  ... and {len(report.problems) - len(shown)} more (--limit 0)")

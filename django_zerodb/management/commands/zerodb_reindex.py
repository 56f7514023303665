"""``manage.py zerodb_reindex``: drop and rebuild indexes from the records."""

from __future__ import annotations

from django.apps import apps
from django.core.management.base import BaseCommand, CommandError

from django_zerodb.derived import deriver
from django_zerodb.indexes import model_derived
from django_zerodb.management.utils import (
    add_database_argument,
    add_progress_argument,
    catalog_names,
    command_errors,
    encrypted_connection,
    model_labels,
    progress_bar,
    unlocked_session,
)
from django_zerodb.schema import RewriteRecords
from zerodb_core.api import DropIndex, EnsureModel, ModelSpec


class Command(BaseCommand):
    help = (
        "Rebuild the indexes of one or more models of an encrypted database (or of all "
        "with --all): every index the database's catalog lists for them is dropped and "
        "built again from the records, all in ONE transaction (readers see the old indexes "
        "until it commits; a concurrent commit makes it replay on the newer data). Use it "
        "when zerodb_verify reports index problems. The values functional and partial "
        "indexes keep in the records are computed again first, from the installed model. "
        "A unique index whose records hold a duplicate value cannot be rebuilt: the "
        "command fails and nothing changes."
    )

    def add_arguments(self, parser) -> None:
        parser.add_argument(
            "models",
            nargs="*",
            metavar="MODEL",
            help="app_label.ModelName or the table name of each model to reindex",
        )
        parser.add_argument(
            "--all", action="store_true", help="reindex every model of the database"
        )
        add_database_argument(parser)
        add_progress_argument(parser)

    def handle(self, *args, **options) -> None:
        if bool(options["models"]) == bool(options["all"]):
            raise CommandError("name the models to reindex, or pass --all (not both)")
        connection = encrypted_connection(options["database"])
        session = unlocked_session(self, options, connection)
        labels = model_labels()
        models = {m._meta.db_table: m for m in apps.get_models()}
        with command_errors(f"reindexing {connection.alias!r}"), session.writing() as txn:
            catalog = txn.catalog
            names = sorted(catalog.models) if options["all"] else None
            if names is None:
                names = catalog_names(options["models"], catalog)
            specs = [catalog.get(name) for name in names]
            total = sum(len(spec.indexes) for spec in specs)
            rebuilt = []
            with progress_bar(
                self, options, total=total, desc="rebuilding indexes", unit="index"
            ) as bar:
                for spec in specs:
                    records = 0
                    model = models.get(spec.name)
                    if model is not None and model_derived(model):
                        change = deriver(connection, model)
                        txn.apply(RewriteRecords(spec.name, change, "computing index values"))
                    for index in spec.indexes.values():
                        txn.apply(DropIndex(spec.name, index.name))
                        records = txn.apply(EnsureModel(ModelSpec(spec.name, {index.name: index})))
                        bar.update(1)
                    rebuilt.append((spec, records))
        seq = session.engine.stats()["seq"]
        for spec, records in rebuilt:
            label = labels.get(spec.name)
            name = f"{spec.name} ({label})" if label else spec.name
            self.stdout.write(f"{name}: {len(spec.indexes)} indexes rebuilt from {records} records")
        self.stdout.write(
            self.style.SUCCESS(
                f"Rebuilt {total} indexes of {len(rebuilt)} models in one transaction "
                f"(root seq {seq})."
            )
        )

"""``manage.py zerodb_status``: what an encrypted database holds, from its root alone."""

from __future__ import annotations

import datetime
import json
import os
from typing import Any

from django.core.management.base import BaseCommand

from django_zerodb.freshness import describe_tracker
from django_zerodb.management.utils import (
    add_database_argument,
    command_errors,
    connection_params,
    encrypted_connection,
    model_labels,
    unlocked_session,
)
from zerodb_core.api import database_status


class Command(BaseCommand):
    help = (
        "Show an encrypted database: its store (never the passphrase), database name, "
        "root seq, the records of each model and the entries and tree height of each "
        "index (counted from the root record: no record is read), text index statistics, "
        "where rollback detection keeps its floor, and this process's cache and round "
        "trips. Costs one root read."
    )

    def add_arguments(self, parser) -> None:
        add_database_argument(parser)
        parser.add_argument(
            "--json", action="store_true", help="print one JSON object instead of text"
        )

    def handle(self, *args, **options) -> None:
        connection = encrypted_connection(options["database"])
        params = connection_params(connection)
        with command_errors(f"reading {connection.alias!r}"):
            engine = unlocked_session(self, options, connection).engine
            status = database_status(engine)
        labels = model_labels()
        for name, model in status["models"].items():
            model["label"] = labels.get(name)
        status = {
            "alias": connection.alias,
            "store": params["store"],
            "username": params["username"],
            "key_file": _key_file(params),
            "freshness": describe_tracker(engine.freshness),
            **status,
        }
        if options["json"]:
            self.stdout.write(json.dumps(status, indent=2, sort_keys=False, default=str))
            return
        self.stdout.write(_text(status))


def _key_file(params: dict) -> str | None:
    """The key file a blob-server store logs in with (the setting, else the variable)."""
    if not params["store"].startswith("zerodb://"):
        return None
    path = params["key_file"] or os.environ.get("ZERODB_KEY_FILE")
    return None if path is None else str(path)


def _text(s: dict[str, Any]) -> str:
    when = (
        datetime.datetime.fromtimestamp(s["committed_at"], datetime.UTC).isoformat(
            timespec="seconds"
        )
        if s["committed_at"]
        else "never"
    )
    epochs = ", ".join(map(str, s["key_epochs"]))
    lines = [
        f"Encrypted database {s['alias']!r}",
        f"  store:       {s['store']}",
        f"  database:    {s['database']}",
        f"  user:        {s['username']}",
        f"  tenant:      {s['tenant']}",
        f"  key file:    {s['key_file'] or '-'}",
        f"  key epochs:  {epochs} (current {s['current_epoch']})",
        f"  root:        seq {s['seq']}, last commit {when}",
        f"  freshness:   {s['freshness']}",
        "",
    ]
    if not s["models"]:
        lines.append("No models (run `migrate --database ...`).")
    for name, model in s["models"].items():
        label = f" ({model['label']})" if model.get("label") else ""
        lines.append(f"{name}{label}: {model['records']} records, tree height {model['height']}")
        for index_name, index in model["indexes"].items():
            text = ""
            if index["kind"] == "text":
                text = (
                    f", {index['documents']} documents, {index['tokens']} tokens "
                    f"(average {index['average_length']})"
                )
            lines.append(
                f"  {index_name:<28} {index['kind']:<6} {index['entries']:>10} entries, "
                f"height {index['height']}{text}"
            )
    if s["unowned_trees"]:
        lines.append(f"Trees no model owns: {', '.join(s['unowned_trees'])} (run zerodb_verify)")
    e = s["engine"]
    lines += [
        "",
        "This process:",
        f"  round trips: {e['round_trips']} ({e['bytes_sent']} bytes sent, "
        f"{e['bytes_received']} received)",
        f"  cache:       {e['cache_entries']} blobs, {e['cache_bytes']} bytes, "
        f"{e['cache_hits']} hits, {e['cache_misses']} misses",
    ]
    return "\n".join(lines)

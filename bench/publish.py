"""What every benchmark does with its results: a JSON file per run, and a Markdown table
in its own marked section of docs/performance.md (so benchmarks never overwrite each
other's sections)."""

from __future__ import annotations

import json
import os
import platform
import sqlite3
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
DOC = REPO / "docs" / "performance.md"


def publish(
    report: dict[str, Any],
    table: str,
    *,
    name: str,
    day: str,
    out: str,
    heading: str,
    update: bool = True,
    doc: Path = DOC,
) -> Path:
    """Write ``<out>/<name>-<day>.json``, print the table, refresh the doc section
    between ``<!-- bench:<name>:start/end -->`` (appended under ``heading`` if absent)."""
    directory = Path(out)
    directory.mkdir(parents=True, exist_ok=True)
    target = directory / f"{name}-{day}.json"
    target.write_text(json.dumps(report, indent=1) + "\n")
    print()
    print(table)
    print(f"\nwrote {target}")
    if update:
        update_doc(table, name=name, heading=heading, doc=doc)
        print(f"updated {doc.relative_to(REPO) if doc.is_relative_to(REPO) else doc}")
    return target


def update_doc(table: str, *, name: str, heading: str, doc: Path = DOC) -> None:
    """Replace the text between this benchmark's markers, leaving the rest alone."""
    start, end = f"<!-- bench:{name}:start -->", f"<!-- bench:{name}:end -->"
    text = doc.read_text() if doc.exists() else "# Performance\n\n"
    block = f"{start}\n{table}\n{end}"
    if start in text and end in text:
        head, rest = text.split(start, 1)
        text = head + block + rest.split(end, 1)[1]
    else:
        text = text.rstrip("\n") + f"\n\n## {heading}\n\n" + block + "\n"
    doc.write_text(text)


def machine() -> dict[str, Any]:
    """The machine a benchmark ran on, for its report (CPU model, cores, versions)."""
    model = platform.processor() or "unknown CPU"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    cores = os.cpu_count()
    return {
        "cpu": model,
        "cores": cores,
        "python": platform.python_version(),
        "sqlite": sqlite3.sqlite_version,
        "platform": platform.platform(),
        "summary": f"{cores} cores ({model}), Python {platform.python_version()}, "
        f"SQLite {sqlite3.sqlite_version}",
    }

"""The bulk load of ``bench.native_load``, alone, for counting its CPU instructions.

Wall-clock rates swing with whatever else runs on a shared machine; instruction counts do
not. Run under callgrind, counting only inside ``eval`` (the load; not the imports, not
the interpreter's start)::

    valgrind --tool=callgrind --toggle-collect=builtin_eval \\
        --callgrind-out-file=/tmp/load.cg python -m bench.load_instructions
    callgrind_annotate /tmp/load.cg | head -30

A 50-record load runs first, outside ``eval``, so that first-use costs (lazy imports,
caches) are not counted. Options: ``--records 100000 --batch 25000 --seed 1200`` (the
load of ``make bench``). See "Bulk load in instructions" in docs/performance.md.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

from bench.native_load import load


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=100_000)
    parser.add_argument("--batch", type=int, default=25_000, help="records per transaction")
    parser.add_argument("--seed", type=int, default=1200)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="zerodb-load-") as tmp:
        load(f"sqlite:///{Path(tmp) / 'warm.zdb'}", 50, 50, args.seed + 1)
        store = f"sqlite:///{Path(tmp) / 'load.zdb'}"
        scope = {"load": load, "store": store, "args": args}
        report, _ = eval("load(store, args.records, args.batch, args.seed)", scope)
    print(f"{report['records_per_second']:,.0f} records/s", file=sys.stderr)


if __name__ == "__main__":
    main()

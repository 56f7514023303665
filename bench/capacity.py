"""Redis memory per record for the realistic workload, for the capacity page.

Run ``python -m bench.capacity`` (``make bench``). It starts a private redis-server and
``zerodb-server serve`` (as ``bench.write_cost`` does), loads ``--records`` realistic
employees (``zerodb_core.demo``: a 40-word full-text-indexed description, name, surname,
salary; the generator of ``bench.write_cost``) through the native API in transactions of
``--batch``, and reads Redis' ``INFO memory`` twice: right after the load (the garbage
of merged index deltas is still kept for the garbage retention, 10 minutes by default,
as on a live server) and after collecting all of it (retention 0: the steady state of a
table that stopped growing). Per million records is the measured figure times
1,000,000 / ``--records``: an extrapolation, linear because blobs are fixed-size
records and index nodes of bounded size (the B+tree's inner levels grow by a
logarithm, a few percent at most). Results: ``bench/results/capacity-<date>.json`` and
the table between the markers in ``docs/deployment.md``.
"""

from __future__ import annotations

import argparse
import datetime as dt
import random
import tempfile
import time
from pathlib import Path
from typing import Any

import redis
from tqdm import tqdm

from bench.publish import REPO, machine, publish
from bench.write_cost import blob_server
from blob_server.storage.redis import RedisStorage
from zerodb_core import DB
from zerodb_core.demo import Employee, plaintext_bytes, realistic_employee

PASSWORD = "bench capacity passphrase"
MILLION = 1_000_000


def memory(client: redis.Redis) -> dict[str, int]:
    info = client.info("memory")
    return {
        "used_memory": int(info["used_memory"]),
        "used_memory_dataset": int(info["used_memory_dataset"]),
        "keys": int(client.dbsize()),
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=100_000)
    parser.add_argument("--batch", type=int, default=1_000, help="records per transaction")
    parser.add_argument("--seed", type=int, default=14)
    parser.add_argument("--out", default=str(REPO / "bench" / "results"))
    parser.add_argument("--no-doc", action="store_true", help="leave docs/deployment.md")
    args = parser.parse_args(argv)
    rng = random.Random(args.seed)
    report: dict[str, Any] = {
        "args": vars(args) | {"out": None},
        "machine": machine(),
    }
    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(tmp)
        with blob_server(directory) as (address, key, usage, url):
            key_path = directory / "bench.zdbkey"
            key.save(key_path, PASSWORD, kdf="fast")
            client = redis.Redis.from_url(url)
            empty = memory(client)
            plaintext = 0
            started = time.perf_counter()
            with DB(address, password=PASSWORD, key_file=key_path, kdf="fast") as db:
                for _ in tqdm(range(0, args.records, args.batch), desc="load", unit="tx"):
                    rows = [realistic_employee(rng) for _ in range(args.batch)]
                    plaintext += sum(map(plaintext_bytes, rows))
                    with db.transaction():
                        db.add(*(Employee(**row) for row in rows))
                assert len(db[Employee]) == args.records
            report["load_seconds"] = time.perf_counter() - started
            loaded = memory(client)
            storage = RedisStorage(url)
            report["collected_blobs"] = storage.collect_garbage(retention=0)
            storage.close()
            steady = memory(client)
            report["tenant"] = usage()
    scale = MILLION / args.records
    report |= {
        "plaintext_bytes": plaintext,
        "empty": empty,
        "after_load": loaded,
        "after_gc": steady,
        "per_million": {
            name: {k: (v - empty[k]) * scale for k, v in state.items()}
            for name, state in (("after_load", loaded), ("after_gc", steady))
        },
    }
    publish(
        report,
        markdown(report),
        name="capacity",
        day=dt.date.today().isoformat(),
        out=args.out,
        heading="Measured: Redis memory per record",
        update=not args.no_doc,
        doc=REPO / "docs" / "deployment.md",
    )
    return report


def markdown(report: dict[str, Any]) -> str:
    a, per = report["args"], report["per_million"]
    records = a["records"]
    gib = 1 << 30

    def row(label: str, state: str) -> str:
        measured = report[state]["used_memory"] - report["empty"]["used_memory"]
        per_million = per[state]["used_memory"] / gib
        return (
            f"| {label} | {measured / (1 << 20):.0f} MiB | {per_million:.2f} GiB "
            f"| {per[state]['keys'] / MILLION:.2f} M |"
        )

    return "\n".join(
        [
            f"{records:,} realistic records loaded in transactions of {a['batch']:,} through "
            f"`zerodb-server` into one Redis (`python -m bench.capacity`); plaintext "
            f"{report['plaintext_bytes'] / (1 << 20):.0f} MiB (msgpack of the fields). "
            f"Per million records is the measured growth of `used_memory` x "
            f"{MILLION // records}: an **extrapolation**, not a measured million.",
            "",
            f"| state | measured ({records:,} records) | per 1M records (extrapolated) "
            "| keys per 1M |",
            "| --- | ---: | ---: | ---: |",
            row("right after the load (merge garbage kept for the retention)", "after_load"),
            row("after garbage collection (steady state)", "after_gc"),
        ]
    )


if __name__ == "__main__":
    main()

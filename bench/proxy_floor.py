"""The floor under the blob server's fetch: what a proxy that only forwards costs.

The fetch aim of issue 3 is at most twice the raw Redis time for 64 blobs of 16 KiB
(``bench.server_vs_redis`` measures it). This benchmark separates what any proxy pays, a
second trip of the megabyte through the kernel, from what the blob server adds (login
state, argument checks, key names) and what its client adds (``RemoteTransport``: pool,
pushes, answer checks). In one run, the ways in rotating order, against one private
redis-server:

* **raw redis-py**: one ``MGET`` of the 64 keys, as in ``bench.server_vs_redis``;
* **minimal proxy**: a process of this module (``--proxy``) on uvloop that answers each
  one-byte request with the same ``MGET`` through ``RespBlobReader`` and the answer frame
  ``FramePacker.blobs`` builds, read by a bare socket client: the server's data path
  with nothing else;
* **blob server, bare client**: ``zerodb-server serve --redis`` sent a prepacked
  get_blobs request on a logged-in socket, the answer only decoded;
* **blob server**: the same server through ``RemoteTransport.get_blobs``.

Run ``python -m bench.proxy_floor`` (``make bench`` runs it). Results:
``bench/results/floor-<date>.json`` and the table between the markers in
``docs/performance.md``.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import msgpack
import redis
import uvloop
from coincurve import PrivateKey
from redis.connection import parse_url
from tqdm import tqdm

from bench.publish import machine, publish
from bench.server_vs_redis import (
    REPO,
    TENANT,
    cli,
    start_redis,
    start_server,
    stop,
)
from blob_server.cli import keep_freed_memory
from blob_server.storage.resp import RespBlobReader
from blob_server.wire.protocol import (
    BlobsResult,
    FramePacker,
    FrameReceiver,
    request_frame,
    write_frame,
)
from zerodb_core.transport.remote import RemoteTransport

BLOBS = 64
BLOB_BYTES = 16 * 1024
KEYS = [b"floor:%d" % i for i in range(BLOBS)]


def proxy(redis_url: str) -> None:
    """The minimal proxy: print its port, then answer every byte it reads with the 64
    values, framed as the blob server frames a get_blobs answer."""

    keep_freed_memory()  # as the blob server does

    async def main() -> None:
        reader = RespBlobReader(
            parse_url(redis_url),
            url=redis_url,
            socket_timeout=30.0,
            connect_timeout=5.0,
            max_connections=None,
        )
        packer = FramePacker()

        async def answer(stream: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            while await stream.read(1):
                values = await reader.mget(KEYS)
                frame = packer.blobs(1, BlobsResult(dict(zip(KEYS, values, strict=True)), []))
                write_frame(writer, frame)
                del frame, values  # the views' buffer is reused once they are gone
                await writer.drain()

        server = await asyncio.start_server(answer, "127.0.0.1", 0)
        print(server.sockets[0].getsockname()[1], flush=True)
        await server.serve_forever()

    uvloop.run(main())


class ProxyClient:
    """A bare socket client of the minimal proxy."""

    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port))
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.receiver = FrameReceiver()

    def fetch(self) -> dict[bytes, bytes]:
        self.sock.sendall(b"\x01")
        return msgpack.unpackb(self.receiver.recv(self.sock))[2]["blobs"]


class BareServerClient:
    """The blob server driven by a bare socket client: a ``RemoteTransport`` logs in, then
    its socket sends one prepacked get_blobs request per fetch and the answer is only
    decoded, as ``ProxyClient`` does. Set against the server row, it shows what
    ``RemoteTransport`` adds; against the proxy row, what the server adds."""

    def __init__(self, login_key: bytes, port: int, ids: list[bytes]) -> None:
        self.transport = RemoteTransport("127.0.0.1", port, tenant=TENANT, login_key=login_key)
        self.transport.ping()  # connects and logs in
        self.sock = self.transport._primary.sock  # a benchmark's probe of the logged-in socket
        self.request = request_frame(1, "get_blobs", {"database": "floor", "ids": ids})
        self.receiver = FrameReceiver()

    def fetch(self) -> dict[bytes, bytes]:
        self.sock.sendall(self.request)
        return msgpack.unpackb(self.receiver.recv(self.sock))[2]["blobs"]

    def close(self) -> None:
        self.transport.close()


def measure(args: argparse.Namespace) -> dict:
    keep_freed_memory()
    with tempfile.TemporaryDirectory(prefix="zerodb-bench-floor-") as tmp:
        tmp_path = Path(tmp)
        redis_proc, redis_port = start_redis(tmp_path)
        processes = [redis_proc]
        try:
            url = f"redis://127.0.0.1:{redis_port}/0"
            tenants = tmp_path / "tenants.json"
            login_key = PrivateKey()
            cli("add-tenant", TENANT, "--tenants", str(tenants))
            cli("add-key", TENANT, login_key.public_key.format().hex(), "--tenants", str(tenants))
            server, port = start_server(url, tenants, tmp_path / "server.log")
            processes.append(server)
            minimal = subprocess.Popen(
                [sys.executable, "-m", "bench.proxy_floor", "--proxy", url],
                cwd=REPO,
                stdout=subprocess.PIPE,
                text=True,
            )
            processes.append(minimal)
            proxy_client = ProxyClient(int(minimal.stdout.readline()))

            blobs = {os.urandom(16): os.urandom(BLOB_BYTES) for _ in range(BLOBS)}
            raw = redis.Redis.from_url(url)
            raw.mset(dict(zip(KEYS, blobs.values(), strict=True)))
            remote = RemoteTransport("127.0.0.1", port, tenant=TENANT, login_key=login_key.secret)
            assert remote.commit("floor", expected_seq=0, root=b"r", blobs=blobs).ok
            ids = list(blobs)
            bare = BareServerClient(login_key.secret, port, ids)
            ways = {  # the two ways through the server are apart in the rotation
                "raw": lambda: raw.mget(KEYS),
                "bare": bare.fetch,
                "proxy": proxy_client.fetch,
                "server": lambda: remote.get_blobs("floor", ids),
            }
            assert raw.mget(KEYS) == list(blobs.values())
            assert list(proxy_client.fetch().values()) == list(blobs.values())
            assert bare.fetch() == blobs
            assert remote.get_blobs("floor", ids) == blobs
            for fn in [*ways.values()] * 30:  # warm up
                fn()
            samples: dict[str, list[float]] = {name: [] for name in ways}
            order = list(ways.items())
            for i in tqdm(range(args.runs), desc="fetch 64 x 16 KiB", unit="run"):
                turn = i % len(order)  # rotating: no fixed neighbours
                for name, fn in order[turn:] + order[:turn]:
                    started = time.perf_counter()
                    fn()
                    samples[name].append((time.perf_counter() - started) * 1000)
            remote.close()
            bare.close()
            raw.close()
        finally:
            for process in reversed(processes):
                stop(process)
    base = statistics.median(samples["raw"])
    return {
        name: {
            "median_ms": statistics.median(values),
            "ratio": statistics.median(values) / base,
            "samples_ms": [round(v, 4) for v in values],
        }
        for name, values in samples.items()
    }


LABELS = {
    "raw": "raw redis-py",
    "proxy": "minimal proxy (`--proxy`: the server's data path only), bare client",
    "bare": "blob server, bare client (prepacked request, answer only decoded)",
    "server": "blob server, `RemoteTransport`",
}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=1000, help="fetches of each way")
    parser.add_argument("--out", default="bench/results", help="directory for the JSON")
    parser.add_argument("--no-doc", action="store_true", help="leave docs/performance.md")
    parser.add_argument("--proxy", metavar="REDIS_URL", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.proxy:
        proxy(args.proxy)
        return
    started = time.perf_counter()
    fetch = measure(args)
    now = dt.datetime.now().astimezone()
    report = {
        "date": now.isoformat(timespec="seconds"),
        "command": ("python -m bench.proxy_floor " + " ".join(argv or sys.argv[1:])).strip(),
        "machine": machine(),
        "runs": args.runs,
        "fetch": fetch,
        "total_seconds": time.perf_counter() - started,
    }
    lines = [
        f"Run of {report['date']} on {report['machine']['summary']}: `{report['command']}` "
        f"(median of {args.runs} interleaved fetches of {BLOBS} blobs of "
        f"{BLOB_BYTES // 1024} KiB; client, proxies and Redis share the machine).",
        "",
        "| way | median ms | ratio to raw |",
        "| --- | ---: | ---: |",
    ]
    for name, label in LABELS.items():
        lines.append(
            f"| {label} | {fetch[name]['median_ms']:.3f} | **{fetch[name]['ratio']:.2f}** |"
        )
    publish(
        report,
        "\n".join(lines),
        name="floor",
        day=f"{now:%Y-%m-%d}",
        out=args.out,
        heading="The floor under the fetch",
        update=not args.no_doc,
    )


if __name__ == "__main__":
    main()

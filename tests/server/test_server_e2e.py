"""End to end: the blob server as a real subprocess, set up with its CLI, used by ``DB``.

Tenants and keys are created with ``zerodb-server add-tenant/add-key`` and
``python -m zerodb_core.keyfile create``; the server runs ``serve`` on an SQLite store,
is restarted in the middle, and must give the same answers afterwards.
"""

from __future__ import annotations

import os
import random
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from blob_server.cli import main as cli_main
from blob_server.wire import protocol
from tests.core.hr import Employee
from tests.server.wire import Wire
from zerodb_core import DB, AuthenticationError, WrongPassphraseError
from zerodb_core.crypto import slot_name
from zerodb_core.keyfile import KeyFile
from zerodb_core.query import Contains, Gt, InRange

ROOT = Path(__file__).resolve().parents[2]
PASSWORD = "correct horse battery staple"
LISTENING = re.compile(rb"event=listening bind=127\.0\.0\.1:(\d+)")
N_EMPLOYEES = 1000


def run(*args: str, env: dict | None = None) -> str:
    done = subprocess.run(
        [sys.executable, *args],
        cwd=ROOT,
        env={**os.environ, **(env or {})},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


class ServerProcess:
    """``python -m blob_server.cli serve`` on a loopback port; its log goes to a file."""

    def __init__(self, storage: str, tenants: Path, log: Path, port: int = 0) -> None:
        self.args = ["-m", "blob_server.cli", "serve", "--storage", storage]
        self.args += ["--tenants", str(tenants), "--gc-interval", "0"]
        self.log = log
        self.port = port
        self.process: subprocess.Popen | None = None

    def start(self) -> None:
        offset = self.log.stat().st_size if self.log.exists() else 0
        with open(self.log, "ab") as log:
            self.process = subprocess.Popen(
                [sys.executable, *self.args, "--bind", f"127.0.0.1:{self.port}"],
                cwd=ROOT,
                stdout=subprocess.DEVNULL,
                stderr=log,
            )
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            found = LISTENING.search(self.log.read_bytes()[offset:])
            if found:
                self.port = int(found.group(1))
                return
            if self.process.poll() is not None:
                break
            time.sleep(0.05)
        self.stop()
        pytest.fail(f"the server did not start:\n{self.log.read_text(errors='replace')}")

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


class RedisServerProcess(ServerProcess):
    """``python -m blob_server.cli serve --redis URL`` (the production flag), on the
    tests' throwaway Redis, which keeps no append-only file: so also
    ``--allow-volatile-redis``."""

    def __init__(self, url: str, tenants: Path, log: Path) -> None:
        super().__init__(url, tenants, log)
        self.args[self.args.index("--storage")] = "--redis"
        self.args.append("--allow-volatile-redis")


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    """Two tenants with one key file each, registered through the CLI; a running server."""
    tmp = tmp_path_factory.mktemp("e2e")
    store = f"sqlite:///{tmp}/blobs.zdb"
    tenants = tmp / "tenants.json"
    keys = {}
    for tenant in ("acme", "beta"):
        run("-m", "blob_server.cli", "add-tenant", tenant, "--tenants", str(tenants))
        path = tmp / f"{tenant}.zdbkey"
        public = run(
            "-m",
            "zerodb_core.keyfile",
            "create",
            "--tenant",
            tenant,
            "--out",
            str(path),
            "--kdf",
            "fast",
            env={"ZERODB_PASSPHRASE": PASSWORD},
        ).strip()
        assert re.fullmatch(r"0[23][0-9a-f]{64}", public)
        run("-m", "blob_server.cli", "add-key", tenant, public, "--tenants", str(tenants))
        keys[tenant] = path
    listing = run("-m", "blob_server.cli", "list-tenants", "--tenants", str(tenants))
    assert "acme" in listing and "beta" in listing
    server = ServerProcess(store, tenants, tmp / "server.log")
    server.start()
    yield server, keys
    server.stop()
    log = server.log.read_text(errors="replace")
    assert "Traceback" not in log, log


def open_db(server: ServerProcess, key: Path, **kwargs) -> DB:
    return DB(
        ("127.0.0.1", server.port),
        username="root",
        password=PASSWORD,
        key_file=key,
        kdf="fast",
        **kwargs,
    )


def answers(db: DB) -> dict:
    staff = db[Employee]
    return {
        "count": len(staff.all()),
        "range": sorted(e.pk for e in staff.query(InRange("salary", 100_000, 120_000))),
        "name": sorted(e.pk for e in staff.query(name="Ann")),
        "top": [e.pk for e in staff.query(Gt("salary", 0), sort_index="salary", limit=5)],
        "text": sorted(e.pk for e in staff.query(Contains("description", "kernel"))),
    }


def test_store_query_restart_query(setup):
    server, keys = setup
    rng = random.Random(3)
    names = ["Ann", "Bob", "Cleo", "Dan", "Eve"]
    words = ["kernel", "payroll", "audit", "printer", "network"]
    with open_db(server, keys["acme"]) as db:
        with db.transaction():
            db.add(
                *[
                    Employee(
                        name=rng.choice(names),
                        surname=f"S{i}",
                        salary=rng.randrange(30_000, 200_000),
                        description=" ".join(rng.sample(words, 2)),
                    )
                    for i in range(N_EMPLOYEES)
                ]
            )
        before = answers(db)
        assert before["count"] == N_EMPLOYEES
        assert before["range"] and before["name"] and before["text"]
        assert db.stats()["round_trips"] > 0

        server.stop()
        server.start()  # same port, same SQLite file

        assert answers(db) == before  # the same DB reconnects and logs in again
        assert db.transport.reconnects >= 1
    with open_db(server, keys["acme"]) as fresh:  # a cold cache reads everything again
        assert answers(fresh) == before


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
def test_either_event_loop_serves(setup, tmp_path, loop):
    server, keys = setup
    tenants = Path(server.args[server.args.index("--tenants") + 1])
    other = ServerProcess("memory://", tenants, tmp_path / "loop.log")
    other.args += ["--loop", loop]
    other.start()
    try:
        # A database of its own: the key file's freshness record knows the others' seqs.
        with open_db(other, keys["acme"], database=f"loop-{loop}") as db:
            with db.transaction():
                db.add(*[Employee(name="Ann", surname=f"L{i}", salary=i) for i in range(300)])
            assert len(db[Employee].query(InRange("salary", 100, 199))) == 100
    finally:
        other.stop()
    log = other.log.read_text(errors="replace")
    assert f"event=loop name={loop}" in log and "Traceback" not in log


def test_second_tenant_sees_only_its_own_data(setup):
    server, keys = setup
    with open_db(server, keys["acme"]) as acme:
        acme.add(Employee(name="Zed", surname="Acme", salary=1, description="acme only"))
    fetched: list[bytes] = []
    with open_db(server, keys["acme"]) as acme:  # a cold cache: the query fetches blobs
        original = acme.transport._get_blobs

        def spy(database, ids):
            fetched.extend(ids)
            return original(database, ids)

        acme.transport._get_blobs = spy
        assert len(acme[Employee].query(name="Zed")) == 1
        acme_root = acme.transport.get_root("main")
    assert fetched
    assert acme_root.seq >= 1
    with open_db(server, keys["beta"]) as beta:
        # Same username and passphrase, same database name: a different, empty database.
        assert len(beta[Employee].query(name="Zed")) == 0
        assert beta.transport.tenant == "beta"
        transport = beta.transport
        assert transport.get_blobs("main", fetched[:50]) == {}
        assert transport.get_keyring("main", slot_name("acme", "main", "root")) is None
        assert transport.get_root("main").data != acme_root.data


def test_wrong_passphrase_and_unregistered_key(setup, tmp_path):
    server, keys = setup
    with pytest.raises(WrongPassphraseError):
        DB(("127.0.0.1", server.port), password="wrong", key_file=keys["acme"], kdf="fast")
    stranger = KeyFile.create("acme")  # a valid key nobody registered
    with pytest.raises(AuthenticationError):
        DB(("127.0.0.1", server.port), password=PASSWORD, key_file=stranger, kdf="fast")


def test_garbage_frames_do_not_disturb_other_connections(setup):
    server, _ = setup
    rng = random.Random(7)
    bystander = Wire(server.port)
    try:
        for _ in range(20):
            sock = socket.create_connection(("127.0.0.1", server.port), timeout=5)
            sock.sendall(bytes(rng.randrange(256) for _ in range(rng.randrange(1, 200))))
            sock.close()
        attacker = Wire(server.port)
        attacker.send_raw(protocol.LENGTH.pack(3) + b"\xff\xff\xff")
        assert attacker.recv().result[0] == protocol.BAD_FRAME
        attacker.send_raw(b"\xff\xff\xff\xff")  # 4 GiB announced
        assert attacker.recv().result[0] == protocol.TOO_LARGE
        assert attacker.closed_by_server()
        attacker.close()
        assert bystander.call("ping").ok
    finally:
        bystander.close()
    assert cli_main(["check", "--bind", f"127.0.0.1:{server.port}"]) == 0


@pytest.mark.parametrize(
    "command",
    [
        "serve",
        "add-tenant",
        "set-limits",
        "add-key",
        "remove-key",
        "list-tenants",
        "stats",
        "check",
    ],
)
def test_every_command_has_help(command, capsys):
    with pytest.raises(SystemExit) as done:
        cli_main([command, "--help"])
    assert done.value.code == 0
    assert "usage: zerodb-server " + command in capsys.readouterr().out

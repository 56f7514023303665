"""A Redis Cluster that wants a login: an ACL user with a password (``user default off``),
and the same over TLS only (``tls-port``, ``tls-cluster yes``, client certificates).

Real parts: 3-master clusters built by ``tests.server.cluster`` (one of each kind for the
module), ``zerodb-server serve --redis-cluster redis://zerodb@... --redis-password-file``
processes, and real clients. What each test shows:

* commits through one process reach the clients of the others (the subscribers of
  ``cluster_changes`` log in too), and commit leases are one FIFO across processes (the
  asyncio client logs in too: ``test_scale_out``'s test, run on these fleets); on the
  TLS cluster each master has a replica, which follows it as the same ACL user
  (``masteruser``) over TLS (``tls-replication yes``), and commits wait for it
  (``WAIT``), so a replica that could not log in would fail every commit;
* a wrong password, a missing one, an unknown CA: ``serve`` exits with one ``error:``
  line and no traceback, and never prints the password;
* a user without the ``zdb:*`` channels, on every node or on one node only (ACLs are per
  node): refused at first use, naming ``ACL SETUSER <user> &zdb:*``, before a commit
  could be applied and yet answered as failed;
* the URL forms, and that the password stays out of ``url`` and ``repr``;
* ``--redis-password-file`` (also with ``--redis``), and its bad files.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote

import pytest
import redis
from redis.crc import key_slot

from blob_server.cli import _open_storage, build_parser, read_password_file
from blob_server.cli import main as cli_main
from blob_server.exceptions import StorageError, StorageUnavailableError
from blob_server.storage.cluster import ClusterStorage
from blob_server.storage.cluster_address import parse_cluster_address
from blob_server.storage.redis import PUBLISH_PROBE, RedisStorage, url_with_password
from tests.core.hr import Employee
from tests.server import test_scale_out as scale_out
from tests.server.cluster import LocalCluster, NodeLogin, start_cluster
from tests.server.conftest import PrivateRedis
from tests.server.test_push import eq_query, open_db, register, seed, wait_for_seq
from tests.server.test_server_e2e import ROOT, ServerProcess

USER, PASSWORD = "zerodb", "s3cret:/@%pw"  # characters a URL has to escape
GRANTED = f"user default off\nuser {USER} on >{PASSWORD} ~zdb:* &zdb:* +@all\n"


def openssl(*args: object) -> None:
    subprocess.run(["openssl", *map(str, args)], check=True, capture_output=True)


def make_certificates(directory: Path) -> dict[str, str]:
    """A throwaway CA and one certificate it signed for 127.0.0.1, good for a server
    and a client (the nodes present it to each other and to the clients)."""
    directory.mkdir(parents=True, exist_ok=True)
    ca, ca_key = directory / "ca.pem", directory / "ca.key"
    cert, key, csr = directory / "node.pem", directory / "node.key", directory / "node.csr"
    ext = directory / "node.ext"
    ext.write_text(
        "subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth,clientAuth\n"
        "basicConstraints=CA:FALSE\n"
    )
    ec = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes")
    openssl("req", "-x509", *ec, "-keyout", ca_key, "-out", ca, "-days", 2, "-subj", "/CN=CA")
    openssl("req", *ec, "-keyout", key, "-out", csr, "-subj", "/CN=127.0.0.1")
    signing = ("-CA", ca, "-CAkey", ca_key, "-CAcreateserial", "-extfile", ext)
    openssl("x509", "-req", "-in", csr, *signing, "-out", cert, "-days", 2)
    return {"tls-cert-file": str(cert), "tls-key-file": str(key), "tls-ca-cert-file": str(ca)}


def cluster_url(cluster: LocalCluster, login: NodeLogin, *, password: str | None = None) -> str:
    """``--redis-cluster`` in URL form for ``cluster``, with ``password`` in it if given."""
    secret = "" if password is None else ":" + quote(password, safe="")
    if login.tls is None:
        return f"redis://{USER}{secret}@{cluster.spec}"
    tls = login.tls
    return (
        f"rediss://{USER}{secret}@{cluster.spec}?ssl_ca_certs={tls['tls-ca-cert-file']}"
        f"&ssl_certfile={tls['tls-cert-file']}&ssl_keyfile={tls['tls-key-file']}"
    )


class LoginClusterServer(ServerProcess):
    """``serve --redis-cluster URL --redis-password-file PATH`` (the tests' nodes keep
    no AOF: ``--allow-volatile-redis``)."""

    def __init__(self, url: str, password_file: Path, tenants: Path, log: Path) -> None:
        super().__init__(url, tenants, log)
        self.args[self.args.index("--storage")] = "--redis-cluster"
        self.args += ["--redis-password-file", str(password_file), "--allow-volatile-redis"]


@pytest.fixture(scope="module", params=["acl", "tls"])
def login_cluster(request, tmp_path_factory) -> Iterator[tuple[LocalCluster, NodeLogin, Path]]:
    """A 3-master cluster whose nodes want user ``zerodb`` (``default off``); for ``tls``
    over TLS only and with a replica per master; and a file holding the password."""
    tmp = tmp_path_factory.mktemp(f"cluster-{request.param}")
    tls = make_certificates(tmp / "tls") if request.param == "tls" else None
    login = NodeLogin(USER, PASSWORD, tls)
    acl = tmp / "users.acl"
    acl.write_text(GRANTED)
    cluster = start_cluster(
        tmp / "nodes",
        replicas=1 if tls else 0,  # replicas cost 7 s more: the TLS cluster has them
        login=login,
        aclfile=str(acl),
        repl_diskless_sync_delay="0",  # replicas attach at once, not 5 s later
    )
    secret = tmp / "redis-password"
    secret.write_text(PASSWORD + "\n")
    yield cluster, login, secret
    cluster.stop()


@pytest.fixture(scope="module")
def login_fleet(login_cluster, tmp_path_factory) -> Iterator[tuple[list[ServerProcess], dict]]:
    """Three server processes on the login cluster, and key files for two tenants."""
    cluster, login, secret = login_cluster
    cluster.flush()
    tmp = tmp_path_factory.mktemp("login-fleet")
    tenants, keys = register(tmp)
    public = scale_out.WIRE_KEY.public_key.format().hex()
    assert cli_main(["add-key", "acme", public, "--tenants", str(tenants)]) == 0
    url = cluster_url(cluster, login)
    servers = [LoginClusterServer(url, secret, tenants, tmp / f"s{i}.log") for i in range(3)]
    try:
        for server in servers:
            server.start()
        yield servers, keys
    finally:
        for server in servers:
            server.stop()
    for server in servers:
        log = server.log.read_text(errors="replace")
        assert "Traceback" not in log and "event=op_failed" not in log, log[-3000:]
        assert PASSWORD not in log


def test_commits_through_one_process_are_pushed_to_the_others(login_fleet):
    """Writes and reads through every process, and pushes through the sharded
    subscribers, which log in as the cluster client does: a reader subscribed through
    another process learns each commit by a push (a subscriber that could not log in
    would leave ``known_root_seq`` behind, and the reader on reads of the root)."""
    (a, b, c), keys = login_fleet
    with (
        open_db(a, keys["acme"], "fleet") as writer,
        open_db(b, keys["acme"], "fleet") as reader_b,
        open_db(c, keys["acme"], "fleet") as reader_c,
    ):
        readers = [reader_b, reader_c]
        for reader in readers:
            assert eq_query(reader) == []  # subscribes
        seed(writer)
        expected = eq_query(writer)
        assert expected  # the seed has employees the query finds
        for i in range(3):
            committed = writer.stats()["seq"]
            for reader in readers:
                wait_for_seq(reader, committed)  # pushed by another process
                assert eq_query(reader) == expected
            new = Employee(name="Ann", surname=f"L{i}", salary=1, description="pushed")
            writer.add(new)
            expected = sorted([*expected, new.pk])
        for reader in readers:
            assert reader.transport.pushes >= 3


def test_commit_leases_are_one_fifo_across_processes(login_fleet):
    """The lease scripts run on the asyncio cluster client, which logs in as well."""
    scale_out.test_commit_leases_are_one_fifo_across_processes(login_fleet)


def serve_error(tmp_path: Path, *options: str | Path) -> str:
    """Run ``serve`` with ``options``, which must fail at startup; return its stderr."""
    args = ["--bind", "127.0.0.1:0", "--allow-volatile-redis", *map(str, options)]
    tenants = tmp_path / "tenants.json"
    if not tenants.exists():
        assert cli_main(["add-tenant", "acme", "--tenants", str(tenants)]) == 0
    done = subprocess.run(
        [sys.executable, "-m", "blob_server.cli", "serve", "--tenants", str(tenants), *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
    )
    assert done.returncode != 0, done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    assert done.stderr.strip().splitlines()[-1].startswith("error: "), done.stderr
    return done.stderr


def test_a_wrong_password_is_a_clear_startup_error(login_cluster, tmp_path):
    cluster, login, _ = login_cluster
    wrong = tmp_path / "wrong"
    wrong.write_text("not the password\n")
    err = serve_error(tmp_path, "--redis-cluster", cluster_url(cluster, login))
    assert "error: Redis at redis" in err and "://zerodb@127.0.0.1:" in err, err  # no password
    assert "invalid username-password pair" in err, err
    err = serve_error(
        tmp_path, "--redis-cluster", cluster_url(cluster, login), "--redis-password-file", wrong
    )
    assert "invalid username-password pair" in err and "not the password" not in err, err
    err = serve_error(
        tmp_path, "--redis-cluster", cluster_url(cluster, login, password="not the password")
    )
    assert "invalid username-password pair" in err and "not the password" not in err, err


def test_stats_logs_in_as_serve_does(login_fleet, login_cluster, capsys):
    """``stats`` takes the same options; it finds the fleet's tenant's databases."""
    cluster, login, secret = login_cluster
    (a, _, _), keys = login_fleet
    with open_db(a, keys["acme"], "counted") as db:
        seed(db, n=3)
    tenants = a.args[a.args.index("--tenants") + 1]
    args = ["stats", "--redis-cluster", cluster_url(cluster, login), "--tenants", tenants]
    capsys.readouterr()
    assert cli_main([*args, "--redis-password-file", str(secret), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    acme = next(entry for entry in report["tenants"] if entry["tenant"] == "acme")
    assert acme["databases"] and acme["blobs"] > 0
    assert cli_main(args) == 1  # no password
    assert "invalid username-password pair" in capsys.readouterr().err


def test_the_password_in_the_url_and_in_a_file_is_refused(login_cluster, tmp_path):
    cluster, login, secret = login_cluster
    url = cluster_url(cluster, login, password=PASSWORD)
    err = serve_error(tmp_path, "--redis-cluster", url, "--redis-password-file", str(secret))
    assert "give it once" in err and PASSWORD not in err


@pytest.mark.parametrize("login_cluster", ["tls"], indirect=True)
def test_tls_needs_the_nodes_ca(login_cluster, tmp_path):
    """Without ``ssl_ca_certs`` the system's CAs are trusted, which did not sign the
    nodes' certificates: refused, not connected without verification."""
    cluster, login, secret = login_cluster
    url = f"rediss://{USER}@{cluster.spec}?ssl_certfile={login.tls['tls-cert-file']}"
    url += f"&ssl_keyfile={login.tls['tls-key-file']}"
    err = serve_error(tmp_path, "--redis-cluster", url, "--redis-password-file", str(secret))
    assert "certificate verify failed" in err, err


def slot_owner(cluster: LocalCluster, slot: int) -> int:
    """The port of the master that owns ``slot``."""
    for first, last, owner, *_ in cluster.nodes[0].client().execute_command("CLUSTER", "SLOTS"):
        if first <= slot <= last:
            return owner[1]
    raise AssertionError(f"no owner of slot {slot}")


def set_channels(node, rule: str) -> None:
    node.client().execute_command("ACL", "SETUSER", USER, rule)


@pytest.mark.parametrize("where", ["every node", "one node"])
def test_a_user_that_may_not_publish_root_changes_is_refused(login_cluster, where, tmp_path):
    """Without ``&zdb:*`` each commit's swap script would fail at its SPUBLISH, after
    its writes (a script's writes are not undone): applied, yet answered as failed.
    So the first use refuses such a user, naming the grant (``serve``: at startup,
    rather than answer every request "storage unavailable"). ACLs are per node: a
    single node without the grant is found too, even one that does not own the probe
    channel's slot (Redis checks the ACL before it answers MOVED)."""
    cluster, login, _ = login_cluster
    url = cluster_url(cluster, login, password=PASSWORD)
    database = "refused-" + where.replace(" ", "-")  # not emptied after: the fleet uses it
    owner = slot_owner(cluster, key_slot(PUBLISH_PROBE))
    revoked = (
        cluster.masters()
        if where == "every node"
        else [next(n for n in cluster.masters() if n.port != owner)]
    )
    for node in revoked:
        set_channels(node, "resetchannels")
    try:
        store = ClusterStorage(url)
        with pytest.raises(StorageUnavailableError) as refused:
            store.commit("acme", database, expected_seq=0, root=b"r", blobs={b"\1" * 16: b"x"})
        message = str(refused.value)
        assert "ACL SETUSER <user> &zdb:*" in message and PASSWORD not in message
        named = [f"Redis Cluster node 127.0.0.1:{node.port} of" for node in revoked]
        assert any(name in message for name in named), message
        store.close()
        err = serve_error(tmp_path, "--redis-cluster", url)  # serve: at startup
        assert any(f"error: {name}" in err for name in named), err
        assert "ACL SETUSER <user> &zdb:*" in err and PASSWORD not in err, err
    finally:
        for node in revoked:
            set_channels(node, "&zdb:*")
    store = ClusterStorage(url)
    try:
        assert store.get_root("acme", database).seq == 0  # nothing was applied
        assert store.commit("acme", database, expected_seq=0, root=b"r", blobs={}).ok
    finally:
        store.close()


# -- the address forms, without a cluster ---------------------------------------------------


def test_the_url_form_takes_user_password_and_tls_options():
    found = parse_cluster_address(
        "rediss://zerodb:p%40ss@10.0.0.1:7000,[::1]:7001?ssl_ca_certs=/ca.pem"
        "&ssl_certfile=/c.pem&ssl_keyfile=/k.pem&ssl_check_hostname=false"
    )
    assert [(n.host, n.port) for n in found.nodes] == [("10.0.0.1", 7000), ("::1", 7001)]
    assert found.connection_options() == {
        "username": "zerodb",
        "password": "p@ss",
        "ssl": True,
        "ssl_ca_certs": "/ca.pem",
        "ssl_certfile": "/c.pem",
        "ssl_keyfile": "/k.pem",
        "ssl_check_hostname": False,
    }
    assert found.url == "rediss://zerodb@10.0.0.1:7000,[::1]:7001"
    assert "p@ss" not in repr(found) and "p@ss" not in repr(ClusterStorage(found.url))
    bare = parse_cluster_address("127.0.0.1:7000,127.0.0.1:7001", password="from a file")
    assert bare.url == "redis-cluster://127.0.0.1:7000,127.0.0.1:7001"
    assert bare.connection_options() == {"username": None, "password": "from a file"}
    assert parse_cluster_address("redis://h:1/0").connection_options()["password"] is None


@pytest.mark.parametrize(
    ("spec", "said"),
    [
        ("http://h:1", "scheme"),
        ("redis://h:1/2", "only database 0"),
        ("redis://h:1?ssl_ca_certs=/ca.pem", "need TLS"),
        ("rediss://h:1?ssl_ca_cert=/ca.pem", "unknown Redis Cluster URL option"),
        ("rediss://h:1?ssl_certfile=/c.pem", "go together"),
        ("rediss://h:1?ssl_check_hostname=maybe", "bad value"),
        ("redis://u:pw@h", "HOST:PORT"),
    ],
)
def test_a_bad_cluster_url_is_refused(spec, said):
    with pytest.raises(StorageUnavailableError, match=said):
        parse_cluster_address(spec)


@pytest.mark.parametrize(
    "spec",
    [
        "redis://admin:s3cr?t-tail@127.0.0.1",  # no port: the node is refused
        "redis://:hunter2",  # the host forgotten
        "admin:hunter2@127.0.0.1:7000",  # the scheme forgotten
        "redis://admin:hunter2@127.0.0.1:7000,hunter2:x",
    ],
)
def test_a_bad_address_never_repeats_the_password(spec):
    with pytest.raises(StorageUnavailableError) as refused:
        parse_cluster_address(spec)
    assert "hunter2" not in str(refused.value) and "s3cr" not in str(refused.value)


def test_a_password_may_hold_question_marks_and_slashes():
    found = parse_cluster_address("redis://admin:s3cr?t/x#y@127.0.0.1:7000")
    assert found.connection_options()["password"] == "s3cr?t/x#y"
    assert [(n.host, n.port) for n in found.nodes] == [("127.0.0.1", 7000)]
    assert found.url == "redis://admin@127.0.0.1:7000"


class PasswordRedis(PrivateRedis):
    """A redis-server with ``requirepass``: the helpers log in."""

    def client(self) -> redis.Redis:
        return redis.Redis(port=self.port, password=PASSWORD, socket_connect_timeout=0.5)


def test_a_password_file_serves_a_single_redis_too(tmp_path):
    """``--redis-password-file`` with ``--redis`` (``stats`` opens the storage as
    ``serve`` does): the right password reads, a wrong one is refused; and ``serve``
    refuses a user without the ``zdb:*`` channels when it starts, as on a cluster."""
    node = PasswordRedis(tmp_path / "redis", requirepass=PASSWORD)
    node.start()
    tenants = tmp_path / "tenants.json"
    assert cli_main(["add-tenant", "acme", "--tenants", str(tenants)]) == 0
    secret, wrong = tmp_path / "pw", tmp_path / "wrong"
    secret.write_text(PASSWORD + "\n")
    wrong.write_text("nope\n")
    base = ["stats", "--redis", node.url, "--tenants", str(tenants), "--json"]
    try:
        assert cli_main([*base, "--redis-password-file", str(secret)]) == 0
        assert cli_main([*base, "--redis-password-file", str(wrong)]) == 1
        with pytest.raises(StorageUnavailableError, match="give it once"):
            url_with_password(f"redis://:x@127.0.0.1:{node.port}/0", PASSWORD)
        url = url_with_password(f"redis://127.0.0.1:{node.port}/0", PASSWORD)
        store = RedisStorage(url)
        assert PASSWORD not in store.url and store.get_root("acme", "db").seq == 0
        store.close()
        node.client().execute_command("ACL", "SETUSER", "default", "resetchannels")
        err = serve_error(tmp_path, "--redis", node.url, "--redis-password-file", secret)
        assert f"error: Redis at redis://:***@127.0.0.1:{node.port}/0 does not let" in err, err
        assert "ACL SETUSER <user> &zdb:*" in err and PASSWORD not in err, err
    finally:
        node.kill()


@pytest.mark.parametrize(
    ("content", "said"),
    [
        (None, "cannot read the Redis password file"),
        ("", "one non-empty line"),
        ("two\nlines\n", "one non-empty line"),
    ],
)
def test_a_bad_password_file_is_refused(tmp_path, content, said):
    path = tmp_path / "pw"
    if content is not None:
        path.write_text(content)
    args = build_parser().parse_args(
        ["serve", "--redis-cluster", "127.0.0.1:7000", "--redis-password-file", str(path)]
    )
    with pytest.raises(StorageError, match=said):
        _open_storage(args)


def test_a_password_file_needs_a_redis(tmp_path):
    path = tmp_path / "pw"
    path.write_text("secret\n")
    args = build_parser().parse_args(["serve", "--redis-password-file", str(path)])
    with pytest.raises(StorageError, match="needs --redis or --redis-cluster"):
        _open_storage(args)
    assert read_password_file(str(path)) == "secret"

"""Server-id pinning: a key file logs in only to the server it first logged in to (or the
one named at its creation), so a client sent to another server does not log in there.

Two in-process servers with different tenants files (so different server ids) register
the same tenant and key: only the pin tells them apart.
"""

from __future__ import annotations

import msgpack
import pytest
from coincurve import PrivateKey

from blob_server.auth import Authenticator
from blob_server.storage import MemoryStorage
from tests.server.wire import InProcessServer, registry_with
from zerodb_core import DB, AuthenticationError, IntegrityError
from zerodb_core import keyfile as keyfile_module
from zerodb_core.crypto.envelope import open_envelope
from zerodb_core.keyfile import KeyFile, main
from zerodb_core.transport.remote import RemoteTransport

PASSWORD = "pinning test passphrase"
KEY = PrivateKey()


class CountingAuthenticator(Authenticator):
    """Counts the logins a server receives (a refused pin must not even try one)."""

    logins = 0

    def login(self, address, challenge, args, max_failures=None):
        type(self).logins += 1
        return super().login(address, challenge, args, max_failures)


@pytest.fixture
def servers(tmp_path):
    """The real server and another one (a different tenants file: another id)."""
    running = []
    for name in ("real", "other"):
        registry = registry_with(tmp_path / f"{name}.json", acme=[KEY])
        running.append(InProcessServer(MemoryStorage(), CountingAuthenticator(registry)))
    CountingAuthenticator.logins = 0
    yield running
    for server in running:
        server.stop()


def server_id(server: InProcessServer) -> str:
    return server.server.auth.server_id


def open_db(server: InProcessServer, key_file, **kwargs) -> DB:
    return DB(
        ("127.0.0.1", server.port), password=PASSWORD, key_file=key_file, kdf="fast", **kwargs
    )


@pytest.fixture
def key_path(tmp_path):
    path = tmp_path / "acme.zdbkey"
    KeyFile(KEY.secret, "acme").save(path, PASSWORD, kdf="fast")
    return path


def test_the_first_login_pins_the_key_file(servers, key_path):
    real, _ = servers
    assert KeyFile.load(key_path, PASSWORD).server_id is None
    before = key_path.read_bytes()
    with open_db(real, key_path) as db:
        assert db.transport.server_id == server_id(real)
    pinned = KeyFile.load(key_path, PASSWORD)
    assert pinned.server_id == server_id(real)
    assert pinned.login_key == KEY.secret and pinned.tenant == "acme"
    assert key_path.read_bytes() != before
    assert key_path.stat().st_mode & 0o777 == 0o600
    # Same KDF costs and salt as before (only the nonce and contents are new).
    assert key_path.read_bytes()[:38] == before[:38]
    with open_db(real, key_path):  # logging in again changes nothing
        pass
    assert KeyFile.load(key_path, PASSWORD).server_id == server_id(real)


def test_a_pinned_key_file_refuses_another_server_before_signing(servers, key_path):
    real, other = servers
    with open_db(real, key_path):
        pass
    logins = CountingAuthenticator.logins
    with pytest.raises(AuthenticationError) as caught:
        open_db(other, key_path)
    message = str(caught.value)
    assert server_id(other) in message and server_id(real) in message
    assert CountingAuthenticator.logins == logins  # no login was even attempted
    with open_db(real, key_path):  # the real one still works
        pass


def test_a_key_pinned_at_creation(servers, tmp_path, monkeypatch, capsys):
    real, other = servers
    monkeypatch.setenv("ZERODB_PASSPHRASE", PASSWORD)
    path = tmp_path / "created.zdbkey"
    created = ["create", "--tenant", "acme", "--out", str(path), "--kdf", "fast"]
    assert main([*created, "--server-id", server_id(other)]) == 0
    # The file holds a new key: register it with both servers.
    public = capsys.readouterr().out.strip()
    for server in servers:
        server.server.auth.registry.add_key("acme", public)
    assert main(["show", str(path)]) == 0
    assert f"server id: {server_id(other)}" in capsys.readouterr().out
    with pytest.raises(AuthenticationError, match=server_id(real)):
        open_db(real, path)  # never pinned to the first server it meets
    with open_db(other, path):
        pass


def test_the_pin_command_repins_and_clears(servers, key_path, monkeypatch, capsys):
    real, other = servers
    monkeypatch.setenv("ZERODB_PASSPHRASE", PASSWORD)
    with open_db(real, key_path):
        pass
    assert main(["pin", str(key_path), "--server-id", server_id(other)]) == 0
    assert capsys.readouterr().out.strip() == f"server id: {server_id(other)}"
    with pytest.raises(AuthenticationError):
        open_db(real, key_path)
    assert main(["pin", str(key_path), "--clear"]) == 0
    assert KeyFile.load(key_path, PASSWORD).server_id is None
    with open_db(real, key_path):  # unpinned: the next login pins again
        pass
    assert KeyFile.load(key_path, PASSWORD).server_id == server_id(real)
    with pytest.raises(SystemExit):
        main(["pin", str(key_path)])  # --server-id or --clear


def test_a_reconnect_to_a_server_with_another_id_is_refused(servers):
    real, other = servers
    client = RemoteTransport("127.0.0.1", real.port, tenant="acme", login_key=KEY.secret)
    try:
        assert client.server_id == server_id(real)
        assert client.get_root("main").seq == 0
        client.port = other.port  # the address now leads elsewhere (DNS, routing, ...)
        client._drop()
        with pytest.raises(AuthenticationError, match=server_id(other)):
            client.get_root("main")
    finally:
        client.close()


def test_a_keyfile_object_is_pinned_in_memory(servers):
    real, other = servers
    key = KeyFile(KEY.secret, "acme")
    with open_db(real, key):
        pass
    assert key.server_id == server_id(real)
    with pytest.raises(AuthenticationError):
        open_db(other, key)


def test_pinning_refuses_a_file_pinned_meanwhile_to_another_id(key_path):
    loaded = KeyFile.load(key_path, PASSWORD)
    KeyFile.load(key_path, PASSWORD).pin(key_path, PASSWORD, "first-server")  # "another process"
    with pytest.raises(AuthenticationError, match="pinned to server id 'first-server'"):
        loaded.pin(key_path, PASSWORD, "second-server")
    loaded.pin(key_path, PASSWORD, "first-server")  # the same id: nothing to do
    assert loaded.server_id == "first-server"
    replaced = KeyFile(PrivateKey().secret, "acme")  # a different key in the same place
    with pytest.raises(IntegrityError, match="another login key"):
        replaced.pin(key_path, PASSWORD, "first-server")


def test_a_key_file_that_cannot_be_written_stays_usable(servers, key_path, monkeypatch):
    real, _ = servers

    def read_only(path, data):
        raise PermissionError(13, "Read-only file system", str(path))

    monkeypatch.setattr(keyfile_module, "_replace_file", read_only)
    with pytest.warns(RuntimeWarning, match="could not record server id"):
        db = open_db(real, key_path)
    with db:
        assert db.transport.server_id == server_id(real)
    assert KeyFile.load(key_path, PASSWORD).server_id is None


def test_unpinned_files_stay_in_the_old_format(key_path):
    """A file without a pin holds exactly the three original fields, so versions without
    pinning still open it; a pinned one adds ``server_id``."""

    def fields(sealed: bytes) -> set[str]:
        plaintext, _ = open_envelope(keyfile_module.MAGIC, sealed, PASSWORD, b"", what="", wrong="")
        return set(msgpack.unpackb(plaintext))

    assert fields(key_path.read_bytes()) == {"login_key", "tenant", "server"}
    sealed = KeyFile(KEY.secret, "acme", server_id="x" * 32).seal(PASSWORD, kdf="fast")
    assert fields(sealed) == {"login_key", "tenant", "server", "server_id"}
    assert KeyFile.open(sealed, PASSWORD).server_id == "x" * 32
    with pytest.raises(ValueError):
        KeyFile(KEY.secret, "acme", server_id="")

"""``DB((host, port), ..., tls=, ca_file=, timeout=)``: the options reach the transport.

The server speaks TLS with a throwaway self-signed certificate (made with ``openssl``);
the client must trust exactly that certificate (``ca_file``) to connect.
"""

from __future__ import annotations

import ssl

import pytest
from coincurve import PrivateKey

from blob_server.auth import Authenticator
from blob_server.storage import MemoryStorage
from tests.core.hr import Employee
from tests.server.wire import InProcessServer, registry_with, self_signed_cert
from zerodb_core import DB, QueryError, StoreUnavailableError
from zerodb_core.keyfile import KeyFile

PASSWORD = "remote options passphrase"
KEY = PrivateKey()


@pytest.fixture(scope="module")
def cert(tmp_path_factory):
    return self_signed_cert(tmp_path_factory.mktemp("tls"))


@pytest.fixture
def tls_server(tmp_path, cert):
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(*cert)
    registry = registry_with(tmp_path / "tenants.json", acme=[KEY])
    server = InProcessServer(MemoryStorage(), Authenticator(registry), ssl=context)
    yield server
    server.stop()


def open_db(server: InProcessServer, **options) -> DB:
    return DB(
        ("127.0.0.1", server.port),
        password=PASSWORD,
        key_file=KeyFile(KEY.secret, "acme"),
        kdf="fast",
        **options,
    )


def test_ca_file_and_timeout_reach_the_transport(tls_server, cert):
    with open_db(tls_server, ca_file=cert[0], timeout=7.5) as db:
        transport = db.transport
        assert transport.timeout == 7.5
        assert isinstance(transport._sock, ssl.SSLSocket)
        assert transport._sock.version() in ("TLSv1.2", "TLSv1.3")
        db.add(Employee(name="Ann", surname="A", salary=1, description="over tls"))
        assert [e.name for e in db[Employee].all()] == ["Ann"]


def test_an_ssl_context_can_be_given_as_tls(tls_server, cert):
    context = ssl.create_default_context(cafile=str(cert[0]))
    with open_db(tls_server, tls=context) as db:
        assert db.transport.ssl is context
        assert db.transport.get_root("main").seq == 0


def test_a_certificate_nobody_vouches_for_is_refused(tls_server):
    with pytest.raises(StoreUnavailableError, match="TLS verification"):
        open_db(tls_server, tls=True)  # the system's CAs did not sign it


def test_plain_tcp_to_a_tls_server_fails(tls_server):
    with pytest.raises(StoreUnavailableError):
        open_db(tls_server, timeout=2)


def test_option_mistakes_are_refused(tls_server, cert, tmp_path):
    with pytest.raises(QueryError, match="timeout, tls: for a blob server"):
        DB("memory://", password=PASSWORD, kdf="fast", tls=True, timeout=3)
    with pytest.raises(QueryError, match="tls=False"):
        open_db(tls_server, tls=False, ca_file=cert[0])
    with pytest.raises(QueryError, match="not both"):
        open_db(tls_server, tls=ssl.create_default_context(), ca_file=cert[0])
    with pytest.raises(StoreUnavailableError, match="CA file"):
        open_db(tls_server, ca_file=tmp_path / "missing.pem")

"""The ``zerodb_*`` management commands: init, status, verify, reindex, rotate_key.

Most tests run on an alias of their own (``zalias``): an SQLite store in the test's
temporary directory with the test models' tables, so that damaging an index or changing
the passphrase touches nothing another test uses. Writes must be committed for the
commands (which read the committed state) to see them: the tests are transactional.
"""

from __future__ import annotations

import json
from io import StringIO

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import DatabaseError, connections

from django_zerodb.store import forget_engines
from tests.django.testapp.models import Contact, Counter, Department, Employee
from zerodb_core.encoding import encode_key
from zerodb_core.keyfile import KeyFile
from zerodb_core.serialization import pack
from zerodb_core.transaction import WriteOp

PASSPHRASE = "commands test passphrase"
# The aliases of this module exist for its whole run (the test case validates the
# databases it may touch before function fixtures run); each test gives them a new store.
ALIAS = "zcmd"
NEW = "znew"
REMOTE = "zremote"
db = pytest.mark.django_db(databases=["default", "encrypted", ALIAS, NEW, REMOTE], transaction=True)


def configure(alias: str, options: dict, name: str = "cmd") -> None:
    settings = connections.configure_settings(
        {
            "default": dict(connections.settings["default"]),  # Django insists on one
            alias: {"ENGINE": "django_zerodb", "NAME": name, "OPTIONS": options},
        }
    )
    connections.settings[alias] = settings[alias]


def unconfigure(alias: str) -> None:
    connections[alias].close()
    del connections[alias]
    del connections.settings[alias]


def use_store(alias: str, store: str, **options) -> None:
    connections[alias].close()
    current = connections[alias].settings_dict["OPTIONS"]
    current.clear()
    current.update({"STORE": store, "PASSPHRASE": PASSPHRASE, "KDF": "fast", **options})


@pytest.fixture(scope="module", autouse=True)
def aliases(django_db_setup):
    """Added after the test databases are set up: they are no test databases."""
    for alias in (ALIAS, NEW, REMOTE):
        configure(alias, {"STORE": "memory://", "PASSPHRASE": PASSPHRASE, "KDF": "fast"})
    yield
    for alias in (ALIAS, NEW, REMOTE):
        unconfigure(alias)


@pytest.fixture
def zalias(tmp_path):
    """The encrypted alias ``zcmd`` on an SQLite store of its own, with the test models'
    tables."""
    store = f"sqlite:///{tmp_path}/cmd.zdb"
    use_store(ALIAS, store)
    with connections[ALIAS].schema_editor() as editor:
        for model in (Department, Employee, Counter):
            editor.create_model(model)
    yield ALIAS
    connections[ALIAS].close()
    forget_engines(store)


def fill(alias: str, n: int = 40) -> None:
    rd = Department.objects.using(alias).create(name="R&D")
    Employee.objects.using(alias).bulk_create(
        Employee(
            first_name=f"F{i % 5}",
            last_name="L",
            email=f"e{i}@example.com",
            salary=1000 * i,
            department_id=rd.pk,
            bio="kernel panic at dawn" if i % 2 else "",
        )
        for i in range(n)
    )


def run(*args, **kwargs) -> tuple[str, str]:
    out, err = StringIO(), StringIO()
    call_command(*args, stdout=out, stderr=err, **kwargs)
    return out.getvalue(), err.getvalue()


class _Commit(WriteOp):
    """A write operation that does nothing, so a transaction whose only change is a raw
    tree write still commits."""

    def apply(self, txn):
        return None


def corrupt_salary_index(alias: str) -> int:
    """Write a wrong entry into Employee's salary index through the engine's tree API:
    an entry for an existing record with a value the record does not have."""
    engine = connections[alias].session.engine
    pk = Employee.objects.using(alias).order_by("pk").values_list("pk", flat=True)[0]
    with engine.transaction() as txn:
        spec = txn.catalog.get(Employee._meta.db_table)
        tree = txn.tree(spec.index_tree(spec.indexes["f:salary"]))
        tree.put(encode_key(123_456_789) + encode_key(pk), pack(pk), False)
        txn.apply(_Commit())
    return pk


# -- zerodb_status ----------------------------------------------------------------------


@db
def test_status_counts_records_and_index_entries(zalias):
    fill(zalias)
    out, err = run("zerodb_status", "--database", zalias)
    assert "testapp_employee (testapp.Employee): 40 records" in out
    assert "u:email" in out and "40 entries" in out
    assert "40 documents, 80 tokens (average 2.0)" in out
    assert "store:       sqlite:///" in out and PASSPHRASE not in out + err
    assert "django_zerodb_seenroot in the 'default' database" in out
    assert err == ""
    data = json.loads(run("zerodb_status", "--database", zalias, "--json")[0])
    employee = data["models"]["testapp_employee"]
    assert employee["records"] == 40 and employee["label"] == "testapp.Employee"
    assert employee["indexes"]["f:salary"]["entries"] == 40
    assert employee["indexes"]["t:bio"]["documents"] == 40
    assert data["seq"] > 0 and data["engine"]["round_trips"] > 0
    assert data["database"] == "cmd" and PASSPHRASE not in json.dumps(data)


@db
def test_status_defaults_to_the_encrypted_alias():
    Department.objects.create(name="Ops")
    data = json.loads(run("zerodb_status", "--json")[0])
    assert data["alias"] == "encrypted"
    assert data["models"]["testapp_department"]["records"] == 1
    assert data["freshness"] == "memory (this process only)"  # a memory:// test store


def test_commands_refuse_a_plaintext_database():
    with pytest.raises(CommandError, match="not an encrypted database"):
        run("zerodb_status", "--database", "default")
    with pytest.raises(CommandError, match="no database"):
        run("zerodb_verify", "--database", "nope")


# -- zerodb_verify and zerodb_reindex ---------------------------------------------------


@db
def test_verify_a_sound_database(zalias):
    fill(zalias)
    out, err = run("zerodb_verify", "--database", zalias)
    assert "No problems found." in out and "41 records" in out
    assert err == ""  # no progress bar in captured output
    report = json.loads(run("zerodb_verify", "--database", zalias, "--json")[0])
    assert report["ok"] and report["problems"] == []
    out, err = run("zerodb_verify", "testapp.Employee", "--database", zalias, "--progress")
    assert "No problems found." in out and "\r" not in out
    assert "verifying zcmd" in err  # the bar went to stderr


class Terminal(StringIO):
    def isatty(self) -> bool:
        return True


@db
def test_verify_on_a_terminal_leaves_no_bar(zalias):
    """Work shorter than a second draws no bar on a terminal (none to leave behind)."""
    fill(zalias)
    terminal = Terminal()
    call_command("zerodb_verify", "--database", zalias, stdout=StringIO(), stderr=terminal)
    assert terminal.getvalue() == ""


@db
def test_verify_finds_a_corrupted_index_and_reindex_repairs_it(zalias):
    fill(zalias)
    pk = corrupt_salary_index(zalias)
    out = StringIO()
    with pytest.raises(CommandError, match="1 problem") as raised:
        call_command("zerodb_verify", "--database", zalias, stdout=out, stderr=StringIO())
    assert raised.value.returncode == 1
    assert f"index testapp_employee.f:salary: an entry points to record {pk}" in out.getvalue()
    with pytest.raises(CommandError):
        run("zerodb_verify", "--database", zalias, "--json")
    # The other models are clean.
    run("zerodb_verify", "testapp.Department", "testapp_counter", "--database", zalias)

    out, _ = run("zerodb_reindex", "testapp.Employee", "--database", zalias)
    assert "testapp_employee (testapp.Employee): 6 indexes rebuilt from 40 records" in out
    assert "Rebuilt 6 indexes of 1 models in one transaction" in out
    assert "No problems found." in run("zerodb_verify", "--database", zalias)[0]
    assert Employee.objects.using(zalias).filter(salary=123_456_789).count() == 0
    assert Employee.objects.using(zalias).filter(salary__gte=39_000).count() == 1


@db
def test_reindex_all_and_its_refusals(zalias):
    fill(zalias, 10)
    seq = connections[zalias].session.engine.read_root().seq
    out, _ = run("zerodb_reindex", "--all", "--database", zalias)
    assert "of 3 models in one transaction" in out
    assert connections[zalias].session.engine.read_root().seq == seq + 1  # one commit
    assert "No problems found." in run("zerodb_verify", "--database", zalias)[0]
    with pytest.raises(CommandError, match="--all"):
        run("zerodb_reindex", "--database", zalias)
    with pytest.raises(CommandError, match=r"holds no model 'testapp\.Tag'"):
        run("zerodb_reindex", "testapp.Tag", "--database", zalias)
    with pytest.raises(CommandError, match="holds no model"):
        run("zerodb_verify", "nothing_here", "--database", zalias)


@db
def test_reindex_refuses_a_unique_duplicate_and_changes_nothing(zalias):
    fill(zalias, 5)
    engine = connections[zalias].session.engine
    first, second = Employee.objects.using(zalias).order_by("pk")[:2]
    with engine.transaction() as txn:  # a second record with the first one's email
        spec = txn.catalog.get(Employee._meta.db_table)
        records = txn.tree(spec.record_tree)
        fields = txn.table(spec.name).get(second.pk)
        records.put(
            encode_key(second.pk),
            b"\x00" + pack([second.pk, {**fields, "email": first.email}]),
            True,
        )
        txn.apply(_Commit())
    out = StringIO()
    with pytest.raises(CommandError):
        call_command("zerodb_verify", "--database", zalias, stdout=out)
    assert "duplicate" in out.getvalue()
    seq = engine.read_root().seq
    with pytest.raises(CommandError, match=r"UNIQUE|duplicate"):
        run("zerodb_reindex", "testapp.Employee", "--database", zalias)
    assert engine.read_root().seq == seq


# -- zerodb_init ------------------------------------------------------------------------


@db
def test_init_opens_an_embedded_store(zalias):
    out, _ = run("zerodb_init", "--database", zalias)
    assert "an existing database at root seq" in out
    with pytest.raises(CommandError, match="embedded store"):
        run("zerodb_init", "--database", zalias, "--tenant", "acme")


@db
def test_init_creates_a_new_database(tmp_path):
    store = f"sqlite:///{tmp_path}/new.zdb"
    use_store(NEW, store)
    try:
        out, _ = run("zerodb_init", "--database", NEW)
        assert "a new, empty database" in out and f"migrate --database {NEW}" in out
    finally:
        connections[NEW].close()
        forget_engines(store)


def test_init_creates_a_key_file_for_a_blob_server(tmp_path):
    key = tmp_path / "keys" / "acme.zdbkey"
    use_store(REMOTE, "zerodb://127.0.0.1:9", KEY_FILE=str(key))
    with pytest.raises(CommandError, match="--tenant"):
        run("zerodb_init", "--database", REMOTE)
    out, err = run("zerodb_init", "--database", REMOTE, "--tenant", "acme", "--kdf", "fast")
    keyfile = KeyFile.load(key, PASSPHRASE)
    public = keyfile.public_key.hex()
    assert keyfile.tenant == "acme" and keyfile.server == "127.0.0.1:9"
    assert f"Public key: {public}" in out
    assert f"zerodb-server add-key acme {public}" in out
    assert (key.stat().st_mode & 0o777) == 0o600
    assert PASSPHRASE not in out + err
    with pytest.raises(CommandError, match="refusing to overwrite"):
        run("zerodb_init", "--database", REMOTE, "--key-only", "--tenant", "acme")
    assert KeyFile.load(key, PASSPHRASE).login_key == keyfile.login_key
    out, _ = run(
        "zerodb_init", "--database", REMOTE, "--tenant", "acme", "--kdf", "fast", "--force"
    )
    replaced = KeyFile.load(key, PASSPHRASE)
    assert replaced.login_key != keyfile.login_key
    assert replaced.public_key.hex() in out


@pytest.fixture
def blob_server(tmp_path):
    """A blob server (memory storage) with one tenant, ``hr``, and no key yet."""
    from tests.server.test_server_e2e import ServerProcess
    from tests.server.test_server_e2e import run as cli

    tenants = tmp_path / "tenants.json"
    cli("-m", "blob_server.cli", "add-tenant", "hr", "--tenants", str(tenants))
    server = ServerProcess("memory://", tenants, tmp_path / "server.log")
    server.start()
    yield server, tenants, cli
    forget_engines(f"zerodb://127.0.0.1:{server.port}")
    use_store(REMOTE, "memory://")  # the test case's flush runs on an empty memory store
    server.stop()


@db
def test_the_commands_on_a_blob_server(tmp_path, blob_server, monkeypatch):
    """init (key, then keyring), status, verify and a passphrase change that re-seals
    the key file, against a real blob server."""
    server, tenants, cli = blob_server
    key = tmp_path / "hr.zdbkey"
    store = f"zerodb://127.0.0.1:{server.port}"
    use_store(REMOTE, store, KEY_FILE=str(key))
    out, _ = run("zerodb_init", "--database", REMOTE, "--tenant", "hr")
    public = out.split("Public key: ")[1].split()[0]
    cli("-m", "blob_server.cli", "add-key", "hr", public, "--tenants", str(tenants))
    out, _ = run("zerodb_init", "--database", REMOTE)
    assert "exists; opening the database" in out and "a new, empty database" in out
    with connections[REMOTE].schema_editor() as editor:
        editor.create_model(Department)
    Department.objects.using(REMOTE).bulk_create(Department(name=f"d{i}") for i in range(30))
    data = json.loads(run("zerodb_status", "--database", REMOTE, "--json")[0])
    assert data["tenant"] == "hr" and data["key_file"] == str(key) and data["store"] == store
    assert data["models"]["testapp_department"]["records"] == 30
    assert "No problems found." in run("zerodb_verify", "--database", REMOTE)[0]
    # Freshness of a remote store is kept per tenant.
    from django_zerodb.models import SeenRoot

    row = SeenRoot.objects.get(store=f"{store}#tenant=hr", database="cmd")
    assert row.seq == data["seq"]

    monkeypatch.setenv("NEW_HR_PASSPHRASE", "the new hr passphrase")
    out, _ = run(
        "zerodb_rotate_key", "--database", REMOTE, "--new-passphrase-env", "NEW_HR_PASSPHRASE"
    )
    assert f"The key file {key} is sealed under it too." in out
    assert KeyFile.load(key, "the new hr passphrase").public_key.hex() == public
    connections[REMOTE].close()
    forget_engines(store)
    connections[REMOTE].settings_dict["OPTIONS"]["PASSPHRASE"] = "the new hr passphrase"
    assert Department.objects.using(REMOTE).count() == 30


# -- zerodb_rotate_key ------------------------------------------------------------------


@db
def test_rotate_key_changes_the_passphrase(zalias, monkeypatch):
    fill(zalias, 5)
    monkeypatch.setenv("ZERODB_NEW_PASSPHRASE", "a brand new passphrase")
    out, _ = run(
        "zerodb_rotate_key", "--database", zalias, "--new-passphrase-env", "ZERODB_NEW_PASSPHRASE"
    )
    assert "now wrapped under the new passphrase" in out and "No data was re-encrypted" in out
    assert Employee.objects.using(zalias).count() == 5  # the running engine keeps working
    store = connections[zalias].settings_dict["OPTIONS"]["STORE"]
    connections[zalias].close()
    forget_engines(store)
    with pytest.raises(DatabaseError, match="wrong passphrase"):
        Employee.objects.using(zalias).count()
    connections[zalias].close()
    connections[zalias].settings_dict["OPTIONS"]["PASSPHRASE"] = "a brand new passphrase"
    assert Employee.objects.using(zalias).count() == 5


@db
def test_slow_steps_say_what_they_do_on_a_terminal(zalias, monkeypatch):
    """Unlocking and re-wrapping run Argon2id (seconds, no progress to count): a status
    line says so first, on a terminal; in captured output, nothing."""
    fill(zalias, 5)
    connections[zalias].close()
    terminal = Terminal()
    call_command("zerodb_status", "--database", zalias, stdout=StringIO(), stderr=terminal)
    assert (
        terminal.getvalue()
        == f"unlocking '{zalias}' (Argon2id key derivation: a few seconds) ...\n"
    )
    assert run("zerodb_status", "--database", zalias)[1] == ""
    monkeypatch.setenv("ZERODB_NEW_PASSPHRASE", "a brand new passphrase")
    terminal = Terminal()
    call_command(
        "zerodb_rotate_key", "--database", zalias, "--new-passphrase-env",
        "ZERODB_NEW_PASSPHRASE", stdout=StringIO(), stderr=terminal,
    )  # fmt: skip
    assert "re-wrapping the keyring under the new passphrase" in terminal.getvalue()
    connections[zalias].settings_dict["OPTIONS"]["PASSPHRASE"] = "a brand new passphrase"


@db
def test_rotate_key_new_epoch(zalias):
    fill(zalias, n=10)
    out, _ = run("zerodb_rotate_key", "--database", zalias, "--new-epoch")
    assert "Key epoch 2 started" in out
    engine = connections[zalias].session.engine
    assert engine.keyring.epochs == (1, 2) and engine.keys.current_epoch == 2
    Employee.objects.using(zalias).filter(salary__lt=5000).update(title="rotated")
    store = connections[zalias].settings_dict["OPTIONS"]["STORE"]
    connections[zalias].close()
    forget_engines(store)  # a new process: opens the keyring with both epochs
    assert Employee.objects.using(zalias).filter(title="rotated").count() == 5
    assert run("zerodb_verify", "--database", zalias)[0]


def test_rotate_key_refusals(monkeypatch):
    with pytest.raises(CommandError, match="one at a time"):
        run("zerodb_rotate_key", "--new-epoch", "--new-passphrase-env", "X")
    with pytest.raises(CommandError, match="--new-passphrase-env"):
        run("zerodb_rotate_key")
    monkeypatch.delenv("ZERODB_UNSET_VARIABLE", raising=False)
    with pytest.raises(CommandError, match="not set"):
        run("zerodb_rotate_key", "--new-passphrase-env", "ZERODB_UNSET_VARIABLE")


def test_every_command_has_help():
    from django.core.management import load_command_class

    for name in (
        "zerodb_init",
        "zerodb_status",
        "zerodb_verify",
        "zerodb_reindex",
        "zerodb_rotate_key",
    ):
        command = load_command_class("django_zerodb", name)
        text = command.create_parser("manage.py", name).format_help()
        assert "--database" in text and len(command.help) > 200, name


@db
def test_reindex_computes_the_values_of_functional_indexes_again(zalias):
    """A record whose derived column is stale (written without the model, as a raw
    engine write does) is found again after a reindex."""
    from django_zerodb.derived import is_derived

    with connections[zalias].schema_editor() as editor:
        editor.create_model(Contact)
    Contact.objects.using(zalias).create(last_name="Curry", email="a@x.org")
    engine = connections[zalias].session.engine
    with engine.transaction() as txn:
        table = txn.table(Contact._meta.db_table)
        ((pk, fields),) = txn.run([table.scan_reader()])[0]
        table.put(pk, {k: v for k, v in fields.items() if not is_derived(k)})
        txn.apply(_Commit())
    assert not Contact.objects.using(zalias).filter(last_name__iexact="CURRY").exists()
    out, _ = run("zerodb_reindex", "testapp.Contact", "--database", zalias)
    assert "indexes rebuilt from 1 records" in out
    assert Contact.objects.using(zalias).filter(last_name__iexact="CURRY").count() == 1

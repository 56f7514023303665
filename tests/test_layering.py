"""The declared surfaces between the packages, enforced on the source (``ast``, no imports).

- ``django_zerodb`` uses the engine only through ``zerodb_core.api`` and only the names its
  ``__all__`` declares; every declared name is used (the interface lists what the adapter
  needs, no more).
- ``zerodb_core`` (the trusted client) imports nothing of ``blob_server`` but
  ``blob_server.wire`` and, for embedded stores, the factory
  ``blob_server.storage.open_storage``; ``blob_server.wire`` imports nothing else of
  ``blob_server`` and nothing of ``zerodb_core``.
- No module of the repository imports a private name (``_name``) or a private module of
  another top-level package. Tests are white-box and exempt: they test the private parts of
  the module they cover.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import zerodb_core.api

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("zerodb_core", "blob_server", "django_zerodb", "bench", "example_project", "scripts")


def _modules(package: str) -> list[Path]:
    return sorted((ROOT / package).rglob("*.py"))


def _imports(tree: ast.AST) -> list[tuple[str, str | None, int]]:
    """Return ``(module, name or None, line)`` for each absolute import in ``tree``."""
    found: list[tuple[str, str | None, int]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.extend((node.module, alias.name, node.lineno) for alias in node.names)
        elif isinstance(node, ast.Import):
            found.extend((alias.name, None, node.lineno) for alias in node.names)
    return found


def engine_uses(source: str) -> tuple[list[str], set[str]]:
    """Return the violations of the engine interface in one adapter module, and the names used.

    A violation is a ``zerodb_core`` import of anything but ``zerodb_core.api`` or of a name
    ``zerodb_core.api.__all__`` does not declare; ``import zerodb_core.api as core`` counts
    the attributes read from ``core``.
    """
    tree = ast.parse(source)
    declared = set(zerodb_core.api.__all__)
    violations: list[str] = []
    used: set[str] = set()
    aliases: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] != "zerodb_core":
                    continue
                if alias.name != "zerodb_core.api" or alias.asname is None:
                    violations.append(f"line {node.lineno}: import {alias.name}")
                else:
                    aliases.add(alias.asname)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if node.module.split(".")[0] != "zerodb_core":
                continue
            for alias in node.names:
                if node.module != "zerodb_core.api" or alias.name not in declared:
                    violations.append(f"line {node.lineno}: from {node.module} import {alias.name}")
                else:
                    used.add(alias.name)
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id in aliases
        ):
            if node.attr in declared:
                used.add(node.attr)
            else:
                violations.append(f"line {node.lineno}: {node.value.id}.{node.attr}")
    return violations, used


#: What the client may import of the server package besides ``blob_server.wire``.
EMBEDDED_FACTORY = ("blob_server.storage", "open_storage")


def _imported(module: str, name: str | None) -> str:
    """The full dotted name an import brings in (``from a import b`` -> ``a.b``)."""
    return module if name is None else f"{module}.{name}"


def outside(source: str, package: str, allowed: tuple[str, ...], exempt=()) -> list[str]:
    """Return the imports in ``source`` of ``package`` that are not under an ``allowed``
    prefix (nor an ``exempt`` ``(module, name)`` pair)."""
    found = []
    for module, name, line in _imports(ast.parse(source)):
        if module.split(".")[0] != package or (module, name) in exempt:
            continue
        full = _imported(module, name)
        if not any(full == a or full.startswith(a + ".") for a in allowed):
            found.append(f"line {line}: {full}")
    return found


def test_the_client_imports_only_the_wire_surface_of_the_server():
    found = []
    for path in _modules("zerodb_core"):
        bad = outside(path.read_text(), "blob_server", ("blob_server.wire",), (EMBEDDED_FACTORY,))
        found.extend(f"{path.relative_to(ROOT)} {v}" for v in bad)
    assert found == []


def test_the_wire_surface_imports_nothing_else():
    found = []
    for path in _modules("blob_server/wire"):
        source = path.read_text()
        bad = outside(source, "blob_server", ("blob_server.wire",))
        bad += outside(source, "zerodb_core", ())
        found.extend(f"{path.relative_to(ROOT)} {v}" for v in bad)
    assert found == []


def private_imports(source: str, package: str) -> list[str]:
    """Return the imports in ``source`` (a module of ``package``) of another package's privates."""
    found = []
    for module, name, line in _imports(ast.parse(source)):
        parts = module.split(".")
        if parts[0] == package or parts[0] not in PACKAGES:
            continue
        private = [
            p for p in [*parts[1:], name or ""] if p.startswith("_") and not p.endswith("__")
        ]
        if private:
            found.append(f"line {line}: {module} {name or ''}".rstrip())
    return found


def test_the_adapter_uses_the_engine_only_through_its_interface():
    violations: list[str] = []
    used: set[str] = set()
    for path in _modules("django_zerodb"):
        bad, names = engine_uses(path.read_text())
        violations.extend(f"{path.relative_to(ROOT)} {v}" for v in bad)
        used |= names
    assert violations == []
    assert sorted(set(zerodb_core.api.__all__) - used) == []  # nothing declared but unused


def test_every_declared_name_exists():
    missing = [name for name in zerodb_core.api.__all__ if not hasattr(zerodb_core.api, name)]
    assert missing == []


@pytest.mark.parametrize("package", PACKAGES)
def test_no_module_imports_a_private_name_of_another_package(package):
    found = []
    for path in _modules(package):
        found.extend(
            f"{path.relative_to(ROOT)} {v}" for v in private_imports(path.read_text(), package)
        )
    assert found == []


def test_the_checks_catch_what_they_look_for():
    """The walkers above find each kind of violation (so the tests above can fail)."""
    source = (
        "import zerodb_core.db\n"
        "import zerodb_core.api as core\n"
        "from zerodb_core.query.planner import plan\n"
        "from zerodb_core.api import Eq, Node\n"
        "core.Eq, core.Secret\n"
    )
    violations, used = engine_uses(source)
    assert [v.split(":")[0] for v in violations] == ["line 1", "line 3", "line 4", "line 5"]
    assert used == {"Eq"}
    source = (
        "from zerodb_core.keyfile import _replace_file\n"
        "from blob_server.storage._private import thing\n"
        "from django_zerodb._own import fine\n"
        "from zerodb_core import __version__\n"
    )
    assert outside(
        "from blob_server import wire\nfrom blob_server import storage\n"
        "from blob_server.storage import open_storage, MemoryStorage\n",
        "blob_server",
        ("blob_server.wire",),
        (EMBEDDED_FACTORY,),
    ) == ["line 2: blob_server.storage", "line 3: blob_server.storage.MemoryStorage"]
    assert private_imports(source, "django_zerodb") == [
        "line 1: zerodb_core.keyfile _replace_file",
        "line 2: blob_server.storage._private thing",
    ]


def test_queries_do_not_import_the_compilers():
    """The compilers build queries and hand write operations (``writes``) over; a query
    importing the compiler module back was an import cycle."""
    for name in ("query.py", "writes.py"):
        imports = _imports(ast.parse((ROOT / "django_zerodb" / name).read_text()))
        found = [_imported(m, n) for m, n, _ in imports]
        assert [f for f in found if f.split(".")[:2] == ["django_zerodb", "compiler"]] == []

"""docs/tutorial.md, run as written: every fenced block of the tutorial, in order.

The doc cannot drift from what is tested, because the blocks *are* the test. Each fenced
block's info string says what to do with it, and a block this test does not know fails
it:

* ``sh``: run with bash (``-e -o pipefail``) as one session would: the working
  directory and the exported variables carry over to the next block;
* ``sh venv``: the ``sh`` block that creates the project's virtualenv and installs the
  package into it. ``test_the_tutorial`` links ``.venv`` to the virtualenv running the
  tests (``make test`` must not install from the network) and checks instead that what
  the ``pip install`` line names exists (the checkout's extras in setup.cfg, the other
  distributions installed); ``test_the_tutorial_in_a_fresh_virtualenv`` (``slow``,
  ``make tutorial``) runs it literally: a new virtualenv, ``pip install`` from the index;
* ``sh server=/path``: started in the background (a second terminal); the test waits for
  ``http://127.0.0.1:8000/path`` to answer, and stops it at the next ``server`` block or
  at the end;
* ``python file=PATH`` / ``python append=PATH`` / ``ini file=PATH``: written to /
  appended to ``PATH``, relative to the working directory;
* ``text output`` / ``json output``: what the ``sh`` block before it prints. Each line
  must appear in the output, in order; ``...`` in a line matches anything.

No warning and no error on the way (issue 16's target): every command runs with
``PYTHONWARNINGS=default`` (deprecations shown), its output must not mention a warning,
an error or a traceback, and everything it writes to stderr must be one of the lines
Django's test runner writes there; the development servers' logs are held to the same
rule once the server stops (Django's "This is a development server" notice aside).

The sandbox: ``HOME`` is a temporary directory (the tutorial works in ``~/zerodb-tutorial``),
the first block runs in the checkout (``make demo`` with ``HRSITE_VAR_DIR`` in the
temporary directory, so ``example_project/var`` is not touched; ``DEMO_ARGS`` seeds fewer
employees), ``127.0.0.1:8000`` becomes a free port, and the test-only fast KDF is used.
After the doc, the tutorial project's admin is checked over HTTP: log in, search, the
"Encrypted store" page.
"""

from __future__ import annotations

import configparser
import dataclasses
import http.cookiejar
import importlib.metadata
import os
import re
import shlex
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

from tests.children import clean_env, free_port
from tests.e2e.conftest import ARTIFACTS, ROOT

pytestmark = pytest.mark.xdist_group("e2e")

TUTORIAL = ROOT / "docs" / "tutorial.md"
DOC_ADDRESS = "127.0.0.1:8000"
FENCE = re.compile(r"^```([^\n`]*)\n(.*?)^```[ \t]*$", re.MULTILINE | re.DOTALL)
WARNINGS = re.compile(
    r"warn|traceback|\berror|exception|deprecat|identified some issues", re.IGNORECASE
)
# What may go to stderr: Django's test runner (unittest) writes its report there.
STDERR = re.compile(
    r"|(Creating|Destroying) test database for alias '\w+'\.\.\."
    r"|\.+|-+|Ran \d+ tests? in [\d.]+s|OK"
)
# runserver's own notice, printed at every start.
DEV_SERVER_NOTICE = re.compile(
    r"WARNING: This is a development server\..*|For more information on production servers.*"
)
KINDS = {
    "sh",
    "sh venv",
    "sh server",
    "python file",
    "python append",
    "ini file",
    "text output",
    "json output",
}


@dataclasses.dataclass
class Block:
    kind: str  # one of KINDS
    arg: str | None  # the path of server=, file=, append=
    body: str
    line: int

    def __str__(self) -> str:
        return f"docs/tutorial.md:{self.line} ({self.kind})"


def parse(text: str) -> list[Block]:
    blocks = []
    for match in FENCE.finditer(text):
        info, body = match.group(1).strip(), match.group(2)
        line = text.count("\n", 0, match.start()) + 1
        words = info.split()
        arg = None
        kind = " ".join(words)
        if len(words) == 2 and "=" in words[1]:
            option, _, arg = words[1].partition("=")
            kind = f"{words[0]} {option}"
        assert kind in KINDS, (
            f"docs/tutorial.md:{line}: a ```{info} block: tests/e2e/test_tutorial.py does not "
            f"know how to run it (known: {', '.join(sorted(KINDS))})"
        )
        blocks.append(Block(kind, arg, body, line))
    return blocks


def test_the_tutorial_parses():
    blocks = parse(TUTORIAL.read_text())
    kinds = [b.kind for b in blocks]
    assert kinds[0] == "sh server" and "make demo" in blocks[0].body
    assert kinds.count("sh server") == 3
    venv = blocks[kinds.index("sh venv")].body
    assert kinds.count("sh venv") == 1 and " -m venv " in venv and "pip install" in venv
    assert all(
        b.kind != "text output" or blocks[i - 1].kind == "sh" for i, b in enumerate(blocks)
    ), "an output block must follow a sh block"
    with pytest.raises(AssertionError, match="does not know"):
        parse("```bash\nls\n```\n")


def matches(expected: str, output: str, block: Block) -> None:
    """Each non-blank line of ``expected`` is in ``output``, in order (``...`` is a
    wildcard)."""
    lines = [line.strip() for line in output.splitlines()]
    position = 0
    for want in expected.splitlines():
        want = want.strip()
        if not want or want == "...":
            continue
        pattern = re.compile(".*".join(re.escape(part) for part in want.split("...")))
        for i in range(position, len(lines)):
            if pattern.fullmatch(lines[i]):
                position = i + 1
                break
        else:
            raise AssertionError(f"{block}: {want!r} is not in the output:\n{output}")


def output_problems(output: str, stderr: str) -> list[str]:
    """The lines of a command's output that are a warning or an error (the tutorial's
    target: none)."""
    found = [line for line in output.splitlines() if WARNINGS.search(line)]
    found += [f"stderr: {line}" for line in stderr.splitlines() if not STDERR.fullmatch(line)]
    return found


def test_output_problems_are_found():
    assert output_problems("Ran 3 tests in 0.1s\nOK\n", "Ran 3 tests in 0.1s\nOK\n") == []
    assert output_problems("x.py:3: DeprecationWarning: old\n", "") != []
    assert output_problems("", "django_zerodb: kept in memory only\n") != []
    assert output_problems("SystemCheckError: System check identified some issues:", "")


def check_requirements(line: str) -> None:
    """What a ``pip install`` line names exists: the checkout's extras, and the other
    distributions (installed in the virtualenv running the tests)."""
    extras = configparser.ConfigParser()
    extras.read(ROOT / "setup.cfg")
    known = set(extras["options.extras_require"])
    words = shlex.split(line)
    assert words[:4] == ["python", "-m", "pip", "install"], line
    for word in words[4:]:
        if word.startswith("-"):
            continue
        if word.startswith("$CHECKOUT"):
            named = re.fullmatch(r"\$CHECKOUT(?:\[([\w,-]+)\])?", word)
            assert named, f"{line}: {word}"
            missing = set((named.group(1) or "").split(",")) - known - {""}
            assert not missing, f"{line}: setup.cfg has no extra {missing}"
        else:
            importlib.metadata.version(word)  # PackageNotFoundError if not installed


class Session:
    """A shell session: the working directory and exported variables of the last block."""

    def __init__(self, cwd: Path, env: dict[str, str], state: Path, port: int) -> None:
        self.cwd = cwd
        self.env = env
        self.state = state
        self.port = port
        self.servers: list[tuple[Block, subprocess.Popen, Path]] = []

    def localize(self, text: str) -> str:
        return text.replace(DOC_ADDRESS, f"127.0.0.1:{self.port}")

    def run(self, block: Block, body: str | None = None, quiet: re.Pattern | None = None) -> str:
        """Run ``body`` (default: the block's); ``quiet`` matches stderr lines that are
        the machine's, not the product's."""
        err = self.state / "stderr"
        script = (
            f"{self.localize(block.body if body is None else body)}\n"
            f"pwd > {shlex.quote(str(self.state / 'cwd'))}\n"
            f"env -0 > {shlex.quote(str(self.state / 'env'))}\n"
        )
        with err.open("w") as stderr:
            result = subprocess.run(
                ["bash", "-e", "-o", "pipefail", "-c", script],
                cwd=self.cwd,
                env=self.env,
                stdout=subprocess.PIPE,
                stderr=stderr,
                text=True,
                timeout=600,
                check=False,
            )
        errors = "".join(
            line for line in err.open() if quiet is None or not quiet.fullmatch(line.rstrip("\n"))
        )
        output = result.stdout + errors
        assert result.returncode == 0, f"{block} exited with {result.returncode}:\n{output}"
        problems = output_problems(result.stdout, errors)
        assert not problems, f"{block} warned: {problems}\n{output}"
        self.cwd = Path((self.state / "cwd").read_text().strip())
        pairs = (self.state / "env").read_bytes().decode().split("\0")
        self.env = dict(p.split("=", 1) for p in pairs if "=" in p)
        return output

    def start(self, block: Block) -> None:
        self.stop()
        log = self.state / f"server-{block.line}.log"
        server = subprocess.Popen(
            ["bash", "-e", "-c", f"exec {self.localize(block.body).strip()}"],
            cwd=self.cwd,
            env=self.env,
            stdout=log.open("w"),
            stderr=subprocess.STDOUT,
            start_new_session=True,  # make, python and runserver's reloader: one group
        )
        self.servers.append((block, server, log))
        url = f"http://127.0.0.1:{self.port}{block.arg}"
        deadline = time.monotonic() + 240  # the first `make demo` may install
        while True:
            try:
                urllib.request.urlopen(url, timeout=5).close()
                return
            except urllib.error.HTTPError as error:
                assert error.code < 500, f"{block}: {url} answered {error.code}:\n{log.read_text()}"
                return
            except OSError:
                if server.poll() is not None or time.monotonic() > deadline:
                    raise AssertionError(
                        f"{block}: {url} did not answer:\n{log.read_text()}"
                    ) from None
                time.sleep(0.25)

    def stop(self) -> None:
        for block, server, log in self.servers:
            if server.poll() is None:
                os.killpg(server.pid, signal.SIGTERM)
                try:
                    server.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    os.killpg(server.pid, signal.SIGKILL)
                    server.wait()
            text = log.read_text()
            lines = [line for line in text.splitlines() if not DEV_SERVER_NOTICE.fullmatch(line)]
            problems = output_problems("\n".join(lines), "")
            assert not problems, f"{block}: the server warned: {problems}\n{text}"
        self.servers = []


def run_tutorial(tmp_path: Path, *, fresh_virtualenv: bool) -> None:
    blocks = parse(TUTORIAL.read_text())
    home = tmp_path / "home"
    state = tmp_path / "state"
    home.mkdir()
    state.mkdir()
    port = free_port()
    env = clean_env(
        HOME=str(home),
        HRSITE_VAR_DIR=str(tmp_path / "demo-var"),
        DEMO_ARGS=f"--addr 127.0.0.1:{port} --employees 300",
        PYTHONWARNINGS="default",
    )
    env.pop("VIRTUAL_ENV", None)
    env.pop("MAKEFLAGS", None)
    env.pop("MAKELEVEL", None)
    session = Session(ROOT, env, state, port)
    demo_var = ROOT / "example_project" / "var"
    before = sorted(demo_var.rglob("*")) if demo_var.exists() else None
    output = None
    ARTIFACTS.mkdir(exist_ok=True)
    transcript = (ARTIFACTS / "tutorial-transcript.txt").open("w")
    try:
        for block in blocks:
            if block.kind == "sh venv":
                output = session.run(block, *venv_block(block, fresh_virtualenv))
                transcript.write(f"$ {block.body.strip()}\n{output}\n")
            elif block.kind == "sh":
                output = session.run(block)
                transcript.write(f"$ {block.body.strip()}\n{output}\n")
            elif block.kind == "sh server":
                session.start(block)
                output = None
            elif block.kind in ("text output", "json output"):
                assert output is not None, f"{block}: no sh block before it"
                matches(block.body, output, block)
            else:
                path = session.cwd / block.arg
                with path.open("a" if block.kind == "python append" else "w") as f:
                    f.write(block.body)
        project = home / "zerodb-tutorial"
        assert (project / "notebook.zdb").exists()
        check_admin(f"http://127.0.0.1:{port}")
        check_tests_need_no_passphrase(project, session.env)
    finally:
        transcript.close()
        session.stop()
    # `make demo` ran on the temporary var dir: the checkout's is as it was.
    assert (sorted(demo_var.rglob("*")) if demo_var.exists() else None) == before


# The pip configuration of some machines names local indexes that do not exist; pip says
# so on every install. That is the machine's, not the package's.
# pip's "[notice] A new release of pip is available" is about pip too.
PIP_MACHINE_NOTICE = re.compile(r"WARNING: Location '[^']*' is ignored: .*|\[notice\] .*")


def venv_block(block: Block, fresh: bool) -> tuple[str, re.Pattern | None]:
    """The ``sh venv`` block as run: literally in a fresh virtualenv (pip's own
    deprecation warnings silenced: they are pip's), else on the tests' virtualenv."""
    lines = []
    for line in block.body.splitlines():
        if " -m venv " in line:
            if not fresh:  # the virtualenv of this test run, as the tutorial's
                line = f"ln -s {shlex.quote(sys.prefix)} {line.split()[-1]}"
        elif line.startswith("python -m pip install "):
            if fresh:
                line = f"PYTHONWARNINGS= {line}"
            else:
                check_requirements(line)
                continue
        lines.append(line)
    return "\n".join(lines), PIP_MACHINE_NOTICE if fresh else None


def test_the_tutorial(tmp_path):
    run_tutorial(tmp_path, fresh_virtualenv=False)


@pytest.mark.slow
def test_the_tutorial_in_a_fresh_virtualenv(tmp_path):
    """``make tutorial``: section 2's virtualenv and ``pip install`` for real (the
    package index or the pip configuration's mirrors must be reachable)."""
    run_tutorial(tmp_path, fresh_virtualenv=True)


def check_tests_need_no_passphrase(project: Path, env: dict[str, str]) -> None:
    """Section 8 says so: the tests run in a shell where ``ZERODB_PASSPHRASE`` is unset."""
    env = {k: v for k, v in env.items() if k != "ZERODB_PASSPHRASE"}
    result = subprocess.run(
        ["python", "-m", "pytest", "-q", "-p", "no:cacheprovider"],
        cwd=project,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    assert not output_problems(result.stdout, result.stderr), output


def check_admin(base: str) -> None:
    """The tutorial project's admin, logged in as its superuser."""
    jar = http.cookiejar.CookieJar()
    opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(jar))
    opener.open(f"{base}/admin/login/").read()
    token = next(c.value for c in jar if c.name == "csrftoken")
    data = urllib.parse.urlencode(
        {
            "username": "admin",
            "password": "pick-a-better-one",
            "csrfmiddlewaretoken": token,
            "next": "/admin/",
        }
    ).encode()
    request = urllib.request.Request(
        f"{base}/admin/login/", data=data, headers={"Referer": f"{base}/admin/login/"}
    )
    index = opener.open(request).read().decode()
    assert "Site administration" in index and "/admin/zerodb/" in index, index[:3000]
    notes = opener.open(f"{base}/admin/notes/note/?q=kernel").read().decode()
    assert "2 results" in notes and "Kernel notes" in notes and "Groceries" not in notes
    store = opener.open(f"{base}/admin/zerodb/").read().decode()
    assert "notes.Note" in store and "notebook.zdb" in store
    assert "correct horse" not in store  # never the passphrase

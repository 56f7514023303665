"""Child processes of the example-project and browser tests: their environment, a free
port, and a run that fails the test with the child's output when it fails."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path


def clean_env(**extra: str) -> dict[str, str]:
    """A child's environment: none of this run's pytest, Django or demo variables, the
    fast (test-only) KDF, no bytecode written into the work tree."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("PYTEST_", "DJANGO_", "ZERODB_", "HRSITE_"))
    }
    env["ZERODB_KDF"] = "fast"
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    env.update(extra)
    return env


def free_port() -> int:
    """A loopback TCP port nothing listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_python(
    *args: str, cwd: Path, env: dict[str, str], timeout: float = 120
) -> subprocess.CompletedProcess:
    """``python *args``; the test fails with both outputs if it exits non-zero."""
    result = subprocess.run(
        [sys.executable, *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    assert result.returncode == 0, (
        f"{' '.join(args)} exited with {result.returncode}\n"
        f"--- stdout\n{result.stdout}\n--- stderr\n{result.stderr}"
    )
    return result

"""Running ``statectl`` as a user does, in a fresh process, and checking what it printed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.helpers.fixtures import ROOT


def run(*args: str, check_rc: int | None = 0) -> subprocess.CompletedProcess:
    """``statectl ARGS``; its exit code checked unless ``check_rc`` is None."""
    proc = subprocess.run(
        [sys.executable, "-m", "statectl.cli", *args], capture_output=True, text=True, timeout=120
    )
    if check_rc is not None:
        assert proc.returncode == check_rc, proc.stderr + proc.stdout
    return proc


def assert_one_line_error(proc: subprocess.CompletedProcess, *needles: str) -> None:
    """Exit code 2 and one ``statectl: error:`` line, no traceback, holding every needle."""
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("statectl: error: ")
    assert "Traceback" not in proc.stderr
    for n in needles:
        assert n in lines[0], lines[0]


def cli_json(*args: str, rc: int = 0) -> dict:
    """``statectl ARGS --json``, its exit code checked, its document parsed."""
    proc = subprocess.run(
        [sys.executable, "-m", "statectl.cli", *args, "--json"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == rc, proc.stderr + proc.stdout
    return json.loads(proc.stdout)


def cli(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    """``statectl ARGS`` from the repository root, ``env`` added to the environment."""
    return subprocess.run(
        [sys.executable, "-m", "statectl.cli", *args],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})},
        cwd=str(ROOT),
    )


def run_cli(
    *args: str, cwd: Path | None = None, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "statectl.cli", *args],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=cwd,
        env={**(os.environ if env is None else env), "PYTHONPATH": str(ROOT)},
    )


def peak_rss_of_cli(args: list[str]) -> float:
    """Peak RSS (MB) of ``statectl ARGS`` in a fresh process (with ``--workers 1`` the process
    is the tree)."""
    script = (
        "import json, resource, subprocess, sys\n"
        "subprocess.run([sys.executable, '-m', 'statectl.cli', *sys.argv[1:]], check=True,"
        " stdout=subprocess.DEVNULL)\n"
        "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", script, *args],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        check=True,
    )
    return float(out.stdout.strip().splitlines()[-1])

"""The CLI with only the base dependencies installed, as a user's fresh ``pip install statectl``.

The test extras pull in packages (click through moto, pandas, pyspark) that a user does not
have; an import of one of them in the CLI once turned every usage error into a traceback while
the suite stayed green. This test builds a venv from pyproject.toml's base dependencies alone.
"""

from __future__ import annotations

import fcntl
import os
import subprocess
import venv
from pathlib import Path

import pytest

from tests.helpers.fixtures import FIXTURES, ROOT

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def base_venv(tmp_path_factory) -> Path:
    """Built once per run: pytest-xdist's workers share the session's base directory, so the
    first to get here builds the venv under a lock and the other waits for it (a second pip
    install would cost as much again)."""
    base = tmp_path_factory.getbasetemp()
    shared = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base
    where = shared / "base-venv"
    with open(shared / "base-venv.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        if not (where / "built").exists():
            _build(where)
            (where / "built").touch()
    return where


def _build(where: Path) -> None:
    venv.EnvBuilder(with_pip=True, clear=True).create(where)
    python = where / "bin" / "python"
    proc = subprocess.run(
        [str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check", str(ROOT)],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]


def _run(venv_dir: Path, *args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "STATECTL"))}
    return subprocess.run(
        [str(venv_dir / "bin" / "statectl"), *args],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        cwd=venv_dir,  # not the repository: nothing from the work tree may be imported
    )


def test_the_venv_has_no_test_extras(base_venv):
    for module in ("click", "pyspark", "pandas", "moto"):
        proc = subprocess.run(
            [str(base_venv / "bin" / "python"), "-c", f"import {module}"], capture_output=True
        )
        assert proc.returncode != 0, f"{module} is installed in the base venv"


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        ((), "Usage: statectl"),
        (("nosuchcommand",), "No such command"),
        (("inspect",), "Missing argument"),
        (("inspect", "--nosuchflag", "x"), "No such option"),
        (("export", str(FIXTURES / "agg-hdfs"), "-o", "x.parquet", "--batch", "abc"), "--batch"),
    ],
)
def test_usage_errors_exit_2_without_traceback(base_venv, args, needle):
    proc = _run(base_venv, *args)
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr + proc.stdout
    assert needle in proc.stderr + proc.stdout


def test_help_and_a_real_command_work(base_venv):
    assert _run(base_venv, "--help").returncode == 0
    proc = _run(base_venv, "inspect", str(FIXTURES / "agg-hdfs"))
    assert proc.returncode == 0, proc.stderr
    assert "stateStoreSave" in proc.stdout


def test_bad_input_is_one_line_exit_2(base_venv, tmp_path):
    proc = _run(base_venv, "inspect", str(tmp_path / "nope"))
    assert proc.returncode == 2
    assert proc.stderr.startswith("statectl: error: ")
    assert len(proc.stderr.strip().splitlines()) == 1
    # A relative path is named as written (it came back absolute).
    assert _run(base_venv, "inspect", "nope").stderr == "statectl: error: nope: no such directory\n"


def test_restore_help_reads_at_80_columns(base_venv):
    """What tests/test_cli_help.py checks, with only the base dependencies."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "STATECTL"))}
    proc = subprocess.run(
        [str(base_venv / "bin" / "statectl"), "restore", "--help"],
        capture_output=True,
        text=True,
        timeout=120,
        env={**env, "COLUMNS": "80"},
        cwd=base_venv,
    )
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert max(len(line) for line in lines) <= 80 and "…" not in proc.stdout
    assert "--allow-non-restored-state" in proc.stdout and "<list[str]>" not in proc.stdout
    assert "What to restore:" in lines and "Usage: statectl restore [OPTIONS] TARGET" in lines


def test_a_full_stdout_is_one_line_with_base_dependencies(base_venv):
    with open("/dev/full", "w") as full:
        proc = subprocess.run(
            [str(base_venv / "bin" / "statectl"), "inspect", str(FIXTURES / "agg-hdfs"), "--json"],
            stdout=full,
            stderr=subprocess.PIPE,
            text=True,
            timeout=120,
            cwd=base_venv,
        )
    assert proc.returncode == 2
    assert proc.stderr == "statectl: error: standard output: No space left on device\n"

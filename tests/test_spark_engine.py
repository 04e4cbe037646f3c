"""The Spark engine (statectl/spark_engine.py): partition tasks as Spark tasks.

The Spark engine must give the very savepoint the local engine gives (same data files, byte for
byte, and the same ``_metadata`` apart from its creation time), on the session-scoped ``local[2]``
session and on ``local-cluster`` (separate executor JVMs and Python workers); an executor that
cannot import statectl is one clean line, exit 2.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import FIXTURES

import statectl
from statectl.engine import Engine
from statectl.errors import MissingFileError, StatectlError
from statectl.spark_engine import _guarded, _unwrap, engine_for, parse_spark_confs

ROOT = Path(__file__).resolve().parent.parent


def _cli(
    *args: str, env: dict[str, str] | None = None, cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "statectl", *args],
        capture_output=True,
        text=True,
        timeout=900,
        env={**os.environ, **(env or {})},
        cwd=cwd,
    )


def _contents(sp: str) -> tuple[dict, dict[str, str]]:
    """A savepoint's _metadata without what differs between two runs, and its files' sha256."""
    root = Path(sp.removeprefix("file://"))
    meta = json.loads((root / "_metadata").read_text())
    for volatile in ("created_at", "metadata_sha256"):
        meta.pop(volatile)
    files = {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*.parquet"))
    }
    return meta, files


# -- fast: the engine plumbing ---------------------------------------------------------------


def test_spark_conf_pairs_are_parsed_and_checked() -> None:
    assert parse_spark_confs(["spark.master=local[2]", "a.b=x=y"]) == {
        "spark.master": "local[2]",
        "a.b": "x=y",
    }
    with pytest.raises(StatectlError, match="KEY=VALUE"):
        parse_spark_confs(["spark.master"])
    with pytest.raises(StatectlError, match="--engine must be one of local, spark"):
        engine_for("dask")


def test_engines_share_one_task_protocol() -> None:
    """Use cases hand zero-argument tasks to ``run`` of either engine; results in job order."""
    import functools

    jobs = [functools.partial(abs, -j) for j in range(40)]
    assert list(Engine.of(workers=2).run(jobs)) == list(range(40))
    assert list(Engine.of(workers=1).run(jobs[:2])) == [0, 1]
    assert engine_for("local", workers=3).workers == 3


def test_task_errors_cross_back_as_the_same_class() -> None:
    """What a Spark task raises on purpose is raised on the driver as the same error class (the
    savepoint's retry on a file deleted by maintenance depends on MissingFileError)."""

    def fails(job: int) -> int:
        if job == 1:
            raise MissingFileError("state version 4 needs 4.delta", "/ck/state/0/1")
        if job == 2:
            raise ValueError("a bug")
        return job

    run = _guarded(fails)
    assert _unwrap(run((0, 0))) == 0
    with pytest.raises(MissingFileError, match=r"/ck/state/0/1: state version 4 needs 4\.delta"):
        _unwrap(run((1, 1)))
    with pytest.raises(RuntimeError, match="a Spark task failed: ValueError: a bug"):
        _unwrap(run((2, 2)))


def test_cli_refuses_spark_conf_without_the_spark_engine(tmp_path: Path) -> None:
    p = _cli("savepoint", str(FIXTURES / "agg-hdfs"), str(tmp_path), "--spark-conf", "a=b")
    assert p.returncode == 2, p.stderr
    assert p.stderr.strip() == "statectl: error: --spark-conf needs --engine spark (or auto)"
    p = _cli("savepoint", str(FIXTURES / "agg-hdfs"), str(tmp_path), "--engine", "dask")
    assert p.returncode == 2 and "--engine must be one of local, spark" in p.stderr


# -- Spark: the same savepoint as the local engine ---------------------------------------------


@pytest.mark.spark
@pytest.mark.parametrize("name", ["agg-hdfs", "join-rocksdb", "tws-rocksdb", "multi-hdfs"])
def test_spark_engine_savepoint_equals_local(spark, tmp_path: Path, name: str) -> None:
    local = statectl.savepoint(str(FIXTURES / name), str(tmp_path / "local"))
    on_spark = statectl.savepoint(str(FIXTURES / name), str(tmp_path / "spark"), spark=spark)
    assert _contents(on_spark.path) == _contents(local.path)
    assert on_spark.operators == local.operators and sum(local.operators.values()) > 0


@pytest.mark.spark
def test_spark_engine_on_a_local_cluster_equals_local(tmp_path: Path) -> None:
    """Separate executor processes (local-cluster: a master, 2 workers, their own JVMs and
    Python workers) read the checkpoint and write the data files; the driver writes _metadata."""
    src = str(FIXTURES / "agg-rocksdb-changelog")
    local = _cli("savepoint", src, str(tmp_path / "local"), "--json")
    assert local.returncode == 0, local.stderr
    p = _cli(
        "savepoint",
        src,
        str(tmp_path / "cluster"),
        "--json",
        "--engine",
        "spark",
        "--spark-conf",
        "spark.master=local-cluster[2,1,1024]",
        "--spark-conf",
        "spark.ui.enabled=false",
    )
    assert p.returncode == 0, p.stderr
    assert p.stderr == ""  # the JVM's start-up noise and progress bars stay out of the terminal
    assert _contents(json.loads(p.stdout)["path"]) == _contents(json.loads(local.stdout)["path"])


@pytest.mark.spark
def test_executors_without_statectl_fail_fast_with_one_line(tmp_path: Path) -> None:
    """Executors whose Python cannot import statectl: exit 2, one line that says how to ship it,
    and no savepoint directory left behind."""
    shadow = tmp_path / "shadow" / "statectl"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text("raise ImportError('No module named statectl')\n")
    worker_python = tmp_path / "python-without-statectl"
    worker_python.write_text(
        f'#!/bin/sh\nPYTHONPATH="{shadow.parent}" exec "{sys.executable}" "$@"\n'
    )
    worker_python.chmod(0o755)
    out = tmp_path / "sp"
    p = _cli(
        "savepoint",
        str(FIXTURES / "agg-hdfs"),
        str(out),
        "--engine",
        "spark",
        "--spark-conf",
        "spark.master=local[1]",
        "--spark-conf",
        "spark.ui.enabled=false",
        env={"PYSPARK_PYTHON": str(worker_python)},  # what PySpark starts its workers with
        cwd=tmp_path,  # not the repository: its statectl/ would be importable from the cwd
    )
    assert p.returncode == 2, p.stderr
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1, p.stderr
    assert "a Spark executor cannot import statectl" in lines[0]
    assert "spark.archives" in lines[0]
    assert not out.exists() or not list(out.rglob("_metadata"))

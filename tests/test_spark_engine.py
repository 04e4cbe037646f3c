"""The Spark engine (statectl/spark_engine.py): partition tasks as Spark tasks.

The Spark engine must give the very savepoint the local engine gives (same data files, byte for
byte, and the same ``_metadata`` apart from its creation time), on the session-scoped ``local[2]``
session and on ``local-cluster`` (separate executor JVMs and Python workers); an executor that
cannot import statectl is one clean line, exit 2.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import statectl
from statectl.engine import Engine
from statectl.errors import MissingFileError, StatectlError
from statectl.spark_engine import _guarded, _unwrap, engine_for, parse_spark_confs
from tests.helpers.fixtures import FIXTURES
from tests.helpers.restore import (
    assert_exactly_once,
    assert_same_checkpoint,
    savepoint_contents,
    synthetic_savepoint,
)
from tests.helpers.spark import CLUSTER, run, write_input

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


def test_both_engines_are_state_engines() -> None:
    """Callers hold a ``StateEngine`` and ask it, never which class it is: the local engine and
    the Spark engine (built here on no session: nothing of Spark's is called) both are one, and
    ``engine_for`` hands an engine back as it is."""
    from statectl.engine import is_state_engine
    from statectl.spark_engine import SparkEngine

    local, on_spark = Engine.of(memory="64M", workers=2), SparkEngine(spark=None)
    for engine in (local, on_spark):
        assert is_state_engine(engine)
        assert engine_for(engine) is engine
    assert not is_state_engine("local") and not is_state_engine(object())
    assert (local.name, local.runs_locally, local.per_task) == ("local", True, 32 << 20)
    assert (on_spark.name, on_spark.runs_locally) == ("spark", False)


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
    # Restore's stages: the error inside Spark's error text, path and hint kept apart (the driver
    # rebuilds the path's URL), brackets and newlines in the message included.
    from statectl.errors import CorruptFileError
    from statectl.spark_engine import _marked, _reraise

    sent = CorruptFileError("bad [block] ]x\nend", "/sp/operators/a/part-0.parquet", "re-take it")
    spark_text = f"Py4JJavaError: ...\nTraceback...\nRuntimeError: {_marked(sent)}\n\tat ..."
    with pytest.raises(CorruptFileError) as got:
        _reraise(RuntimeError(spark_text))
    assert (str(got.value), got.value.path, got.value.hint) == (str(sent), sent.path, sent.hint)


def test_storage_and_os_errors_in_tasks_are_the_users_not_bugs() -> None:
    """An executor that cannot reach the object store, or misses a file, fails the command with
    the line a local run prints (exit 2), not as a bug in statectl; a file's path is shown as
    the URL the driver opened it under (an executor has only s3fs's "bucket/key")."""
    from botocore.exceptions import EndpointConnectionError

    from statectl.errors import describe_failure, register_url_root
    from statectl.spark_engine import _marked, _reraise, _user_error

    unreachable = EndpointConnectionError(endpoint_url="http://minio.internal:9000/lake")
    missing = FileNotFoundError(2, "No such file or directory", "unit-lake/ck/state/0/1/2.delta")

    def fails(job: int) -> int:
        raise unreachable if job == 0 else missing

    run = _guarded(fails)
    with pytest.raises(StatectlError) as got:
        _unwrap(run((0, 0)))
    assert describe_failure(got.value) == describe_failure(unreachable)
    assert "cannot reach the storage endpoint" in str(got.value)
    register_url_root("unit-lake/ck", lambda p: f"s3://{p}")  # what the driver's FileIO did
    for outcome in (lambda: _unwrap(run((1, 1))), lambda: _reraise(_marked(_user_error(missing)))):
        with pytest.raises(StatectlError) as got:
            outcome()
        assert str(got.value) == "s3://unit-lake/ck/state/0/1/2.delta: No such file or directory"


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
    assert savepoint_contents(on_spark.path) == savepoint_contents(local.path)
    assert on_spark.operators == local.operators and sum(local.operators.values()) > 0
    # --memory is each Spark task's budget: 2000 bytes streams every partition in chunks and
    # spills in the executor's own temporary directory, with the same result.
    tiny = statectl.savepoint(
        str(FIXTURES / name), str(tmp_path / "tiny"), spark=spark, memory=2000
    )
    local_tiny = statectl.savepoint(
        str(FIXTURES / name), str(tmp_path / "local-tiny"), memory=2000, workers=1
    )
    assert savepoint_contents(tiny.path) == savepoint_contents(local_tiny.path)
    assert tiny.operators == local.operators
    assert tiny.to_dict()["engine"] == "spark"


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
    assert savepoint_contents(json.loads(p.stdout)["path"]) == savepoint_contents(
        json.loads(local.stdout)["path"]
    )


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


# -- --engine auto -------------------------------------------------------------------------------


def test_auto_picks_spark_only_for_large_state_with_a_session_at_hand(monkeypatch) -> None:
    from statectl.spark_engine import (
        DEFAULT_AUTO_THRESHOLD,
        SparkEngine,
        active_session,
        choose_engine,
    )

    huge, small = (lambda: 1 << 40), (lambda: 1 << 20)
    # A session active in this process is "at hand" (another test's, when one ran here first);
    # with none and no master there is nothing to run on.
    active = active_session() is not None
    assert choose_engine(None, {}, huge) == ("spark" if active else "local")
    master = {"spark.master": "local-cluster[2,1,1024]"}
    assert choose_engine(None, master, small) == "local"  # small: a cluster's start-up costs more
    assert choose_engine(None, master, huge) == "spark"
    assert choose_engine(object(), {}, lambda: DEFAULT_AUTO_THRESHOLD) == "spark"
    monkeypatch.setenv("STATECTL_SPARK_THRESHOLD", "1000000")  # bytes
    assert choose_engine(None, master, small) == "spark"
    assert isinstance(engine_for("auto", state_bytes=huge), SparkEngine if active else Engine)


def test_cli_auto_without_a_session_runs_locally_and_says_so(tmp_path: Path) -> None:
    sp = _cli("savepoint", str(FIXTURES / "agg-hdfs"), str(tmp_path / "sp"), "--json")
    assert sp.returncode == 0, sp.stderr
    url = json.loads(sp.stdout)["path"]
    assert json.loads(sp.stdout)["engine"] == "local"
    p = _cli("restore", str(tmp_path / "ck"), "-s", url, "--engine", "auto", "--json")
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["engine"] == "local"
    out = tmp_path / "x.parquet"
    p = _cli("export", url, "-o", str(out), "--operator", "0", "--engine", "auto", "--json")
    assert p.returncode == 0 and json.loads(p.stdout)["engine"] == "local", p.stderr
    p = _cli("migrate", str(FIXTURES / "agg-hdfs"), str(tmp_path / "m"), "--spark-conf", "a=b")
    assert p.returncode == 2
    assert p.stderr.strip() == "statectl: error: --spark-conf needs --engine spark (or auto)"


# -- Spark: restore, migrate and export equal the local engine's -----------------------------------


@pytest.mark.spark
@pytest.mark.parametrize(
    ("name", "backend", "changelog", "partitions", "memory"),
    [
        ("agg-hdfs", "hdfs", False, 3, None),
        ("multi-hdfs", "rocksdb", True, 4, None),
        ("agg-ckptv2-rocksdb-changelog", "rocksdb", False, 3, None),
        ("join-hdfs", "rocksdb", False, 3, None),
        # Column families are encoded on the driver, a partition spilled to its local disk:
        # whole, or (a tiny budget) a chunk at a time.
        ("tws-rocksdb", "rocksdb", False, 3, None),
        ("tws-rocksdb", "rocksdb", False, 3, 2000),
        ("join4-rocksdb", "rocksdb", False, 3, 2000),
    ],
)
def test_spark_engine_restore_equals_local(
    spark, tmp_path, name, backend, changelog, partitions, memory
):

    sp = statectl.savepoint(str(FIXTURES / name), str(tmp_path / "sp"))
    args = {"backend": backend, "partitions": partitions, "changelog": changelog}
    local = statectl.restore(sp, str(tmp_path / "local"), **args)
    on_spark = statectl.restore(
        sp, str(tmp_path / "spark"), **args, engine="spark", spark=spark, memory=memory
    )
    assert local.to_dict()["engine"] == "local" and on_spark.to_dict()["engine"] == "spark"
    assert_same_checkpoint(tmp_path / "local", tmp_path / "spark", tmp_path)


@pytest.mark.spark
@pytest.mark.parametrize(
    ("name", "selection"),
    [("agg-hdfs", {}), ("join-rocksdb", {"join_side": "right"}), ("tws-rocksdb", {"timers": True})],
)
def test_spark_engine_export_equals_local(spark, tmp_path, name, selection) -> None:
    import pyarrow.parquet as pq

    sp = statectl.savepoint(str(FIXTURES / name), str(tmp_path / "sp"))
    for i, src in enumerate((str(FIXTURES / name), sp.path)):
        a = statectl.api.export(src, str(tmp_path / f"l{i}.parquet"), **selection)
        b = statectl.api.export(src, str(tmp_path / f"s{i}.parquet"), **selection, spark=spark)
        assert (a["engine"], b["engine"]) == ("local", "spark") and a["rows"] > 0
        assert pq.read_table(tmp_path / f"s{i}.parquet").equals(
            pq.read_table(tmp_path / f"l{i}.parquet")
        )


@pytest.mark.spark
def test_spark_engine_restore_on_a_local_cluster_continues_exactly(spark, tmp_path: Path) -> None:
    """Separate executors spill, shuffle and build the stores (HDFS -> RocksDB, 2 -> 3
    partitions); the checkpoint equals the local engine's, and the query continues on it as
    if never stopped. Migrate runs its savepoint and restore on the cluster too."""

    d = tmp_path / "input"
    write_input(d, 0, 3)
    first = run(spark, "agg", d, tmp_path / "ck1", "hdfs")
    sp = statectl.savepoint(str(tmp_path / "ck1"), str(tmp_path / "sp"))
    statectl.restore(sp, str(tmp_path / "local"), backend="rocksdb", partitions=3)
    target = ["--backend", "rocksdb", "--partitions", "3", "--engine", "spark", *CLUSTER]
    p = _cli("restore", str(tmp_path / "ck2"), "-s", sp.path, *target, "--json")
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["engine"] == "spark"
    assert_same_checkpoint(tmp_path / "local", tmp_path / "ck2", tmp_path)
    m = _cli("migrate", str(tmp_path / "ck1"), str(tmp_path / "mig"), *target, "--json")
    assert m.returncode == 0, m.stderr
    assert json.loads(m.stdout)["engine"] == "spark"
    assert_same_checkpoint(tmp_path / "local", tmp_path / "mig", tmp_path)

    write_input(d, 3, 2)
    continued = run(spark, "agg", d, tmp_path / "ck2")
    full = run(spark, "agg", d, tmp_path / "ck3", "hdfs")
    assert any(continued.values())
    assert_exactly_once(first, continued, full)


@pytest.mark.spark
def test_killed_spark_engine_restore_leaves_nothing_complete(tmp_path: Path) -> None:
    """SIGKILL to the CLI's process group (the driver, its JVM, the cluster) while the build
    stage writes the stores: the target is marked unfinished (Spark refuses to start on it), a
    plain re-run refuses it, and a re-run with --overwrite restores what the local engine does."""
    import signal
    import time

    from statectl.in_progress import read_in_progress

    sp = synthetic_savepoint(tmp_path / "src", 200_000)
    target = tmp_path / "ck"
    argv = ["restore", str(target), "-s", sp, "--backend", "rocksdb", "--partitions", "4"]
    proc = subprocess.Popen(
        [sys.executable, "-m", "statectl", *argv, "--engine", "spark", *CLUSTER],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,  # its own process group, as bench/fuzz.py's kill family
    )
    deadline = time.monotonic() + 600
    try:
        # Mid-way: the target is marked and the executors have started writing state files.
        while time.monotonic() < deadline and proc.poll() is None:
            state = target / "state"
            if state.is_dir() and any(p.is_file() for p in state.rglob("*")):
                break
            time.sleep(0.02)
        assert proc.poll() is None, "the restore finished before it could be killed"
        os.killpg(proc.pid, signal.SIGKILL)
    finally:
        proc.wait()
    assert read_in_progress(statectl.io.FileIO.for_url(str(target))[0], str(target)) is not None
    assert not (target / "commits").exists() or not any((target / "commits").iterdir())
    again = _cli(*argv, "--engine", "spark", *CLUSTER)
    assert again.returncode == 2 and "unfinished restore" in again.stderr, again.stderr
    again = _cli(*argv, "--engine", "spark", *CLUSTER, "--overwrite", "--json")
    assert again.returncode == 0, again.stderr
    assert json.loads(again.stdout)["engine"] == "spark"
    local = _cli("restore", str(tmp_path / "local"), *argv[2:])
    assert local.returncode == 0, local.stderr
    assert_same_checkpoint(tmp_path / "local", target, tmp_path)

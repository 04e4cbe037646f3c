"""What a careful new user still hit in the second hour (issue 25): a dry run that passes where
the restore fails, a failed restore that leaves a marked target, interrupted runs that exit
silently or leak temporary directories, and stdout that cannot be written. Each is checked as
the user meets it: ``statectl`` in a subprocess."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import pytest

from tests.helpers.cli import assert_one_line_error, run, run_cli
from tests.helpers.fixtures import FIXTURES


@pytest.fixture(scope="module")
def savepoints(tmp_path_factory) -> dict[str, pathlib.Path]:
    """A canonical and a native savepoint of agg-hdfs (read-only for the tests)."""
    where = tmp_path_factory.mktemp("second-hour")
    out = {}
    for kind in ("canonical", "native"):
        info = json.loads(
            run(
                "savepoint", str(FIXTURES / "agg-hdfs"), str(where / kind), "--type", kind, "--json"
            ).stdout
        )
        out[kind] = pathlib.Path(info["path"].removeprefix("file://"))
    return out


def _damaged_copy(src: pathlib.Path, dst: pathlib.Path, suffix: str) -> pathlib.Path:
    """A copy of savepoint ``src`` whose first data file ending in ``suffix`` is truncated."""
    subprocess.run(["cp", "-r", str(src), str(dst)], check=True)
    victim = sorted(p for p in dst.rglob(f"*{suffix}") if p.is_file() and p.stat().st_size > 0)[0]
    data = victim.read_bytes()
    victim.write_bytes(data[: len(data) // 2])
    return victim


def test_dry_run_fails_where_the_restore_fails_and_the_restore_leaves_nothing(savepoints, tmp_path):
    sp = tmp_path / "sp"
    victim = _damaged_copy(savepoints["canonical"], sp, ".parquet")
    target = tmp_path / "target"
    dry = run("restore", "-s", str(sp), str(target), "--dry-run", check_rc=None)
    assert_one_line_error(dry, victim.name, "damaged")
    assert not target.exists()
    real = run("restore", "-s", str(sp), str(target), check_rc=None)
    assert_one_line_error(real, victim.name, "damaged")
    assert not target.exists(), "a failed restore left something where nothing was"
    target.mkdir()  # an empty directory given as the target stays an empty directory
    assert_one_line_error(run("restore", "-s", str(sp), str(target), check_rc=None), "damaged")
    assert target.is_dir() and list(target.iterdir()) == []
    # Under --json the dry run's failure is the error document, exit 2.
    doc = json.loads(
        run("restore", "-s", str(sp), str(target), "--dry-run", "--json", check_rc=2).stdout
    )
    assert doc["exit_code"] == 2 and victim.name in doc["error"]


def test_a_damaged_native_savepoint_is_refused_before_anything_is_written(savepoints, tmp_path):
    """A native savepoint's files are copied as they are: the restore verifies them first (it
    used to copy a damaged file into a checkpoint Spark then failed on)."""
    sp = tmp_path / "sp"
    victim = _damaged_copy(savepoints["native"], sp, ".delta")
    target = tmp_path / "target"
    for extra in (("--dry-run",), ()):
        proc = run("restore", "-s", str(sp), str(target), *extra, check_rc=None)
        assert_one_line_error(proc, victim.name)
        assert not target.exists()


def test_the_dry_run_of_a_sound_savepoint_passes_naming_paths_as_written(savepoints, tmp_path):
    sp = str(savepoints["canonical"])
    proc = run_cli("restore", "-s", sp, "target", "--dry-run", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    # As the user wrote them: not file:///.../target.
    assert proc.stdout.startswith(f"Would restore {sp} -> target ("), proc.stdout
    assert not (tmp_path / "target").exists()


def test_a_refused_plan_is_not_headed_would_restore(savepoints, tmp_path):
    target = tmp_path / "target"
    target.mkdir()
    (target / "something").write_text("x")
    sp = str(savepoints["canonical"])
    proc = run("restore", "-s", sp, str(target), "--dry-run", check_rc=2)
    assert proc.stdout.startswith("Cannot restore"), proc.stdout
    assert "not empty" in proc.stderr


@pytest.fixture(scope="module")
def damaged_checkpoint(tmp_path_factory) -> pathlib.Path:
    """agg-hdfs with partition 1's last delta truncated (its checksum file removed): partition
    0 exports first, so the failure comes with an output file half written."""
    ck = tmp_path_factory.mktemp("damaged") / "ck"
    subprocess.run(["cp", "-r", str(FIXTURES / "agg-hdfs"), str(ck)], check=True)
    part = ck / "state" / "0" / "1"
    last = max(part.glob("*.delta"), key=lambda p: int(p.stem))
    last.write_bytes(last.read_bytes()[:30])
    for crc in part.glob(".*.crc"):
        crc.unlink()
    return ck


@pytest.mark.parametrize(
    ("fmt", "as_json"), [("parquet", False), ("parquet", True), ("csv", False)]
)
def test_export_of_damaged_state_is_one_line_and_json_keeps_stderr_clean(
    damaged_checkpoint, tmp_path, fmt, as_json
):
    out = tmp_path / f"out.{fmt}"
    args = ("export", str(damaged_checkpoint), "-o", str(out))
    if as_json:
        proc = run(*args, "--json", check_rc=2)
        assert proc.stderr == ""
        assert "4.delta" in json.loads(proc.stdout)["error"]
    else:  # no "Exception ignored in: ParquetWriter.__del__" after the line
        assert_one_line_error(run(*args, check_rc=None), "4.delta")
    assert not out.exists()


@pytest.fixture(scope="module")
def big_rocksdb(tmp_path_factory) -> dict[str, pathlib.Path]:
    """A savepoint of agg-rocksdb's query with 150,000 keys, and its restore as a RocksDB
    checkpoint at 4 partitions: large enough that two workers spend seconds in their
    temporary RocksDB directories."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    import statectl

    where = tmp_path_factory.mktemp("big")
    base = statectl.open(str(FIXTURES / "agg-rocksdb"))
    (op,) = base.operators
    key_type, value_type = (op.tables[0].schema.field(c).type for c in ("key", "value"))
    ids = pa.array(np.arange(150_000, dtype=np.int64))
    ones = pa.array(np.ones(len(ids), dtype=np.int64))
    key = pa.StructArray.from_arrays(
        [pc.binary_join_element_wise("key-", pc.cast(ids, pa.string()), "")], fields=list(key_type)
    )
    value = pa.StructArray.from_arrays(
        [ones, ids, pc.cast(ids, pa.float64()), ones], fields=list(value_type)
    )
    batch = pa.RecordBatch.from_arrays([key, value], names=["key", "value"])
    sp = where / "sp"
    statectl.SavepointWriter.from_savepoint(base).with_state(op.uid, iter([batch])).write(str(sp))
    ck = where / "ck"
    statectl.restore(str(sp), str(ck), backend="rocksdb", partitions=4)
    return {"savepoint": sp, "checkpoint": ck}


def _interrupt_when_workers_write(args: list[str], tmp: pathlib.Path, how: str):
    """``statectl ARGS --workers 2`` with its own TMPDIR, interrupted (``how``: SIGTERM to the
    process, or SIGINT to its process group as Ctrl-C in a terminal sends it) once a worker is
    inside a temporary RocksDB directory."""
    import signal
    import time

    tmp.mkdir()
    proc = subprocess.Popen(
        [sys.executable, "-m", "statectl.cli", *args, "--workers", "2"],
        env={**os.environ, "TMPDIR": str(tmp)},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    deadline = time.monotonic() + 120
    while not list(tmp.rglob("statectl-rocksdb-*")):
        assert proc.poll() is None, f"finished before it could be interrupted: {proc.stderr}"
        assert time.monotonic() < deadline
        time.sleep(0.002)
    if how == "SIGTERM":
        proc.send_signal(signal.SIGTERM)
    else:
        os.killpg(proc.pid, signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    return proc.returncode, err


def test_sigterm_of_a_restore_says_what_it_left_and_leaks_no_temporary_directory(
    big_rocksdb, tmp_path
):
    target = tmp_path / "target"
    rc, err = _interrupt_when_workers_write(
        ["restore", "-s", str(big_rocksdb["savepoint"]), str(target), "--partitions", "4"],
        tmp_path / "tmp",
        "SIGTERM",
    )
    assert rc == 143, err
    (line,) = err.strip().splitlines()
    assert line.startswith("statectl: terminated") and "--overwrite" in line, line
    assert str(target) in line and "unfinished restore" in line
    assert list((tmp_path / "tmp").iterdir()) == []
    assert (target / "metadata").read_text().startswith("STATECTL_RESTORE_IN_PROGRESS")


def test_ctrl_c_of_a_savepoint_of_rocksdb_state_leaks_no_temporary_directory(big_rocksdb, tmp_path):
    rc, err = _interrupt_when_workers_write(
        ["savepoint", str(big_rocksdb["checkpoint"]), str(tmp_path / "sps")],
        tmp_path / "tmp",
        "SIGINT",
    )
    assert rc == 130, err
    assert err.strip().splitlines()[-1].startswith("statectl: interrupted"), err
    assert "Traceback" not in err
    assert list((tmp_path / "tmp").iterdir()) == []


def _with_stdout(stdout: int, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "statectl.cli", *args],
        stdout=stdout,
        stderr=subprocess.PIPE,
        text=True,
        timeout=120,
    )


@pytest.mark.parametrize("as_json", [True, False], ids=["json", "text"])
def test_a_full_stdout_is_one_line_on_stderr_and_exit_2(as_json):
    """``> /dev/full``: the write fails with ENOSPC (the error object used to be written to
    the same failing stdout, raising again: a traceback and exit 1)."""
    with open("/dev/full", "w") as full:
        proc = _with_stdout(
            full.fileno(), "inspect", str(FIXTURES / "agg-hdfs"), *(["--json"] if as_json else [])
        )
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr == "statectl: error: standard output: No space left on device\n"


@pytest.mark.parametrize("as_json", [True, False], ids=["json", "text"])
def test_a_closed_pipe_is_a_quiet_conventional_exit(as_json):
    """``| head -1`` that already went away: exit 141 (128 + SIGPIPE) and nothing on stderr
    (it used to be exit 1, silently, or a traceback)."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        proc = _with_stdout(write_end, "list", str(FIXTURES), *(["--json"] if as_json else []))
    finally:
        os.close(write_end)
    assert (proc.returncode, proc.stderr) == (141, "")


def test_storage_option_after_the_command_is_taken_as_before_it(tmp_path):
    (tmp_path / "empty").mkdir()
    run("list", str(tmp_path / "empty"), "--storage-option", "anon=true")
    # --debug too: the traceback, then the same line and exit code.
    proc = run("inspect", str(tmp_path / "missing"), "--debug", check_rc=2)
    assert "Traceback" in proc.stderr and proc.stderr.endswith("missing: no such directory\n")
    run("list", str(tmp_path / "empty"), "--storage-option=anon=true")
    proc = run("list", str(tmp_path / "empty"), "--storage-option", "bad", check_rc=None)
    assert_one_line_error(proc, "--storage-option must look like KEY=VALUE")


def test_backend_names_are_taken_in_any_case(savepoints, tmp_path):
    doc = json.loads(
        run(
            "restore", "-s", str(savepoints["canonical"]), str(tmp_path / "t"),
            "--backend", "RocksDB", "--dry-run", "--json",
        ).stdout
    )  # fmt: skip
    assert doc["backend"] == "rocksdb"


def test_query_file_imports_a_module_beside_it(savepoints, tmp_path):
    """``--query jobs/job.py:build`` from elsewhere: ``import sibling`` in job.py works, as
    under ``python jobs/job.py``. The sibling raises on import, so the check needs no Spark:
    the error names the sibling's exception, not ``No module named 'sibling'``."""
    jobs = tmp_path / "jobs"
    jobs.mkdir()
    (jobs / "statectl_sibling_x.py").write_text("raise RuntimeError('the sibling was imported')\n")
    (jobs / "job.py").write_text("import statectl_sibling_x\n\ndef build(spark):\n    pass\n")
    proc = run(
        "restore", "-s", str(savepoints["canonical"]), str(tmp_path / "t"),
        "--query", f"{jobs / 'job.py'}:build", "--dry-run", check_rc=None,
    )  # fmt: skip
    assert_one_line_error(proc, "RuntimeError: the sibling was imported")


def test_restore_from_a_missing_savepoint_says_no_such_directory(tmp_path):
    proc = run("restore", "-s", str(tmp_path / "missing"), str(tmp_path / "t"), check_rc=None)
    assert_one_line_error(proc, "missing: no such directory")


def test_json_lines_and_csv_write_timestamps_alike_in_iso_8601(tmp_path):
    """agg-types has a TIMESTAMP and a TIMESTAMP_NTZ grouping column: JSON lines wrote
    ``2024-01-01 00:00:01+00:00``, CSV ``2024-01-01 00:00:01.000000Z``."""
    src = str(FIXTURES / "agg-types-hdfs")
    run("export", src, "-o", str(tmp_path / "s.jsonl"))
    run("export", src, "-o", str(tmp_path / "s.csv"))
    rows = [json.loads(line) for line in (tmp_path / "s.jsonl").read_text().splitlines()]
    import csv

    with open(tmp_path / "s.csv", newline="") as f:
        table = list(csv.DictReader(f))
    assert [r["key"]["ts"] for r in rows] == [r["key.ts"] for r in table]
    assert [r["key"]["tsn"] for r in rows] == [r["key.tsn"] for r in table]
    assert rows[1]["key"]["ts"] == "2024-01-01T00:00:01+00:00"
    assert rows[1]["key"]["tsn"] == "2024-01-01T00:00:01"


def test_stats_and_diff_show_keys_as_json_not_python_reprs():
    window = str(FIXTURES / "window-hdfs")
    stats = run("inspect", window, "--stats").stdout
    diff = run("diff", window, str(FIXTURES / "agg-hdfs")).stdout
    for out in (stats, diff):
        assert "datetime.datetime" not in out and "ZoneInfo" not in out, out
        assert "2024-01-01T00:00:50+00:00" in out, out
    assert stats.startswith(f"{window} (batch")  # the path as typed, not file://
    assert diff.startswith(f"A {window} (batch")


def test_cli_errors_name_cli_options_not_api_arguments(tmp_path):
    proc = run(
        "export", str(FIXTURES / "agg-hdfs"), "-o", str(tmp_path / "x.csv"), "--store", "nope",
        check_rc=None,
    )  # fmt: skip
    assert_one_line_error(proc, "--store")
    assert "table=" not in proc.stderr


def test_list_reports_a_truncated_delta_as_damaged(tmp_path):
    """Issue 25 item 7: `list` said `ok` for a checkpoint whose latest delta was truncated
    (its health only checked that files exist); `inspect` refused it."""
    import shutil

    shutil.copytree(FIXTURES / "agg-hdfs", tmp_path / "a")
    shutil.copytree(FIXTURES / "agg-hdfs", tmp_path / "b")
    delta = tmp_path / "a" / "state" / "0" / "0" / "4.delta"
    delta.write_bytes(delta.read_bytes()[:20])
    proc = subprocess.run(
        [sys.executable, "-m", "statectl.cli", "list", str(tmp_path), "--json"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    entries = {pathlib.PurePath(e["path"]).name: e for e in json.loads(proc.stdout)}
    assert entries["b"]["problems"] == []
    (problem,) = entries["a"]["problems"]
    assert "4.delta" in problem and "checksum" in problem


def _error_line(proc: subprocess.CompletedProcess) -> str:
    assert_one_line_error(proc)
    return proc.stderr.strip().removeprefix("statectl: error: ")


def test_paths_in_errors_are_as_the_user_wrote_them(savepoints, damaged_checkpoint, tmp_path):
    """Issue 25 item 7: errors (and inspect) named paths absolute or as ``file://`` URLs.
    Relative paths, run from the directory they are relative to."""

    def cli_here(*args: str) -> subprocess.CompletedProcess:
        return run_cli(*args, cwd=tmp_path)

    assert _error_line(cli_here("inspect", "missing")) == "missing: no such directory"
    # A damaged savepoint's file, named under the savepoint as typed (not /tmp/.../sp/...),
    # in the --json error document too.
    victim = _damaged_copy(savepoints["canonical"], tmp_path / "sp", ".parquet")
    rel = victim.relative_to(tmp_path).as_posix()
    line = _error_line(cli_here("restore", "-s", "sp", "target"))
    assert line.startswith(f"{rel}: has "), line
    # Output too: inspect's heading printed the absolute path.
    assert cli_here("inspect", "sp").stdout.startswith("Savepoint sp\n")
    doc = json.loads(cli_here("restore", "-s", "sp", "target", "--dry-run", "--json").stdout)
    assert doc["path"] == rel and doc["error"].startswith(f"{rel}: has "), doc
    # A truncated delta under a relative checkpoint directory; ./ kept as written.
    subprocess.run(["cp", "-r", str(damaged_checkpoint), str(tmp_path / "ck")], check=True)
    line = _error_line(cli_here("export", "./ck", "-o", "out.csv"))
    assert line.startswith("./ck/state/0/1/4.delta: truncated"), line
    # A refused plan's problem names the target as typed (it was file:///.../target).
    (tmp_path / "target").mkdir()
    (tmp_path / "target" / "x").write_text("x")
    proc = cli_here("restore", "-s", str(savepoints["canonical"]), "target")
    assert proc.returncode == 2
    (line,) = proc.stderr.splitlines()
    assert line.startswith("statectl: error: target: the target exists and is not empty"), line


def test_edit_of_one_join_store_is_refused_in_the_command_lines_terms():
    """It said ``filter on ...: ... (remove_operator)``: the Python API's names."""
    proc = run(
        "edit", str(FIXTURES / "join-hdfs"), "--operator", "0", "--table", "left-keyToNumValues",
        "--delete-where", "key.field0 = 'a'", "--dry-run", check_rc=None,
    )  # fmt: skip
    assert_one_line_error(proc, "edit on symmetricHashJoin-", "--drop leaves the whole join out")
    assert "remove_operator" not in proc.stderr and "filter" not in proc.stderr


CHANGED_KEYS = """
import pyspark.sql.functions as F


def _events(spark):
    return spark.readStream.schema("id long, k string, v long, ts timestamp").json({input!r})


def _aggregates():
    return F.count("*").alias("cnt"), F.sum("v").alias("total"), F.avg("v").alias("mean")


def renamed(spark):
    return _events(spark).withColumnRenamed("k", "user").groupBy("user").agg(*_aggregates())


def by_expression(spark):
    return _events(spark).groupBy(F.length("k")).agg(*_aggregates())
"""


def _statectl_in_this_process(*args: str) -> tuple[int, str, str]:
    """``statectl ARGS`` run by main() in the test process, so ``--query`` plans with the
    session's SparkSession (a fresh process would start a JVM per command); its wording
    switch stays in a copied context."""
    import contextlib
    import contextvars
    import io

    from statectl import cli

    out, err = io.StringIO(), io.StringIO()
    argv, sys.argv = sys.argv, ["statectl", *args]
    rc: object = 0
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            contextvars.copy_context().run(cli.main)
    except SystemExit as e:
        rc = e.code or 0
    finally:
        sys.argv = argv
    return int(rc), out.getvalue(), err.getvalue()  # type: ignore[call-overload]


@pytest.mark.spark
def test_query_plans_list_renamed_keys_and_refuse_in_the_users_terms(spark, savepoints, tmp_path):
    """Issue 25 item 7: a renamed grouping column was matched by position with nothing in
    the plan (or listed twice); a refusal showed Spark's internal ``_groupingexpression`` and
    ran to 420 characters. agg-hdfs groups by ``k``."""
    jobs = tmp_path / "jobs.py"
    jobs.write_text(CHANGED_KEYS.format(input=str(tmp_path / "no-input")))
    sp = str(savepoints["canonical"])
    import statectl

    (uid,) = (op.uid for op in statectl.open(sp).operators)
    note = f"uid {uid}: key field 0 (user): renamed k -> user, matched by position"
    restore = ("restore", "-s", sp, str(tmp_path / "t"), "--dry-run", "--query")
    rc, out, err = _statectl_in_this_process(*restore, f"{jobs}:renamed")
    assert rc == 0, err
    assert out.splitlines().count(f"  evolved: {note}") == 1, out
    rc, out, err = _statectl_in_this_process(*restore, f"{jobs}:renamed", "--json")
    assert rc == 0 and json.loads(out)["evolved"] == [note], out
    rc, out, err = _statectl_in_this_process(*restore, f"{jobs}:by_expression")
    assert rc == 2 and out.startswith("Cannot restore"), out + err
    (line,) = [ln for ln in err.splitlines() if ln.startswith("statectl: error:")]
    assert "key field 0 (length(k)): string in the savepoint, integer in the query" in line
    assert "_groupingexpression" not in err and f"--drop {uid} -n" in line
    assert len(line) <= 250, (len(line), line)  # it was 420

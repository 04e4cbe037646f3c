"""Restore planning: a dry run refuses exactly what the real run refuses; a restore writes only
inside its target; an interrupted restore or migrate is visible, refused by Spark and statectl,
and replaced with --overwrite; native savepoints restore as a copy."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from statectl.checkpoint.model import Checkpoint
from statectl.errors import StatectlError
from statectl.inspection import inspect_path, list_dir
from statectl.restoration import (
    MAX_SOURCE_LOG_FILES,
    restore,
    source_log_layout,
)
from statectl.savepoints.create import take_savepoint
from statectl.savepoints.format import seal
from statectl.state import Selection, read_state
from tests.helpers.cli import cli
from tests.helpers.fixtures import FIXTURES
from tests.helpers.restore import assert_exactly_once
from tests.helpers.rows import arrow_rows
from tests.helpers.spark import run, write_input

ROOT = Path(__file__).resolve().parent.parent


def files_under(d: Path) -> set[str]:
    return {str(p.relative_to(d)) for p in d.rglob("*")}


def crafted(tmp_path: Path, url: str, name: str, edit) -> str:
    """A copy of the savepoint at ``url`` with its _metadata edited by ``edit(dict)``."""
    src = Path(url.removeprefix("file://"))
    dst = tmp_path / name
    shutil.copytree(src, dst)
    meta = json.loads((dst / "_metadata").read_text())
    edit(meta)
    (dst / "_metadata").write_text(json.dumps(seal(meta)))  # crafted: sealed again
    return str(dst)


@pytest.fixture(scope="module")
def savepoints(tmp_path_factory):
    d = tmp_path_factory.mktemp("sps")
    agg, _ = take_savepoint(str(FIXTURES / "agg-hdfs"), str(d / "agg"))
    tws, _ = take_savepoint(str(FIXTURES / "tws-rocksdb"), str(d / "tws"))
    return {"agg": agg, "tws": tws}


def _set_op(key, value):
    def edit(meta):
        meta["operators"][0][key] = value

    return edit


def _set_table_name(meta):
    meta["operators"][0]["tables"][0]["name"] = "../../../outside"


def _set_source(meta):
    meta["source_logs"] = {"../../outside": meta["source_logs"]["0"]}


def _set_batch_id(meta):
    meta["source_logs"]["0"][-1]["batchId"] = 3_000_000


def _set_offset_log(meta):
    meta["offset_log_version"] = 3


# (case, savepoint edit or None, extra args, target kind, expected message)
REFUSALS = [
    ("non-empty", None, [], "busy", "is not empty; refusing to overwrite it (--overwrite"),
    ("a file", None, [], "file", "exists and is a file"),
    ("a checkpoint", None, [], "checkpoint", "is a Spark checkpoint; refusing to overwrite"),
    ("inside the savepoint", None, [], "in-savepoint", "is inside the savepoint"),
    ("offset log v3", _set_offset_log, [], "new", "offset log v3 is not supported"),
    ("backend", None, ["--backend", "cassandra"], "new", "--backend must be hdfs or rocksdb"),
    ("partitions 0", None, ["--partitions", "0"], "new", "--partitions must be at least 1, got 0"),
    ("partitions -2", None, ["--partitions=-2"], "new", "--partitions must be at least 1"),
    ("tws on hdfs", None, ["--backend", "hdfs"], "new-tws", "restores only to RocksDB"),
    ("unknown uid", None, ["--map", "nope=1"], "new", "--map names uids the savepoint does not"),
    (
        "operator id",
        _set_op("operator_id", "../../outside/X"),
        [],
        "new",
        "operator_id",
    ),
    ("table name", _set_table_name, [], "new", "table name"),
    ("source name", _set_source, [], "new", "source log name '../../outside'"),
    ("batch id", _set_batch_id, [], "new", "has batchId 3000000; a file source's batch ids"),
    ("checkpoint as -s", None, [], "from-checkpoint", "use `statectl migrate CHECKPOINT TARGET`"),
]


@pytest.mark.parametrize(
    ("case", "edit", "args", "kind", "message"), REFUSALS, ids=[r[0] for r in REFUSALS]
)
def test_dry_run_refuses_exactly_what_the_restore_refuses(
    tmp_path, savepoints, case, edit, args, kind, message
):
    sp = savepoints["tws" if kind == "new-tws" else "agg"]
    if edit is not None:
        sp = crafted(tmp_path, sp, "crafted", edit)
    target = tmp_path / "target"
    if kind == "busy":
        target.mkdir()
        (target / "notes.txt").write_text("mine")
    elif kind == "file":
        target.write_text("mine")
    elif kind == "checkpoint":
        shutil.copytree(FIXTURES / "agg-hdfs", target)
    elif kind == "in-savepoint":
        target = Path(sp.removeprefix("file://")) / "live"
    elif kind == "from-checkpoint":
        sp = str(FIXTURES / "agg-hdfs")
    before = files_under(tmp_path)
    outcomes = []
    for dry in (["--dry-run"], []):
        proc = cli("restore", "-s", sp, str(target), *args, *dry)
        errors = [ln for ln in proc.stderr.splitlines() if ln.startswith("statectl: error:")]
        assert proc.returncode == 2, (case, proc.stdout, proc.stderr)
        assert "Traceback" not in proc.stderr, proc.stderr
        assert any(message in e for e in errors), (case, proc.stderr)
        outcomes.append((proc.returncode, errors))
        # Nothing written, anywhere: not in the target, not outside it.
        assert files_under(tmp_path) == before, case
    assert outcomes[0] == outcomes[1]


def test_an_accepted_dry_run_writes_and_the_restore_succeeds(tmp_path, savepoints):
    target = tmp_path / "t"
    proc = cli("restore", "-s", savepoints["agg"], str(target), "--dry-run", "--json")
    assert proc.returncode == 0 and json.loads(proc.stdout)["ok"] and not target.exists()
    proc = cli("restore", "-s", savepoints["agg"], str(target), "--json")
    assert proc.returncode == 0, proc.stderr
    assert Checkpoint.open(str(target)).latest_committed_batch is not None
    # Restoring again refuses and names the flag (which does not replace a real checkpoint).
    again = cli("restore", "-s", savepoints["agg"], str(target), "--overwrite")
    assert again.returncode == 2 and "Spark checkpoint; refusing to overwrite it" in again.stderr


def test_source_logs_stay_bounded_however_long_the_query_ran():
    entries = [{"path": f"file:/in/{b}.json", "timestamp": 0, "batchId": b} for b in range(35)]
    files = source_log_layout(entries, previous_offset=33)
    # The compaction at or before batch 34, then every later batch: what Spark's cleanup leaves.
    assert [n for n, _ in files] == ["29.compact", "30", "31", "32", "33", "34"]
    assert len(files[0][1]) == 30 and [e["batchId"] for e in files[-1][1]] == [34]
    # A query that ran 3 million batches still restores with a handful of files.
    far = [{"path": "file:/in/x.json", "timestamp": 0, "batchId": 3_000_000}]
    assert len(source_log_layout(far, previous_offset=2_999_999)) <= 10
    # An implausible previous offset would need many files: planning refuses it.
    assert len(source_log_layout(far, previous_offset=0)) > MAX_SOURCE_LOG_FILES


def test_migrate_and_restore_refuse_targets_inside_their_source(tmp_path, savepoints):
    ck = tmp_path / "ck"
    shutil.copytree(FIXTURES / "agg-hdfs", ck)
    before = files_under(tmp_path)
    proc = cli("migrate", str(ck), str(ck / "migrated"))
    assert proc.returncode == 2 and "inside the source checkpoint" in proc.stderr
    sp = Path(savepoints["agg"].removeprefix("file://"))
    proc = cli("restore", "-s", str(sp), str(sp / "live"))
    assert proc.returncode == 2 and "inside the savepoint" in proc.stderr
    # Whatever the savepoint records, a target inside a checkpoint or another savepoint.
    proc = cli("restore", "-s", str(sp), str(ck / "state" / "restored"))
    assert proc.returncode == 2 and "inside the Spark checkpoint" in proc.stderr
    other, _ = take_savepoint(str(FIXTURES / "dedup-hdfs"), str(tmp_path / "other"))
    before = files_under(tmp_path)
    proc = cli("restore", "-s", str(sp), other + "/x/y")
    assert proc.returncode == 2 and "inside the savepoint" in proc.stderr
    assert files_under(tmp_path) == before and not (sp / "live").exists()


def test_native_savepoint_with_its_own_backend_and_partitions_restores(tmp_path):
    url, meta = take_savepoint(str(FIXTURES / "agg-ckptv2-rocksdb"), str(tmp_path), kind="native")
    plan = restore(url, str(tmp_path / "ck"))
    assert not plan.problems
    src = Checkpoint.open(str(FIXTURES / "agg-ckptv2-rocksdb"))
    dst = Checkpoint.open(str(tmp_path / "ck"))
    assert dst.latest_committed_batch == meta.batch_id
    assert dst.checkpoint_format_version(meta.batch_id) == 2
    assert arrow_rows(read_state(dst, Selection(0))) == arrow_rows(read_state(src, Selection(0)))
    other = restore(url, str(tmp_path / "ck3"), partitions=3)
    assert other.problems and "convert it first" in other.problems[0]


# -- interrupted restores -----------------------------------------------------------------
def interrupt_after_state(monkeypatch, error: type[BaseException] = KeyboardInterrupt):
    """Stop write_restore once the state is written, before the logs: interrupted (Ctrl-C, as
    a crash leaves it too: the marked target stays), or failing with ``error`` (an Exception:
    the restore removes the target it created)."""
    import statectl.restoration.write as w

    def boom(*_a, **_k):
        raise error("simulated interruption")

    monkeypatch.setattr(w, "write_source_logs", boom)


def test_a_failed_restore_removes_the_target_it_created(tmp_path, savepoints, monkeypatch):
    target = tmp_path / "ck"
    with monkeypatch.context() as m:
        interrupt_after_state(m, RuntimeError)
        with pytest.raises(RuntimeError):
            restore(savepoints["agg"], str(target))
    assert not target.exists()


def test_an_interrupted_restore_is_reported_refused_and_overwritable(
    tmp_path, savepoints, monkeypatch
):
    target = tmp_path / "ck"
    with monkeypatch.context() as m:
        interrupt_after_state(m)
        with pytest.raises(KeyboardInterrupt):
            restore(savepoints["agg"], str(target))
    assert (target / "state").is_dir()
    assert (target / "metadata").read_text().startswith("STATECTL_RESTORE_IN_PROGRESS\n")
    [entry] = list_dir(str(tmp_path))
    assert entry["health"] == "interrupted" and "in progress or interrupted" in entry["problems"][0]
    with pytest.raises(StatectlError, match="restore in progress or interrupted"):
        inspect_path(str(target))
    proc = cli("inspect", str(target))
    assert proc.returncode == 2 and "--overwrite" in proc.stderr
    refused = cli("restore", "-s", savepoints["agg"], str(target))
    assert refused.returncode == 2 and "pass --overwrite to replace it" in refused.stderr
    ok = cli("restore", "-s", savepoints["agg"], str(target), "--overwrite")
    assert ok.returncode == 0, ok.stderr
    ck = Checkpoint.open(str(target))
    src = Checkpoint.open(str(FIXTURES / "agg-hdfs"))
    assert ck.query_id == src.query_id
    assert arrow_rows(read_state(ck, Selection(0))) == arrow_rows(read_state(src, Selection(0)))
    assert list_dir(str(tmp_path))[0]["health"] == "ok"


KILLED = """
import os, signal, sys
import statectl.restoration.write as r
orig = r.write_operator
SIG = getattr(signal, sys.argv[1])
def crash(*a, **k):
    orig(*a, **k)
    os.kill(os.getpid(), SIG)
r.write_operator = crash
sys.argv = ["statectl", *sys.argv[2:]]
from statectl.cli import main
main()
"""


@pytest.mark.parametrize("sig", ["SIGKILL", "SIGTERM"])
def test_a_killed_migrate_leaves_no_savepoint_behind(tmp_path, sig):
    target = tmp_path / "m"
    tmpdir = tmp_path / "tmpdir"
    tmpdir.mkdir()
    script = tmp_path / "killed.py"
    script.write_text(KILLED)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TMPDIR": str(tmpdir)}
    args = [sys.executable, str(script), sig, "migrate", str(FIXTURES / "multi-hdfs"), str(target)]
    proc = subprocess.run(args, capture_output=True, text=True, env=env)
    assert proc.returncode == (-9 if sig == "SIGKILL" else 143), proc.stderr
    left = list(tmpdir.iterdir())
    if sig == "SIGKILL":  # no clean-up ran: at most the run's scratch directory, which the
        # next statectl run removes (its process is gone)
        assert len(left) <= 1 and all(p.name.startswith("statectl-run-") for p in left), left
        subprocess.run([sys.executable, "-m", "statectl.cli", "--version"], env=env, check=True)
        left = list(tmpdir.iterdir())
    assert not left  # nothing in the temp directory
    assert (target / "metadata").read_text().startswith("STATECTL_RESTORE_IN_PROGRESS\n")
    leftovers = list((target / ".statectl-tmp").glob("savepoint-*"))
    # kill -9 runs no clean-up: the savepoint is inside the marked target, which --overwrite
    # replaces. SIGTERM runs the finally blocks: it is gone.
    assert len(leftovers) == (1 if sig == "SIGKILL" else 0)
    assert list_dir(str(tmp_path))[0]["health"] == "interrupted"
    again = cli("migrate", str(FIXTURES / "multi-hdfs"), str(target))
    assert again.returncode == 2 and "--overwrite" in again.stderr
    ok = cli("migrate", str(FIXTURES / "multi-hdfs"), str(target), "--overwrite", "--json")
    assert ok.returncode == 0, ok.stderr
    assert not (target / ".statectl-tmp").exists()
    assert Checkpoint.open(str(target)).operator_ids() == [0, 1]


KILLED_MARKING = """
import os, signal, sys
from fsspec.implementations.local import LocalFileSystem
orig = LocalFileSystem.mv
def mv(self, src, dst, *a, **k):
    if os.path.basename(src).startswith(".metadata."):
        os.kill(os.getpid(), signal.SIGKILL)  # the marker's temporary is written, not renamed
    return orig(self, src, dst, *a, **k)
LocalFileSystem.mv = mv
sys.argv = ["statectl", *sys.argv[1:]]
from statectl.cli import main
main()
"""


@pytest.mark.parametrize("command", ["restore", "migrate"])
def test_killed_while_marking_the_target_is_overwritable(tmp_path, savepoints, command):
    """kill -9 between writing the marker's temporary and renaming it leaves a directory with
    only that temporary: reported as an unfinished restore, refused, replaced by --overwrite."""
    target = tmp_path / "out"
    script = tmp_path / "killed.py"
    script.write_text(KILLED_MARKING)
    args = (
        ["restore", str(target), "-s", savepoints["agg"]]
        if command == "restore"
        else ["migrate", str(FIXTURES / "agg-hdfs"), str(target)]
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, str(script), *args], capture_output=True, env=env)
    assert proc.returncode == -9
    [left] = list(target.iterdir())
    assert left.name.startswith(".metadata.") and left.name.endswith(".tmp")
    again = cli(*args)
    assert again.returncode == 2 and "stopped while marking the target" in again.stderr
    assert "--overwrite" in again.stderr
    ok = cli(*args, "--overwrite")
    assert ok.returncode == 0, ok.stderr
    assert sorted(p.name for p in target.iterdir() if p.name.startswith(".")) == []
    ck = Checkpoint.open(str(target))
    src = Checkpoint.open(str(FIXTURES / "agg-hdfs"))
    assert arrow_rows(read_state(ck, Selection(0))) == arrow_rows(read_state(src, Selection(0)))


# -- with Spark ---------------------------------------------------------------------------
@pytest.mark.spark
def test_spark_refuses_an_interrupted_restore_and_continues_after_overwrite(
    spark, tmp_path, monkeypatch
):
    d = tmp_path / "input"
    write_input(d, 0, 3)
    first = run(spark, "agg", d, tmp_path / "ck1", "hdfs")
    sp_url, meta = take_savepoint(str(tmp_path / "ck1"), str(tmp_path / "sp"))
    with monkeypatch.context() as m:
        interrupt_after_state(m)
        with pytest.raises(KeyboardInterrupt):
            restore(sp_url, str(tmp_path / "ck2"), backend="rocksdb", partitions=3)
    write_input(d, 3, 2)
    # Spark reads metadata first and fails on the marker, instead of starting from scratch.
    with pytest.raises(Exception, match="STATECTL_RESTORE_IN_PROGRESS"):
        run(spark, "agg", d, tmp_path / "ck2")
    assert not (tmp_path / "ck2" / "offsets").exists()  # Spark wrote nothing there
    plan = restore(sp_url, str(tmp_path / "ck2"), backend="rocksdb", partitions=3, overwrite=True)
    assert not plan.problems
    continued = run(spark, "agg", d, tmp_path / "ck2")
    full = run(spark, "agg", d, tmp_path / "ck3", "hdfs")
    assert all(b > meta.batch_id for b in continued) and any(continued.values())
    assert_exactly_once(first, continued, full)


@pytest.mark.spark
def test_long_source_log_restores_compacted_and_continues(spark, tmp_path):
    """12 file-source batches (a compaction at 9): the restore writes 9.compact, 10, 11 only,
    and the query continues exactly once."""
    d = tmp_path / "input"
    write_input(d, 0, 12)
    first = run(spark, "agg", d, tmp_path / "ck1", "hdfs")
    sp_url, meta = take_savepoint(str(tmp_path / "ck1"), str(tmp_path / "sp"))
    restore(sp_url, str(tmp_path / "ck2"), backend="rocksdb")
    assert sorted(os.listdir(tmp_path / "ck2" / "sources" / "0")) == ["10", "11", "9.compact"]
    write_input(d, 12, 2)
    continued = run(spark, "agg", d, tmp_path / "ck2")
    full = run(spark, "agg", d, tmp_path / "ck3", "hdfs")
    assert all(b > meta.batch_id for b in continued) and any(continued.values())
    assert_exactly_once(first, continued, full)


@pytest.mark.spark
def test_native_savepoint_restore_continues(spark, tmp_path):
    d = tmp_path / "input"
    write_input(d, 0, 3)
    first = run(spark, "agg", d, tmp_path / "ck1", "rocksdb")
    sp_url, meta = take_savepoint(str(tmp_path / "ck1"), str(tmp_path / "sp"), kind="native")
    assert not restore(sp_url, str(tmp_path / "ck2")).problems
    write_input(d, 3, 2)
    continued = run(spark, "agg", d, tmp_path / "ck2")
    full = run(spark, "agg", d, tmp_path / "ck3", "rocksdb")
    assert all(b > meta.batch_id for b in continued) and any(continued.values())
    assert_exactly_once(first, continued, full)


CHANGED = """
import pyspark.sql.functions as F

EVENTS = "id long, k string, v long, ts timestamp"
INPUT = {input!r}  # does not exist: CI has no production input
KEY = {key!r}


def src(spark):
    return spark.readStream.schema(EVENTS).option("maxFilesPerTrigger", 1).json(INPUT)


def agg_types(spark, key=KEY):
    df = src(spark).selectExpr(*key, "case when v = 4 then null else v end as maybe")
    keys = [c for c in df.columns if c != "maybe"]
    return df.groupBy(*keys).agg(F.count("*").alias("cnt"), F.max("maybe").alias("mx"))


def retyped(spark):
    key = [k.replace("cast(v * 1000 as int) end as i", "cast(v * 1000 as string) end as i")
           for k in KEY]
    assert key != KEY
    return agg_types(spark, key)


def broken(spark):
    df = src(spark)
    return df.groupBy("nope").count()


def raises(spark):
    x = {{}}
    return x["missing"]
"""


def changed_queries(tmp_path: Path) -> Path:
    sys.path.insert(0, str(ROOT / "fixtures"))
    try:
        from generate import AGG_TYPES_KEY
    finally:
        sys.path.remove(str(ROOT / "fixtures"))
    q = tmp_path / "changed.py"
    q.write_text(CHANGED.format(input=str(tmp_path / "no" / "such" / "input"), key=AGG_TYPES_KEY))
    return q


@pytest.mark.spark
def test_query_dry_run_without_source_data(spark, tmp_path):
    """The unchanged query plans although its input directory does not exist; the output mode
    is inferred (update: an aggregation without watermark) and checked by Spark's rules."""
    q = changed_queries(tmp_path)
    sp_url, meta = take_savepoint(str(FIXTURES / "agg-types-hdfs"), str(tmp_path / "sp"))
    plan = restore(sp_url, str(tmp_path / "ck"), query=f"{q}:agg_types", spark=spark, dry_run=True)
    assert not plan.problems, plan.problems
    assert plan.restored == {meta.operators[0].uid: 0} and not plan.started_empty
    assert not (tmp_path / "no").exists() and not (tmp_path / "ck").exists()
    with pytest.raises(
        StatectlError,
        match=r"in append output mode: .*not supported for streaming aggregations without watermark",
    ):
        restore(
            sp_url, str(tmp_path / "ck"), query=f"{q}:agg_types", spark=spark, output_mode="append"
        )
    # Errors in the user's function: one line naming the user's file and line.
    with pytest.raises(StatectlError) as e:
        restore(sp_url, str(tmp_path / "ck"), query=f"{q}:raises", spark=spark, dry_run=True)
    line = next(i for i, t in enumerate(q.read_text().splitlines(), 1) if 'x["missing"]' in t)
    assert str(e.value).startswith(f"{q}:{line}: ") and "KeyError" in str(e.value)
    with pytest.raises(StatectlError, match="UNRESOLVED_COLUMN") as e:
        restore(sp_url, str(tmp_path / "ck"), query=f"{q}:broken", spark=spark, dry_run=True)
    assert "\n" not in str(e.value)


@pytest.mark.spark
def test_changed_key_type_is_named_and_not_offered_n(tmp_path):
    """The grouping key `i` cast to string: the plan names the field, offers no -n, and starts
    nothing empty; through the CLI, in a fresh process (JVM start, no log noise)."""
    q = changed_queries(tmp_path)
    sp_url, meta = take_savepoint(str(FIXTURES / "agg-types-hdfs"), str(tmp_path / "sp"))
    proc = cli(
        "restore", "-s", sp_url, str(tmp_path / "ck"), "--query", f"{q}:retyped", "--dry-run"
    )
    assert proc.returncode == 2, proc.stderr
    errors = [ln for ln in proc.stderr.splitlines() if ln.startswith("statectl: error:")]
    assert len(errors) == 1, proc.stderr
    assert "field 3 (i): integer in the savepoint, string in the query" in errors[0]
    assert "-n (--allow" not in proc.stderr and f"--drop {meta.operators[0].uid} -n" in errors[0]
    assert "starts with empty state" not in proc.stdout
    assert "starting Spark to plan the query" in proc.stderr
    noise = [ln for ln in proc.stderr.splitlines() if not ln.startswith("statectl: ")]
    assert not noise, noise
    assert not (tmp_path / "ck").exists()


@pytest.mark.parametrize("fmt", [2, 3, 4])
def test_a_join_savepoint_pinning_avro_encoding_is_refused_with_sparks_reason(tmp_path, fmt):
    """Spark 4.3 refuses Avro state encoding for stream-stream joins at every join state
    format (checked with a real query: "State store encoding format as avro is not supported
    for operator=join"), so a join savepoint that pins it was not written by Spark as it is:
    refused at plan time, whatever --join-state-format says."""
    url, _ = take_savepoint(str(FIXTURES / "join3-rocksdb"), str(tmp_path / "sp"))

    def avro(meta):
        meta["pinned_confs"]["spark.sql.streaming.stateStore.encodingFormat"] = "avro"

    sp = crafted(tmp_path, url, "avro", avro)
    plan = restore(sp, str(tmp_path / "ck"), dry_run=True, join_state_format=fmt)
    assert any("Avro state encoding is not supported for joins" in p for p in plan.problems)
    p = cli("restore", str(tmp_path / "ck"), "-s", sp, "--join-state-format", str(fmt))
    assert p.returncode == 2 and "refuses to run" in p.stderr
    assert not (tmp_path / "ck").exists()

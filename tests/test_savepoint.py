"""Savepoints: taken from every fixture, equal to the checkpoint's state, relocatable, atomic."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from statectl.checkpoint.model import Checkpoint
from statectl.errors import StatectlError
from statectl.savepoints.create import default_uid, take_savepoint
from statectl.savepoints.store import Savepoint
from statectl.state import Selection, read_state
from tests.helpers.fixtures import FIXTURES, load_manifest
from tests.helpers.reads import selection
from tests.helpers.rows import arrow_rows, spark_rows

FIXTURE_NAMES = sorted({fx["name"] for fx in load_manifest() if fx.get("reads")})


def tree_digest(root: Path) -> dict[str, str]:
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


@pytest.fixture(scope="module")
def savepoints(tmp_path_factory):
    """One savepoint per fixture, taken once for the module."""
    target = tmp_path_factory.mktemp("savepoints")
    out = {}
    for name in FIXTURE_NAMES:
        url, _ = take_savepoint(str(FIXTURES / name), str(target))
        out[name] = url
    return out


@pytest.mark.parametrize("name", FIXTURE_NAMES)
def test_savepoint_equals_checkpoint_state(savepoints, name):
    """Every read Spark can do on the checkpoint gives the same rows from the savepoint."""
    fx = next(f for f in load_manifest() if f["name"] == name)
    sp = Savepoint.open(savepoints[name])
    ckpt = Checkpoint.open(str(FIXTURES / name))
    assert sp.metadata.batch_id == ckpt.latest_committed_batch
    assert sp.metadata.query_id == ckpt.query_id
    for read in fx["reads"]:
        sel = selection(read)
        ours = sp.read(sel, read["operatorId"])
        theirs = read_state(ckpt, sel)
        assert ours.schema.names == theirs.schema.names
        assert ours.schema == theirs.schema
        assert arrow_rows(ours) == arrow_rows(theirs)


def test_metadata_is_relocatable_and_complete(savepoints):
    sp = Savepoint.open(savepoints["join-hdfs"])
    text = (Path(sp.root) / "_metadata").read_text()
    assert str(FIXTURES) not in text and sp.root not in text  # no absolute path to either
    meta = json.loads(text)
    assert meta["format"] == "statectl-savepoint" and meta["format_version"] == 1
    (op,) = meta["operators"]
    assert sorted(t["name"] for t in op["tables"]) == sorted(
        f"{s}-{k}" for s in ("left", "right") for k in ("keyToNumValues", "keyWithIndexToValue")
    )
    for t in op["tables"]:
        for f in t["files"]:
            assert not f["path"].startswith("/")
            data = (Path(sp.root) / f["path"]).read_bytes()
            assert hashlib.sha256(data).hexdigest() == f["sha256"] and len(data) == f["bytes"]
    ckpt = Checkpoint.open(str(FIXTURES / "join-hdfs"))
    last = ckpt.latest_committed_batch
    assert meta["batch_id"] == last
    assert meta["offsets"] == ckpt.offsets(last).offsets
    entries = meta["source_logs"]["0"]
    assert len(entries) == len({e["path"] for e in entries}) > 0
    assert max(e["batchId"] for e in entries) <= last


def test_default_uid_is_stable_and_backend_independent():
    def uid(name):
        c = Checkpoint.open(str(FIXTURES / name))
        return default_uid(c.operator(0, c.latest_committed_batch))

    assert uid("agg-hdfs") == uid("agg-rocksdb") == uid("agg-rocksdb-changelog")
    # Spark < 4.0 wrote no operator metadata: the name is unknown, the uid still deterministic.
    assert uid("spark35-agg-hdfs") == uid("spark35-agg-rocksdb") != uid("agg-hdfs")
    assert uid("agg-hdfs") != uid("dedup-hdfs")
    assert uid("agg-hdfs").startswith("stateStoreSave-")


def test_explicit_uid_and_relabel(tmp_path):
    url, meta = take_savepoint(str(FIXTURES / "multi-hdfs"), str(tmp_path), uids={1: "dedup"})
    assert {op.operator_id: op.uid for op in meta.operators}[1] == "dedup"
    src_root = Path(url.removeprefix("file://"))
    before = tree_digest(src_root)
    out = json.loads(run_cli("relabel", url, "dedup=dedup-v2", "--json").stdout)
    assert out["relabelled"] == {"dedup": "dedup-v2"} and out["source"] == url
    assert tree_digest(src_root) == before  # the source savepoint is not modified
    sp = Savepoint.open(out["path"])
    assert Path(sp.root).parent == src_root.parent
    assert "dedup-v2" in [op.uid for op in sp.metadata.operators]
    # The renamed uid's data folder follows it; the other operators' files are where they were.
    assert (Path(sp.root) / "operators" / "dedup-v2").is_dir()
    assert not (Path(sp.root) / "operators" / "dedup").exists()
    paths = [f.path for op in sp.metadata.operators for t in op.tables for f in t.files]
    assert all((Path(sp.root) / p).is_file() for p in paths)
    old = Savepoint.open(url)
    assert sp.read(Selection(), "dedup-v2").equals(old.read(Selection(), "dedup"))
    assert sp.read(Selection(), 0).equals(old.read(Selection(), 0))


def test_relabel_native_savepoint_to_target(tmp_path):
    url, _ = take_savepoint(str(FIXTURES / "agg-hdfs"), str(tmp_path / "a"), kind="native")
    (uid,) = [op.uid for op in Savepoint.open(url).metadata.operators]
    out = json.loads(
        run_cli("relabel", url, f"{uid}=totals", "-t", str(tmp_path / "b"), "--json").stdout
    )
    assert out["path"].startswith(f"file://{tmp_path / 'b'}/savepoint-")
    sp, old = Savepoint.open(out["path"]), Savepoint.open(url)
    assert sp.read(Selection(), "totals").equals(old.read(Selection(), uid))


def test_moved_savepoint_still_works(savepoints, tmp_path):
    src = Path(Savepoint.open(savepoints["tws-rocksdb"]).root)
    moved = tmp_path / "elsewhere" / src.name
    shutil.copytree(src, moved)
    shutil.rmtree(src.parent / "unused", ignore_errors=True)
    info = json.loads(run_cli("inspect", str(moved), "--json").stdout)
    assert info["kind"] == "savepoint"
    out = tmp_path / "mp.parquet"
    run_cli(
        "export",
        str(moved),
        "--operator",
        info["operators"][0]["uid"],
        "--state-var",
        "mp",
        "-o",
        str(out),
    )
    assert pq.read_table(out).num_rows == next(
        s["rows"] for s in info["operators"][0]["stores"] if s["name"] == "mp"
    )


def run_cli(*args, check=True, env=None):
    proc = subprocess.run(
        [sys.executable, "-m", "statectl.cli", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    if check:
        assert proc.returncode == 0, proc.stderr
    return proc


def test_cli_savepoint_target_resolution(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "STATECTL_SAVEPOINT_DIR"}
    proc = subprocess.run(
        [sys.executable, "-m", "statectl.cli", "savepoint", str(FIXTURES / "agg-hdfs")],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
    )
    assert proc.returncode == 2 and "STATECTL_SAVEPOINT_DIR" in proc.stderr
    env["STATECTL_SAVEPOINT_DIR"] = str(tmp_path / "from-env")
    out = run_cli("savepoint", str(FIXTURES / "agg-hdfs"), "--json", env=env)
    path = json.loads(out.stdout)["path"]
    last = Checkpoint.open(str(FIXTURES / "agg-hdfs")).latest_committed_batch
    assert "/from-env/savepoint-" in path and path.split("/")[-1].split("-")[2] == str(last)
    (tmp_path / "statectl.toml").write_text('[savepoint]\ndir = "from-toml"\n')
    env.pop("STATECTL_SAVEPOINT_DIR")
    proc = subprocess.run(
        [sys.executable, "-m", "statectl.cli", "savepoint", str(FIXTURES / "agg-hdfs")],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    assert list((tmp_path / "from-toml").glob("savepoint-*/_metadata"))


def test_crash_midway_leaves_nothing_complete(fixture_copy, tmp_path):
    """Kill the process after the first data file: no _metadata, checkpoint byte-identical."""
    ckpt = fixture_copy("join-rocksdb")
    before = tree_digest(ckpt)
    target = tmp_path / "sp"
    code = (
        "import os, statectl.savepoints.create as c\n"
        "orig = c.write_table\n"
        "n = [0]\n"
        "def crash(*a, **k):\n"
        "    n[0] += 1\n"
        "    if n[0] == 2: os._exit(9)\n"
        "    return orig(*a, **k)\n"
        "c.write_table = crash\n"
        f"c.take_savepoint({str(ckpt)!r}, {str(target)!r})\n"
    )
    env = {**os.environ, "STATECTL_WORKERS": "1"}  # the crash must hit the process writing
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert proc.returncode == 9
    (partial,) = list(target.iterdir())
    assert not (partial / "_metadata").exists()
    assert tree_digest(ckpt) == before
    listing = json.loads(run_cli("list", str(target), "--json").stdout)
    assert listing[0]["kind"] == "savepoint" and listing[0]["health"] == "incomplete"
    assert run_cli("inspect", str(partial), check=False).returncode == 2
    assert run_cli("dispose", str(partial), "--yes", check=False).returncode == 2  # not complete


def test_failure_cleans_up_and_leaves_checkpoint_alone(fixture_copy, tmp_path, monkeypatch):
    import statectl.savepoints.create as create

    ckpt = fixture_copy("agg-rocksdb")
    before = tree_digest(ckpt)
    monkeypatch.setattr(
        create, "write_table", lambda *a, **k: (_ for _ in ()).throw(OSError("disk full"))
    )
    with pytest.raises(OSError):
        take_savepoint(str(ckpt), str(tmp_path / "sp"))
    assert not list((tmp_path / "sp").glob("*/_metadata"))
    assert tree_digest(ckpt) == before


def test_dispose(tmp_path, fixture_copy):
    url, _ = take_savepoint(str(FIXTURES / "dedup-hdfs"), str(tmp_path))
    path = url.removeprefix("file://")
    plan = json.loads(run_cli("dispose", path, "--dry-run", "--json").stdout)
    assert plan["deleted"] is False and plan["files"] >= 2 and os.path.exists(path)
    proc = run_cli("dispose", path, check=False)  # no TTY, no --yes: refuse
    assert proc.returncode == 2 and "--yes" in proc.stderr and os.path.exists(path)
    run_cli("dispose", path, "--yes")
    assert not os.path.exists(path)
    ckpt = fixture_copy("agg-hdfs")
    proc = run_cli("dispose", str(ckpt), "--yes", check=False)
    assert proc.returncode == 2 and "checkpoint" in proc.stderr and (ckpt / "offsets").exists()
    other = tmp_path / "random"
    other.mkdir()
    (other / "data.txt").write_text("keep me")
    assert run_cli("dispose", str(other), "--yes", check=False).returncode == 2
    assert (other / "data.txt").exists()


def test_list_shows_savepoints(savepoints):
    root = Path(Savepoint.open(savepoints["agg-hdfs"]).root).parent
    entries = json.loads(run_cli("list", str(root), "--json").stdout)
    by_batch = [e for e in entries if e["kind"] == "savepoint" and e.get("complete")]
    assert len(by_batch) == len(FIXTURE_NAMES)
    assert all(e["health"] == "ok" and e["created_at"] for e in by_batch)


def test_unknown_format_version(savepoints, tmp_path):
    src = Path(Savepoint.open(savepoints["agg-hdfs"]).root)
    dst = tmp_path / src.name
    shutil.copytree(src, dst)
    meta = json.loads((dst / "_metadata").read_text())
    meta["format_version"] = 99
    (dst / "_metadata").write_text(json.dumps(meta))
    proc = run_cli("inspect", str(dst), check=False)
    assert (
        proc.returncode == 2 and "format version 99" in proc.stderr and "_metadata" in proc.stderr
    )


def test_process_pool_gives_the_same_savepoint(tmp_path):
    _, m1 = take_savepoint(str(FIXTURES / "join-rocksdb"), str(tmp_path / "a"), workers=1)
    _, m2 = take_savepoint(str(FIXTURES / "join-rocksdb"), str(tmp_path / "b"), workers=2)
    f1 = [(f.path, f.rows, f.sha256) for op in m1.operators for t in op.tables for f in t.files]
    f2 = [(f.path, f.rows, f.sha256) for op in m2.operators for t in op.tables for f in t.files]
    assert f1 == f2 and len(f1) == 8  # 4 join stores x 2 partitions, byte-identical files


def test_batch_option(tmp_path):
    url, meta = take_savepoint(str(FIXTURES / "agg-hdfs"), str(tmp_path), batch=1)
    assert meta.batch_id == 1
    ckpt = Checkpoint.open(str(FIXTURES / "agg-hdfs"))
    assert arrow_rows(Savepoint.open(url).read(Selection(), 0)) == arrow_rows(
        read_state(ckpt, Selection(batch=1))
    )
    with pytest.raises(StatectlError, match="not a committed batch"):
        take_savepoint(str(FIXTURES / "agg-hdfs"), str(tmp_path), batch=77)


# -- with Spark ----------------------------------------------------------------------------
@pytest.mark.spark
def test_spark_reads_the_parquet_files(spark, savepoints):
    sp = Savepoint.open(savepoints["agg-types-hdfs"])
    (op,) = sp.metadata.operators
    (table,) = op.tables
    path = os.path.dirname(os.path.join(sp.root, table.files[0].path))  # the table's directory
    assert len(table.files) == op.partitions  # one file per source partition
    df = spark.read.parquet(path)
    assert df.count() == table.rows
    assert df.columns == ["key", "value", "partition_id"]
    import pandas as pd

    assert len(pd.read_parquet(path)) == table.rows


@pytest.mark.spark
def test_savepoints_of_a_running_query(spark, tmp_path):
    """Savepoints taken while a real query keeps running each match Spark's reader at their batch."""
    inp, ckpt = tmp_path / "in", tmp_path / "ckpt"
    inp.mkdir()

    def write(i):
        rows = [json.dumps({"k": f"k{(i * 3 + j) % 11}", "v": j}) for j in range(40)]
        (inp / f"f{i:03d}.json").write_text("\n".join(rows))

    write(0)
    spark.conf.set(
        "spark.sql.streaming.stateStore.providerClass",
        "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider",
    )
    try:
        q = (
            spark.readStream.schema("k string, v long")
            .option("maxFilesPerTrigger", 1)
            .json(str(inp))
            .groupBy("k")
            .count()
            .writeStream.format("noop")
            .outputMode("update")
            .option("checkpointLocation", str(ckpt))
            .trigger(processingTime="200 milliseconds")
            .start()
        )
    finally:
        spark.conf.unset("spark.sql.streaming.stateStore.providerClass")
    stop = threading.Event()

    def feed():
        i = 1
        while not stop.is_set() and i < 40:
            write(i)
            i += 1
            time.sleep(0.15)

    feeder = threading.Thread(target=feed)
    feeder.start()
    taken = []
    try:
        deadline = time.time() + 120
        last = -1
        while len(taken) < 3 and time.time() < deadline:
            committed = (
                Checkpoint.open(str(ckpt)).latest_committed_batch
                if (ckpt / "commits").exists()
                else None
            )
            if committed is not None and committed > last:  # a new batch since the last savepoint
                url, meta = take_savepoint(str(ckpt), str(tmp_path / "sp"))
                taken.append((url, meta.batch_id))
                last = meta.batch_id
            time.sleep(0.3)
        assert q.isActive
    finally:
        stop.set()
        feeder.join()
        q.stop()
    assert len(taken) == 3 and len({b for _, b in taken}) == 3
    for url, batch in taken:
        ours = arrow_rows(Savepoint.open(url).read(Selection(), 0))
        theirs = spark_rows(
            spark.read.format("statestore").option("batchId", batch).load(str(ckpt))
        )
        assert ours == theirs


@pytest.mark.spark
def test_stop_with_savepoint(spark, tmp_path):
    import statectl

    inp, ckpt = tmp_path / "in", tmp_path / "ckpt"
    inp.mkdir()
    for i in range(3):
        (inp / f"f{i}.json").write_text(
            "\n".join(json.dumps({"k": f"k{j % 5}"}) for j in range(i, i + 10))
        )
    q = (
        spark.readStream.schema("k string")
        .option("maxFilesPerTrigger", 1)
        .json(str(inp))
        .dropDuplicates(["k"])
        .writeStream.format("noop")
        .option("checkpointLocation", str(ckpt))
        .trigger(processingTime="100 milliseconds")
        .start()
    )
    q.processAllAvailable()
    url = statectl.stop_with_savepoint(q, str(tmp_path / "sp"))
    assert not q.isActive
    sp = Savepoint.open(url)
    assert sp.metadata.batch_id == Checkpoint.open(str(ckpt)).latest_committed_batch
    assert sp.read(Selection(), 0).num_rows == 5


# -- native savepoints ------------------------------------------------------------------------
NATIVE = [
    "agg-hdfs",
    "agg-snapshots-hdfs",
    "agg-snapshots-rocksdb-changelog",
    "agg-ckptv2-rocksdb-changelog",
    "join-rocksdb",
    "tws-rocksdb-changelog",
    "tws-avro-rocksdb",
    "multi-hdfs",
]


@pytest.mark.parametrize("name", NATIVE)
def test_native_savepoint_copies_what_loads_the_batch(tmp_path, name):
    fx = next(f for f in load_manifest() if f["name"] == name)
    url, meta = take_savepoint(str(FIXTURES / name), str(tmp_path), kind="native")
    sp = Savepoint.open(url)
    assert sp.metadata.savepoint_type == "native"
    ckpt = Checkpoint.open(str(FIXTURES / name))
    for read in fx["reads"]:
        sel = selection(read)
        assert arrow_rows(sp.read(sel, read["operatorId"])) == arrow_rows(read_state(ckpt, sel))
    copied = sum(1 for _ in (Path(sp.root) / "checkpoint" / "state").rglob("*"))
    original = sum(1 for _ in (FIXTURES / name / "state").rglob("*"))
    assert copied <= original
    # Converting it gives the canonical savepoint of the same batch, same uids.
    _, meta2 = take_savepoint(url, str(tmp_path / "canonical"))
    assert meta2.savepoint_type == "canonical" and meta2.batch_id == meta.batch_id
    assert [o.uid for o in meta2.operators] == [o.uid for o in meta.operators]
    info = json.loads(run_cli("inspect", url, "--json").stdout)
    assert info["type"] == "native" and info["operators"][0]["uid"] == meta.operators[0].uid


def test_native_snapshot_chain_is_minimal(tmp_path):
    """Only the newest snapshot at or below the version and the deltas after it are copied."""
    url, meta = take_savepoint(str(FIXTURES / "agg-snapshots-hdfs"), str(tmp_path), kind="native")
    names = sorted(
        p.name
        for p in (Path(url.removeprefix("file://")) / "checkpoint/state/0/0").iterdir()
        if p.is_file()
    )
    version = meta.batch_id + 1
    snaps = sorted(
        int(p.stem)
        for p in (FIXTURES / "agg-snapshots-hdfs/state/0/0").glob("*.snapshot")
        if int(p.stem) <= version
    )
    expected = [f"{snaps[-1]}.snapshot"] + [f"{v}.delta" for v in range(snaps[-1] + 1, version + 1)]
    assert names == sorted(expected)


def test_native_savepoint_restores_as_a_copy_or_is_converted_first(tmp_path):
    url, _ = take_savepoint(str(FIXTURES / "agg-hdfs"), str(tmp_path), kind="native")
    from statectl.restoration import restore

    plan = restore(url, str(tmp_path / "other"), partitions=3)
    assert plan.problems and "convert it first" in plan.problems[0]
    plan = restore(url, str(tmp_path / "new"))  # same backend and partitions: a copy
    assert not plan.problems
    src, dst = Checkpoint.open(str(FIXTURES / "agg-hdfs")), Checkpoint.open(str(tmp_path / "new"))
    assert dst.latest_committed_batch == src.latest_committed_batch
    assert arrow_rows(read_state(dst, Selection(0))) == arrow_rows(read_state(src, Selection(0)))


@pytest.mark.spark
def test_spark_resumes_from_a_native_savepoint_copy(spark, tmp_path):
    """The native savepoint's checkpoint/ is a checkpoint Spark continues from (same backend)."""
    inp = tmp_path / "in"
    inp.mkdir()
    for i in range(3):
        (inp / f"f{i}.json").write_text(
            "\n".join(json.dumps({"k": f"k{(i + j) % 4}"}) for j in range(6))
        )

    def run(ckpt):
        q = (
            spark.readStream.schema("k string")
            .option("maxFilesPerTrigger", 1)
            .json(str(inp))
            .groupBy("k")
            .count()
            .writeStream.format("noop")
            .outputMode("update")
            .option("checkpointLocation", str(ckpt))
            .trigger(availableNow=True)
            .start()
        )
        q.awaitTermination()

    run(tmp_path / "ck")
    url, meta = take_savepoint(str(tmp_path / "ck"), str(tmp_path / "sp"), kind="native")
    shutil.copytree(Path(url.removeprefix("file://")) / "checkpoint", tmp_path / "ck2")
    (inp / "f3.json").write_text("\n".join(json.dumps({"k": "k1"}) for _ in range(5)))
    run(tmp_path / "ck2")
    run(tmp_path / "ck")
    a = spark_rows(spark.read.format("statestore").load(str(tmp_path / "ck2")))
    b = spark_rows(spark.read.format("statestore").load(str(tmp_path / "ck")))
    assert (
        a == b
        and Checkpoint.open(str(tmp_path / "ck2")).latest_committed_batch == meta.batch_id + 1
    )

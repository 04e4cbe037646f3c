"""Restore: Spark resumes a query from a restored checkpoint, on either backend, at another
partition count, and its output equals one uninterrupted run of the same query."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from statectl.checkpoint.model import Checkpoint
from statectl.query_plan import load_query_function
from statectl.restoration import RestoreOptions, plan_restore, restore
from statectl.savepoints.create import take_savepoint
from statectl.savepoints.store import Savepoint, table_selection
from statectl.state import Selection, read_state
from tests.helpers.fixtures import FIXTURES, load_manifest, restore_target
from tests.helpers.restore import assert_exactly_once, session_merged_across_restore
from tests.helpers.rows import arrow_rows, spark_rows
from tests.helpers.spark import LIMIT, PROVIDERS, QUERY_SOURCE, run, write_input

# Every operator from one backend to {the same, the other} x {the same (2), another (3)}
# partition count; source backends alternate. transformWithState runs on RocksDB only.
OPERATORS = ["agg", "dedup", "window", "join", "dedupwm", "fmgws", "multi"]
CASES = [
    (case, src, dst, n)
    for i, case in enumerate(OPERATORS)
    for src in [("hdfs", "rocksdb")[i % 2]]
    for dst in ("hdfs", "rocksdb")
    for n in (2, 3)
] + [
    ("agg", "rocksdb", "hdfs", 1),
    ("tws", "rocksdb", "rocksdb", 2),
    ("tws", "rocksdb", "rocksdb", 3),
    ("tws-avro", "rocksdb", "rocksdb", 1),
    # Keys of every supported type, placed by statectl's Murmur3 for 3 and 5 partitions.
    ("agg-types", "hdfs", "rocksdb", 3),
    ("agg-types", "rocksdb", "hdfs", 5),
    # Row checksums on the source: restored as plain rows, the conf pinned off.
    ("agg-checksum", "hdfs", "rocksdb", 3),
    ("agg-checksum", "rocksdb", "hdfs", 2),
    # Session windows: placed by the grouping key, prefix-encoded keys on RocksDB.
    *[("session", "hdfs", dst, n) for dst in ("hdfs", "rocksdb") for n in (2, 3)],
    ("session", "rocksdb", "hdfs", 3),
    ("session", "rocksdb", "rocksdb", 3),
    ("session-dynamic", "hdfs", "rocksdb", 3),
    ("session-dynamic", "rocksdb", "hdfs", 2),
    ("session-dynamic", "hdfs", "hdfs", 3),
    ("session-dynamic", "rocksdb", "rocksdb", 2),
    # Streaming limit: its count lives in partition 0 at any partition count.
    *[("limit", "hdfs", dst, n) for dst in ("hdfs", "rocksdb") for n in (2, 3)],
    ("limit", "rocksdb", "hdfs", 3),
    ("limit", "rocksdb", "rocksdb", 3),
    # applyInPandasWithState at state format 1 (the state fields unnested in the value).
    ("fmgws-v1", "hdfs", "hdfs", 3),
    ("fmgws-v1", "hdfs", "rocksdb", 2),
    ("fmgws-v1", "hdfs", "hdfs", 2),
    ("fmgws-v1", "hdfs", "rocksdb", 3),
    ("tws-rows", "rocksdb", "rocksdb", 3),
    ("tws-rows", "rocksdb", "rocksdb", 2),
    ("tws-avro", "rocksdb", "rocksdb", 2),
    # Aggregation at state format 1 (the value row repeats the grouping columns).
    *[("agg-v1", "hdfs", dst, n) for dst in ("hdfs", "rocksdb") for n in (2, 3)],
    ("agg-v1", "rocksdb", "hdfs", 3),
]
CASE_CONFS = {
    "fmgws-v1": {"spark.sql.streaming.flatMapGroupsWithState.stateFormatVersion": "1"},
    "tws-avro": {"spark.sql.streaming.stateStore.encodingFormat": "avro"},
    "agg-checksum": {"spark.sql.streaming.stateStore.rowChecksum.enabled": "true"},
    "agg-v1": {"spark.sql.streaming.aggregation.stateFormatVersion": "1"},
}


_SOURCES: dict[tuple, tuple] = {}


def savepoint_and_reference(spark, tmp_path_factory, case: str, backend: str) -> tuple:
    """For one query and source backend, shared by the cells restoring it: the input (3
    files, then 2 more), what the first run emitted over the first 3, a savepoint of it, and
    what one uninterrupted run emitted over all 5. Read-only for the cells: each restores the
    savepoint into a checkpoint of its own and continues over the same input."""
    key = (case, backend)
    if key not in _SOURCES:
        root = tmp_path_factory.mktemp(f"source-{case}-{backend}")
        d = root / "input"
        write_input(d, 0, 3)
        confs = CASE_CONFS.get(case, {})
        first = run(spark, case, d, root / "ck1", backend, confs)
        assert len(first) >= 3
        sp_url, meta = take_savepoint(str(root / "ck1"), str(root / "sp"))
        write_input(d, 3, 2)
        full = run(spark, case, d, root / "ck3", backend, confs)
        _SOURCES[key] = (d, first, sp_url, meta, full)
    return _SOURCES[key]


@pytest.mark.spark
@pytest.mark.parametrize(("case", "src_backend", "dst_backend", "partitions"), CASES)
def test_restored_query_continues_like_an_uninterrupted_run(
    spark, tmp_path, tmp_path_factory, case, src_backend, dst_backend, partitions
):
    confs = CASE_CONFS.get(case, {})
    d, first, sp_url, meta, full = savepoint_and_reference(
        spark, tmp_path_factory, case, src_backend
    )
    plan = restore(sp_url, str(tmp_path / "ck2"), backend=dst_backend, partitions=partitions)
    assert plan.backend == dst_backend and not plan.problems
    for key, value in confs.items():  # the source really ran with the case's confs
        assert meta.pinned_confs.get(key) == value
    if case == "agg-checksum":
        pinned = Checkpoint.open(str(tmp_path / "ck2")).offsets(meta.batch_id).conf
        assert pinned["spark.sql.streaming.stateStore.rowChecksum.enabled"] == "false"
    if case == "agg-v1":  # Spark must read the restored values at the format they were written in
        pinned = Checkpoint.open(str(tmp_path / "ck2")).offsets(meta.batch_id).conf
        assert pinned["spark.sql.streaming.aggregation.stateFormatVersion"] == "1"

    # Spark's own reader sees the savepoint's rows in the restored checkpoint.
    for op in meta.operators:
        if op.name == "symmetricHashJoin":
            sels = [{"joinSide": "left"}, {"joinSide": "right"}]
        elif op.column_families:
            sels = [
                {"readRegisteredTimers": "true"} if t.kind == "timers" else {"stateVarName": t.name}
                for t in op.tables
            ]
        else:
            sels = [{}]
        for opts in sels:
            reader = spark.read.format("statestore").option("operatorId", op.operator_id)
            for k, v in opts.items():
                reader = reader.option(k, v)
            df = reader.load(str(tmp_path / "ck2")).drop("partition_id")
            sel = Selection(
                op.operator_id,
                join_side=opts.get("joinSide"),
                state_var=opts.get("stateVarName"),
                registered_timers="readRegisteredTimers" in opts,
            )
            ours = Savepoint.open(sp_url).read(sel, op.uid).drop_columns(["partition_id"])
            assert spark_rows(df) == arrow_rows(ours), opts

    continued = run(spark, case, d, tmp_path / "ck2")
    # Exactly-once end to end: what the first run and the restored run emitted together is what
    # one uninterrupted run emitted. (Batch ids may differ: a watermark-only batch runs at the
    # end of the first run, where the uninterrupted run had none.)
    assert all(b > meta.batch_id for b in continued) and any(continued.values())
    assert_exactly_once(first, continued, full)
    if case == "limit":  # not reached before the savepoint, reached exactly after it
        emitted = [sum(len(rows) for rows in part.values()) for part in (first, continued)]
        assert emitted[0] < LIMIT and sum(emitted) == LIMIT, emitted
        assert sorted(p.name for p in (tmp_path / "ck2" / "state" / "0").iterdir()) == [
            "0",
            "_metadata",
        ]
    if case.startswith("session"):
        assert session_merged_across_restore([r for rows in continued.values() for r in rows])
    restored = Checkpoint.open(str(tmp_path / "ck2"))
    last = restored.latest_committed_batch
    assert last == max(continued)
    assert restored.backend(last) == dst_backend and restored.num_partitions(last) == partitions


CKPT_V2 = {"spark.sql.streaming.stateStore.checkpointFormatVersion": "2"}


@pytest.mark.spark
@pytest.mark.parametrize(
    ("case", "confs"),
    [
        ("agg", {}),
        # Column families under v2: transformWithState and join state format 4.
        ("tws", {}),
        ("join", {"spark.sql.streaming.join.stateFormatVersion": "4"}),
    ],
    ids=["agg", "tws", "join4"],
)
def test_checkpoint_format_v2_query_restores_and_continues(spark, tmp_path, case, confs):
    """A checkpoint format v2 query (ids in the commit log, ``N_<id>.zip``) restores to format
    v2 at another partition count and continues exactly."""
    confs = {**CKPT_V2, **confs}
    d = tmp_path / "input"
    write_input(d, 0, 3)
    first = run(spark, case, d, tmp_path / "ck1", "rocksdb", confs)
    src = Checkpoint.open(str(tmp_path / "ck1"))
    assert src.checkpoint_format_version(src.latest_committed_batch) == 2
    sp_url, meta = take_savepoint(str(tmp_path / "ck1"), str(tmp_path / "sp"))
    plan = restore(sp_url, str(tmp_path / "ck2"), partitions=3)
    assert not plan.problems and plan.backend == "rocksdb" and plan.checkpoint_format == 2
    ck2 = Checkpoint.open(str(tmp_path / "ck2"))
    assert ck2.checkpoint_format_version(meta.batch_id) == 2
    ids = ck2.commit(meta.batch_id).state_unique_ids
    assert [len(p) for p in ids["0"]] == [1, 1, 1]
    zip_name = f"{meta.batch_id + 1}_{ids['0'][2][0]}.zip"
    assert (tmp_path / "ck2" / "state" / "0" / "2" / zip_name).exists()
    write_input(d, 3, 2)
    continued = run(spark, case, d, tmp_path / "ck2", confs=confs)
    full = run(spark, case, d, tmp_path / "ck3", "rocksdb", confs)
    assert_exactly_once(first, continued, full)
    restored = Checkpoint.open(str(tmp_path / "ck2"))
    last = restored.latest_committed_batch
    assert last > meta.batch_id and restored.num_partitions(last) == 3


@pytest.mark.spark
def test_offset_log_v2_query_restores_and_continues(spark, tmp_path):
    """Named sources (``queryEvolution.enableSourceEvolution``) write offset log v2 with
    ``name:offset`` lines and ``sources/<name>``; a restore keeps both and the query continues."""
    named = {"spark.sql.streaming.queryEvolution.enableSourceEvolution": "true"}
    d = tmp_path / "input"
    write_input(d, 0, 3)
    first = run(spark, "agg-named", d, tmp_path / "ck1", "hdfs", named)
    sp_url, meta = take_savepoint(str(tmp_path / "ck1"), str(tmp_path / "sp"))
    assert meta.offset_log_version == 2 and list(meta.offsets) == ["events"]
    plan = restore(sp_url, str(tmp_path / "ck2"), backend="rocksdb", partitions=3)
    assert not plan.problems
    restored = (tmp_path / "ck2" / "offsets" / str(meta.batch_id)).read_text().splitlines()
    assert restored[0] == "v2" and restored[2].startswith("events:")
    write_input(d, 3, 2)
    continued = run(spark, "agg-named", d, tmp_path / "ck2", confs=named)
    full = run(spark, "agg-named", d, tmp_path / "ck3", "hdfs", named)
    assert_exactly_once(first, continued, full)
    assert all(b > meta.batch_id for b in continued) and any(continued.values())


# Every fixture Spark 4.3 wrote (the older lines' are tests/test_releases.py's).
SPARK43_FIXTURES = [fx for fx in load_manifest() if not re.match(r"^spark\d\d-", fx["name"])]


@pytest.mark.parametrize("fx", SPARK43_FIXTURES, ids=lambda fx: fx["name"])
def test_restore_every_fixture_reads_back(tmp_path, fx):
    """Without Spark: every fixture restores to 3 partitions, on the other backend where Spark
    allows it (:func:`tests.helpers.fixtures.restore_target`), and the restored state equals the
    source state row for row, every key in one of the new partitions."""
    name = fx["name"]
    backend, partitions = restore_target(fx)
    url, meta = take_savepoint(str(FIXTURES / name), str(tmp_path / "sp"))
    src = Checkpoint.open(str(FIXTURES / name))
    target = tmp_path / "ck"
    plan = restore(url, str(target), backend=backend, partitions=partitions)
    assert not plan.problems and plan.backend == backend
    dst = Checkpoint.open(str(target))
    assert dst.latest_committed_batch == src.latest_committed_batch
    assert dst.num_partitions(dst.latest_committed_batch) == partitions
    for op in meta.operators:
        for table in op.tables:
            sel = table_selection(op.operator_id, table)
            a = read_state(dst, sel)
            b = read_state(src, sel)
            assert arrow_rows(a.drop_columns(["partition_id"])) == arrow_rows(
                b.drop_columns(["partition_id"])
            ), (op.operator_id, table.name)
            assert set(a.column("partition_id").to_pylist()) <= set(range(partitions))


def test_restore_refuses_a_non_empty_target_and_unsupported_tws(tmp_path):
    url, _ = take_savepoint(str(FIXTURES / "agg-hdfs"), str(tmp_path / "sp"))
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "x").write_text("x")
    plan = restore(url, str(tmp_path / "busy"))
    assert (
        plan.problems and "is not empty; refusing to overwrite it (--overwrite" in plan.problems[0]
    )
    assert (tmp_path / "busy" / "x").read_text() == "x"
    tws, _ = take_savepoint(str(FIXTURES / "tws-rocksdb"), str(tmp_path / "sp"))
    plan = restore(tws, str(tmp_path / "tws"), backend="hdfs")
    assert plan.problems and "restores only to RocksDB" in plan.problems[0]
    plan = restore(tws, str(tmp_path / "tws"), changelog=True)
    assert plan.problems and "restores only to RocksDB snapshots" in plan.problems[0]
    # Internal families statectl cannot rebuild, or TTL indexes that match no state variable
    # with TTL'd values: refused up front.
    for family, problem in (
        ("$zzz_cnt", "internal column families $zzz_cnt cannot be restored yet"),
        ("$ttl_nope", "$ttl_nope (state TTL) belongs to no ListState or MapState or ValueState"),
        ("$min_cnt", "$min_cnt (state TTL) belongs to no ListState"),
        ("$ttl_cnt", "has the TTL index $ttl_cnt but its values are not struct<value, ttlExp"),
    ):
        sp = Savepoint.open(tws)
        sp.metadata.operators[0].column_families.append({"name": family})
        p = plan_restore(sp, str(tmp_path / "tws"), RestoreOptions())
        assert p.problems and problem in p.problems[0]
    assert not (tmp_path / "tws").exists()


def test_cli_restore_dry_run_and_map(tmp_path):
    url, _meta = take_savepoint(
        str(FIXTURES / "multi-hdfs"), str(tmp_path / "sp"), uids={0: "counts", 1: "dedup"}
    )

    def cli(*args):
        return subprocess.run(
            [sys.executable, "-m", "statectl.cli", *args], capture_output=True, text=True
        )

    proc = cli(
        "restore",
        "-s",
        url,
        str(tmp_path / "new"),
        "--map",
        "counts=1",
        "--map",
        "dedup=0",
        "--backend",
        "rocksdb",
        "--partitions",
        "4",
        "--dry-run",
        "--json",
    )
    assert proc.returncode == 0, proc.stderr
    plan = json.loads(proc.stdout)
    assert plan["restored"] == {"counts": 1, "dedup": 0} and plan["partitions"] == 4 and plan["ok"]
    assert not (tmp_path / "new").exists()
    proc = cli("restore", "-s", url, str(tmp_path / "new"), "--map", "nope=3", "--json")
    assert proc.returncode == 2 and json.loads(proc.stdout)["problems"]
    # The dedupe moves to operator 0 (the count was removed): without -n the count's state has
    # no operator left and the restore fails; with -n it is dropped.
    proc = cli("restore", "-s", url, str(tmp_path / "new"), "--map", "dedup=0", "--json")
    assert proc.returncode == 2 and "counts" in json.loads(proc.stdout)["problems"][0]
    proc = cli("restore", "-s", url, str(tmp_path / "m"), "--map", "dedup=0", "-n", "--json")
    assert proc.returncode == 0, proc.stderr
    info = json.loads(proc.stdout)
    assert info["restored"] == {"dedup": 0} and info["dropped"] == ["counts"]
    proc = cli("restore", "-s", url, str(tmp_path / "m2"), "--map", "dedup=0", "-n")
    assert proc.returncode == 0 and "the state of uid counts is not restored (-n)" in proc.stderr
    proc = cli("restore", "-s", url, str(tmp_path / "new"), "--drop", "dedup", "--json")
    assert proc.returncode == 2 and "-n" in json.loads(proc.stdout)["problems"][0]
    proc = cli("restore", "-s", url, str(tmp_path / "new"), "--drop", "dedup", "-n", "--json")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["dropped"] == ["dedup"]
    assert Checkpoint.open(str(tmp_path / "new")).operator_ids() == [0]


def test_cli_migrate_changes_backend_and_partitions(tmp_path):
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "statectl.cli",
            "migrate",
            str(FIXTURES / "dedup-hdfs"),
            str(tmp_path / "m"),
            "--backend",
            "rocksdb",
            "--partitions",
            "3",
            "--json",
        ],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stderr
    info = json.loads(proc.stdout)
    assert info["backend"] == "rocksdb" and info["savepoint"] is None
    dst, src = Checkpoint.open(str(tmp_path / "m")), Checkpoint.open(str(FIXTURES / "dedup-hdfs"))
    b = dst.latest_committed_batch
    assert dst.backend(b) == "rocksdb" and dst.num_partitions(b) == 3
    assert arrow_rows(read_state(dst, Selection(0)).drop_columns(["partition_id"])) == arrow_rows(
        read_state(src, Selection(0)).drop_columns(["partition_id"])
    )


@pytest.mark.spark
def test_spark_offline_repartition_runs_on_a_migrated_checkpoint(spark, tmp_path):
    """Spark 4.3's own repartition (RocksDB only) accepts a checkpoint statectl moved off HDFS."""
    target = tmp_path / "ck"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "statectl.cli",
            "migrate",
            str(FIXTURES / "agg-hdfs"),
            str(target),
            "--backend",
            "rocksdb",
        ],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stderr
    before = spark_rows(spark.read.format("statestore").load(str(target)).drop("partition_id"))
    spark._streamingCheckpointManager.repartition(str(target), 3)
    after = spark.read.format("statestore").load(str(target))
    assert sorted(r[0] for r in after.select("partition_id").distinct().collect()) == [0, 1, 2]
    assert spark_rows(after.drop("partition_id")) == before


CHANGED_QUERIES = (
    """
import pandas as pd
import pyspark.sql.functions as F
from pyspark.sql.streaming import StatefulProcessor

"""
    + QUERY_SOURCE
    + '''

def before(spark):
    """Operators: 0 = count per k (stateStoreSave), 1 = dedupe on (id, k)."""
    return src(spark).dropDuplicates(["id", "k"]).groupBy("k").count()


def after(spark):
    """The count is removed; a dedupe on (id, k, v) is added before the (id, k) one, which
    moves from operator 1 to operator 0."""
    return src(spark).select("id", "k", "v").dropDuplicates(["id", "k", "v"]).dropDuplicates(
        ["id", "k"]
    )


def dedup_only(spark):
    return src(spark).dropDuplicates(["id", "k"])


class Counter(StatefulProcessor):
    def init(self, handle):
        self.cnt = handle.getValueState("cnt", "c long")

    def handleInputRows(self, key, rows, timerValues):
        n = sum(len(pdf) for pdf in rows)
        c = (self.cnt.get()[0] if self.cnt.exists() else 0) + n
        self.cnt.update((c,))
        yield pd.DataFrame({{"k": [key[0]], "c": [c]}})

    def close(self):
        pass


def with_tws(spark):
    """A transformWithState operator added after the dedupe: it becomes operator 0 and starts
    empty; the dedupe moves to operator 1."""
    return (
        src(spark)
        .dropDuplicates(["id", "k"])
        .groupBy("k")
        .transformWithStateInPandas(
            Counter(), outputStructType="k string, c long", outputMode="Update", timeMode="None"
        )
    )


def retyped(spark):
    """The (id, k) dedupe with k cast to an int: its key schema is incompatible."""
    return src(spark).select("id", F.length("k").alias("k")).dropDuplicates(["id", "k"])
'''
)


@pytest.mark.spark
def test_changed_query_adds_a_transform_with_state_operator(spark, tmp_path):
    """A new transformWithState operator with no state in the savepoint starts empty (RocksDB
    snapshot with no entries, its schema file and metadata v2 from planning)."""
    d = tmp_path / "input"
    write_input(d, 0, 3)
    queries = tmp_path / "queries_tws.py"
    queries.write_text(CHANGED_QUERIES.format(input=str(d)))
    rocksdb = {"spark.sql.streaming.stateStore.providerClass": PROVIDERS["rocksdb"]}

    def start(func, ckpt, mode, confs=None):
        out: list = []
        for k, v in (confs or {}).items():
            spark.conf.set(k, v)
        try:
            (
                load_query_function(f"{queries}:{func}")(spark)
                .writeStream.foreachBatch(lambda df, _: out.extend(tuple(r) for r in df.collect()))
                .outputMode(mode)
                .option("checkpointLocation", str(ckpt))
                .trigger(availableNow=True)
                .start()
                .awaitTermination()
            )
        finally:
            for k in confs or {}:
                spark.conf.unset(k)
        return out

    start("dedup_only", tmp_path / "ck1", "append", rocksdb)
    sp_url, meta = take_savepoint(str(tmp_path / "ck1"), str(tmp_path / "sp"))
    plan = restore(
        sp_url,
        str(tmp_path / "ck2"),
        query=f"{queries}:with_tws",
        output_mode="update",
        spark=spark,
    )
    assert not plan.problems, plan.problems
    assert plan.restored == {meta.operators[0].uid: 1}
    assert plan.started_empty == {0: "transformWithStateInPandasExec"}
    ck2 = Checkpoint.open(str(tmp_path / "ck2"))
    assert [s.name for s in ck2.operator(0, meta.batch_id).schemas] == ["cnt"]

    write_input(d, 3, 2)
    now = time.time()
    for b in (3, 4):
        os.utime(d / f"part-{b:03d}.json", (now + b, now + b))
    out = start("with_tws", tmp_path / "ck2", "update")
    # The counter counts, per k, the (id, k) pairs the restored dedupe lets through.
    seen = _pairs(d, range(3))
    fresh: dict[str, int] = {}
    for b in (3, 4):
        for _, k in _pairs(d, [b]) - seen:
            fresh[k] = fresh.get(k, 0) + 1
        seen |= _pairs(d, [b])
    assert {k: c for k, c in out if c == max(c2 for k2, c2 in out if k2 == k)} == fresh


def _pairs(d, batches):
    out = set()
    for b in batches:
        for line in (d / f"part-{b:03d}.json").read_text().splitlines():
            row = json.loads(line)
            out.add((row["id"], row["k"]))
    return out


@pytest.mark.spark
def test_changed_query_restores_with_query_and_n(spark, tmp_path):
    """A stateful operator removed, one added upstream, one shifted: --query matches the state
    by what the operator is; without -n the restore fails and writes nothing."""
    d = tmp_path / "input"
    write_input(d, 0, 3)
    queries = tmp_path / "queries.py"
    queries.write_text(CHANGED_QUERIES.format(input=str(d)))

    def start(func, ckpt, mode):
        sys.path.insert(0, str(tmp_path))
        try:
            import importlib

            mod = importlib.import_module("queries")
            importlib.reload(mod)
        finally:
            sys.path.remove(str(tmp_path))
        out: dict[int, list] = {}

        def collect(df, batch_id):
            out[batch_id] = [tuple(r) for r in df.collect()]

        q = (
            getattr(mod, func)(spark)
            .writeStream.foreachBatch(collect)
            .outputMode(mode)
            .option("checkpointLocation", str(ckpt))
            .trigger(availableNow=True)
            .start()
        )
        q.awaitTermination()
        return out

    start("before", tmp_path / "ck1", "update")
    sp_url, meta = take_savepoint(str(tmp_path / "ck1"), str(tmp_path / "sp"))
    uids = {op.name: op.uid for op in meta.operators}
    assert {op.name: op.operator_id for op in meta.operators} == {"stateStoreSave": 0, "dedupe": 1}

    spec = f"{queries}:after"
    refused = restore(sp_url, str(tmp_path / "ck2"), query=spec, spark=spark, partitions=3)
    assert refused.problems and uids["stateStoreSave"] in refused.problems[0]
    assert "-n" in refused.problems[0] and not (tmp_path / "ck2").exists()

    plan = restore(
        sp_url,
        str(tmp_path / "ck2"),
        query=spec,
        spark=spark,
        allow_non_restored=True,
        backend="rocksdb",
        partitions=3,
    )
    assert not plan.problems, plan.problems
    assert plan.restored == {uids["dedupe"]: 0}
    assert plan.dropped == [uids["stateStoreSave"]] and plan.started_empty == {1: "dedupe"}

    # Spark's reader finds the (id, k) state at its new operator id.
    got = spark_rows(
        spark.read.format("statestore")
        .option("operatorId", 0)
        .load(str(tmp_path / "ck2"))
        .drop("partition_id")
    )
    want = arrow_rows(
        Savepoint.open(sp_url).read(Selection(1), uids["dedupe"]).drop_columns(["partition_id"])
    )
    assert got == want

    write_input(d, 3, 3)
    now = time.time()
    for b in range(3, 6):  # the file source takes files in modification time order
        os.utime(d / f"part-{b:03d}.json", (now + b, now + b))
    continued = start("after", tmp_path / "ck2", "append")
    assert all(b > meta.batch_id for b in continued)
    seen = _pairs(d, range(3))
    for b in sorted(continued):
        batch_file = 3 + b - min(continued)
        expected = _pairs(d, [batch_file]) - seen
        assert {(r[0], r[1]) for r in continued[b]} == expected, b
        seen |= expected
    assert any(continued.values())

    # Mapped onto an operator whose key schema is incompatible: named precisely, dry run fails.
    bad = restore(
        sp_url,
        str(tmp_path / "ck3"),
        query=f"{queries}:retyped",
        spark=spark,
        mapping={uids["dedupe"]: 0},
        allow_non_restored=True,
        dry_run=True,
    )
    assert any(
        "key field 1 (k): string in the savepoint, integer in the query, which is not a "
        "widening" in p
        for p in bad.problems
    ), bad.problems

    # The CLI dry run is the pre-deploy check: exit 2 without -n, the plan as JSON.
    def dry_run(*extra):
        return subprocess.run(
            [
                sys.executable,
                "-m",
                "statectl.cli",
                "restore",
                "-s",
                sp_url,
                str(tmp_path / "ck4"),
                "--query",
                spec,
                "--dry-run",
                "--json",
                *extra,
            ],
            capture_output=True,
            text=True,
        )

    proc = dry_run()
    assert proc.returncode == 2 and not json.loads(proc.stdout)["ok"], proc.stderr[-2000:]
    proc = dry_run("-n")
    assert proc.returncode == 0, proc.stderr[-2000:]
    info = json.loads(proc.stdout)
    assert info["restored"] == {uids["dedupe"]: 0} and info["started_empty"] == {"1": "dedupe"}
    assert not (tmp_path / "ck4").exists()


UPGRADE_QUERY = '''
import pyspark.sql.functions as F


def agg(spark):
    """fixtures/generate.py's q_agg, the query that wrote spark35-agg-hdfs."""
    return (
        spark.readStream.schema("id long, k string, v long, ts timestamp")
        .option("maxFilesPerTrigger", 1)
        .json({input!r})
        .groupBy("k")
        .agg(F.count("*").alias("cnt"), F.sum("v").alias("total"), F.avg("v").alias("mean"))
    )
'''


@pytest.mark.spark
def test_spark35_state_moves_to_spark43_with_query(spark, tmp_path):
    """Spark 3.5 wrote no operator metadata ("unknown" operators): --query still matches the
    state to 4.3's operator by its stores and schemas, and 4.3 continues from it."""
    sp_url, meta = take_savepoint(str(FIXTURES / "spark35-agg-hdfs"), str(tmp_path / "sp"))
    assert [op.name for op in meta.operators] == ["unknown"]
    # The file source re-plans the last batch on restart and wants its files under the same
    # input directory, so the query reads the directory the fixture's query read (now empty).
    recorded = meta.source_logs["0"][0]["path"]
    d = Path(recorded.removeprefix("file://")).parent
    d.mkdir(parents=True, exist_ok=True)
    queries = tmp_path / "upgrade.py"
    queries.write_text(UPGRADE_QUERY.format(input=str(d)))
    plan = restore(
        sp_url,
        str(tmp_path / "ck"),
        query=f"{queries}:agg",
        output_mode="update",
        spark=spark,
        backend="rocksdb",
        partitions=3,
    )
    assert not plan.problems and plan.restored == {meta.operators[0].uid: 0}
    ck = Checkpoint.open(str(tmp_path / "ck"))
    assert ck.operator(0, meta.batch_id).name == "stateStoreSave"

    state = Savepoint.open(sp_url).read(Selection(0), meta.operators[0].uid)
    keys = state.column("key").combine_chunks().field("k").to_pylist()
    counts = state.column("value").combine_chunks().field(0).to_pylist()  # count(*)
    before = dict(zip(keys, counts, strict=True))
    rows = [{"id": 1, "k": k, "v": 1, "ts": "2024-01-01T00:00:00"} for k in ("k0", "k3", "znew")]
    try:
        (d / "part-new.json").write_text("\n".join(json.dumps(r) for r in rows))
        out: list = []
        (
            load_query_function(f"{queries}:agg")(spark)
            .writeStream.foreachBatch(lambda df, _: out.extend(df.collect()))
            .outputMode("update")
            .option("checkpointLocation", str(tmp_path / "ck"))
            .trigger(availableNow=True)
            .start()
            .awaitTermination()
        )
    finally:
        shutil.rmtree(d)
    got = {r["k"]: r["cnt"] for r in out}
    assert got == {"k0": before["k0"] + 1, "k3": before["k3"] + 1, "znew": 1}


@pytest.mark.parametrize("name", ["session-rocksdb", "session-dynamic-rocksdb"])
@pytest.mark.parametrize("changelog", [False, True])
def test_session_state_restores_byte_for_byte_as_spark_wrote_it(tmp_path, changelog, name):
    """A session window (fixed or dynamic gap) restored to RocksDB at the fixture's own
    partition count holds exactly the bytes Spark wrote: keys prefix-encoded (numColsPrefixKey
    1), values, the schema file and the operator metadata."""
    from statectl.state import StoreEncoding, load_raw

    url, _ = take_savepoint(str(FIXTURES / name), str(tmp_path / "sp"))
    restore(url, str(tmp_path / "ck"), backend="rocksdb", partitions=2, changelog=changelog)
    src, dst = Checkpoint.open(str(FIXTURES / name)), Checkpoint.open(str(tmp_path / "ck"))
    b = src.latest_committed_batch
    for p in range(2):
        entries = []
        for ck in (src, dst):
            op = ck.operator(0, b)
            raw = load_raw(ck, op, "default", p, b, StoreEncoding.of(ck, b))
            entries.append(sorted(zip(raw.keys.to_pylist(), raw.values.to_pylist(), strict=True)))
        assert entries[0] == entries[1] and entries[0], p
    for rel in ("state/0/0/_metadata/schema", "state/0/_metadata/metadata"):
        assert (tmp_path / "ck" / rel).read_bytes() == (FIXTURES / name / rel).read_bytes(), rel


def test_limit_restores_to_partition_0_only(tmp_path):
    """A streaming limit's count goes to partition 0 at any partition count (a whole-key hash of
    its null key would put it in 42 % n); the other partitions are not written, as Spark writes
    none, and statectl reads the result back."""
    for name in ("limit-hdfs", "limit-rocksdb"):
        url, _ = take_savepoint(str(FIXTURES / name), str(tmp_path / f"sp-{name}"))
        for backend in ("hdfs", "rocksdb"):
            target = tmp_path / f"{name}-{backend}"
            restore(url, str(target), backend=backend, partitions=5)
            assert sorted(p.name for p in (target / "state" / "0").iterdir()) == ["0", "_metadata"]
            meta = (target / "state" / "0" / "_metadata" / "metadata").read_text()
            assert '"operatorName":"globalLimit"' in meta and '"numPartitions":5' in meta
            table = read_state(Checkpoint.open(str(target)), Selection(0))
            assert table.column("partition_id").to_pylist() == [0]
            assert arrow_rows(table.drop_columns(["partition_id"])) == [((None,), (20,))]

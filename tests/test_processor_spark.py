"""The state processor on real Spark: an edited savepoint restores and the query continues
with the deleted key starting fresh; ``diff`` equals a diff computed with Spark's own
``statestore`` reader; ``to_spark`` reads the same rows as ``read``."""

from __future__ import annotations

import json

import pytest

import statectl
from statectl.restoration import restore
from statectl.savepoints.create import take_savepoint
from tests.helpers.fixtures import FIXTURES
from tests.helpers.rows import arrow_rows, spark_rows
from tests.helpers.spark import run, write_input

pytestmark = pytest.mark.spark


def _reference(d, files: range, keys_fresh: set[str], files_fresh: range) -> dict[str, tuple]:
    """(count, sum, avg) per key computed from the input files in plain Python: a fresh key
    counts only ``files_fresh``, every other key every file."""
    rows: dict[str, list[int]] = {}
    for b in files:
        for line in (d / f"part-{b:03d}.json").read_text().splitlines():
            r = json.loads(line)
            if r["k"] in keys_fresh and b not in files_fresh:
                continue
            rows.setdefault(r["k"], []).append(r["v"])
    return {k: (len(v), sum(v), sum(v) / len(v)) for k, v in rows.items()}


def _last_per_key(out: dict[int, list]) -> dict[str, tuple]:
    last: dict[str, tuple] = {}
    for b in sorted(out):
        for k, n, s, a in out[b]:
            last[k] = (n, s, a)
    return last


def test_deleted_key_starts_fresh_after_restore_and_continue(spark, tmp_path):
    d = tmp_path / "input"
    write_input(d, 0, 3)
    run(spark, "agg", d, tmp_path / "ck1", "hdfs")
    sp_url, meta = take_savepoint(str(tmp_path / "ck1"), str(tmp_path / "sp"), uids={0: "agg"})
    before = statectl.open(sp_url)
    assert "k1" in {r["k"] for r in before.read("agg").column("key").to_pylist()}

    edited = statectl.edit(sp_url, tmp_path / "edited", "agg", delete_where="key.k = 'k1'")
    assert edited.tables["default"]["removed"] == 1
    plan = restore(edited.target, str(tmp_path / "ck2"), partitions=3)
    assert not plan.problems

    write_input(d, 3, 2)
    continued = run(spark, "agg", d, tmp_path / "ck2")
    assert all(b > meta.batch_id for b in continued) and continued
    got = _last_per_key(continued)
    expected = _reference(d, range(5), {"k1"}, range(3, 5))
    assert "k1" in got
    for k, (n, s, a) in got.items():
        assert (n, s) == expected[k][:2], k
        assert a == pytest.approx(expected[k][2]), k
    # the keys the new batches did not touch kept their state too
    after = {r["k"] for r in statectl.open(tmp_path / "ck2").read(0).column("key").to_pylist()}
    assert after == set(expected)


def test_diff_equals_a_diff_from_sparks_statestore_reader(spark, tmp_path):
    d = tmp_path / "input"
    write_input(d, 0, 3)
    run(spark, "agg", d, tmp_path / "ck1", "rocksdb")
    sp_url, meta = take_savepoint(str(tmp_path / "ck1"), str(tmp_path / "sp"))
    edited = statectl.edit(sp_url, tmp_path / "edited", 0, delete_where="key.k IN ('k1', 'k2')")
    restore(edited.target, str(tmp_path / "ck2"))
    write_input(d, 3, 1)
    run(spark, "agg", d, tmp_path / "ck2")
    ck = statectl.open(tmp_path / "ck2")
    a_batch, b_batch = meta.batch_id, ck.batch
    ours = statectl.diff(ck.path, ck.path, batch_a=a_batch, batch_b=b_batch, samples=0)

    def state(batch):
        return (
            spark.read.format("statestore")
            .option("operatorId", 0)
            .option("batchId", batch)
            .load(str(tmp_path / "ck2"))
        )

    a, b = state(a_batch).alias("a"), state(b_batch).alias("b")
    j = a.join(b, on=a["key"] == b["key"], how="full_outer")
    theirs = {
        "added": j.where("a.key IS NULL").count(),
        "removed": j.where("b.key IS NULL").count(),
        "changed": j.where(
            "a.key IS NOT NULL AND b.key IS NOT NULL AND NOT (a.value <=> b.value)"
        ).count(),
        "unchanged": j.where(
            "a.key IS NOT NULL AND b.key IS NOT NULL AND a.value <=> b.value"
        ).count(),
    }
    assert ours.counts[ck.operators[0].uid]["default"] == theirs
    assert theirs["added"] >= 1 and theirs["changed"] >= 1  # k1/k2 came back, others moved on


def test_to_spark_reads_what_read_returns(spark, tmp_path):

    sp = statectl.open(statectl.savepoint(FIXTURES / "join-hdfs", tmp_path / "sp"))
    ck = statectl.open(FIXTURES / "join-hdfs")
    for handle in (sp, ck):
        for opts in ({"join_side": "left"}, {"table": "right-keyToNumValues"}):
            df = handle.to_spark(spark, 0, **opts)
            ours = handle.read(0, **opts)
            assert spark_rows(df) == sorted(arrow_rows(ours), key=repr), (handle.kind, opts)


BOOTSTRAP_QUERIES = """
def counts(spark):
    return (
        spark.readStream.schema("id long, k string, v long, ts timestamp")
        .json({input!r})
        .groupBy("k")
        .count()
    )


def rate_counts(spark):
    return (
        spark.readStream.format("rate-micro-batch").option("rowsPerBatch", 10).load()
        .selectExpr("concat('k', cast(value % 7 as string)) AS k")
        .groupBy("k")
        .count()
    )
"""


def _bootstrap_queries(tmp_path):
    d = tmp_path / "input"
    path = tmp_path / "boot.py"
    path.write_text(BOOTSTRAP_QUERIES.format(input=str(d)))
    return d, path


def _counts(out: dict[int, list]) -> dict[str, int]:
    return {k: n for k, n in out[min(out)]}


def test_for_query_bootstrap_is_the_new_querys_first_output(spark, tmp_path):
    """A query that never ran starts from state computed elsewhere (a batch backfill): its
    first output is backfill + new data, the reference counted from the files in Python."""
    import pandas as pd

    from statectl.errors import StatectlError
    from statectl.query_plan import load_query_function

    d, queries = _bootstrap_queries(tmp_path)
    spec = f"{queries}:counts"
    writer = statectl.SavepointWriter.for_query(spec, partitions=3, spark=spark)
    [op] = writer.base.operators
    assert op.name == "stateStoreSave" and op.partitions == 3
    with pytest.raises(StatectlError, match=r"value\.count"):
        writer.with_state(op.uid, pd.DataFrame({"key.k": ["k1"], "value.count": ["many"]}))
    with pytest.raises(StatectlError, match="file source"):
        writer.with_offsets({0: '{"logOffset":3}'})
    backfill = pd.DataFrame({"key.k": ["k1", "k2", "zz"], "value.count": [100, 7, 5]})
    sp = writer.with_state(op.uid, backfill).write(tmp_path / "sp")
    assert sp.read(op.uid).num_rows == 3

    plan = restore(sp.path, str(tmp_path / "ck"))
    assert not plan.problems
    write_input(d, 0, 2)
    fn = load_query_function(spec)
    out = run(spark, lambda s, _d: (fn(s), "update"), d, tmp_path / "ck")
    assert min(out) == 1  # resumes after the bootstrap's batch 0
    expected: dict[str, int] = {"k1": 100, "k2": 7, "zz": 5}
    for b in range(2):
        for line in (d / f"part-{b:03d}.json").read_text().splitlines():
            k = json.loads(line)["k"]
            expected[k] = expected.get(k, 0) + 1
    got = _counts(out)
    assert got == {k: expected[k] for k in got} and "k1" in got
    state = statectl.open(tmp_path / "ck").read(0)
    rows = {r["key"]["k"]: r["value"]["count"] for r in state.to_pylist()}
    assert rows == expected


def test_for_query_bootstrap_with_offsets_starts_the_source_there(spark, tmp_path):
    from statectl.errors import StatectlError
    from statectl.query_plan import load_query_function

    _, queries = _bootstrap_queries(tmp_path)
    spec = f"{queries}:rate_counts"
    with pytest.raises(StatectlError, match="cannot parse"):
        statectl.SavepointWriter.for_query(
            spec, partitions=2, spark=spark, offsets={"rate-micro-batch": {"offset": "x"}}
        )
    writer = statectl.SavepointWriter.for_query(
        spec,
        batch=4,
        partitions=2,
        spark=spark,
        offsets={"rate-micro-batch": {"offset": 50, "timestamp": 50000}},
    )
    [op] = writer.base.operators
    # the bootstrap state from a Spark DataFrame (e.g. a batch backfill's result)
    state = spark.createDataFrame(
        [(("k1",), (10,)), (("k3",), (1,))], "key struct<k: string>, value struct<count: bigint>"
    )
    sp = writer.with_state(op.uid, state).write(tmp_path / "sp")
    assert sp.batch == 4
    plan = restore(sp.path, str(tmp_path / "ck"))
    assert not plan.problems
    fn = load_query_function(spec)
    out = run(spark, lambda s, _d: (fn(s), "update"), tmp_path, tmp_path / "ck")
    assert min(out) == 5
    expected = {"k1": 10, "k3": 1}
    for v in range(50, 60):
        expected[f"k{v % 7}"] = expected.get(f"k{v % 7}", 0) + 1
    got = _counts(out)
    assert got == {k: expected[k] for k in got} and set(got) == {f"k{v % 7}" for v in range(50, 60)}


def test_with_state_streams_a_spark_dataframe_a_partition_at_a_time(spark, tmp_path):
    """A Spark DataFrame of several partitions goes in one Spark partition at a time (never
    collected whole) and gives the savepoint an Arrow table of the same rows gives."""
    from statectl.processor.spill import is_stream, spark_chunks

    sp_url, _ = take_savepoint(str(FIXTURES / "fmgws-hdfs"), str(tmp_path / "sp"))
    base = statectl.open(sp_url)
    uid = base.operators[0].uid
    rows = base.read(uid).drop_columns(["partition_id"])
    import pyarrow.parquet as pq

    pq.write_table(rows, tmp_path / "rows.parquet")
    df = spark.read.parquet(str(tmp_path / "rows.parquet")).repartition(3)
    assert is_stream(df)
    parts = list(spark_chunks(df))
    assert len(parts) >= 3 and sum(p.num_rows for p in parts) == rows.num_rows
    from_spark = statectl.SavepointWriter.from_savepoint(sp_url).with_state(uid, df)
    from_arrow = statectl.SavepointWriter.from_savepoint(sp_url).with_state(uid, rows)
    a = from_spark.write(tmp_path / "a").read(uid)
    b = from_arrow.write(tmp_path / "b").read(uid)
    assert sorted(arrow_rows(a), key=repr) == sorted(arrow_rows(b), key=repr)
    assert sorted(arrow_rows(b), key=repr) == sorted(arrow_rows(base.read(uid)), key=repr)

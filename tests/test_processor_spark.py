"""The state processor on real Spark: an edited savepoint restores and the query continues
with the deleted key starting fresh; ``diff`` equals a diff computed with Spark's own
``statestore`` reader; ``to_spark`` reads the same rows as ``read``."""

from __future__ import annotations

import json

import pytest

import statectl
from statectl.restoring import restore
from statectl.savepoints.create import take_savepoint
from tests.conftest import arrow_rows, spark_rows
from tests.test_restore import run, write_input

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
    from tests.conftest import FIXTURES

    sp = statectl.open(statectl.savepoint(FIXTURES / "join-hdfs", tmp_path / "sp"))
    ck = statectl.open(FIXTURES / "join-hdfs")
    for handle in (sp, ck):
        for opts in ({"join_side": "left"}, {"table": "right-keyToNumValues"}):
            df = handle.to_spark(spark, 0, **opts)
            ours = handle.read(0, **opts)
            assert spark_rows(df) == sorted(arrow_rows(ours), key=repr), (handle.kind, opts)

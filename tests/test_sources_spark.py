"""Restore into a query whose sources changed, on real Spark: a file source handed over to
another source at a given offset, a source removed (-n) while another keeps its seen-files log
at a new index, a source added from its configured start. Every continued output is compared
with counts computed from the inputs in plain Python."""

from __future__ import annotations

import json
from collections import Counter

import pytest
from typer.testing import CliRunner

from statectl.api import restore
from statectl.cli import app
from statectl.query_plan import load_query_function
from statectl.savepoints.create import take_savepoint
from tests.helpers.spark import run, write_input

pytestmark = pytest.mark.spark

QUERIES = """
def file_source(spark, path):
    return spark.readStream.schema("id long, k string, v long, ts timestamp").json(path)


def rate(spark):
    return (
        spark.readStream.format("rate-micro-batch").option("rowsPerBatch", 10).load()
        .selectExpr("concat('k', cast(value % 7 as string)) AS k")
    )


def from_a(spark):
    return file_source(spark, {a!r}).groupBy("k").count()


def from_rate(spark):
    return rate(spark).groupBy("k").count()


def from_a_and_b(spark):
    return file_source(spark, {a!r}).select("k").union(file_source(spark, {b!r}).select("k")).groupBy("k").count()


def from_b_and_rate(spark):
    return file_source(spark, {b!r}).select("k").union(rate(spark)).groupBy("k").count()


def named(spark, path, name):
    return spark.readStream.name(name).schema("id long, k string, v long, ts timestamp").json(path)


def named_a_and_b(spark):
    return named(spark, {a!r}, "a").select("k").union(named(spark, {b!r}, "b").select("k")).groupBy("k").count()


def named_b_and_rate(spark):
    rate = spark.readStream.name("r").format("rate-micro-batch").option("rowsPerBatch", 10).load()
    return (
        named(spark, {b!r}, "b").select("k")
        .union(rate.selectExpr("concat('k', cast(value % 7 as string)) AS k"))
        .groupBy("k").count()
    )
"""

# Offset log v2: sources keyed by the names readStream.name(...) gives them (Spark 4.2+).
NAMED = {"spark.sql.streaming.queryEvolution.enableSourceEvolution": "true"}


def _queries(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    path = tmp_path / "queries.py"
    path.write_text(QUERIES.format(a=str(a), b=str(b)))
    return a, b, path


def _case(spec):
    fn = load_query_function(spec)
    return lambda spark, _d: (fn(spark), "update")


def _file_keys(d, files) -> Counter:
    c: Counter = Counter()
    for i in files:
        for line in (d / f"part-{i:03d}.json").read_text().splitlines():
            c[json.loads(line)["k"]] += 1
    return c


def _rate_keys(values) -> Counter:
    return Counter(f"k{v % 7}" for v in values)


def _last(out: dict[int, list]) -> dict[str, int]:
    last: dict[str, int] = {}
    for b in sorted(out):
        for k, n in out[b]:
            last[k] = n
    return last


def test_file_source_handed_over_to_another_source_at_given_offsets(spark, tmp_path):
    a, _, queries = _queries(tmp_path)
    write_input(a, 0, 3)
    run(spark, _case(f"{queries}:from_a"), a, tmp_path / "ck1", "hdfs")
    sp_url, meta = take_savepoint(str(tmp_path / "ck1"), str(tmp_path / "sp"))
    spec = f"{queries}:from_rate"

    # An offset the rate source cannot parse is refused at plan time, by the CLI with exit 2.
    bad = CliRunner().invoke(
        app,
        [
            "restore",
            str(tmp_path / "bad"),
            "-s",
            sp_url,
            "--query",
            spec,
            "--dry-run",
            "--source-offsets",
            '0={"offset":"x"}',
        ],
    )
    assert bad.exit_code == 2, bad.output
    assert "cannot parse this offset" in bad.output and not (tmp_path / "bad").exists()

    given = '{"offset":100,"timestamp":100000}'
    plan = restore(
        sp_url,
        tmp_path / "ck2",
        query=spec,
        spark=spark,
        partitions=3,
        source_offsets={"rate-micro-batch": given},
    )
    assert plan.ok, plan.problems
    [src] = plan.sources
    assert src["position"] == "given" and src["offset"] == given
    assert src["replaces"] == f"FileSource[{a}]"
    offsets = (tmp_path / "ck2" / "offsets" / str(meta.batch_id)).read_text().splitlines()
    assert offsets[2:] == [given]
    assert not (tmp_path / "ck2" / "sources").exists()  # the file source's log is not carried

    continued = run(spark, _case(spec), a, tmp_path / "ck2")
    assert continued and all(b > meta.batch_id for b in continued)
    expected = _file_keys(a, range(3)) + _rate_keys(range(100, 110))
    got = _last(continued)
    assert got == {k: expected[k] for k in got}
    assert set(got) == set(_rate_keys(range(100, 110)))


def test_source_removed_with_n_kept_source_moves_and_added_source_starts_fresh(spark, tmp_path):
    a, b, queries = _queries(tmp_path)
    write_input(a, 0, 2)
    write_input(b, 10, 2)
    run(spark, _case(f"{queries}:from_a_and_b"), a, tmp_path / "ck1", "hdfs")
    sp_url, meta = take_savepoint(str(tmp_path / "ck1"), str(tmp_path / "sp"))
    spec = f"{queries}:from_b_and_rate"

    refused = restore(sp_url, tmp_path / "ck2", query=spec, spark=spark, dry_run=True)
    assert not refused.ok
    assert any(f"FileSource[{a}]" in p and "-n" in p for p in refused.problems), refused.problems

    plan = restore(
        sp_url, tmp_path / "ck2", query=spec, spark=spark, allow_non_restored=True, partitions=2
    )
    assert plan.ok, plan.problems
    by_pos = {s["description"]: s for s in plan.sources}
    assert by_pos[f"FileSource[{b}]"]["position"] == "kept"
    assert by_pos[f"FileSource[{b}]"]["from"] == 1 and by_pos[f"FileSource[{b}]"]["index"] == 0
    assert by_pos["rate-micro-batch"]["position"] == "new"
    assert by_pos[f"FileSource[{a}]"]["position"] == "dropped"
    assert (tmp_path / "ck2" / "sources" / "0").is_dir()

    # New files in both directories: only b's new files and the rate source's first batch count.
    write_input(a, 2, 2)
    write_input(b, 12, 2)
    continued = run(spark, _case(spec), b, tmp_path / "ck2")
    assert continued and all(x > meta.batch_id for x in continued)
    expected = _file_keys(a, range(2)) + _file_keys(b, range(10, 14)) + _rate_keys(range(0, 10))
    got = _last(continued)
    assert got == {k: expected[k] for k in got}
    assert set(got) == set(_file_keys(b, range(12, 14)) + _rate_keys(range(10)))


def test_named_sources_are_matched_by_name_dropped_with_n_and_added_from_their_start(
    spark, tmp_path
):
    """Offset log v2: the query drops named source ``a``, keeps ``b`` (now first in the plan)
    and adds ``r``; restored at another partition count, ``b`` continues from its seen-files
    log and ``r`` from its first batch, as Spark's own source evolution would."""
    a, b, queries = _queries(tmp_path)
    write_input(a, 0, 2)
    write_input(b, 10, 2)
    run(spark, _case(f"{queries}:named_a_and_b"), a, tmp_path / "ck1", "hdfs", NAMED)
    sp_url, meta = take_savepoint(str(tmp_path / "ck1"), str(tmp_path / "sp"))
    assert meta.offset_log_version == 2 and sorted(meta.offsets) == ["a", "b"]
    spec = f"{queries}:named_b_and_rate"

    refused = restore(sp_url, tmp_path / "ck2", query=spec, spark=spark, dry_run=True)
    assert not refused.ok
    assert any("'a'" in p and "-n" in p for p in refused.problems), refused.problems

    plan = restore(
        sp_url, tmp_path / "ck2", query=spec, spark=spark, allow_non_restored=True, partitions=3
    )
    assert plan.ok, plan.problems
    by_name = {s["index"] or s["savepoint_index"]: s for s in plan.sources}
    assert by_name["b"]["position"] == "kept" and by_name["r"]["position"] == "new"
    assert by_name["a"]["position"] == "dropped"
    lines = (tmp_path / "ck2" / "offsets" / str(meta.batch_id)).read_text().splitlines()
    assert lines[0] == "v2" and [x.split(":")[0] for x in lines[2:]] == ["b"]
    assert sorted(p.name for p in (tmp_path / "ck2" / "sources").iterdir()) == ["b"]

    write_input(a, 2, 2)
    write_input(b, 12, 2)
    continued = run(spark, _case(spec), b, tmp_path / "ck2", confs=NAMED)
    assert continued and all(x > meta.batch_id for x in continued)
    expected = _file_keys(a, range(2)) + _file_keys(b, range(10, 14)) + _rate_keys(range(0, 10))
    got = _last(continued)
    assert got == {k: expected[k] for k in got}
    assert set(got) == set(_file_keys(b, range(12, 14)) + _rate_keys(range(10)))

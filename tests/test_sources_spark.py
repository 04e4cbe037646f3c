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
from statectl.checkpoint.model import Checkpoint
from statectl.cli import app
from statectl.query_plan import load_query_function
from statectl.savepoints.create import take_savepoint
from statectl.sources.kinds import kafka_json
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


# -- continuations over Python data sources whose offsets look like Kafka's (issue 22) ------


def topic_source(name: str, topic: str, stop: int, per_batch: int = 4):
    """A PySpark Python streaming data source named ``name`` reading one Kafka-like topic:
    offsets ``{topic: {"0": n}}``, ``per_batch`` rows a batch up to ``stop``. Row ``i`` is
    ``(i, "k{i % 3}")``, a function of the offset only, so every run is deterministic.
    Classes defined in here so that cloudpickle ships them by value to the Python workers."""
    from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition

    class Part(InputPartition):
        def __init__(self, start, end):
            self.start, self.end = start, end

    class Reader(DataSourceStreamReader):
        def initialOffset(self):
            return {topic: {"0": 0}}

        def latestOffset(self, start=None, limit=None):
            n = (start or self.initialOffset())[topic]["0"]
            return {topic: {"0": min(n + per_batch, stop)}}

        def partitions(self, start, end):
            return [Part(start[topic]["0"], end[topic]["0"])]

        def read(self, partition):
            for i in range(partition.start, partition.end):
                yield (i, f"k{i % 3}")

        def commit(self, end):
            pass

    class Source(DataSource):
        @classmethod
        def name(cls):
            return name

        def schema(self):
            return "i long, k string"

        def streamReader(self, schema):
            return Reader()

    return Source


def read_topic(spark, topic: str, stop: int, name: str | None = None):
    """The topic's source registered as ``statectl_topic_<topic>``; ``name``: named source."""
    fmt = f"statectl_topic_{topic}"
    spark.dataSource.register(topic_source(fmt, topic, stop))
    reader = spark.readStream.name(name) if name else spark.readStream
    return reader.format(fmt).load()


def union_query(inp, stop):
    """The Python source's topic ``events`` unioned with a file source, counted per key."""

    def q(spark, _d):
        files = spark.readStream.schema("id long, k string, v long, ts timestamp").json(str(inp))
        rows = read_topic(spark, "events", stop).select("k").union(files.select("k"))
        return rows.groupBy("k").count(), "update"

    return q


def named_query(stop):
    def q(spark, _d):
        return read_topic(spark, "events", stop, name="events").groupBy("k").count(), "update"

    return q


def join_query(stop):
    """A stream-stream inner join of topics ``left`` and ``right`` on ``k``."""

    def q(spark, _d):
        left = read_topic(spark, "left", stop).selectExpr("i AS li", "k")
        right = read_topic(spark, "right", stop).selectExpr("i AS ri", "k AS rk")
        return left.join(right, left.k == right.rk).select("k", "li", "ri"), "append"

    return q


def _topic_keys(offsets) -> Counter:
    return Counter(f"k{i % 3}" for i in offsets)


def _restore_cli(*args: str) -> None:
    res = CliRunner().invoke(app, ["restore", *args])
    assert res.exit_code == 0, res.output


def _uninterrupted(spark, query, ckpt) -> dict[int, list]:
    """Two batches on one checkpoint, never restored: availableNow takes one batch of a
    Python data source a run (its latest offset when the run starts is the run's end)."""
    out: dict[int, list] = {}
    for _ in range(2):
        out.update(run(spark, query, ckpt, ckpt))
    assert sorted(out) == [0, 1]
    return out


def test_python_source_union_file_source_continues_on_rocksdb_at_3_partitions(spark, tmp_path):
    """A union of the Kafka-like Python source with a file source: one batch on HDFS at 2
    partitions, restored to RocksDB at 3 and continued for one batch: the counts of one
    uninterrupted run over both sources' rows (run on Spark, and counted in Python)."""
    a = tmp_path / "a"
    write_input(a, 0, 1)
    first = run(spark, union_query(a, 4), a, tmp_path / "ck1", "hdfs")
    assert sorted(first) == [0]
    sp_url, meta = take_savepoint(str(tmp_path / "ck1"), str(tmp_path / "sp"))
    assert [s["kind"] for s in meta.sources] == ["python", "file"]
    _restore_cli(str(tmp_path / "ck2"), "-s", sp_url, "--backend", "rocksdb", "--partitions", "3")
    write_input(a, 1, 1)
    continued = run(spark, union_query(a, 8), a, tmp_path / "ck2")
    assert sorted(continued) == [1]
    expected = _file_keys(a, range(2)) + _topic_keys(range(8))
    assert {**_last(first), **_last(continued)} == dict(expected)
    assert set(_last(continued)) == set(expected)  # every key changed in the second batch
    uninterrupted = _uninterrupted(spark, union_query(a, 8), tmp_path / "full")
    assert {**_last(first), **_last(continued)} == _last(uninterrupted)
    assert Checkpoint.open(str(tmp_path / "ck2")).backend(1) == "rocksdb"


def test_named_python_source_restored_with_an_offset_given_by_name(spark, tmp_path):
    """Offset log v2 over a non-file source (Spark 4.3, ``readStream.name("events")``): read,
    savepointed, restored to RocksDB at 3 partitions with ``--source-offsets events=JSON``
    (skipping rows 4-7), continued: the counts of rows 0-3 and 8-11."""
    first = run(spark, named_query(4), tmp_path, tmp_path / "ck1", "hdfs", NAMED)
    sp_url, meta = take_savepoint(str(tmp_path / "ck1"), str(tmp_path / "sp"))
    assert meta.offset_log_version == 2 and list(meta.offsets) == ["events"]
    info = json.loads(CliRunner().invoke(app, ["inspect", sp_url, "--json", "--no-rows"]).output)
    assert [(s["name"], s["kind"]) for s in info["sources"]] == [("events", "python")]
    bad = CliRunner().invoke(
        app, ["restore", str(tmp_path / "bad"), "-s", sp_url, "--source-offsets", "events=[8]"]
    )
    assert bad.exit_code == 2 and "Python data source" in bad.output, bad.output
    given = '{"events":{"0":8}}'
    _restore_cli(
        str(tmp_path / "ck2"), "-s", sp_url, "--backend", "rocksdb", "--partitions", "3",
        "--source-offsets", f"events={given}",
    )  # fmt: skip
    lines = (tmp_path / "ck2" / "offsets" / str(meta.batch_id)).read_text().splitlines()
    # written as the Python source writes its offsets (json.dumps), keyed by name
    assert lines[0] == "v2" and lines[2:] == ['events:{"events": {"0": 8}}'], lines
    continued = run(spark, named_query(12), tmp_path, tmp_path / "ck2", confs=NAMED)
    assert sorted(continued) == [meta.batch_id + 1]
    assert {**_last(first), **_last(continued)} == dict(_topic_keys([*range(4), *range(8, 12)]))


def test_stream_stream_join_of_two_topics_continues_on_rocksdb_at_3_partitions(spark, tmp_path):
    """A stream-stream join of two Kafka-like topics: one batch on HDFS at 2 partitions,
    restored to RocksDB at 3 (its four join stores per partition repartitioned), one more
    batch: every matching pair exactly once, batch by batch as one uninterrupted run (four
    rows of each topic a batch) outputs them."""
    first = run(spark, join_query(4), tmp_path, tmp_path / "ck1", "hdfs")
    sp_url, meta = take_savepoint(str(tmp_path / "ck1"), str(tmp_path / "sp"))
    assert [json.loads(o) for o in meta.offsets.values()] == [
        {"left": {"0": 4}},
        {"right": {"0": 4}},
    ]
    _restore_cli(str(tmp_path / "ck2"), "-s", sp_url, "--backend", "rocksdb", "--partitions", "3")
    continued = run(spark, join_query(8), tmp_path, tmp_path / "ck2")
    assert sorted(first) == [0] and sorted(continued) == [1]
    pairs = sorted((f"k{i % 3}", i, j) for i in range(8) for j in range(8) if i % 3 == j % 3)
    got = sorted(first[0] + continued[1])
    assert got == pairs and len(set(got)) == len(got)
    uninterrupted = _uninterrupted(spark, join_query(8), tmp_path / "full")
    assert first[0] + continued[1] == uninterrupted[0] + uninterrupted[1]


def test_kafka_offsets_are_written_in_json_utils_order(spark):
    """``kafka_json`` against what ``JsonUtils.partitionOffsets`` runs (the Kafka connector
    jar cannot be installed here): the same Scala 2.13 ``mutable.HashMap``s, filled in the
    same order, written by Jackson with its Scala module, from the jars of this Spark."""
    jvm = spark.sparkContext._jvm
    scala_module = getattr(
        getattr(jvm.com.fasterxml.jackson.module.scala, "DefaultScalaModule$"), "MODULE$"
    )
    mapper = jvm.com.fasterxml.jackson.databind.ObjectMapper().registerModule(scala_module)
    cases = [
        {"events": {"0": 24, "1": 16}},
        {"events": {str(p): p * 3 for p in range(40)}},
        {"b": {"0": 1}, "a": {"7": 2, "16": 3, "5": -2}, "topicA": {"0": 1}, "Ab": {"0": 1}},
        {f"t{i}": {"0": i, "100": i} for i in range(30)},
        {"BB": {"0": 1}, "Aa": {"0": 2}},  # the same String.hashCode
    ]
    for offsets in cases:
        pairs = sorted((t, int(p), o) for t, parts in offsets.items() for p, o in parts.items())
        result = jvm.scala.collection.mutable.HashMap()
        for topic, p, o in pairs:
            found = result.get(topic)  # getOrElse's default is by-name (a Function0)
            parts = found.get() if found.isDefined() else jvm.scala.collection.mutable.HashMap()
            parts.update(p, jvm.java.lang.Long.valueOf(o))
            result.update(topic, parts)
        assert kafka_json(offsets) == mapper.writeValueAsString(result), offsets

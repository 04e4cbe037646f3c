"""A checkpoint upgraded to format v2 runs in Real-Time Mode (issue 23).

Spark 4.3 decides the state checkpoint format of a restarted query from its newest commit
(``CheckpointVersionManager.setSparkSessionConfigsForCommitLog``: a ``v2`` commit, or a ``v3``
one with ``stateUniqueIds``, means format 2), and ``MicroBatchExecution.initializeExecution``
refuses a ``RealTimeTrigger`` on format 1 with
``STREAMING_REAL_TIME_MODE.CHECKPOINT_FORMAT_V1_NOT_SUPPORTED`` before it runs a batch. So a
query that ran with an ordinary trigger (format 1) cannot move to Real-Time Mode on its own
checkpoint; ``migrate --checkpoint-format 2`` is the way across.

The source is the JVM's ``LowLatencyMemoryStream`` (Real-Time Mode reads only it and Kafka);
it also runs with an ordinary trigger, so one query writes the v1 checkpoint in this process.
The Real-Time Mode continuation runs in a subprocess (fixtures/realtime.py): it needs a task
slot for every source and shuffle partition at once, more than the session's ``local[2]``.
"""

from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
import sys

import pytest

import statectl
from statectl.checkpoint.model import Checkpoint
from tests.helpers.fixtures import ROOT
from tests.helpers.spark import PROVIDERS

RUNNER = ROOT / "fixtures" / "realtime.py"
_spec = importlib.util.spec_from_file_location("fixture_realtime_day2", RUNNER)
assert _spec and _spec.loader
realtime = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(realtime)

STEPS = [["a", "b", "a", "k1", "c"]]  # one batch before the upgrade, the smallest proof
MORE = ["d", "a", "b", "k1"]
PROVIDER = "spark.sql.streaming.stateStore.providerClass"
# The runtime floor of a real-time batch (default 5 s): the refused start below names 2 s.
MIN_BATCH = "spark.sql.streaming.realTimeMode.minBatchDuration"


def _memory_stream(spark):
    """``groupBy(value).count()`` over a two-partition ``LowLatencyMemoryStream`` (the query
    of fixtures/realtime.py), and a function adding one step of keys to the stream."""
    from pyspark.sql import DataFrame

    jvm = spark._jvm
    stream = jvm.org.apache.spark.sql.execution.streaming.sources.LowLatencyMemoryStream.apply(
        spark._jsparkSession, realtime.SOURCE_PARTITIONS, jvm.org.apache.spark.sql.Encoders.STRING()
    )

    def add(keys: list[str]) -> None:
        items = jvm.java.util.ArrayList()
        for k in keys:
            items.add(k)
        stream.addData(jvm.scala.jdk.javaapi.CollectionConverters.asScala(items))

    return DataFrame(stream.toDF(), spark).groupBy("value").count(), add


def _microbatch(df, ckpt, out: dict):
    def collect(batch, batch_id):
        out[batch_id] = {r["value"]: r["count"] for r in batch.collect()}

    return (
        df.writeStream.outputMode("update")
        .foreachBatch(collect)
        .option("checkpointLocation", str(ckpt))
        .trigger(processingTime="200 milliseconds")
        .start()
    )


@pytest.mark.spark
def test_v1_checkpoint_migrated_to_v2_continues_in_real_time_mode(spark, tmp_path):
    df, add = _memory_stream(spark)
    first: dict[int, dict] = {}
    # The data is in the stream before the query starts: a trigger that fires first would
    # otherwise commit an empty batch 0 (the source reports an offset before any data).
    for step in STEPS:
        add(step)
    spark.conf.set(PROVIDER, PROVIDERS["rocksdb"])  # Real-Time Mode's only state store
    try:
        q = _microbatch(df, tmp_path / "v1", first)
    finally:
        spark.conf.unset(PROVIDER)
    q.processAllAvailable()
    q.stop()
    v1 = Checkpoint.open(str(tmp_path / "v1"))
    assert v1.latest_committed_batch == 0 and v1.checkpoint_format_version(0) == 1
    assert (tmp_path / "v1" / "commits" / "0").read_text().startswith("v1\n")
    shutil.copytree(tmp_path / "v1", tmp_path / "reference")

    # (a) Without the upgrade Spark refuses the checkpoint in Real-Time Mode, before a batch.
    spark.conf.set(MIN_BATCH, "1s")
    try:
        rt = (
            df.writeStream.outputMode("update")
            .foreach(lambda row: None)
            .option("checkpointLocation", str(tmp_path / "v1"))
            .trigger(realTime="2 seconds")
            .start()
        )
    finally:
        spark.conf.unset(MIN_BATCH)
    with pytest.raises(Exception, match="CHECKPOINT_FORMAT_V1_NOT_SUPPORTED"):
        rt.awaitTermination(120)
    for log in ("offsets", "commits"):  # nothing was written
        assert sorted(p.name for p in (tmp_path / "v1" / log).glob("[0-9]*")) == ["0"]

    # The uninterrupted reference: the same query, same trigger, on its own checkpoint.
    add(MORE)
    more: dict[int, dict] = {}
    q = _microbatch(df, tmp_path / "reference", more)
    q.processAllAvailable()
    q.stop()
    assert sorted(more) == [1]

    # (b) Upgraded, the checkpoint runs in Real-Time Mode and continues exactly.
    doc = statectl.migrate(tmp_path / "v1", tmp_path / "v2", checkpoint_format=2).to_dict()
    assert any("checkpoint format 1 -> 2" in c for c in doc["conversions"])
    steps = json.dumps([*STEPS, MORE])
    args = [str(tmp_path / "v2"), str(tmp_path / "out"), steps, "--replay", str(len(STEPS))]
    done = subprocess.run(
        [sys.executable, str(RUNNER), *args, "--partitions", "2"],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    # Only the new step's keys, each with every count it had before (a lost state restarts
    # a key at 1): what the uninterrupted query emitted for that batch.
    assert realtime.seen(tmp_path / "out") == more[1] == {"a": 3, "b": 2, "d": 1, "k1": 2}
    v2 = Checkpoint.open(str(tmp_path / "v2"))
    last = v2.latest_committed_batch
    assert last > 0 and v2.checkpoint_format_version(last) == 2

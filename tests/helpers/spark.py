"""The streaming queries the Spark tests run (by case name, over JSON files written per batch)
and the runner that runs one to the end of its input and collects what each batch emitted."""

from __future__ import annotations

import datetime as dt
import json

from tests.helpers.rows import normalize

# The file source of the query modules the Spark tests write (``{input!r}``: its directory,
# filled by ``str.format``): one JSON file per micro-batch.
QUERY_SOURCE = """INPUT = {input!r}


def src(spark):
    return (
        spark.readStream.schema("id long, k string, v long, ts timestamp")
        .option("maxFilesPerTrigger", 1)
        .json(INPUT)
    )
"""

# ``statectl --engine spark`` on a local cluster of two executors (no shared /tmp with the
# driver, as on a real cluster).
CLUSTER = [
    "--spark-conf",
    "spark.master=local-cluster[2,1,1024]",
    "--spark-conf",
    "spark.ui.enabled=false",
]

PROVIDERS = {
    "hdfs": "org.apache.spark.sql.execution.streaming.state.HDFSBackedStateStoreProvider",
    "rocksdb": "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider",
}


def write_input(d, start, count):
    d.mkdir(exist_ok=True)
    t0 = dt.datetime(2024, 1, 1)
    for b in range(start, start + count):
        rows = []
        for j in range(10):
            ts = t0 + dt.timedelta(seconds=b * 8 + j % 5)
            rows.append(
                json.dumps(
                    {
                        "id": j % 4,
                        "k": f"k{(b * 3 + j) % 7}",
                        "v": (j * 5 + b) % 9,
                        "ts": ts.isoformat(),
                    }
                )
            )
        (d / f"part-{b:03d}.json").write_text("\n".join(rows))


def tws_processor():
    """Value, list and map state and event-time timers (the tws fixtures' processor).

    Defined inside a function so cloudpickle ships it by value to the Python workers."""
    import pandas as pd
    from pyspark.sql.streaming import StatefulProcessor
    from pyspark.sql.types import LongType, StringType, StructField, StructType

    class Processor(StatefulProcessor):
        def init(self, handle):
            self.handle = handle
            self.cnt = handle.getValueState("cnt", StructType([StructField("c", LongType())]))
            self.lst = handle.getListState("lst", StructType([StructField("v", LongType())]))
            self.mp = handle.getMapState(
                "mp",
                StructType([StructField("mk", StringType())]),
                StructType([StructField("mv", LongType())]),
            )

        def handleInputRows(self, key, rows, timerValues):
            n, latest = 0, 0
            for pdf in rows:
                for v, ts in zip(pdf["v"], pdf["ts"], strict=True):
                    self.lst.appendValue((int(v),))
                    self.mp.updateValue((str(int(v) % 3),), (int(v),))
                    latest = max(latest, int(pd.Timestamp(ts).timestamp() * 1000))
                    n += 1
            # The list length and a map value make the output depend on all restored state.
            # (Map key "1", not "0": timers remove "0", and whether a timer fires before or
            # after a batch's input depends on where no-data batches fall, which differs
            # between a split and an uninterrupted run.)
            total = sum(1 for _ in self.lst.get())
            first = self.mp.getValue(("1",))[0] if self.mp.containsKey(("1",)) else -2
            c = (self.cnt.get()[0] if self.cnt.exists() else 0) + n
            self.cnt.update((c,))
            self.handle.registerTimer(latest + 10_000)
            yield pd.DataFrame({"k": [key[0]], "c": [c * 1_000_000 + total * 100 + first]})

        def handleExpiredTimer(self, key, timerValues, expiredTimerInfo):
            if self.mp.containsKey(("0",)):
                self.mp.removeKey(("0",))
            yield pd.DataFrame({"k": [key[0]], "c": [-1]})

        def close(self):
            pass

    return Processor()


def tws_rows_processor():
    """The tws processor for the row-based ``transformWithState`` of PySpark 4.1+: rows in,
    ``Row``s out (the tws-rows fixture's operator, ``transformWithStateInPySparkExec``)."""
    import datetime as _dt

    from pyspark.sql import Row
    from pyspark.sql.streaming import StatefulProcessor
    from pyspark.sql.types import LongType, StringType, StructField, StructType

    class Processor(StatefulProcessor):
        def init(self, handle):
            self.handle = handle
            self.cnt = handle.getValueState("cnt", StructType([StructField("c", LongType())]))
            self.lst = handle.getListState("lst", StructType([StructField("v", LongType())]))
            self.mp = handle.getMapState(
                "mp",
                StructType([StructField("mk", StringType())]),
                StructType([StructField("mv", LongType())]),
            )

        def handleInputRows(self, key, rows, timerValues):
            n, latest = 0, 0
            for row in rows:
                self.lst.appendValue((int(row.v),))
                self.mp.updateValue((str(int(row.v) % 3),), (int(row.v),))
                ts = row.ts if row.ts.tzinfo else row.ts.replace(tzinfo=_dt.timezone.utc)
                latest = max(latest, int(ts.timestamp() * 1000))
                n += 1
            # As in tws_processor: the output depends on every kind of restored state.
            total = sum(1 for _ in self.lst.get())
            first = self.mp.getValue(("1",))[0] if self.mp.containsKey(("1",)) else -2
            c = (self.cnt.get()[0] if self.cnt.exists() else 0) + n
            self.cnt.update((c,))
            self.handle.registerTimer(latest + 10_000)
            yield Row(k=key[0], c=c * 1_000_000 + total * 100 + first)

        def handleExpiredTimer(self, key, timerValues, expiredTimerInfo):
            if self.mp.containsKey(("0",)):
                self.mp.removeKey(("0",))
            yield Row(k=key[0], c=-1)

        def close(self):
            pass

    return Processor()


TYPED_KEYS = [
    "id % 2 = 0 as b",
    "cast(id as byte) as by",
    "cast(-id as short) as sh",
    "case when id = 1 then null else cast(id * 1000 as int) end as i",
    "id - 4 as l",
    "cast(id / 2 as float) as f",
    "id * -0.25d as d",
    "case when id = 3 then null else concat('h\u00e9llo-', k, '-longer than eight') end as s",
    "cast(k as binary) as bin",
    "date_add(date'2024-01-01', cast(id as int)) as dt",
    "timestamp_seconds(1704067200 + id) as ts2",
    "cast(timestamp_seconds(1704067200 + id) as timestamp_ntz) as tsn",
    "case when id = 2 then null else cast(id * 1.25 as decimal(10,2)) end as dec",
    "cast(-id * 12345678901234567.891 as decimal(38,3)) as bigdec",
    "case when id = 3 then null else named_struct('a', cast(id as int), 'b', k) end as st",
    "array(cast(id as int), null, 3) as arr",
    "array(k, 'qq') as arrs",
    "case when id = 0 then null else map(k, cast(id as int)) end as mp",
]


def build(spark, case, d):
    import pyspark.sql.functions as F

    def src():
        reader = spark.readStream.name("events") if case.endswith("-named") else spark.readStream
        return (
            reader.schema("id long, k string, v long, ts timestamp")
            .option("maxFilesPerTrigger", 1)
            .json(str(d))
        )

    if case in ("agg", "agg-named", "agg-checksum", "agg-v1"):
        return src().groupBy("k").agg(
            F.count("*").alias("n"), F.sum("v").alias("s"), F.avg("v").alias("a")
        ), "update"
    if case == "agg-types":
        # Grouping keys of every type statectl places, derived from id and k only so that the
        # new batches hit restored keys: a misplaced key would miss its state and count from 0.
        df = src().selectExpr(*TYPED_KEYS, "case when v = 4 then null else v end as maybe")
        keys = [c for c in df.columns if c != "maybe"]
        return df.groupBy(*keys).agg(F.count("*").alias("n"), F.max("maybe").alias("mx")), "update"
    if case == "dedup":
        return src().dropDuplicates(["id", "k"]), "append"
    if case == "window":
        return src().withWatermark("ts", "5 seconds").groupBy(
            F.window("ts", "10 seconds"), "k"
        ).count(), "append"
    if case == "join":
        left = src().withWatermark("ts", "10 seconds").selectExpr("k as lk", "v as lv", "ts as lts")
        right = (
            src().withWatermark("ts", "10 seconds").selectExpr("k as rk", "id as rid", "ts as rts")
        )
        return left.join(
            right, F.expr("lk = rk AND rts BETWEEN lts AND lts + interval 2 seconds")
        ), "append"
    if case == "join-fixture":  # the query of the join fixtures (fixtures/generate.py)
        from fixtures.generate import q_join

        return q_join(spark, d)
    if case == "join-leftsemi-fixture":  # the query of join4-leftsemi-rocksdb
        from fixtures.generate import q_join_outer

        return q_join_outer("left_semi")(spark, d)
    if case == "dedupwm":
        return src().withWatermark("ts", "10 seconds").dropDuplicatesWithinWatermark(
            ["id", "k"]
        ), "append"
    if case in ("fmgws", "fmgws-v1"):
        from pyspark.sql.streaming.state import GroupStateTimeout

        # Nested so cloudpickle ships it by value: Python workers cannot import tests/.
        def count_per_key(key, pdfs, state):
            """applyInPandasWithState: a running row count per key, kept in user state."""
            import pandas as pd

            n = state.get[0] if state.exists else 0
            for pdf in pdfs:
                n += len(pdf)
            state.update((n,))
            yield pd.DataFrame({"k": [key[0]], "n": [n]})

        return src().groupBy("k").applyInPandasWithState(
            count_per_key, "k string, n long", "n long", "update", GroupStateTimeout.NoTimeout
        ), "update"
    if case in ("tws", "tws-avro"):
        return src().withWatermark("ts", "5 seconds").groupBy("k").transformWithStateInPandas(
            tws_processor(),
            outputStructType="k string, c long",
            outputMode="Update",
            timeMode="EventTime",
        ), "update"
    if case == "tws-rows":
        return src().withWatermark("ts", "5 seconds").groupBy("k").transformWithState(
            tws_rows_processor(),
            outputStructType="k string, c long",
            outputMode="Update",
            timeMode="EventTime",
        ), "update"
    if case == "multi":
        return src().dropDuplicates(["id", "k"]).groupBy("k").count(), "update"
    if case == "limit":
        return src().limit(LIMIT), "append"
    if case in ("session", "session-dynamic"):
        # Batch b's events lie at 8b..8b+4 s: a 5 s gap (4 or 6 s, by key, dynamic) merges a
        # key's events across consecutive batches, and sessions still open at the savepoint
        # merge with the next batch's events after the restore (SESSION_MERGED checks it).
        gap = (
            "5 seconds"
            if case == "session"
            else F.when(F.col("k").isin("k0", "k1", "k2"), "6 seconds").otherwise("4 seconds")
        )
        return src().withWatermark("ts", "5 seconds").groupBy(
            F.session_window("ts", gap), "k"
        ).count(), "append"
    raise AssertionError(case)


# More than the first run's 3 batches of 10 rows: the limit is reached after the restore.
LIMIT = 45


def run(spark, case, d, ckpt, provider=None, confs=None, sink_name=None, once=False):
    """Run to the end of the input; return {batch id: sorted output rows}.

    ``case`` names a query of :func:`build`, or is a function ``(spark, input) -> (DataFrame,
    output mode)`` such as fixtures/generate.py's queries. ``sink_name`` names the sink (sink
    evolution, commit log v3); PySpark has no ``DataStreamWriter.name``, the JVM writer has.
    ``once``: one batch (trigger once), for ProcessingTime queries availableNow never ends."""
    out: dict[int, list] = {}
    confs = dict(confs or {})

    def collect(df, batch_id):
        out[batch_id] = sorted((normalize(tuple(r)) for r in df.collect()), key=repr)

    key = "spark.sql.streaming.stateStore.providerClass"
    if provider:
        confs[key] = PROVIDERS[provider]
    for k, v in confs.items():
        spark.conf.set(k, v)
    try:
        df, mode = case(spark, d) if callable(case) else build(spark, case, d)
        q = (
            df.writeStream.foreachBatch(collect)
            .outputMode(mode)
            .option("checkpointLocation", str(ckpt))
        )
        if sink_name:
            q._jwrite.name(sink_name)
        (q.trigger(once=True) if once else q.trigger(availableNow=True)).start().awaitTermination()
    finally:
        for k in confs:
            spark.conf.unset(k)
    return out

"""transformWithState with state TTL: a restored query keeps every restored value until its
original expiry, then expires it, and otherwise continues like an uninterrupted run.

TTL runs in processing time (Spark 4.3 refuses it with EventTime), so the test lets real time
pass. The source checkpoint gets two batches; the restored query and the uninterrupted one (the
source checkpoint itself, copied) then each run one batch before any restored value expired and,
after waiting past every list and map value's expiry, one more. Each batch of the two runs
falls in the same TTL window (asserted), so the same values have expired for both. The checks
that need no race against the TTL run while it passes.
"""

from __future__ import annotations

import shutil
import time

import pytest

from statectl.checkpoint.model import Checkpoint
from statectl.restoration import restore
from statectl.savepoints.create import take_savepoint
from statectl.savepoints.store import Savepoint
from statectl.state import Selection
from tests.helpers.restore import entries_by_family
from tests.helpers.rows import arrow_rows, normalize, spark_rows
from tests.helpers.spark import write_input

# The TTL of list and map values, tried in turn: the first that outlasts the source's batches,
# a savepoint, a restore and the restored runs' first batch (3 query starts: well under a
# minute on an idle machine, minutes on a busy one). The test waits about one TTL.
SHORT_TTLS_MS = (75_000, 240_000)
ROCKSDB = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"


def ttl_processor(short_ttl_ms: int):
    """A count that outlives the test (ValueState, TTL 1 h), and a list and a map whose values
    expire after ``short_ttl_ms``. Each output row packs the count, the live list length and
    the sum of the live map values, so it shows exactly which restored values Spark still
    sees. (Nested so cloudpickle ships it by value to the Python workers.)"""
    import pandas as pd
    from pyspark.sql.streaming import StatefulProcessor
    from pyspark.sql.types import LongType, StringType, StructField, StructType

    class Processor(StatefulProcessor):
        def init(self, handle):
            self.cnt = handle.getValueState(
                "cnt", StructType([StructField("c", LongType())]), ttlDurationMs=3_600_000
            )
            self.lst = handle.getListState(
                "lst", StructType([StructField("v", LongType())]), ttlDurationMs=short_ttl_ms
            )
            self.mp = handle.getMapState(
                "mp",
                StructType([StructField("mk", StringType())]),
                StructType([StructField("mv", LongType())]),
                ttlDurationMs=short_ttl_ms,
            )

        def handleInputRows(self, key, rows, timerValues):
            n = 0
            for pdf in rows:
                for v in pdf["v"]:
                    self.lst.appendValue((int(v),))
                    self.mp.updateValue((str(int(v) % 3),), (int(v) + 1,))
                    n += 1
            c = (self.cnt.get()[0] if self.cnt.exists() else 0) + n
            self.cnt.update((c,))
            live = sum(1 for _ in self.lst.get())
            total = sum(int(v[0]) for v in self.mp.values())
            yield pd.DataFrame({"k": [key[0]], "c": [c * 1_000_000 + live * 1000 + total]})

        def close(self):
            pass

    return Processor()


def start(spark, d, ckpt, out: dict[int, list], ttl_ms: int, once: bool = True):
    """Start one trigger(once) run: the batch of the newest input file; or (``once=False``) an
    availableNow run of every new file, a batch each. ProcessingTime mode always has another
    batch to run, so availableNow ends only without no-data batches (``run``)."""

    def collect(df, batch_id):
        out[batch_id] = sorted((normalize(tuple(r)) for r in df.collect()), key=repr)

    df = (
        spark.readStream.schema("id long, k string, v long, ts timestamp")
        .option("maxFilesPerTrigger", 1)
        .json(str(d))
        .groupBy("k")
        .transformWithStateInPandas(
            ttl_processor(ttl_ms),
            outputStructType="k string, c long",
            outputMode="Update",
            timeMode="ProcessingTime",
        )
    )
    writer = (
        df.writeStream.foreachBatch(collect)
        .outputMode("update")
        .option("checkpointLocation", str(ckpt))
    )
    return (writer.trigger(once=True) if once else writer.trigger(availableNow=True)).start()


def run_once(
    spark, d, *ckpts, ttl_ms: int, confs: dict[str, str] | None = None
) -> list[dict[int, list]]:
    """One batch on each checkpoint, one after the other (two foreachBatch queries side by
    side lose one's output); their outputs by batch id."""
    outs: list[dict[int, list]] = [{} for _ in ckpts]
    confs = {"spark.sql.streaming.stateStore.providerClass": ROCKSDB, **(confs or {})}
    for k, v in confs.items():
        spark.conf.set(k, v)
    try:
        for c, o in zip(ckpts, outs, strict=True):
            start(spark, d, c, o, ttl_ms).awaitTermination()
    finally:
        for k in confs:
            spark.conf.unset(k)
    return outs


def run_source(spark, d, ckpt, ttl_ms: int, confs: dict[str, str] | None = None) -> None:
    """The source checkpoint's batches, one per input file, in one query (its start is most
    of a batch's time). Without no-data batches availableNow ends after the last file; with
    them a ProcessingTime query always has one more to run. (Not a pinned conf: the restored
    runs, trigger once, run one batch with input either way.)"""
    confs = {
        "spark.sql.streaming.stateStore.providerClass": ROCKSDB,
        "spark.sql.streaming.noDataMicroBatches.enabled": "false",
        **(confs or {}),
    }
    for k, v in confs.items():
        spark.conf.set(k, v)
    try:
        out: dict[int, list] = {}
        start(spark, d, ckpt, out, ttl_ms, once=False).awaitTermination()
        assert sorted(out) == [0, 1], sorted(out)
    finally:
        for k in confs:
            spark.conf.unset(k)


def batch_ms(ckpt, batch: int) -> int:
    return Checkpoint.open(str(ckpt)).offsets(batch).batch_timestamp_ms


def wait_until(ms: int) -> None:
    while (now := time.time() * 1000) < ms:
        time.sleep(min(5.0, (ms - now) / 1000 + 0.05))


def rows_per_key(batches: range) -> dict[str, int]:
    """How many input rows of each key ``write_input`` writes in these batches."""
    n: dict[str, int] = {}
    for b in batches:
        for j in range(10):
            k = f"k{(b * 3 + j) % 7}"
            n[k] = n.get(k, 0) + 1
    return n


def unpack(out: dict[int, list]) -> dict[str, tuple[int, int]]:
    """{key: (count, live list length)} of a run's only batch."""
    (rows,) = out.values()
    return {k: (c // 1_000_000, c // 1000 % 1000) for k, c in rows}


def read_state(spark, ckpt, var: str, batch: int | None = None) -> list[tuple]:
    """Spark's reading of the state after ``batch`` (default: the latest)."""
    reader = spark.read.format("statestore").option("operatorId", 0).option("stateVarName", var)
    if batch is not None:
        reader = reader.option("batchId", batch)
    return spark_rows(reader.load(str(ckpt)).drop("partition_id"))


# slow: it waits a TTL (75 s, or 4 minutes on a busy machine), so it starts first
# (tests/conftest.py).
@pytest.mark.slow
@pytest.mark.spark
def test_restored_ttl_state_expires_at_its_original_expiry(spark, tmp_path):
    for ttl_ms in SHORT_TTLS_MS:
        if restored_values_expire_at_their_original_expiry(spark, tmp_path / str(ttl_ms), ttl_ms):
            return
    pytest.fail(f"the machine was too slow for this test even with a TTL of {ttl_ms} ms")


def restored_values_expire_at_their_original_expiry(spark, root, ttl_ms: int) -> bool:
    """The test with list and map values of TTL ``ttl_ms``; False, before any assertion that
    depends on time, when the restored runs' first batch came after the first restored value
    expired."""
    root.mkdir()
    d, src = root / "input", root / "src"
    write_input(d, 0, 2)
    run_source(spark, d, src, ttl_ms)
    t = [batch_ms(src, b) for b in range(2)]
    sp_url, meta = take_savepoint(str(src), str(root / "sp"))
    restored, uninterrupted = root / "restored", root / "uninterrupted"
    assert not restore(sp_url, str(restored), partitions=3).problems
    shutil.copytree(src, uninterrupted)

    # Batch 2, before the first restored value expires: all restored values are live.
    write_input(d, 2, 1)
    out = run_once(spark, d, restored, uninterrupted, ttl_ms=ttl_ms)
    t2 = [batch_ms(c, 2) for c in (restored, uninterrupted)]
    if max(t2) >= t[0] + ttl_ms:
        print(f"TTL {ttl_ms} ms: the restored runs' batch came {max(t2) - t[0]} ms after batch 0")
        return False
    assert out[0] == out[1] and list(out[0]) == [2]
    count = rows_per_key(range(3))
    assert unpack(out[0]) == {k: (count[k], count[k]) for k in rows_per_key(range(2, 3))}

    # While the TTL passes. Same partition count: every entry of every column family (value,
    # list and map state, $ttl_*, $min_lst, $count_lst) is the one Spark wrote. Map TTL has no
    # committed fixture; this real checkpoint is its byte-level proof.
    assert {"$ttl_cnt", "$ttl_lst", "$ttl_mp", "$min_lst", "$count_lst"} <= {
        cf["name"] for cf in meta.operators[0].column_families
    }
    assert not restore(sp_url, str(root / "same")).problems
    assert entries_by_family(Checkpoint.open(str(root / "same"))) == entries_by_family(
        Checkpoint.open(str(src))  # untouched: the uninterrupted run runs on a copy
    )
    # Another partition count, read back by Spark as restored (the state after batch 1): each
    # value with its original expiry.
    for var in ("cnt", "lst", "mp"):
        ours = Savepoint.open(sp_url).read(Selection(0, state_var=var), meta.operators[0].uid)
        theirs = read_state(spark, restored, var, batch=1)
        assert theirs == arrow_rows(ours.drop_columns(["partition_id"]))

    # Batch 3, once every list and map value so far expired: only batch 3's are live; the
    # count (TTL 1 h) goes on.
    wait_until(max(t2) + ttl_ms + 1000)
    write_input(d, 3, 1)
    out = run_once(spark, d, restored, uninterrupted, ttl_ms=ttl_ms)
    assert out[0] == out[1] and list(out[0]) == [3]
    count, live = rows_per_key(range(4)), rows_per_key(range(3, 4))
    assert unpack(out[0]) == {k: (count[k], live[k]) for k in live}
    # Gone from the state itself (evicted through the restored $ttl_ indexes), not only
    # hidden from the processor: what remains in the list and the map is batch 3's.
    for ckpt in (restored, uninterrupted):
        t3 = batch_ms(ckpt, 3)
        for var in ("lst", "mp"):
            expiries = {row[-1][-1] for row in read_state(spark, ckpt, var)}
            assert expiries == {t3 + ttl_ms}, (ckpt.name, var)
    # The counts are equal; their expiries are each run's own batch time + 1 h.
    counts = [
        {(r[0], r[1][0]) for r in read_state(spark, c, "cnt")} for c in (restored, uninterrupted)
    ]
    assert counts[0] == counts[1] and len(counts[0]) == 7
    return True


@pytest.mark.spark
def test_avro_ttl_state_restores_byte_for_byte(spark, tmp_path):
    """With the Avro state encoding, every column family of value, list and map state with
    TTL (and its indexes) is restored as Spark wrote it, at the same partition count and
    through another one."""
    d, src = tmp_path / "input", tmp_path / "src"
    avro = {"spark.sql.streaming.stateStore.encodingFormat": "avro"}
    for b in (0, 1):
        write_input(d, b, 1)
        run_once(spark, d, src, ttl_ms=SHORT_TTLS_MS[-1], confs=avro)
    spark_entries = entries_by_family(Checkpoint.open(str(src)))
    assert {"$ttl_cnt", "$ttl_lst", "$ttl_mp", "$min_lst", "$count_lst"} <= {
        f for entries in spark_entries for f, _, _ in entries
    }
    sp_url, meta = take_savepoint(str(src), str(tmp_path / "sp"))
    assert meta.pinned_confs["spark.sql.streaming.stateStore.encodingFormat"] == "avro"
    assert not restore(sp_url, str(tmp_path / "same")).problems
    assert entries_by_family(Checkpoint.open(str(tmp_path / "same"))) == spark_entries
    assert not restore(sp_url, str(tmp_path / "three"), partitions=3).problems
    sp3, _ = take_savepoint(str(tmp_path / "three"), str(tmp_path / "sp3"))
    assert not restore(sp3, str(tmp_path / "two"), partitions=2).problems
    assert entries_by_family(Checkpoint.open(str(tmp_path / "two"))) == spark_entries

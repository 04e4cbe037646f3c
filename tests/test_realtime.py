"""Real-time mode (``trigger(realTime=...)``, Spark 4.1+): its aggregation operator
(``StatefulStreamlineAggregate``) reads as Spark reads it, savepoints, restores at another
partition count, and the restored real-time query continues with the counts it had.

The queries run in a subprocess (fixtures/realtime.py): real-time mode needs a task slot for
every source and shuffle partition at once, more than the session's ``local[2]``.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from collections import Counter

import pytest

from statectl.checkpoint.model import Checkpoint
from statectl.restoration import restore
from statectl.savepoints.create import take_savepoint
from statectl.savepoints.store import Savepoint
from statectl.state import Selection, read_state
from tests.helpers.fixtures import ROOT
from tests.helpers.rows import arrow_rows, spark_rows

RUNNER = ROOT / "fixtures" / "realtime.py"
_spec = importlib.util.spec_from_file_location("fixture_realtime", RUNNER)
assert _spec and _spec.loader
realtime = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(realtime)
STEPS = [["a", "b", "a", "k1"], ["c", "a", "k2", "b"]]
MORE = [["d", "a", "b", "k1"]]


def run_realtime(
    ckpt, out, steps, *, partitions: int = 2, replay: int = 0, dedup: bool = False
) -> dict[str, int]:
    """The largest count the real-time query's sink emitted per key (1 per key for dedup)."""
    args = [str(ckpt), str(out), json.dumps(steps), "--partitions", str(partitions)]
    args += ["--dedup"] if dedup else []
    done = subprocess.run(
        [sys.executable, str(RUNNER), *args, "--replay", str(replay)],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return realtime.seen(out)


def totals(steps: list[list[str]]) -> dict[str, int]:
    return dict(Counter(k for step in steps for k in step))


@pytest.mark.spark
def test_realtime_aggregation_restores_and_continues(spark, tmp_path):
    first = run_realtime(tmp_path / "ck1", tmp_path / "out1", STEPS)
    assert first == totals(STEPS)
    src = Checkpoint.open(str(tmp_path / "ck1"))
    batch = src.latest_committed_batch
    op = src.operator(0, batch)
    assert op.name == "StatefulStreamlineAggregate" and op.kind.restorable
    # statectl reads what Spark's reader reads (checkpoint format v2: Spark needs the conf).
    ours = read_state(src, Selection(0))
    key = "spark.sql.streaming.stateStore.checkpointFormatVersion"
    spark.conf.set(key, "2")
    try:
        df = spark.read.format("statestore").option("batchId", batch).load(str(tmp_path / "ck1"))
        theirs = spark_rows(df)
    finally:
        spark.conf.unset(key)
    assert sorted(arrow_rows(ours), key=repr) == sorted(theirs, key=repr)
    assert {r["key"]["value"]: r["value"]["count"] for r in ours.to_pylist()} == totals(STEPS)

    sp_url, meta = take_savepoint(str(tmp_path / "ck1"), str(tmp_path / "sp"))
    assert Savepoint.open(sp_url).metadata.operators[0].name == "StatefulStreamlineAggregate"
    plan = restore(sp_url, str(tmp_path / "ck2"), partitions=3)
    assert not plan.problems and plan.backend == "rocksdb"
    continued = run_realtime(
        tmp_path / "ck2", tmp_path / "out2", STEPS + MORE, partitions=3, replay=len(STEPS)
    )
    # The continued run emits only the keys of the new step, each with every count it had
    # before the restore plus the new ones (a key whose state were lost would restart at 1).
    want = totals(STEPS + MORE)
    assert continued == {k: want[k] for k in MORE[0]}
    assert continued["a"] > totals(MORE)["a"]
    restored = Checkpoint.open(str(tmp_path / "ck2"))
    assert restored.latest_committed_batch > meta.batch_id
    assert restored.num_partitions(restored.latest_committed_batch) == 3


@pytest.mark.spark
def test_realtime_dedup_restores_and_continues(tmp_path):
    """``dropDuplicates`` in real-time mode (operator ``dedupe``): after a restore at another
    partition count, only keys never seen before are emitted."""
    first = run_realtime(tmp_path / "ck1", tmp_path / "out1", STEPS, dedup=True)
    assert first == dict.fromkeys(totals(STEPS), 1)
    assert Checkpoint.open(str(tmp_path / "ck1")).operator(0, 0).name == "dedupe"
    sp_url, _ = take_savepoint(str(tmp_path / "ck1"), str(tmp_path / "sp"))
    plan = restore(sp_url, str(tmp_path / "ck2"), partitions=3)
    assert not plan.problems
    continued = run_realtime(
        tmp_path / "ck2",
        tmp_path / "out2",
        STEPS + MORE,
        partitions=3,
        replay=len(STEPS),
        dedup=True,
    )
    assert continued == {"d": 1}  # a, b and k1 were seen before the restore

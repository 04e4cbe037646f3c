"""Doctor and gc proven on Spark 4.3: the recovery command ``doctor`` prints yields a checkpoint
the real query continues from exactly as an uninterrupted run from that batch did, and a
checkpoint after ``gc`` restarts and continues exactly. One reference run is shared."""

from __future__ import annotations

import shlex
import shutil

import pytest
from typer.testing import CliRunner

from statectl.cli import app
from statectl.diagnosis import diagnose, spans
from tests.helpers.spark import run, write_input


@pytest.fixture(scope="module")
def reference(spark, tmp_path_factory):
    """An aggregation on RocksDB (a zip per batch): batches 0-3, a copy of its checkpoint
    then, and batches 4-5 of the same, uninterrupted run."""
    root = tmp_path_factory.mktemp("day2")
    d = root / "in"
    write_input(d, 0, 4)
    out = run(spark, "agg", d, root / "ck", "rocksdb")
    shutil.copytree(root / "ck", root / "ck-at-3")
    write_input(d, 4, 2)
    out.update(run(spark, "agg", d, root / "ck", "rocksdb"))
    assert sorted(out) == [0, 1, 2, 3, 4, 5]
    return root, d, out


def _cli(*args: str) -> None:
    result = CliRunner().invoke(app, list(args))
    assert result.exit_code == 0, result.output


@pytest.mark.spark
def test_doctor_recovery_continues_like_an_uninterrupted_run(spark, reference, tmp_path):
    root, d, full = reference
    ck = tmp_path / "ck"
    shutil.copytree(root / "ck", ck)
    # The two newest snapshots of partition 0 (batches 4 and 5) are gone; an older zip (batch
    # 1's) only matters to a restart from there.
    for v in (6, 5, 2):
        (ck / f"state/0/0/{v}.zip").unlink()
    diag = diagnose(str(ck))
    assert diag.latest_committed_batch == 5 and diag.last_recoverable_batch == 3
    assert any("state version 6 needs" in p.message and p.blocking for p in diag.problems)
    p0 = next(s for s in diag.stores if s.partition == 0)
    assert spans(p0.rebuildable) == "0,2-3"
    assert diag.lost_batches == [4, 5]
    args = shlex.split(diag.recovery[-1])
    assert args[:2] == ["statectl", "migrate"] and args[-2:] == ["--batch", "3"]
    _cli(*args[1:])
    continued = run(spark, "agg", d, tmp_path / "ck-recovered-3")
    assert continued == {b: full[b] for b in (4, 5)}


@pytest.mark.spark
def test_checkpoint_after_gc_restarts_and_continues(spark, reference, tmp_path):
    root, d, full = reference
    ck = tmp_path / "ck"
    shutil.copytree(root / "ck-at-3", ck)
    _cli("gc", str(ck), "--keep-batches", "1", "--yes")
    assert not (ck / "state/0/0/2.zip").exists() and not (ck / "offsets/0").exists()
    assert (ck / "state/0/0/3.zip").exists() and (ck / "offsets/1").exists()
    diag = diagnose(str(ck))  # every kept batch still rebuilds, everywhere
    assert all(spans(s.rebuildable) == "2-3" for s in diag.stores), diag.stores
    continued = run(spark, "agg", d, ck)
    assert continued == {b: full[b] for b in (4, 5)}


@pytest.mark.spark
def test_gc_under_a_running_query_keeps_it_running_and_restartable(spark, tmp_path):
    """The issue's proof for gc's safety: gc a live query's checkpoint (HDFS-backed, where
    Spark's own maintenance runs beside it) twice while it runs; the query keeps running and
    emits what an uninterrupted run emits, restarts from the cleaned checkpoint, and a restart
    at the oldest batch gc kept continues exactly too."""
    import os
    import time

    from tests.helpers.rows import normalize
    from tests.helpers.spark import build

    ref_in, d = tmp_path / "ref-in", tmp_path / "in"
    write_input(ref_in, 0, 8)
    now = time.time()
    for b in range(8):  # the file source takes files by modification time (ms): no ties
        os.utime(ref_in / f"part-{b:03d}.json", (now + b, now + b))
    reference = run(spark, "agg", ref_in, tmp_path / "ref", "hdfs")
    assert sorted(reference) == list(range(8))
    out: dict[int, list] = {}

    def collect(df, batch_id):
        out[batch_id] = sorted((normalize(tuple(r)) for r in df.collect()), key=repr)

    ck = tmp_path / "ck"
    d.mkdir()
    df, mode = build(spark, "agg", d)
    q = (
        df.writeStream.foreachBatch(collect)
        .outputMode(mode)
        .option("checkpointLocation", str(ck))
        .trigger(processingTime="200 milliseconds")
        .start()
    )
    try:
        for b in range(6):
            write_input(d, b, 1)
            deadline = time.monotonic() + 180
            while b not in out and q.isActive and time.monotonic() < deadline:
                time.sleep(0.1)
            assert b in out, (b, q.exception())
            if b in (3, 5):  # the writer is live: batch b+1 may be planned while gc runs
                # foreachBatch sees batch b before Spark commits it: gc counts from the last
                # commit, so wait for it (else gc keeps one batch more and `kept` differs).
                while not (ck / "commits" / str(b)).exists() and time.monotonic() < deadline:
                    time.sleep(0.05)
                _cli("gc", str(ck), "--keep-batches", "1", "--yes")
        assert q.isActive and q.exception() is None
    finally:
        q.stop()
    assert out == {b: reference[b] for b in range(6)}
    # Log entries no kept restart reads are gone; deltas stay while no snapshot covers them
    # (a restart at batch 4 replays versions 1-5).
    assert not (ck / "offsets/0").exists() and not (ck / "commits/0").exists()
    kept = {spans(s.rebuildable) for s in diagnose(str(ck)).stores}
    # --keep-batches 1: the latest batch, the one before it, and the one ahead of that (its
    # offsets are what a restart at the oldest kept batch replays from), everywhere.
    assert kept == {"3-5"}, kept
    _cli("migrate", str(ck), str(tmp_path / "at-3"), "--batch", "3")
    write_input(d, 6, 2)
    now = time.time()
    for b in (6, 7):
        os.utime(d / f"part-{b:03d}.json", (now + b, now + b))
    assert run(spark, "agg", d, ck) == {b: reference[b] for b in (6, 7)}
    assert run(spark, "agg", d, tmp_path / "at-3") == {b: reference[b] for b in (4, 5, 6, 7)}

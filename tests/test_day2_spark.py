"""Doctor and gc proven on Spark 4.3: the recovery command ``doctor`` prints yields a checkpoint
the real query continues from exactly as an uninterrupted run from that batch did, and a
checkpoint after ``gc`` restarts and continues exactly. One reference run is shared."""

from __future__ import annotations

import shlex
import shutil

import pytest
from typer.testing import CliRunner

from statectl.cli import app
from statectl.doctor import diagnose, spans
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

"""``statectl gc``: savepoint retention (per query, never the newest complete one, only what
``dispose`` deletes, dry-run with sizes, incomplete savepoints) and checkpoint clean-up on
copies of Spark-written checkpoints (what is deleted is exactly what no kept restart needs)."""

from __future__ import annotations

import datetime as dt
import json
import os
import shutil

import pytest
from typer.testing import CliRunner

from statectl.cli import app
from statectl.diagnosis import diagnose, spans
from statectl.errors import StatectlError
from statectl.retention import gc_plan, run_gc
from statectl.savepoints.create import take_savepoint
from tests.helpers.fixtures import FIXTURES

LATER = dt.datetime.now(dt.timezone.utc) + dt.timedelta(days=40)


@pytest.fixture(scope="module")
def savepoints(tmp_path_factory):
    """Savepoints of agg-hdfs at batches 1, 2, 3 and of dedup-hdfs at its latest batch."""
    root = tmp_path_factory.mktemp("sps") / "sps"
    made = {b: take_savepoint(str(FIXTURES / "agg-hdfs"), str(root), batch=b)[0] for b in (1, 2, 3)}
    other = take_savepoint(str(FIXTURES / "dedup-hdfs"), str(root))[0]
    return root, made, other


@pytest.fixture
def sps(savepoints, tmp_path):
    root, made, other = savepoints
    dst = tmp_path / "sps"
    shutil.copytree(root, dst)
    name = lambda url: url.rsplit("/", 1)[1]  # noqa: E731
    return dst, {b: name(u) for b, u in made.items()}, name(other)


def _invoke(*args: str, rc: int = 0):
    """``statectl ARGS`` in this process; ``rc=2``: refused with a one-line StatectlError
    (exit code 2 under the real entry point, which the runner does not wrap)."""
    result = CliRunner().invoke(app, list(args))
    if rc == 2:
        assert isinstance(result.exception, StatectlError), result.output
    else:
        assert result.exit_code == rc, result.output
    return result


def test_keep_last_keeps_the_newest_per_query(sps):
    root, agg, dedup = sps
    plan = gc_plan(str(root), keep_last=1)
    gone = sorted(d.path.rsplit("/", 1)[1] for d in plan.delete)
    assert gone == sorted([agg[1], agg[2]])
    run_gc(plan)
    assert sorted(p.name for p in root.iterdir()) == sorted([agg[3], dedup])


def test_max_age_never_deletes_the_newest(sps):
    root, agg, dedup = sps
    assert not gc_plan(str(root), max_age="30d").delete  # all were made just now
    plan = gc_plan(str(root), max_age="30d", now=LATER)
    assert sorted(d.path.rsplit("/", 1)[1] for d in plan.delete) == sorted([agg[1], agg[2]])
    assert {k["path"].rsplit("/", 1)[1] for k in plan.kept if k["why"] == "newest"} == {
        agg[3],
        dedup,
    }
    plan = gc_plan(str(root), keep_last=2, max_age="30d")  # either rule deletes
    assert [d.path.rsplit("/", 1)[1] for d in plan.delete] == [agg[1]]


def test_dry_run_lists_with_sizes_and_deletes_nothing(sps):
    root, agg, _ = sps
    before = sorted(p.name for p in root.iterdir())
    doc = json.loads(_invoke("gc", str(root), "--keep-last", "1", "--dry-run", "--json").stdout)
    assert doc["deleted"] is False and len(doc["delete"]) == 2
    sizes = {d["path"].rsplit("/", 1)[1]: d["bytes"] for d in doc["delete"]}
    for b in (1, 2):
        on_disk = sum(f.stat().st_size for f in (root / agg[b]).rglob("*") if f.is_file())
        assert sizes[agg[b]] == on_disk > 0
    text = _invoke("gc", str(root), "--keep-last", "1", "--dry-run").stdout
    assert text.startswith("Would delete: 2 item(s)") and agg[1] in text
    assert sorted(p.name for p in root.iterdir()) == before
    # Without --yes and no terminal: refused, like dispose.
    result = _invoke("gc", str(root), "--keep-last", "1", rc=2)
    assert "pass --yes" in str(result.exception)
    assert sorted(p.name for p in root.iterdir()) == before


def test_only_what_dispose_deletes(sps):
    root, agg, _ = sps
    (root / agg[1] / "notes.txt").write_text("mine")
    plan = gc_plan(str(root), keep_last=1)
    assert [d.path.rsplit("/", 1)[1] for d in plan.delete] == [agg[2]]
    assert "not part of the savepoint" in plan.skipped[0]["reason"]
    run_gc(plan)
    assert (root / agg[1] / "notes.txt").exists() and (root / agg[1] / "_metadata").exists()


def test_incomplete_savepoints(sps):
    root, _, _ = sps
    old, fresh, foreign = (
        root / "savepoint-43a72f-5-0123abcd",
        root / "savepoint-43a72f-6-4567abcd",
        root / "savepoint-43a72f-7-89abcdef",
    )
    for d in (old, fresh, foreign):
        (d / "operators/0/default").mkdir(parents=True)
        (d / "operators/0/default/part-00000.parquet").write_bytes(b"x" * 100)
    (foreign / "mine.txt").write_text("keep")
    stale = (dt.datetime.now() - dt.timedelta(days=3)).timestamp()
    for d in (old, foreign):
        for f in d.rglob("*"):
            os.utime(f, (stale, stale))
    plan = gc_plan(str(root), keep_last=5)
    assert [d.path.rsplit("/", 1)[1] for d in plan.delete] == [old.name]
    assert plan.delete[0].bytes == 100
    assert any(foreign.name in s["path"] for s in plan.skipped)
    run_gc(plan)
    assert not old.exists() and fresh.exists() and foreign.exists()


def test_refusals(sps, fixture_copy):
    root, agg, _ = sps
    _invoke("gc", str(root), rc=2)  # nothing said about what to keep
    _invoke("gc", str(root / agg[1]), "--keep-last", "1", rc=2)  # a savepoint, not a directory
    _invoke("gc", str(root), "--keep-batches", "1", rc=2)
    _invoke("gc", str(root), "--max-age", "soon", rc=2)
    _invoke("gc", str(fixture_copy("agg-ckptv2-rocksdb")), "--keep-batches", "1", rc=2)


def test_checkpoint_gc_deletes_only_what_no_kept_restart_needs(fixture_copy):
    ck = fixture_copy("agg-snapshots-hdfs")  # snapshots at 3, 6, 9, 12; latest batch 11
    plan = gc_plan(str(ck), keep_batches=3)  # restarts at batches 8-11: versions 9-12
    deleted = {d.path.split(str(ck) + "/")[1] for d in plan.delete}
    state = {p for p in deleted if p.startswith("state/")}
    expected = {f"state/0/{p}/{v}.delta" for p in (0, 1) for v in range(1, 9)}
    expected |= {f"state/0/{p}/{v}.snapshot" for p in (0, 1) for v in (3, 6)}
    assert state == expected
    assert {p for p in deleted if not p.startswith("state/")} == {
        f"{log}/{b}" for log in ("offsets", "commits") for b in range(0, 7)
    }
    run_gc(plan)
    assert not (ck / "state/0/0/.3.snapshot.crc").exists()  # sidecars go with their files
    diag = diagnose(str(ck))
    assert diag.last_recoverable_batch == 11
    assert all(spans(s.rebuildable) == "8-11" for s in diag.stores)
    assert not [p for p in diag.problems if p.blocking]


def test_checkpoint_gc_of_rocksdb_keeps_shared_ssts(fixture_copy):
    ck = fixture_copy("agg-rocksdb")
    plan = gc_plan(str(ck), keep_batches=1)  # batches 2-3: zips 3 and 4
    run_gc(plan)
    diag = diagnose(str(ck))
    assert all(spans(s.rebuildable) == "2-3" for s in diag.stores)
    assert sorted(p.name for p in (ck / "state/0/0").glob("*.zip")) == ["3.zip", "4.zip"]
    # Every SST left is named by a kept zip, and every SST a kept zip names is left.
    assert not gc_plan(str(ck), keep_batches=1).delete


def test_checkpoint_gc_with_nothing_to_do(fixture_copy):
    ck = fixture_copy("agg-hdfs")
    out = _invoke("gc", str(ck), "--dry-run").stdout  # default: 100 batches kept
    assert out.startswith("Nothing to delete")


def test_api_gc_is_the_json(sps, tmp_path):
    """``statectl.gc()`` is ``gc --yes`` (``dry_run=True``: ``--dry-run``), its ``to_dict()``
    what the command prints with ``--json``; it deletes the same savepoints."""
    import statectl

    root, agg, _ = sps
    shutil.copytree(root, tmp_path / "cli")
    planned = statectl.gc(root, keep_last=1, dry_run=True)
    assert not planned.deleted and planned.kind == "savepoints" and len(planned.delete) == 2
    cli = _invoke("gc", str(root), "--keep-last", "1", "--dry-run", "--json").stdout
    assert planned.to_dict() == json.loads(cli)
    done = statectl.gc(root, keep_last=1)
    assert done.deleted and done.bytes == planned.bytes > 0
    assert not (root / agg[1]).exists() and (root / agg[3]).exists()
    cli = _invoke("gc", str(tmp_path / "cli"), "--keep-last", "1", "--yes", "--json").stdout
    assert done.to_dict() == json.loads(cli.replace(str(tmp_path / "cli"), str(root)))
    assert not (tmp_path / "cli" / agg[1]).exists()
    assert not statectl.gc(root, keep_last=1).deleted  # nothing left to delete

"""Issue 26, the data half: checkpoints without checksum files are reported as unverifiable,
and a sealed savepoint is checked against itself (sources, type, schemas, partition ids, uids).
One test per finding, at the CLI (a subprocess), as a user meets it."""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from statectl.savepoints.create import take_savepoint
from statectl.savepoints.format import seal
from tests.helpers.cli import run_cli
from tests.helpers.fixtures import FIXTURES


def assert_refused(proc: subprocess.CompletedProcess, *needles: str) -> None:
    assert proc.returncode == 2, proc.stderr + proc.stdout
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("statectl: error: "), proc.stderr
    for n in needles:
        assert n in lines[0], lines[0]


def json_of(*args: str) -> dict | list:
    proc = run_cli(*args, "--json")
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def strip_checksums(root: Path) -> None:
    """What S3A (no Hadoop .crc) or a copy tool leaves: no checksum files at all."""
    for p in list(root.rglob("*.crc")):
        p.unlink()


# -- item 1: checkpoints without checksum files ---------------------------------------------


def test_swapped_deltas_without_checksums_are_reported_unverifiable(fixture_copy, tmp_path):
    ckpt = fixture_copy("agg-hdfs")
    strip_checksums(ckpt)
    part = ckpt / "state/0/0"
    a, b = (part / "2.delta").read_bytes(), (part / "4.delta").read_bytes()
    (part / "2.delta").write_bytes(b)
    (part / "4.delta").write_bytes(a)
    info = json_of("inspect", str(ckpt))
    assert info["verification"] == "unverifiable"
    assert {"state/0/0/2.delta", "state/0/0/4.delta", "offsets/3"} <= set(
        info["unverifiable_files"]
    )
    human = run_cli("inspect", str(ckpt))
    assert human.returncode == 0 and "unverifiable" in human.stdout
    # The intact fixture, every file with its sidecar, is verified.
    intact = json_of("inspect", str(FIXTURES / "agg-hdfs"))
    assert intact["verification"] == "verified" and intact["unverifiable_files"] == []
    listed = {Path(e["path"]).name: e for e in json_of("list", str(tmp_path))}
    assert listed["agg-hdfs"]["verification"] == "unverifiable"
    assert "state/0/0/4.delta" in listed["agg-hdfs"]["unverifiable_files"]
    table = run_cli("list", str(tmp_path))
    assert table.returncode == 0 and "unverifiable" in table.stdout
    # savepoint records it in _metadata, and inspect of the savepoint shows it.
    made = run_cli("savepoint", str(ckpt), str(tmp_path / "sps"))
    assert made.returncode == 0, made.stderr
    (sp,) = (tmp_path / "sps").iterdir()
    meta = json.loads((sp / "_metadata").read_text())
    assert "state/0/0/2.delta" in meta["source_checkpoint"]["unverifiable_files"]
    assert json_of("inspect", str(sp))["verification"] == "unverifiable"


def test_rocksdb_changelogs_without_checksums_are_unverifiable(fixture_copy):
    ckpt = fixture_copy("agg-ckptv2-rocksdb-changelog")
    assert json_of("inspect", str(ckpt))["verification"] == "verified"
    strip_checksums(ckpt)
    files = json_of("inspect", str(ckpt))["unverifiable_files"]
    assert any(f.startswith("state/0/1/") and f.endswith(".changelog") for f in files), files


def test_checkpoint_v2_changelog_of_another_version_is_refused(fixture_copy, tmp_path):
    """Without checksums, the lineage a v2 changelog carries still names its version."""
    ckpt = fixture_copy("agg-ckptv2-rocksdb-changelog")
    strip_checksums(ckpt)
    part = ckpt / "state/0/1"
    first, last = sorted(part.glob("1_*.changelog"))[0], sorted(part.glob("4_*.changelog"))[0]
    a, b = first.read_bytes(), last.read_bytes()
    first.write_bytes(b)
    last.write_bytes(a)
    out = tmp_path / "rows.jsonl"
    assert_refused(run_cli("export", str(ckpt), "-o", str(out)), last.name, "lineage ends at")
    assert_refused(run_cli("inspect", str(ckpt)), "another version's changelog")


# -- crafted, sealed savepoints ----------------------------------------------------------------


@pytest.fixture(scope="module")
def savepoint(tmp_path_factory) -> Path:
    url, _ = take_savepoint(str(FIXTURES / "agg-hdfs"), str(tmp_path_factory.mktemp("sps")))
    return Path(url.removeprefix("file://"))


def crafted(savepoint: Path, tmp_path: Path, edit: Callable[[dict, Path], None]) -> Path:
    """A copy of the savepoint, edited, its _metadata sealed again (what a forger does)."""
    sp = tmp_path / "crafted"
    shutil.copytree(savepoint, sp)
    meta = json.loads((sp / "_metadata").read_text())
    edit(meta, sp)
    (sp / "_metadata").write_text(json.dumps(seal(meta)))
    return sp


def rewrite_first_file(meta: dict, sp: Path, change: Callable[[pa.Table], pa.Table]) -> None:
    """Replace the first data file with ``change(table)``; its size and sha256 follow."""
    f = meta["operators"][0]["tables"][0]["files"][0]
    path = sp / f["path"]
    pq.write_table(change(pq.read_table(path)), path)
    data = path.read_bytes()
    f["bytes"], f["sha256"] = len(data), hashlib.sha256(data).hexdigest()


def _table(m: dict) -> dict:
    return m["operators"][0]["tables"][0]


@pytest.mark.parametrize(
    ("edit", "needle"),
    [
        (lambda m: m.update(offsets={}), "source log name '0'"),
        (lambda m: _table(m).update(kind="timers"), "kinds ['timers']"),
        (lambda m: _table(m).update(kind="ValueState"), "has tables of kinds"),
        (lambda m: _table(m).update(kind="join-store"), "join store"),
    ],
)
def test_inconsistent_sealed_savepoints_are_one_line_errors(savepoint, tmp_path, edit, needle):
    sp = crafted(savepoint, tmp_path, lambda m, _: edit(m))
    out = tmp_path / "out"
    assert_refused(run_cli("restore", "-s", str(sp), str(out)), needle, "_metadata")
    assert not out.exists()
    rows = tmp_path / "rows.jsonl"
    assert_refused(run_cli("export", str(sp), "--operator", "0", "-o", str(rows)), needle)


def test_native_type_over_canonical_contents_is_one_line(savepoint, tmp_path):
    sp = crafted(savepoint, tmp_path, lambda m, _: m.update(savepoint_type="native"))
    proc = run_cli("restore", "-s", str(sp), str(tmp_path / "out"))
    assert_refused(proc, "type is 'native'", "canonical")
    assert not (tmp_path / "out").exists()


def _int_keys(t: pa.Table) -> pa.Table:
    key = pa.StructArray.from_arrays([pa.array(range(t.num_rows), pa.int64())], names=["k"])
    return t.set_column(0, "key", key)


def _forged_partition(t: pa.Table) -> pa.Table:
    return t.set_column(2, "partition_id", pa.array([1] * t.num_rows, pa.int32()))


@pytest.mark.parametrize(
    ("change", "needle"),
    [(_int_keys, "column key is struct<k: int64>"), (_forged_partition, "partition_id")],
)
def test_forged_data_files_are_refused(savepoint, tmp_path, change, needle):
    sp = crafted(savepoint, tmp_path, lambda m, d: rewrite_first_file(m, d, change))
    out = tmp_path / "rows.jsonl"
    assert_refused(run_cli("export", str(sp), "--operator", "0", "-o", str(out)), needle)
    assert not out.exists()
    restored = tmp_path / "restored"
    assert_refused(run_cli("restore", "-s", str(sp), str(restored)), needle, "part-00000")
    assert not (restored / "commits").exists()


@pytest.mark.parametrize("new_uid", ["..", "../../x"])
def test_relabel_applies_the_readers_uid_rule(savepoint, tmp_path, new_uid):
    parent = tmp_path / "copy"
    shutil.copytree(savepoint, parent / savepoint.name)
    uid = json.loads((savepoint / "_metadata").read_text())["operators"][0]["uid"]
    proc = run_cli("relabel", str(parent / savepoint.name), f"{uid}={new_uid}")
    assert_refused(proc, "not a name")
    assert sorted(p.name for p in parent.iterdir()) == [savepoint.name]  # nothing written


# -- item 10: inspect checks key placement as export does -------------------------------------


def test_inspect_refuses_changelogs_swapped_between_partitions(fixture_copy):
    ckpt = fixture_copy("agg-rocksdb-changelog")
    p0, p1 = ckpt / "state/0/0", ckpt / "state/0/1"
    for f in sorted(p0.glob("*.changelog")):
        for name in (f.name, f".{f.name}.crc"):  # the sidecars move along: each still matches
            a, b = (p0 / name).read_bytes(), (p1 / name).read_bytes()
            (p0 / name).write_bytes(b)
            (p1 / name).write_bytes(a)
    assert_refused(run_cli("inspect", str(ckpt)), "belong to another partition", "state/0/")
    assert run_cli("inspect", str(ckpt), "--no-verify").returncode == 0

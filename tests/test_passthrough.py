"""migrate's pass-through (statectl/passthrough.py): operators whose bytes stay the same go
from the source's store files to the target's without the typed savepoint, and write what
the savepoint path writes. No JVM."""

from __future__ import annotations

import functools
from pathlib import Path

import pyarrow as pa
import pytest

from statectl import passthrough as pt
from statectl.backends import HDFS, ROCKSDB
from statectl.checkpoint.model import Checkpoint
from statectl.engine import Engine
from statectl.errors import MissingFileError, StatectlError
from statectl.restoration import migrate
from statectl.savepoints.create import table_tasks, take_savepoint
from statectl.state import StoreEncoding, load_raw, read_state
from tests.helpers.fixtures import FIXTURES
from tests.helpers.restore import assert_exactly_once
from tests.helpers.spark import run, write_input

INLINE = Engine.of(workers=1)  # tasks run in this process: quick, and monkeypatchable


@functools.cache
def _accepted(name: str) -> tuple[int, ...]:
    """Operator ids of the fixture's latest batch that the pass-through takes."""
    ckpt = Checkpoint.open(str(FIXTURES / name))
    b = ckpt.latest_committed_batch
    return tuple(
        op.operator_id for op in ckpt.operators(b) if pt.fallback_reason(ckpt, b, op, None) is None
    )


def _fixtures() -> list[str]:
    names = []
    for d in sorted(FIXTURES.iterdir()):
        if not (d / "offsets").is_dir():
            continue
        try:
            if _accepted(d.name):
                names.append(d.name)
        except StatectlError:
            continue  # damaged on purpose or unsupported: not the pass-through's business
    return names


ACCEPTED = _fixtures()


def _states(target: Path) -> dict[tuple[int, str], pa.Table]:
    """Every table of every operator as statectl reads it (rows in order, partition ids)."""
    ckpt = Checkpoint.open(str(target))
    b = ckpt.latest_committed_batch
    out = {}
    for op in ckpt.operators(b):
        for task in table_tasks(op):
            out[(op.operator_id, task.name)] = read_state(ckpt, task.selection)
    return out


def _entries(target: Path) -> dict[tuple[int, str, int], tuple[list, list]]:
    """Every plain store partition's live entries as bytes (RocksDB: what the SSTs hold)."""
    ckpt = Checkpoint.open(str(target))
    b = ckpt.latest_committed_batch
    enc = StoreEncoding.of(ckpt, b)
    out = {}
    for op in ckpt.operators(b):
        if op.uses_column_families:
            continue
        for store in op.store_names:
            for p in range(op.num_partitions):
                raw = load_raw(ckpt, op, store, p, b, enc)
                out[(op.operator_id, store, p)] = (raw.keys.to_pylist(), raw.values.to_pylist())
    return out


def _same_states(a: Path, b: Path) -> None:
    left, right = _states(a), _states(b)
    assert left.keys() == right.keys()
    for name, table in left.items():
        assert table.equals(right[name], check_metadata=True), name


def _files(root: Path) -> dict[str, bytes]:
    return {
        str(f.relative_to(root)): f.read_bytes() for f in sorted(root.rglob("*")) if f.is_file()
    }


def _both(name: str, tmp_path: Path, backend: str, partitions: int = 3, **kw):
    fast, _ = migrate(
        str(FIXTURES / name),
        str(tmp_path / "fast"),
        backend=backend,
        partitions=partitions,
        engine=INLINE,
        **kw,
    )
    slow, _ = migrate(
        str(FIXTURES / name),
        str(tmp_path / "slow"),
        backend=backend,
        partitions=partitions,
        engine=INLINE,
        passthrough=False,
        **kw,
    )
    assert not slow.passthrough
    return fast, slow


def test_the_pass_through_takes_the_plain_stores_of_both_backends():
    """The kinds and formats it must take (so a test fails if it silently never runs)."""
    for name in (
        "agg-hdfs",
        "agg-rocksdb",
        "agg-rocksdb-changelog",
        "agg-ckptv2-rocksdb",
        "agg-v1-hdfs",
        "agg-zstd-hdfs",
        "agg-types-rocksdb",
        "dedup-hdfs",
        "dedupwm-rocksdb",
        "fmgws-hdfs",
        "join-hdfs",
        "join-rocksdb",
        "limit-hdfs",
        "window-rocksdb",
        "multi-hdfs",
        "spark35-agg-hdfs",
    ):
        assert name in ACCEPTED, name
    assert len(ACCEPTED) >= 80


@pytest.mark.parametrize("name", ACCEPTED)
def test_pass_through_writes_what_the_savepoint_path_writes(name, tmp_path):
    """Every fixture it takes, to HDFS at 3 partitions (whatever the source's backend): the
    operators the check accepts pass through, and the target is the savepoint path's, file
    for file and byte for byte. (RocksDB targets: below, on fewer fixtures, since SSTs carry
    random ids and each store partition opens a RocksDB.)"""
    fast, _ = _both(name, tmp_path, HDFS)
    assert {raw[2].operator_id for raw in fast.passthrough.values()} == set(_accepted(name))
    assert _files(tmp_path / "fast") == _files(tmp_path / "slow")


@pytest.mark.parametrize(
    ("name", "backend", "partitions"),
    [
        ("agg-hdfs", ROCKSDB, 8),
        ("join-hdfs", ROCKSDB, 3),
        ("dedupwm-hdfs", ROCKSDB, 3),
        ("fmgws-hdfs", ROCKSDB, 2),
        ("agg-hdfs", HDFS, 5),
        ("agg-rocksdb", ROCKSDB, 2),
        ("spark35-agg-rocksdb", ROCKSDB, 1),
        ("join-hdfs", HDFS, 4),
        ("limit-rocksdb", ROCKSDB, 4),
    ],
)
def test_pass_through_to_rocksdb_and_to_the_same_backend(name, backend, partitions, tmp_path):
    fast, _ = _both(name, tmp_path, backend, partitions)
    assert fast.passthrough
    _same_states(tmp_path / "fast", tmp_path / "slow")
    assert _entries(tmp_path / "fast") == _entries(tmp_path / "slow")
    if backend == HDFS:
        assert _files(tmp_path / "fast") == _files(tmp_path / "slow")


def test_pass_through_on_the_process_pool_and_to_changelog_files(tmp_path):
    fast, _ = migrate(
        str(FIXTURES / "multi-hdfs"), str(tmp_path / "fast"), backend=ROCKSDB, partitions=3,
        changelog=True, workers=2,
    )  # fmt: skip
    migrate(
        str(FIXTURES / "multi-hdfs"), str(tmp_path / "slow"), backend=ROCKSDB, partitions=3,
        changelog=True, workers=2, passthrough=False,
    )  # fmt: skip
    assert len(fast.passthrough) == len(_accepted("multi-hdfs")) >= 2
    assert _files(tmp_path / "fast") == _files(tmp_path / "slow")


@pytest.mark.parametrize(
    ("name", "why"),
    [
        ("agg-rowchecksum-hdfs", "row checksums"),
        ("agg-rowchecksum-rocksdb-changelog", "row checksums"),
        ("session-hdfs", "prefix-encoded keys"),
        ("session-rocksdb", "prefix-encoded keys"),
        ("join3-rocksdb", "column families"),
        ("join4-rocksdb", "column families"),
        ("tws-rocksdb", "column families"),
        ("tws-avro-rocksdb", "column families"),
    ],
)
def test_what_changes_bytes_takes_the_savepoint_path(name, why, tmp_path):
    ckpt = Checkpoint.open(str(FIXTURES / name))
    b = ckpt.latest_committed_batch
    reasons = {pt.fallback_reason(ckpt, b, op, None) for op in ckpt.operators(b)}
    assert reasons == {why}
    plan, _ = migrate(str(FIXTURES / name), str(tmp_path / "m"), partitions=3, engine=INLINE)
    assert not plan.passthrough


def test_a_join_format_conversion_and_a_kept_savepoint_take_the_savepoint_path(tmp_path):
    ckpt = Checkpoint.open(str(FIXTURES / "join-rocksdb"))
    b = ckpt.latest_committed_batch
    (op,) = ckpt.operators(b)
    assert pt.fallback_reason(ckpt, b, op, 3) == "join state format conversion"
    assert pt.fallback_reason(ckpt, b, op, 2) is None
    src = str(FIXTURES / "join-rocksdb")
    plan, _ = migrate(src, str(tmp_path / "j3"), join_state_format=3, engine=INLINE)
    assert not plan.passthrough and plan.join_state_format == 3
    # Spark 3.5 names no operator: its join is known by its kind, and converts alike.
    old = Checkpoint.open(str(FIXTURES / "spark35-join-hdfs"))
    (op,) = old.operators(old.latest_committed_batch)
    assert pt.fallback_reason(old, old.latest_committed_batch, op, 4) == (
        "join state format conversion"
    )
    plan, _ = migrate(str(FIXTURES / "spark35-join-hdfs"), str(tmp_path / "j4"),
                      backend="rocksdb", join_state_format=4, engine=INLINE)  # fmt: skip
    assert not plan.passthrough and plan.join_state_format == 4
    _, back = take_savepoint(str(tmp_path / "j4"), str(tmp_path / "back"))
    assert back.operators[0].state_format == 4 and back.operators[0].rows > 0
    plan, kept = migrate(
        str(FIXTURES / "agg-hdfs"),
        str(tmp_path / "k"),
        keep_savepoint=str(tmp_path / "sp"),
        engine=INLINE,
    )
    assert not plan.passthrough and kept is not None


def test_a_file_removed_while_passing_through_takes_the_savepoint_path(tmp_path, monkeypatch):
    """Spark's maintenance may remove a file of the batch while the pass-through reads it:
    the savepoint path (which tries the newest batch again) writes the target instead."""
    calls = []
    real = pt.RawSpillTask.__call__

    def flaky(self):
        calls.append(self.partition)
        if len(calls) == 1:
            raise MissingFileError("removed meanwhile", "x")
        return real(self)

    monkeypatch.setattr(pt.RawSpillTask, "__call__", flaky)
    plan, _ = migrate(str(FIXTURES / "agg-hdfs"), str(tmp_path / "m"), engine=INLINE)
    assert calls and not plan.passthrough
    monkeypatch.undo()
    migrate(str(FIXTURES / "agg-hdfs"), str(tmp_path / "slow"), engine=INLINE, passthrough=False)
    assert _files(tmp_path / "m") == _files(tmp_path / "slow")


def test_a_source_error_while_passing_through_leaves_no_target(fixture_copy, tmp_path):
    """Swapped partitions fail the placement check, and the target is left as it was found,
    as when the savepoint path refuses them."""
    ck = fixture_copy("agg-hdfs")
    for name in ("4.delta", ".4.delta.crc"):
        a, b = ck / "state/0/0" / name, ck / "state/0/1" / name
        data = a.read_bytes()
        a.write_bytes(b.read_bytes())
        b.write_bytes(data)
    with pytest.raises(StatectlError, match="belong to another partition"):
        migrate(str(ck), str(tmp_path / "m"), engine=INLINE)
    assert not (tmp_path / "m").exists()


def test_version_bytes_are_added_removed_and_kept():
    rows = pa.array([b"\x01\x02", b"", b"\x03"], pa.large_binary())
    rocks = pt.to_target(rows, HDFS, ROCKSDB)
    assert rocks.to_pylist() == [b"\x00\x01\x02", b"\x00", b"\x00\x03"]
    assert pt.to_target(rocks, ROCKSDB, HDFS).to_pylist() == rows.to_pylist()
    assert pt.to_target(rocks, ROCKSDB, ROCKSDB) is rocks
    other = pa.array([b"\x07\x01"], pa.large_binary())  # another version byte: statectl's
    assert pt.to_target(other, ROCKSDB, ROCKSDB).to_pylist() == [b"\x00\x01"]
    assert pt.to_target(rows.slice(1), HDFS, ROCKSDB).to_pylist() == [b"\x00", b"\x00\x03"]


@pytest.mark.spark
def test_passed_through_operators_continue_like_an_uninterrupted_run(spark, tmp_path):
    """HDFS 2 -> RocksDB 3 through the pass-through (deduplication then aggregation, two
    operators): the real query continues, and with the first run it emits what one
    uninterrupted run emits. (Joins and every other kind: their targets are the savepoint
    path's, byte for byte, above; that path's continuations are tests/test_restore.py's.)"""

    d = tmp_path / "input"
    write_input(d, 0, 3)
    first = run(spark, "multi", d, tmp_path / "ck1", "hdfs")
    plan, _ = migrate(str(tmp_path / "ck1"), str(tmp_path / "ck2"), backend=ROCKSDB, partitions=3)
    assert len(plan.passthrough) == 2
    write_input(d, 3, 2)
    continued = run(spark, "multi", d, tmp_path / "ck2")
    full = run(spark, "multi", d, tmp_path / "ck3", "hdfs")
    assert any(continued.values())
    assert_exactly_once(first, continued, full)

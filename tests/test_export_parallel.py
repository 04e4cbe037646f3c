"""The local engine's parallel export (issue 27): partitions read by fork workers, each chunk
left as a file the parent writes in partition order. Its output is the serial export's."""

from __future__ import annotations

import json
import os

import pyarrow.parquet as pq
import pytest

from statectl.errors import CorruptFileError
from statectl.export import export_state
from statectl.restoration import restore
from tests.helpers.fixtures import FIXTURES
from tests.helpers.restore import synthetic_savepoint

TINY = 2000  # bytes per worker: chunks of a few rows, several per partition

CASES = [
    ("agg-hdfs", {}),  # delta replay
    ("agg-rocksdb-changelog", {}),  # changelog replay
    ("join-hdfs", {"join_side": "left"}),  # the joinSide view
    ("tws-rocksdb", {"state_var": "lst"}),  # column families
]


def _export(tmp_path, src: str, name: str, workers: int, memory: int, **kw) -> bytes:
    out = tmp_path / name
    result = export_state(src, 0, out_url=str(out), memory=memory, workers=workers, **kw)
    assert result["rows"] == sum(1 for _ in _rows(out))
    return out.read_bytes()


def _rows(path):
    if path.suffix == ".parquet":
        return pq.read_table(path).to_pylist()
    lines = path.read_text().splitlines()
    return lines[1:] if path.suffix == ".csv" else lines


@pytest.fixture(autouse=True)
def _workers_for_small_state(monkeypatch) -> None:
    """These states are small: the parallel path is taken for them here, as for big ones."""
    monkeypatch.setattr("statectl.export._PARALLEL_MIN_BYTES", 0)


def test_small_state_is_exported_without_workers(tmp_path, monkeypatch):
    # A fixture's few KiB: forking workers would cost more than they save.
    monkeypatch.setattr("statectl.export._PARALLEL_MIN_BYTES", 32 << 20)
    monkeypatch.setattr(
        "statectl.export._write_parallel", lambda *a: pytest.fail("workers started")
    )
    out = tmp_path / "e.parquet"
    result = export_state(str(FIXTURES / "agg-hdfs"), 0, out_url=str(out), workers=2)
    assert result["rows"] == 7 == pq.read_table(out).num_rows


@pytest.fixture(scope="module")
def wide(tmp_path_factory) -> dict[str, str]:
    """3,000 wide keys as an HDFS delta checkpoint and a RocksDB changelog one, 3 partitions
    each (more tasks than workers), and as a savepoint: several chunks per partition under
    :data:`TINY`."""
    root = tmp_path_factory.mktemp("wide")
    sp = synthetic_savepoint(root / "sp", 3000)
    out = {"savepoint": sp}
    for backend, changelog in (("hdfs", False), ("rocksdb", True)):
        target = root / backend
        restore(
            sp,
            str(target),
            backend=backend,
            partitions=3,
            changelog=changelog,
            memory=1 << 34,
            workers=1,
        )
        out[backend] = str(target)
    return out


@pytest.mark.parametrize("source", ["hdfs", "rocksdb", "savepoint"])
def test_parallel_export_writes_the_serial_bytes(tmp_path, wide, source):
    """Two workers, each with a third of the budget (the parent has the last third), write
    what one reader with that third writes, byte for byte, in every format; under a tiny
    budget (several chunk files per partition) the rows, in order, are the ones an export in
    memory writes (JSON lines and CSV: the very bytes, which do not depend on the chunks)."""
    src = wide[source]
    # a changelog replayed in 1 KB chunks is slow: its text formats are the other sources'
    for fmt in ("parquet",) if source == "rocksdb" else ("parquet", "jsonl", "csv"):
        whole = _export(tmp_path, src, f"whole.{fmt}", 1, 1 << 34)
        serial = _export(tmp_path, src, f"s.{fmt}", 1, TINY)
        parallel = _export(tmp_path, src, f"p.{fmt}", 2, 3 * TINY)
        assert parallel == serial, fmt
        if fmt != "parquet":
            assert parallel == whole, fmt
    assert pq.ParquetFile(tmp_path / "p.parquet").metadata.num_row_groups > 6
    in_memory = pq.read_table(tmp_path / "whole.parquet")
    assert pq.read_table(tmp_path / "p.parquet").equals(in_memory)


@pytest.mark.parametrize(("name", "side"), CASES, ids=[c[0] for c in CASES])
def test_parallel_export_of_each_kind_writes_the_serial_bytes(tmp_path, name, side):
    """Fixtures of several kinds (replayed deltas and changelogs, a join side, column
    families): two workers write the serial bytes (of their share), in every format, in
    memory and under a tiny budget."""
    src = str(FIXTURES / name)
    for fmt in ("parquet", "jsonl", "csv"):
        for memory in (1 << 30, TINY):
            serial = _export(tmp_path, src, f"s{memory}.{fmt}", 1, memory, **side)
            parallel = _export(tmp_path, src, f"p{memory}.{fmt}", 2, 3 * memory, **side)
            assert parallel == serial, (fmt, memory)


def test_failed_worker_leaves_no_output(fixture_copy, tmp_path, monkeypatch):
    """A damaged delta in partition 1 fails its worker: the export raises the worker's error
    naming the file, writes no output, and leaves no chunk files behind."""
    ck = fixture_copy("agg-hdfs")
    delta = ck / "state" / "0" / "1" / "3.delta"
    data = bytearray(delta.read_bytes())
    data[-10] ^= 0x40
    delta.write_bytes(bytes(data))
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    monkeypatch.setenv("STATECTL_TMPDIR", str(scratch))
    out = tmp_path / "out" / "e.parquet"
    out.parent.mkdir()
    with pytest.raises(CorruptFileError, match=r"3\.delta"):
        export_state(str(ck), 0, out_url=str(out), memory=3 * TINY, workers=2)
    assert os.listdir(out.parent) == []
    assert os.listdir(scratch) == []


def test_parallel_export_times_its_phases(tmp_path, monkeypatch):
    """With $STATECTL_PHASES the workers charge their reading and their chunk files, the
    parent its Parquet writing and its waiting (bench/scale.py's phase table)."""
    log = tmp_path / "phases.jsonl"
    monkeypatch.setenv("STATECTL_PHASES", str(log))
    export_state(str(FIXTURES / "agg-hdfs"), 0, out_url=str(tmp_path / "e.parquet"), workers=2)
    by_pid: dict[int, set[str]] = {}
    for line in log.read_text().splitlines():
        doc = json.loads(line)
        by_pid.setdefault(doc["pid"], set()).update(doc["phases"])
    parent = by_pid.pop(os.getpid())
    assert {"parquet write", "export wait", "ipc read", "upload"} <= parent
    assert "ipc write" not in parent
    assert by_pid  # the workers (one may have run both tasks)
    for worker in by_pid.values():
        assert {"read+replay", "decode", "ipc write"} <= worker

"""Bounded reads (statectl/backends/replay.py, the streamed codecs and record scans): savepoint,
export and migrate's savepoint half hold about ``--memory``, whatever a partition's size, and
return what an in-memory read returns, row for row."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from statectl.backends.replay import bounded_replay
from statectl.checkpoint.model import Checkpoint
from statectl.codecs.compression import compress_stream, decompress_stream, iter_decompressed
from statectl.codecs.record_replay import last_writer_wins
from statectl.codecs.records import (
    OP_DELETE,
    OP_DELETE_RANGE,
    OP_MERGE,
    OP_PUT,
    RecordBatch,
    iter_record_stream,
    parse_state_records,
    write_state_records,
)
from statectl.engine import Engine
from statectl.errors import CorruptFileError
from statectl.export import export_state
from statectl.passthrough import fallback_reason
from statectl.restoration import restore
from statectl.savepoints.create import take_savepoint
from tests.helpers.cli import peak_rss_of_cli
from tests.helpers.fixtures import FIXTURES
from tests.helpers.records import after_no_snapshot
from tests.helpers.restore import synthetic_savepoint

RNG = np.random.default_rng(11)


def _blob(n: int) -> bytes:
    return bytes(RNG.integers(0, 256, n, dtype=np.uint8))


@pytest.mark.parametrize("codec", ["lz4", "zstd", "snappy", "lzf"])
def test_decompressed_pieces_join_to_the_stream(codec):
    raw = _blob(300_000) + b"z" * 500_000
    data = compress_stream(codec, raw)
    assert b"".join(bytes(p) for p in iter_decompressed(codec, data)) == raw
    assert decompress_stream(codec, data) == raw
    with pytest.raises(CorruptFileError):
        list(iter_decompressed(codec, data[: len(data) // 2]))


@pytest.mark.parametrize("codec", ["lz4", "zstd", "snappy", "lzf"])
@pytest.mark.parametrize("block", [1, 13, 4096, 1 << 20])
def test_decompressed_pieces_of_a_stream_read_in_blocks(codec, block):
    """A large file is read a block at a time (its compressed bytes never held at once): the
    same output, and the same errors at the same byte offsets, as from the whole file."""
    raw = _blob(70_000) + b"z" * 90_000
    data = compress_stream(codec, raw) + compress_stream(codec, b"second stream")

    def blocks(d: bytes):
        return (d[i : i + block] for i in range(0, len(d), block))

    pieces = iter_decompressed(codec, blocks(data))
    assert b"".join(bytes(p) for p in pieces) == raw + b"second stream"
    for cut in (len(data) // 2, len(data) - 3):
        with pytest.raises(CorruptFileError) as whole:
            list(iter_decompressed(codec, data[:cut], "f"))
        with pytest.raises(CorruptFileError) as streamed:
            list(iter_decompressed(codec, blocks(data[:cut]), "f"))
        assert str(streamed.value) == str(whole.value)
    if codec != "lzf":
        with pytest.raises(CorruptFileError, match="empty file"):
            list(iter_decompressed(codec, iter([b""])))


def _records(n: int) -> tuple[pa.Array, pa.Array]:
    keys = [_blob(int(RNG.integers(0, 40))) for _ in range(n)]
    values = [None if RNG.random() < 0.1 else _blob(int(RNG.integers(0, 90))) for _ in range(n)]
    return pa.array(keys, pa.large_binary()), pa.array(values, pa.large_binary())


@pytest.mark.parametrize("piece", [1, 7, 100, 5000])
def test_record_stream_in_windows_equals_the_whole_parse(piece):
    keys, values = _records(2000)
    raw = write_state_records(keys, values)
    whole = parse_state_records(raw)
    pieces = [raw[i : i + piece] for i in range(0, len(raw), piece)]
    chunks = list(iter_record_stream(pieces, max_bytes=500))
    assert len(chunks) > 1
    assert pa.concat_arrays([c.keys for c in chunks]).equals(whole.keys)
    assert pa.concat_arrays([c.values for c in chunks]).equals(whole.values)
    assert np.array_equal(np.concatenate([c.ops for c in chunks]), whole.ops)


@pytest.mark.parametrize(
    ("cut", "message"),
    [
        (lambda r: r[:-4], "missing end marker"),
        (lambda r: r[:-9], "truncated"),
        (lambda r: r + b"xy", "unexpected bytes after the end marker"),
    ],
)
def test_record_stream_rejects_damage_like_the_whole_parse(cut, message):
    raw = cut(write_state_records(*_records(300)))
    with pytest.raises(CorruptFileError, match=message):
        parse_state_records(raw)
    with pytest.raises(CorruptFileError, match=message):
        list(iter_record_stream([raw[i : i + 64] for i in range(0, len(raw), 64)], max_bytes=256))


def test_removal_in_a_streamed_snapshot_is_corrupt():
    keys, _ = _records(50)
    raw = write_state_records(keys, pa.array([b"v"] * 49 + [None], pa.large_binary()))
    with pytest.raises(CorruptFileError, match="removal record"):
        list(iter_record_stream([raw], allow_deletes=False, max_bytes=64))


def _events(n: int, key_space: int) -> list[RecordBatch]:
    """Puts, deletes, merges and a delete-range over a small key space, in chunks."""
    ids = RNG.integers(0, key_space, n)
    ops = RNG.choice([OP_PUT, OP_PUT, OP_PUT, OP_DELETE, OP_MERGE], n).astype(np.uint8)
    ops[n // 2] = OP_DELETE_RANGE
    keys = [b"k%05d" % i for i in ids]
    values: list[bytes | None] = [
        None if op == OP_DELETE else b"v%d" % j for j, op in enumerate(ops.tolist())
    ]
    keys[n // 2], values[n // 2] = b"k00010", b"k00020"  # deletes k00010 .. k00019
    out = []
    for i in range(0, n, 97):
        out.append(
            RecordBatch(
                ops[i : i + 97],
                pa.array(keys[i : i + 97], pa.large_binary()),
                pa.array(values[i : i + 97], pa.large_binary()),
            )
        )
    return out


@pytest.mark.parametrize("budget", [1 << 30, 4000])
def test_bounded_replay_equals_last_writer_wins(tmp_path, budget):
    batches = _events(5000, 700)
    keys, values = last_writer_wins(batches, merge_delimiter=b",")
    chunks = list(
        bounded_replay(
            after_no_snapshot(batches),
            budget=budget,
            max_bytes=500,
            scratch=str(tmp_path),
            merge_delimiter=b",",
        )
    )
    assert len(chunks) > 10 and all(len(k) <= 100 for k, _ in chunks)
    assert pa.concat_arrays([k for k, _ in chunks]).equals(keys)  # the same order, too
    assert pa.concat_arrays([v for _, v in chunks]).equals(values)


def _table_files(url: str, meta) -> list[pa.Table]:  # type: ignore[no-untyped-def]
    root = url.removeprefix("file://")
    return [
        pq.read_table(os.path.join(root, f.path))
        for op in meta.operators
        for t in op.tables
        for f in t.files
    ]


@pytest.mark.parametrize(
    "name",
    [
        "agg-hdfs",
        "agg-rocksdb",
        "agg-rocksdb-changelog",
        "join-hdfs",
        "dedup-rocksdb",
        # column families filtered a chunk of live entries at a time
        "join3-rocksdb",
        "tws-rocksdb-changelog",
        "tws-mergev1-rocksdb-changelog",
        "tws-ttl-rocksdb",
        # format 4's view as format 2's stores, cut between join keys
        "join4-samets-rocksdb",
    ],
)
def test_tiny_budget_savepoint_and_export_equal_in_memory(tmp_path, name):
    """Every partition replayed through hash buckets on disk, in chunks of 16 rows."""
    src = str(FIXTURES / name)
    a, meta_a = take_savepoint(src, str(tmp_path / "a"), engine=Engine(1 << 34, 1))
    b, meta_b = take_savepoint(src, str(tmp_path / "b"), engine=Engine(2000, 2))
    assert [t.num_rows for t in _table_files(a, meta_a)] == [
        t.num_rows for t in _table_files(b, meta_b)
    ]
    for x, y in zip(_table_files(a, meta_a), _table_files(b, meta_b), strict=True):
        assert x.equals(y)
    for fmt in ("jsonl", "csv"):
        big = tmp_path / f"big.{fmt}"
        tiny = tmp_path / f"tiny.{fmt}"
        side = (
            {"join_side": "left"}
            if name.startswith("join")
            else {"state_var": "lst"}
            if name.startswith("tws")
            else {}
        )
        export_state(src, 0, out_url=str(big), memory=1 << 34, **side)
        export_state(src, 0, out_url=str(tiny), memory=2000, **side)
        assert big.read_bytes() == tiny.read_bytes()


def _checkpoint(tmp_path: Path, keys: int) -> str:
    """A RocksDB checkpoint (changelog files, 2 partitions) of ``keys`` wide keys: its state is
    one large changelog per partition, replayed by every read."""
    tmp_path.mkdir()
    sp = synthetic_savepoint(tmp_path / "sp", keys)
    target = tmp_path / "ckpt"
    restore(
        sp, str(target), backend="rocksdb", partitions=2, changelog=True, memory=1 << 34, workers=1
    )
    return str(target)


def _savepoint_rss(ckpt: str, out: Path, memory: str) -> float:
    """Peak RSS (MB) of ``statectl savepoint CKPT OUT --memory MEMORY`` on one worker."""
    return peak_rss_of_cli(["savepoint", ckpt, str(out), "--memory", memory, "--workers", "1"])


@pytest.mark.slow
def test_memory_budget_bounds_savepoint_and_export(tmp_path):
    """Under 32M the peak RSS of a savepoint, an export and a migrate (its pass-through:
    changelogs replayed on disk, bytes spilled by target partition) does not grow with the
    state (200,000 vs 600,000 wide keys); the same savepoint in memory (8G) grows with it; and
    the bounded savepoint holds the in-memory one's rows."""
    small = _checkpoint(tmp_path / "s", 200_000)
    large = _checkpoint(tmp_path / "l", 600_000)

    def savepoint_rss(ckpt: str, out: str, memory: str) -> float:
        return _savepoint_rss(ckpt, tmp_path / out, memory)

    def export_rss(ckpt: str, out: str, memory: str) -> float:
        return peak_rss_of_cli(["export", ckpt, "-o", str(tmp_path / out), "--memory", memory])

    baseline = savepoint_rss(str(FIXTURES / "agg-rocksdb-changelog"), "sp0", "32M")
    sp_small = savepoint_rss(small, "sp1", "32M")
    sp_large = savepoint_rss(large, "sp2", "32M")
    sp_unbounded = savepoint_rss(large, "sp3", "8G")
    ex_small = export_rss(small, "e1.parquet", "32M")
    ex_large = export_rss(large, "e2.parquet", "32M")
    migrate = ["--backend", "hdfs", "--partitions", "3", "--memory", "32M", "--workers", "1"]
    mg_small = peak_rss_of_cli(["migrate", small, str(tmp_path / "m1"), *migrate])
    mg_large = peak_rss_of_cli(["migrate", large, str(tmp_path / "m2"), *migrate])
    ckpt = Checkpoint.open(large)
    b = ckpt.latest_committed_batch
    assert all(fallback_reason(ckpt, b, op, None) is None for op in ckpt.operators(b))
    print(
        f"peak RSS MB: fixture {baseline:.0f}; savepoint under 32M: 200k keys {sp_small:.0f}, "
        f"600k keys {sp_large:.0f}; under 8G: 600k keys {sp_unbounded:.0f}; "
        f"export under 32M: 200k {ex_small:.0f}, 600k {ex_large:.0f}; "
        f"migrate under 32M: 200k {mg_small:.0f}, 600k {mg_large:.0f}"
    )
    assert sp_large - sp_small <= 40  # 3x the keys, the same peak (allocator noise aside)
    assert ex_large - ex_small <= 40
    assert mg_large - mg_small <= 40
    assert sp_large - baseline <= 32 + 128  # the budget plus Parquet and allocator slack
    assert sp_unbounded - baseline >= 2 * (sp_large - baseline)
    # The bounded savepoint (replayed through buckets on disk) holds the same rows, in order.
    (bounded,) = (tmp_path / "sp2").iterdir()
    (unbounded,) = (tmp_path / "sp3").iterdir()
    for part in sorted(bounded.glob("operators/*/*/*.parquet")):
        twin = unbounded / part.relative_to(bounded)
        assert pq.read_table(part).equals(pq.read_table(twin))
    assert pq.read_table(tmp_path / "e2.parquet").num_rows == 600_000


@pytest.mark.parametrize("block", [1, 5, 64 << 10])
@pytest.mark.parametrize("sidecar", ["hadoop", "spark"])
def test_streamed_verification_equals_the_whole_file_check(fixture_copy, block, sidecar):
    """iter_verified checks a file's Hadoop or Spark checksum as its blocks pass: intact, the
    blocks are the file; changed, grown or shrunk, it raises what read_verified raises, before
    the last block is the end of it."""
    from statectl.checksums import iter_verified, read_verified
    from statectl.io import FileIO

    ck = fixture_copy("spark41-agg-hdfs")
    delta = ck / "state" / "0" / "0" / "2.delta"
    if sidecar == "hadoop":
        (delta.parent / "2.delta.crc").unlink()
    else:
        (delta.parent / ".2.delta.crc").unlink()
    io, path = FileIO.for_url(str(delta))
    assert b"".join(iter_verified(io, path, block=block)) == delta.read_bytes()
    intact = delta.read_bytes()
    for damaged in (
        intact[:7] + bytes([intact[7] ^ 1]) + intact[8:],
        intact + b"x",
        intact[:-1],
    ):
        delta.write_bytes(damaged)
        with pytest.raises(CorruptFileError) as whole:
            read_verified(io, path, data_file=True)
        with pytest.raises(CorruptFileError) as streamed:
            b"".join(iter_verified(io, path, block=block))
        assert str(streamed.value) == str(whole.value)
        assert "checksum" in str(streamed.value)
    delta.write_bytes(intact)


def test_tiny_budget_savepoint_of_a_damaged_file_fails_and_writes_nothing(fixture_copy, tmp_path):
    """Under a budget smaller than its files, a checkpoint's files are streamed; a changed byte
    (its checksum no longer matches) fails the savepoint with the file named, and no savepoint
    is left that looks complete."""
    ck = fixture_copy("spark41-agg-hdfs")
    delta = ck / "state" / "0" / "1" / "3.delta"
    data = bytearray(delta.read_bytes())
    data[-10] ^= 0x40
    delta.write_bytes(bytes(data))
    out = tmp_path / "sp"
    with pytest.raises(CorruptFileError, match=r"3\.delta"):
        take_savepoint(str(ck), str(out), engine=Engine(100, 1))
    assert not list(out.glob("*/_metadata"))


def _tws_savepoint(tmp_path: Path, keys: int) -> str:
    """The tws-rocksdb-changelog fixture's savepoint with ``keys`` wide keys in its value state
    ``cnt`` (bootstrapped with SavepointWriter.with_state)."""
    import pyarrow.compute as pc

    import statectl
    from statectl.processor.writing import SavepointWriter

    tmp_path.mkdir()
    url, meta = take_savepoint(str(FIXTURES / "tws-rocksdb-changelog"), str(tmp_path / "sp"))
    (op,) = meta.operators
    ids = pa.array(np.arange(keys))
    k = pc.binary_join_element_wise("key-", ids.cast(pa.string()), "-" + "x" * 150, "")
    data = pa.table(
        {
            "key": pa.StructArray.from_arrays([k], ["k"]),
            "value": pa.StructArray.from_arrays([ids], ["c"]),
        }
    )
    SavepointWriter.from_savepoint(statectl.open(url)).with_state(op.uid, data, "cnt").write(
        str(tmp_path / "big")
    )
    return str(tmp_path / "big")


def _tws_checkpoint(tmp_path: Path, keys: int) -> str:
    """:func:`_tws_savepoint` restored to RocksDB snapshots (in memory)."""
    sp = _tws_savepoint(tmp_path, keys)
    target = tmp_path / "ckpt"
    plan = restore(sp, str(target), memory=1 << 34, workers=1)
    assert not plan.problems, plan.problems
    return str(target)


@pytest.mark.slow
def test_memory_budget_bounds_a_transform_with_state_savepoint(tmp_path):
    """transformWithState's column families are read a chunk of live entries at a time: under
    32M the savepoint's peak RSS does not grow with the state (200,000 vs 600,000 wide keys in
    one value state), in memory (8G) it does, and both hold the same rows."""
    small = _tws_checkpoint(tmp_path / "s", 200_000)
    large = _tws_checkpoint(tmp_path / "l", 600_000)

    def savepoint_rss(ckpt: str, out: str, memory: str) -> float:
        return _savepoint_rss(ckpt, tmp_path / out, memory)

    baseline = savepoint_rss(str(FIXTURES / "tws-rocksdb-changelog"), "sp0", "32M")
    sp_small = min(savepoint_rss(small, f"sp1{i}", "32M") for i in range(2))
    sp_large = min(savepoint_rss(large, f"sp2{i}", "32M") for i in range(2))
    sp_unbounded = savepoint_rss(large, "sp3", "8G")
    print(
        f"peak RSS MB: fixture {baseline:.0f}; under 32M: 200k keys {sp_small:.0f}, "
        f"600k keys {sp_large:.0f}; under 8G: 600k keys {sp_unbounded:.0f}"
    )
    assert sp_large - sp_small <= 64  # 3x the keys, the same peak (allocator noise aside)
    assert sp_unbounded - baseline >= 2 * (sp_large - baseline)
    (bounded,) = (tmp_path / "sp20").iterdir()
    (unbounded,) = (tmp_path / "sp3").iterdir()
    parts = sorted(bounded.glob("operators/*/*/*.parquet"))
    assert sum(pq.read_metadata(p).num_rows for p in parts if p.parent.name == "cnt") == 600_000
    for part in parts:
        twin = unbounded / part.relative_to(bounded)
        assert pq.read_table(part).equals(pq.read_table(twin))


@pytest.mark.parametrize("name", ["join3-rocksdb", "join4-rocksdb", "join4-leftsemi-rocksdb"])
def test_join_column_families_read_in_any_chunks_equal_the_whole(name):
    """Joins at formats 3/4 are read a chunk of live entries at a time (every selection but
    format 4's view as format 2's stores, which numbers each key's values and fails this): each
    row stands alone, so the rows of entries cut into pieces of 3 are the whole partition's."""
    from statectl.checkpoint.model import Checkpoint
    from statectl.join_state import format_of
    from statectl.savepoints.create import table_tasks
    from statectl.state import RawState, Selection, StoreEncoding, _join_rows, load_raw

    ck = Checkpoint.open(str(FIXTURES / name))
    b = ck.latest_committed_batch
    enc = StoreEncoding.of(ck, b)
    (op,) = ck.operators(b)
    fmt = format_of(op.kind)
    sels = [t.selection for t in table_tasks(op)]
    sels += [Selection(0, join_side=s) for s in ("left", "right")]
    sels += [Selection(0, store=s.name) for s in op.schemas]
    chunked = [s for s in sels if not (fmt == 4 and s.join_store)]
    assert len(chunked) >= 6
    for p in range(op.num_partitions):
        raw = load_raw(ck, op, "default", p, b, enc)
        assert len(raw.keys) > 3
        pieces = [
            RawState(raw.keys.slice(i, 3), raw.values.slice(i, 3), cf_ids=raw.cf_ids)
            for i in range(0, len(raw.keys), 3)
        ]
        for sel in chunked:
            whole, store = _join_rows(raw, op, sel, p, enc, fmt, "w")
            parts = [_join_rows(piece, op, sel, p, enc, fmt, "w") for piece in pieces]
            assert {s for _, s in parts} == {store}
            assert pa.concat_tables([t for t, _ in parts]).equals(whole), (sel, p)


def _cf_entries(target: Path, partitions: int) -> list:
    """Every partition's RocksDB entries (sorted) and snapshot metadata (without file names)."""
    import json
    import zipfile

    from statectl.checkpoint.model import Checkpoint
    from statectl.state import StoreEncoding, load_raw

    ck = Checkpoint.open(str(target))
    b = ck.latest_committed_batch
    enc = StoreEncoding.of(ck, b)
    out = []
    for op in ck.operators(b):
        for p in range(partitions):
            raw = load_raw(ck, op, "default", p, b, enc)
            (z,) = (target / "state" / str(op.operator_id) / str(p)).glob("*.zip")
            meta = json.loads(zipfile.ZipFile(z).read("metadata").decode().split("\n", 1)[1])
            meta.pop("sstFiles")
            entries = sorted(zip(raw.keys.to_pylist(), raw.values.to_pylist(), strict=True))
            out.append((entries, meta))
    return out


@pytest.mark.parametrize(
    "name",
    [
        "tws-rocksdb",
        "tws-ttl-rocksdb",
        "tws-avro-rocksdb",
        "tws-mergev1-rocksdb",
        "join3-rocksdb",
        "join4-rocksdb",
        "join4-samets-rocksdb",
        "join4-fullouter-rocksdb",
    ],
)
def test_tiny_budget_restore_of_column_families_equals_in_memory(tmp_path, name, monkeypatch):
    """A column-family partition larger than the budget is encoded a chunk at a time (list
    state, and format 4 join values, in buckets of whole keys) through sorted runs on disk: the
    same entries and snapshot metadata as the whole encoding."""
    import statectl.restoration.families as restoring

    streamed = []
    for fn in ("encode_spilled", "encode_join_spilled"):
        real = getattr(restoring, fn)

        def counting(*args, _real=real, **kwargs):
            streamed.append(1)
            return _real(*args, **kwargs)

        monkeypatch.setattr(restoring, fn, counting)
    url, _ = take_savepoint(str(FIXTURES / name), str(tmp_path / "sp"))
    whole, tiny = tmp_path / "whole", tmp_path / "tiny"
    assert not restore(url, str(whole), partitions=3, memory=1 << 34, workers=1).problems
    assert not streamed
    assert not restore(url, str(tiny), partitions=3, memory=2000, workers=1).problems
    assert len(streamed) == 3
    assert _cf_entries(tiny, 3) == _cf_entries(whole, 3)


@pytest.mark.slow
def test_memory_budget_bounds_a_transform_with_state_restore(tmp_path):
    """Restoring transformWithState under 32M: the peak RSS does not grow with the state
    (200,000 vs 600,000 wide keys in one value state), in memory (8G) it does."""
    small = _tws_savepoint(tmp_path / "s", 200_000)
    large = _tws_savepoint(tmp_path / "l", 600_000)

    def restore_rss(sp: str, out: str, memory: str) -> float:
        args = ["restore", str(tmp_path / out), "-s", sp, "--partitions", "3"]
        return peak_rss_of_cli([*args, "--memory", memory, "--workers", "1"])

    small_rss = min(restore_rss(small, f"r1{i}", "32M") for i in range(2))
    large_rss = min(restore_rss(large, f"r2{i}", "32M") for i in range(2))
    unbounded = restore_rss(large, "r3", "8G")
    print(
        f"peak RSS MB: under 32M: 200k keys {small_rss:.0f}, 600k keys {large_rss:.0f}; "
        f"under 8G: 600k keys {unbounded:.0f}"
    )
    assert large_rss - small_rss <= 64  # 3x the keys, the same peak (allocator noise aside)
    assert unbounded - large_rss >= 150
    assert _cf_entries(tmp_path / "r20", 3) == _cf_entries(tmp_path / "r3", 3)


@pytest.mark.parametrize(
    "name", ["join4-rocksdb", "join4-samets-rocksdb", "join4-fullouter-rocksdb"]
)
def test_format_4_view_as_format_2_reads_in_chunks_of_whole_join_keys(tmp_path, name):
    """Format 4's view as format 2's stores (what a savepoint holds) numbers each join key's
    values by event time: read in many chunks under a tiny budget, each chunk ends between two
    join keys, and the chunks together are the whole partition's rows."""
    from statectl.checkpoint.model import Checkpoint
    from statectl.state import Selection, StoreEncoding, iter_partition, read_partition

    ck = Checkpoint.open(str(FIXTURES / name))
    b = ck.latest_committed_batch
    enc = StoreEncoding.of(ck, b)
    (op,) = ck.operators(b)
    chunked = 0
    for store in ("left-keyWithIndexToValue", "right-keyToNumValues"):
        sel = Selection(0, join_store=store)
        for p in range(op.num_partitions):
            whole = read_partition(ck, op, sel, p, b, enc)
            parts = list(iter_partition(ck, op, sel, p, b, enc, budget=2000, scratch=str(tmp_path)))
            chunked += len(parts) > 1
            assert pa.concat_tables(parts).equals(whole), (store, p)
    assert chunked  # the tiny budget did cut partitions into chunks


def _join4_checkpoint(tmp_path: Path, keys: int) -> str:
    """A stream-stream join at state format 4 (RocksDB, 2 partitions) of ``keys`` wide join
    keys, two left values and one right value each: join4-rocksdb's savepoint with its four
    tables' files replaced (crafted and sealed again: statectl edits a join only whole),
    restored at the savepoint's format."""
    import json

    from statectl.codecs.murmur3 import partition_ids
    from statectl.io import FileIO
    from statectl.savepoints.format import seal
    from statectl.savepoints.layout import write_table

    tmp_path.mkdir()
    url, _ = take_savepoint(str(FIXTURES / "join4-rocksdb"), str(tmp_path / "sp"))
    root = Path(url.removeprefix("file://"))
    doc = json.loads((root / "_metadata").read_text())
    ids = np.arange(keys)
    join_key = pa.array([f"key-{i:012d}-{'x' * 100}" for i in ids])
    part = pa.array(partition_ids([join_key], 2))
    ts = pa.array(np.full(keys, 1_704_067_230_000_000)).cast(pa.timestamp("us", "UTC"))
    values = {"left": (("lk", "lv", "lts"), 2), "right": (("rk", "rid", "rts"), 1)}
    for table in doc["operators"][0]["tables"]:
        side, store = table["name"].split("-", 1)
        cols, n = values[side]
        if store == "keyToNumValues":
            t = pa.table(
                {
                    "key": pa.StructArray.from_arrays([join_key], ["field0"]),
                    "value": pa.StructArray.from_arrays([pa.array(np.full(keys, n))], ["value"]),
                    "partition_id": part,
                }
            )
        else:
            t = pa.concat_tables(
                pa.table(
                    {
                        "key": pa.StructArray.from_arrays(
                            [join_key, pa.array(np.full(keys, i))], ["field0", "index"]
                        ),
                        "value": pa.StructArray.from_arrays(
                            [join_key, pa.array(ids + i), ts, pa.array(np.zeros(keys, bool))],
                            [*cols, "matched"],
                        ),
                        "partition_id": part,
                    }
                )
                for i in range(n)
            )
        table["files"] = []
        for p in range(2):  # one file per partition, as savepoints have them
            rel = f"operators/big/{table['name']}/part-{p:05d}.parquet"
            piece = t.filter(pa.compute.equal(t["partition_id"], p))
            f = write_table(FileIO.for_url(str(root))[0], str(root), rel, piece)
            table["files"].append(
                {"path": f.path, "rows": f.rows, "bytes": f.bytes, "sha256": f.sha256}
            )
        table["rows"] = t.num_rows
    (root / "_metadata").write_text(json.dumps(seal(doc)))
    target = tmp_path / "ckpt"
    restore(url, str(target), backend="rocksdb", partitions=2, memory=1 << 34, workers=1)
    return str(target)


@pytest.mark.slow
def test_memory_budget_bounds_a_format_4_join_savepoint(tmp_path):
    """A savepoint of a format-4 join (its state saved as format 2's stores, each join key's
    values numbered by event time) under 32M does not grow with the state: 100,000 vs 300,000
    join keys, whose rows take 200 MB more as Arrow tables; the rows are those of a savepoint
    under 8G. (8G no longer holds a partition whole either: its chunks are READ_CHUNK_BYTES.)"""
    small = _join4_checkpoint(tmp_path / "s", 100_000)
    large = _join4_checkpoint(tmp_path / "l", 300_000)
    bounded_small = _savepoint_rss(small, tmp_path / "sp1", "32M")
    bounded_large = _savepoint_rss(large, tmp_path / "sp2", "32M")
    unbounded = _savepoint_rss(large, tmp_path / "sp3", "8G")
    print(
        f"format-4 join savepoint peak RSS MB under 32M: 100k keys {bounded_small:.0f}, "
        f"300k keys {bounded_large:.0f}; under 8G: 300k keys {unbounded:.0f}"
    )
    assert bounded_large - bounded_small <= 64
    (bounded,) = (tmp_path / "sp2").iterdir()
    (bounded_few,) = (tmp_path / "sp1").iterdir()
    (whole,) = (tmp_path / "sp3").iterdir()

    def arrow_mb(savepoint: Path) -> float:
        parts = savepoint.glob("operators/*/*/*.parquet")
        return sum(pq.read_table(p).nbytes for p in parts) / (1 << 20)

    # The control: the rows the bounded runs did not hold at once differ by far more than
    # their peaks do.
    assert arrow_mb(bounded) - arrow_mb(bounded_few) >= 150
    for part in sorted(bounded.glob("operators/*/*/*.parquet")):
        assert pq.read_table(part).equals(pq.read_table(whole / part.relative_to(bounded)))


@pytest.mark.parametrize(
    ("chunk_rows", "sizes"),
    [(25, [20, 20, 20, 10]), (30, [30, 30, 10]), (5, [5] * 14), (1000, [70])],
)
def test_savepoint_files_are_read_a_window_of_row_groups_at_a_time(tmp_path, chunk_rows, sizes):
    """Every row once, in order, in batches of whole row groups up to the chunk size (a group
    larger than a chunk is cut): one reader per window, since one over the whole file keeps
    memory for every row group it has passed."""
    from statectl.savepoints.store import _row_group_batches

    path = tmp_path / "part.parquet"
    pq.write_table(pa.table({"n": np.arange(70)}), path, row_group_size=10)
    batches = list(_row_group_batches(pq.ParquetFile(path), chunk_rows))
    assert [b.num_rows for b in batches] == sizes
    assert pa.Table.from_batches(batches).column("n").to_pylist() == list(range(70))

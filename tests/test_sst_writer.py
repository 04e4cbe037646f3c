"""The vectorized SST writer (statectl/backends/sst.py) and the batch merge that feeds it
(statectl/backends/streamed.py ``merge_runs``), against RocksDB itself: every file is ingested into a
RocksDB database (rocksdict) and read back, whole and by point lookups, and RocksDB's own view
of the table (entries, blocks) is checked."""

from __future__ import annotations

import itertools
import os
import random
import struct

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from rocksdict import IngestExternalFileOptions, Rdict, ReadOptions

from statectl.backends import writers
from statectl.backends.sst import BLOCK_SIZE, STEP_ROWS, SstWriter
from statectl.backends.streamed import merge_runs
from statectl.backends.writers import (
    _build_rocksdb,
    _bytewise_order,
    _rocksdb_options,
    sorted_entries,
)

RNG = np.random.default_rng(7)


def _write(path: str, batches: list[tuple[list[bytes], list[bytes]]]) -> int:
    with open(path, "wb") as out:
        writer = SstWriter(out)
        for keys, values in batches:
            writer.add(pa.array(keys, pa.binary()), pa.array(values, pa.binary()))
        return writer.finish()


def _ingest(tmp_path, sst: str) -> Rdict:
    db = Rdict(str(tmp_path / "db"), _rocksdb_options())
    db.ingest_external_file([sst], IngestExternalFileOptions())
    return db


def _check(tmp_path, entries: dict[bytes, bytes], cuts: list[int] | None = None) -> Rdict:
    """Write ``entries`` (in batches cut at ``cuts``), ingest, and read everything back."""
    keys = sorted(entries)
    bounds = [0, *(cuts or []), len(keys)]
    batches = [(keys[a:b], [entries[k] for k in keys[a:b]]) for a, b in itertools.pairwise(bounds)]
    sst = str(tmp_path / "x.sst")
    assert _write(sst, batches) == len(keys)
    db = _ingest(tmp_path, sst)
    assert list(db.items()) == [(k, entries[k]) for k in keys]
    for k in random.Random(1).sample(keys, min(len(keys), 200)):
        assert db[k] == entries[k]  # a point lookup: index binary search, block restarts
    assert db.get(keys[-1] + b"\x00") is None and db.get(b"") in (None, entries.get(b""))
    (live,) = db.live_files()
    assert live["num_entries"] == len(keys)
    assert (live["start_key"], live["end_key"]) == (keys[0], keys[-1])
    return db


def _blob(n: int) -> bytes:
    return bytes(RNG.integers(0, 256, n, dtype=np.uint8))


def test_one_entry(tmp_path):
    _check(tmp_path, {b"\x00k": b"\x00v"}).close()


@pytest.mark.parametrize(
    "batches",
    [
        [[b"b", b"a"]],  # out of order within a batch
        [[b"a", b"a"]],  # a duplicate
        [[b"a", b"c"], [b"b"]],  # out of order across batches
        [[b"a"], [b"a"]],  # a duplicate across batches
        [[b"\x7f"], [b"\x01\xff"]],  # unsigned: 0x01ff sorts before 0x7f
    ],
)
def test_keys_out_of_order_are_refused(tmp_path, batches):
    """As RocksDB's SstFileWriter: an SST with unsorted keys would read back wrong."""
    with pytest.raises(ValueError, match="strictly increasing"):
        _write(str(tmp_path / "x.sst"), [(keys, [b"v"] * len(keys)) for keys in batches])


def test_edge_case_entries(tmp_path):
    """Empty keys and values, 0xff bytes (bytewise order, not signed), keys longer than a
    block, values needing 3-byte varints, incompressible blocks (stored raw)."""
    entries = {
        b"": b"",
        b"\x00": b"",
        b"\xff": b"\xff" * 7,
        b"\xff\xff\xff": b"x",
        b"\x7f\x80": _blob(300),
        b"a" * 5000: b"long key",
        b"b" * (3 * BLOCK_SIZE): _blob(70_000),
        b"c": b"v" * 20_000,
    }
    entries.update({_blob(12): _blob(200) for _ in range(500)})  # random: incompressible
    db = _check(tmp_path, entries, cuts=[1, 3])
    props = db.property_value("rocksdb.aggregated-table-properties")
    assert f"# entries={len(entries)};" in props
    assert "index block size (user-key? 0, delta-value? 0)" in props
    db.close()


def test_many_blocks_and_steps(tmp_path):
    """More rows than one encoding step, in several batches: thousands of blocks, each about
    BLOCK_SIZE, all readable."""
    n = STEP_ROWS * 2 + 123
    keys = [b"\x00\x00\x00\x00\x10key-%08d" % i for i in range(n)]
    entries = {k: b"\x00" + struct.pack("<q", i) * 3 for i, k in enumerate(keys)}
    db = _check(tmp_path, entries, cuts=[10, 70_000])
    props = db.property_value("rocksdb.aggregated-table-properties")
    blocks = int(props.split("# data blocks=")[1].split(";")[0])
    assert blocks > n * 30 // BLOCK_SIZE  # ~30+ bytes an entry, blocks of about 4 KiB
    db.close()


def test_compaction_reads_and_rewrites_the_file(tmp_path):
    """RocksDB's compaction reads every block (verifying checksums) and writes its own SST:
    same entries."""
    entries = {
        _blob(int(RNG.integers(1, 40))): _blob(int(RNG.integers(0, 90))) for _ in range(5000)
    }
    db = _check(tmp_path, entries)
    db.compact_range(None, None)
    assert list(db.items()) == sorted(entries.items())
    db.close()


def test_a_flipped_byte_is_a_checksum_error(tmp_path):
    """The block trailers carry real checksums: RocksDB rejects a corrupted data block."""
    entries = {b"k%05d" % i: b"value %d" % i for i in range(3000)}
    sst = str(tmp_path / "x.sst")
    _write(sst, [(sorted(entries), [entries[k] for k in sorted(entries)])])
    with open(sst, "r+b") as f:
        f.seek(100)
        byte = f.read(1)
        f.seek(100)
        f.write(bytes((byte[0] ^ 0x01,)))
    opts = ReadOptions()
    opts.set_verify_checksums(True)
    with pytest.raises(Exception, match=r"(?i)corrupt|checksum"):  # rocksdict raises Exception
        db = _ingest(tmp_path, sst)  # ingestion reads the first block already
        list(db.items(read_opt=opts))


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    entries=st.dictionaries(
        st.binary(max_size=40), st.binary(max_size=300), min_size=1, max_size=400
    ),
    cuts=st.lists(st.integers(0, 400), max_size=4),
)
def test_random_entries_read_back(tmp_path_factory, entries, cuts):
    tmp = tmp_path_factory.mktemp("sst")
    cuts = sorted(min(c, len(entries)) for c in cuts)
    _check(tmp, entries, cuts).close()


def test_build_rocksdb_from_unsorted_arrays(tmp_path):
    """The in-memory route: arrays sorted bytewise (``sorted_entries``), one SST ingested."""
    entries = {
        _blob(int(RNG.integers(0, 30))): _blob(int(RNG.integers(0, 30))) for _ in range(3000)
    }
    keys, values = sorted_entries(pa.array(list(entries)), pa.array(list(entries.values())))
    _build_rocksdb(str(tmp_path / "db"), [(keys, values)])
    db = Rdict(str(tmp_path / "db"), _rocksdb_options())
    assert list(db.items()) == sorted(entries.items())
    db.close()
    assert not os.path.exists(str(tmp_path / "db") + ".ingest.sst")


def test_build_rocksdb_without_entries(tmp_path):
    _build_rocksdb(str(tmp_path / "db"), [])
    db = Rdict(str(tmp_path / "db"), _rocksdb_options())
    assert list(db.items()) == [] and db.live_files() == []
    db.close()


def _runs(
    tmp_path, rows: list[tuple[bytes, bytes]], pieces: int, batch: int, ranges: bool = False
) -> list[str]:
    """``rows`` dealt round-robin (or, with ``ranges``, cut into key ranges, as a presorted
    input's runs are) into sorted run files of ``batch``-row batches."""
    paths = []
    schema = pa.schema([("key", pa.large_binary()), ("value", pa.large_binary())])
    ordered = sorted(rows)
    for r in range(pieces):
        if ranges:
            part = ordered[r * len(rows) // pieces : (r + 1) * len(rows) // pieces]
        else:
            part = sorted(rows[r::pieces])
        path = str(tmp_path / f"run-{r}.arrow")
        table = pa.table(
            [
                pa.array([k for k, _ in part], pa.large_binary()),
                pa.array([v for _, v in part], pa.large_binary()),
            ],
            schema=schema,
        )
        with pa.OSFile(path, "wb") as f, pa.ipc.new_stream(f, schema) as w:
            for b in table.to_batches(max_chunksize=batch):
                w.write_batch(b)
        paths.append(path)
    return paths


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    keys=st.sets(st.binary(max_size=12), max_size=300),
    pieces=st.integers(1, 5),
    batch=st.integers(1, 50),
    ranges=st.booleans(),
)
def test_merge_runs_yields_sorted_batches(tmp_path_factory, keys, pieces, batch, ranges):
    """The k-way merge of sorted runs, a batch at a time, gives every row once in bytewise
    order (0xff sorts last: unsigned), whatever the runs' batch sizes, for interleaved runs
    (sorted again) and runs over key ranges (only put together)."""
    tmp = tmp_path_factory.mktemp("runs")
    rows = [(k, k[::-1]) for k in keys]
    random.Random(3).shuffle(rows)
    merged = [
        (k, v)
        for ks, vs in merge_runs(_runs(tmp, rows, pieces, batch, ranges))
        for k, v in zip(ks.to_pylist(), vs.to_pylist(), strict=True)
    ]
    assert merged == sorted(rows)


def test_bytewise_order_is_unsigned():
    keys = pa.array([b"\xff", b"\x01", b"\x80\x00", b"\x7f", b""], pa.large_binary())
    order = _bytewise_order(keys).to_pylist()
    assert [keys[i].as_py() for i in order] == [b"", b"\x01", b"\x7f", b"\x80\x00", b"\xff"]


def test_bytewise_order_packs_the_bytes_that_vary():
    # UnsafeRow-like keys equal but in a few bytes (issue 27: one packed word, one sort), and
    # the same with zero-extended twins, whose packed words tie and need the length.
    base = [b"\x00" * 9 + bytes([n % 7]) + b"\x00" * 6 + b"key-%07d" % n for n in range(500)]
    rng = np.random.default_rng(5)
    for keys in (base, base + [k + b"\x00" for k in base[:50]]):
        shuffled = [keys[i] for i in rng.permutation(len(keys))]
        order = _bytewise_order(pa.array(shuffled, pa.large_binary())).to_pylist()
        assert [shuffled[i] for i in order] == sorted(keys)


@settings(max_examples=200, deadline=None)
@given(
    keys=st.lists(
        st.one_of(st.binary(max_size=70), st.sampled_from([b"", b"\x00", b"\x00\x00", b"\xff"])),
        max_size=60,
    ),
    offset=st.integers(0, 3),
    presorted=st.booleans(),
)
def test_bytewise_order_equals_python_bytes_order(keys, offset, presorted):
    """Python compares bytes as RocksDB's BytewiseComparator does (unsigned, a prefix first):
    keys with zero bytes at the end, equal lengths, keys longer than the word sort and keys
    mostly sorted already (both Arrow's sort), a sliced array."""
    if presorted:
        keys = sorted(keys)[1:] + sorted(keys)[:1]
    array = pa.array([b"pad"] * offset + keys, pa.large_binary()).slice(offset)
    order = _bytewise_order(array).to_pylist()
    assert sorted(order) == list(range(len(keys)))
    assert [keys[i] for i in order] == sorted(keys)


@pytest.mark.parametrize("sample", [1 << 16, 64])
def test_presorted_tells_runs_from_shuffled_keys(monkeypatch, sample):
    """Every adjacent pair, or (a partition of millions) evenly spaced ones: keys in a few
    sorted runs are presorted, shuffled ones are not."""
    monkeypatch.setattr(writers, "PRESORTED_SAMPLE", sample)
    keys = [b"key-%05d" % n for n in range(2_000)]
    two_runs = sorted(keys[::2]) + sorted(keys[1::2])
    shuffled = [keys[i] for i in np.random.default_rng(2).permutation(len(keys))]
    assert writers._presorted(pa.array(two_runs, pa.large_binary()))
    assert not writers._presorted(pa.array(shuffled, pa.large_binary()))

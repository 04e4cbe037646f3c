"""statectl's own SST reader (statectl/backends/sst_read.py) against RocksDB itself: every
database it reads (Spark-written fixture snapshots, statectl-written SSTs, files holding older
versions and deletions) gives exactly what rocksdict's iteration gives, and what it must not
read it leaves to RocksDB."""

from __future__ import annotations

import os
import tempfile

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from rocksdict import AccessType, Options, Rdict

from statectl.backends import rocksdb_zip, sst_read
from statectl.backends.writers import _build_rocksdb, _rocksdb_options, write_rocksdb_snapshot
from statectl.errors import CorruptFileError
from statectl.io import FileIO
from tests.helpers.fixtures import FIXTURES


def _read_only(path: str) -> Rdict:
    return Rdict(path, options=Options(raw_mode=True), access_type=AccessType.read_only())


def _native(path: str) -> list[tuple[bytes, bytes]]:
    db = _read_only(path)
    try:
        run = sst_read.sorted_run(path, db.live_files())
    finally:
        db.close()
    return [
        e for keys, values in run for e in zip(keys.to_pylist(), values.to_pylist(), strict=True)
    ]


def _rocksdb(path: str) -> list[tuple[bytes, bytes]]:
    db = _read_only(path)
    try:
        return list(db.items())
    finally:
        db.close()


def test_spark_snapshots_read_as_rocksdb_reads_them():
    """The snapshot zips of the RocksDB fixtures (Spark 3.5 to 4.3, every operator kind; every
    fourth, for time) that are one sorted run read as RocksDB reads them; the others are left
    to RocksDB."""
    read = left = 0
    for z in sorted(FIXTURES.glob("*rocksdb*/state/*/*/*.zip"))[::4]:
        io, _ = FileIO.for_url(str(z.parent))
        with tempfile.TemporaryDirectory() as tmp:
            rocksdb_zip._unpack(io, str(z.parent), str(z), True, tmp)
            try:
                got = _native(tmp)
            except sst_read.Unsupported:
                left += 1
                continue
            assert got == _rocksdb(tmp), z
            read += 1
    assert read >= 40 and left >= 40  # both paths are exercised by the fixtures


def _write(path: str, entries: dict[bytes, bytes]) -> None:
    keys = sorted(entries)
    _build_rocksdb(
        path, [(pa.array(keys, pa.large_binary()), pa.array([entries[k] for k in keys]))]
    )


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.dictionaries(
        st.one_of(
            st.binary(max_size=90),
            # long shared prefixes (restart groups of many entries sharing most bytes)
            st.builds(
                lambda s, t: b"prefix-" * 6 + s + t, st.binary(max_size=3), st.binary(max_size=20)
            ),
        ),
        st.one_of(st.binary(max_size=40), st.binary(min_size=120, max_size=400)),
        min_size=1,
        max_size=400,
    )
)
def test_statectl_written_tables_read_back(entries):
    """Keys of every length (empty, 1 byte, longer than a word, 2-byte varints), values up to
    a few hundred bytes, many blocks: the reader gives back the entries in key order."""
    with tempfile.TemporaryDirectory() as tmp:
        _write(os.path.join(tmp, "db"), entries)
        assert _native(os.path.join(tmp, "db")) == sorted(entries.items())


def test_many_blocks_in_several_steps(tmp_path, monkeypatch):
    """A table parsed a few blocks at a time gives what one step gives."""
    rng = np.random.default_rng(3)
    entries = {
        b"k%08d" % i + bytes(rng.integers(0, 256, i % 7, dtype=np.uint8)): bytes(i % 300)
        for i in range(20000)
    }
    _write(str(tmp_path / "db"), entries)
    whole = _native(str(tmp_path / "db"))
    monkeypatch.setattr(sst_read, "MATRIX_BYTES", 1 << 14)
    assert _native(str(tmp_path / "db")) == whole == sorted(entries.items())


def test_older_versions_and_deletions_are_dropped(tmp_path):
    """A snapshot held across a flush keeps older versions and tombstones in one file:
    the newest entry of each key wins, a deleted key is gone, as RocksDB reads them."""
    path = str(tmp_path / "db")
    db = Rdict(path, options=_rocksdb_options())  # format_version 5, LZ4: as Spark writes
    for i in range(3000):
        db[b"key-%05d" % i] = b"v1-%d" % i
    snap = db.snapshot()
    for i in range(0, 3000, 3):
        db[b"key-%05d" % i] = b"v2-%d" % i
    for i in range(1, 3000, 7):
        del db[b"key-%05d" % i]
    db.flush()
    del snap
    db.close()
    db = _read_only(path)
    assert len(db.live_files()) == 1
    db.close()
    expected = _rocksdb(path)
    assert len(expected) < 3000
    assert _native(path) == expected


def test_overlapping_files_are_left_to_rocksdb(tmp_path):
    path = str(tmp_path / "db")
    db = Rdict(path, options=_rocksdb_options())
    for round_ in range(2):
        for i in range(100):
            db[b"key-%03d" % i] = b"%d" % round_
        db.flush()
    db.close()
    with pytest.raises(sst_read.Unsupported, match="overlap"):
        _native(path)


def test_a_flipped_byte_is_a_checksum_error(tmp_path):
    path = str(tmp_path / "db")
    _write(path, {b"key-%05d" % i: b"value" * 20 for i in range(5000)})
    (sst,) = [os.path.join(path, n) for n in os.listdir(path) if n.endswith(".sst")]
    with open(sst, "r+b") as f:
        f.seek(1000)
        byte = f.read(1)[0]
        f.seek(1000)
        f.write(bytes((byte ^ 0x10,)))
    with pytest.raises(CorruptFileError, match="checksum mismatch"):
        _native(path)


def test_iter_zip_pieces_are_the_whole(tmp_path):
    """A snapshot read in pieces of a kilobyte (a bounded read) is the same entries as read at
    once, through statectl's reader, and as RocksDB reads them."""
    entries = {b"\x00key-%06d" % i: b"\x00value-%d" % (i * 7) for i in range(3000)}
    keys = pa.array(list(entries), pa.large_binary())
    store = str(tmp_path / "store")
    io, _ = FileIO.for_url(store)
    write_rocksdb_snapshot(io, store, 1, keys, pa.array(list(entries.values()), pa.large_binary()))

    def chunks(max_bytes: int | None) -> list[tuple[pa.Array, pa.Array]]:
        zip_path = os.path.join(store, "1.zip")
        return list(rocksdb_zip.iter_zip(io, store, zip_path, metas=[], max_bytes=max_bytes))

    (whole,) = chunks(None)
    pieces = chunks(1 << 10)
    assert len(pieces) > 10
    assert pa.concat_arrays([k for k, _ in pieces]).equals(whole[0])
    assert pa.concat_arrays([v for _, v in pieces]).equals(whole[1])
    assert whole[0].to_pylist() == sorted(entries)
    assert whole[1].to_pylist() == [entries[k] for k in sorted(entries)]

"""Write one store partition at one version in a backend's native files.

* HDFS: ``<version>.snapshot`` holding every entry (Spark loads the newest snapshot at or
  below the version it wants, so nothing older is needed).
* RocksDB (stores without column families): changelog files only, which Spark replays from
  version 0 when no snapshot zip exists: empty ``1..version-1.changelog`` and everything in
  ``<version>.changelog``. Spark 4.3 accepted this route in real restarts (the test suite
  restarts queries on it); it writes its own zip snapshot later.
"""

from __future__ import annotations

import io as _io
import json
import os
import posixpath
import re
import tempfile
import time
import uuid
import zipfile
from collections.abc import Iterable
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from statectl.backends.sst import SstWriter
from statectl.checksums import spark_checksum_file, spark_crc_path
from statectl.codecs.compression import compress_stream
from statectl.codecs.phases import phase
from statectl.codecs.records import record_stream
from statectl.codecs.unaligned import loads_at
from statectl.io import FileIO

EMPTY_RECORDS = b"\xff\xff\xff\xff"


def write_hdfs_store(
    io: FileIO, store_dir: str, version: int, codec: str, keys: pa.Array, values: pa.Array
) -> list[str]:
    path = posixpath.join(store_dir, f"{version}.snapshot")
    with phase("encode records"):
        records = memoryview(record_stream(keys, values, end=True))
    with phase("compress"):
        data = compress_stream(codec, records)
    with phase("upload"):
        io.write_atomic(path, data)
    return [path]


def write_rocksdb_store(
    io: FileIO,
    store_dir: str,
    version: int,
    codec: str,
    keys: pa.Array,
    values: pa.Array,
    *,
    encoded: bool = False,
) -> list[str]:
    """Changelog v1 files; keys and values get RocksDB's 0x00 encoding-version byte (unless
    ``encoded``: they are already the exact RocksDB bytes, e.g. prefix-encoded keys)."""
    written = []
    empty = compress_stream(codec, EMPTY_RECORDS)
    for v in range(1, version):
        path = posixpath.join(store_dir, f"{v}.changelog")
        io.write_atomic(path, empty)
        written.append(path)
    path = posixpath.join(store_dir, f"{version}.changelog")
    records = record_stream(keys, values, prefix=b"" if encoded else b"\x00", end=True)
    io.write_atomic(path, compress_stream(codec, memoryview(records)))
    written.append(path)
    return written


# Files of a RocksDB directory that a Spark snapshot zip carries; SSTs travel separately.
_ZIPPED = re.compile(r"^(CURRENT|MANIFEST-\d+|OPTIONS-\d+|\d+\.log)$")


# Keys up to this long sort as big-endian uint64 words (numpy's lexsort, a pass per word that
# varies); longer ones by Arrow's comparison sort.
WORD_SORT_MAX_BYTES = 64
# Keys whose sorted runs are this long on average go to Arrow's sort instead (see below).
PRESORTED_RUN = 16
PRESORTED_SAMPLE = 1 << 16


def _presorted(keys: pa.Array) -> bool:
    """Whether the keys' sorted runs average at least ``PRESORTED_RUN``, judged on up to
    ``PRESORTED_SAMPLE`` evenly spaced adjacent pairs (comparing every pair of millions of
    binaries costs more than the sort it chooses). Only speed depends on it: keys are unique,
    so both sorts give the same order."""
    n = len(keys)
    if n - 1 <= PRESORTED_SAMPLE:  # every adjacent pair: two slices, no gather
        left, right, pairs = keys.slice(0, n - 1), keys.slice(1), n - 1
    else:
        at = np.linspace(0, n - 2, PRESORTED_SAMPLE).astype(np.int64)
        at = at[np.flatnonzero(np.diff(at, prepend=-1))]  # ascending: drop the repeats
        left, right, pairs = keys.take(pa.array(at)), keys.take(pa.array(at + 1)), len(at)
    descents = pc.sum(pc.less(right, left)).as_py() or 0
    return descents * PRESORTED_RUN < pairs


def _bytewise_order(keys: pa.Array) -> pa.Array:
    """Indices that sort the keys (large_binary) the way RocksDB's BytewiseComparator does.

    Short keys (every real key: the encoding byte, a column family id, an UnsafeRow) sort as
    tuples of big-endian uint64 words, zero-padded, then their length: zero padding keeps
    bytewise order except between a key and itself extended by zero bytes, where the shorter
    one comes first, as the length settles. Words equal in every key cost no pass. Several
    times faster than Arrow's sort of variable-length binaries."""
    n = len(keys)
    if n < 2:
        return pa.array(np.arange(n, dtype=np.int64))
    offsets = np.frombuffer(keys.buffers()[1], dtype=np.int64)[keys.offset : keys.offset + n + 1]
    lengths = np.diff(offsets)
    longest = int(lengths.max())
    if longest == 0:  # every key empty
        return pa.array(np.arange(n, dtype=np.int64))
    if longest > WORD_SORT_MAX_BYTES:
        return pc.sort_indices(keys)
    # Keys mostly in sorted runs already (a RocksDB source's partitions, savepoints written in
    # key order) are what Arrow's adaptive merge sort does fastest; one comparison pass tells.
    if _presorted(keys):
        return pc.sort_indices(keys)
    columns = _varying_bytes(_word_columns(keys, offsets, lengths, longest))
    if len(columns) == 1:  # one word settles every comparison unless two keys share it
        order = np.argsort(columns[0])
        ranked = columns[0][order]
        if bool((ranked[1:] > ranked[:-1]).all()):
            return pa.array(order)
    if (lengths != lengths[0]).any():
        columns.append(lengths)  # after every word: a tie means one key is a zero-padded prefix
    if not columns:  # every key equal (callers have unique keys; kept correct anyway)
        return pa.array(np.arange(n, dtype=np.int64))
    # Least significant column first, each a stable sort of the order so far (numpy's stable
    # sort of integers is adaptive: input in long sorted runs, as savepoints often are, is fast).
    order = np.argsort(columns[-1], kind="stable")
    for column in columns[-2::-1]:
        order = order[np.argsort(column[order], kind="stable")]
    return pa.array(order)


# Masks of a big-endian word's first 0..8 bytes: a key that ends within a word keeps them.
_LEADING_BYTES = np.array(
    [((1 << 64) - 1) ^ ((1 << (64 - 8 * v)) - 1) for v in range(9)], dtype=np.uint64
)


def _word_columns(
    keys: pa.Array, offsets: np.ndarray, lengths: np.ndarray, longest: int
) -> list[np.ndarray]:
    """The keys as big-endian uint64 words, zero-padded; words equal in every key left out."""
    words = (longest + 7) // 8
    # The 8 bytes at every offset of the data, read as one big-endian number: a word of a key
    # is one (unaligned) load, not eight byte gathers, and the data is not copied.
    data = np.frombuffer(keys.buffers()[2], dtype=np.uint8)
    starts = offsets[:-1]
    shortest = int(lengths.min())
    columns: list[np.ndarray] = []
    for w in range(words):
        word = loads_at(data, ">u8", starts + 8 * w)
        if 8 * (w + 1) > shortest:
            # Bytes past a key's end belong to the next key: zero them.
            word &= _LEADING_BYTES[np.clip(lengths - 8 * w, 0, 8)]
        if (word != word[0]).any():
            columns.append(word)
    return columns


def _varying_bytes(columns: list[np.ndarray]) -> list[np.ndarray]:
    """The big-endian words with only the byte positions that differ between keys, packed
    into as few words as they fill (issue 27: an UnsafeRow key of a short string varies in
    about 8 of its 33 bytes, so one sort pass instead of four). A position equal in every key
    never decides a comparison, so the packed words order the keys as the full ones do."""
    packed: list[np.ndarray] = []
    current: np.ndarray | None = None
    filled = 0
    for column in columns:
        varying = int(np.bitwise_or.reduce(column ^ column[0]))
        for first, count in _byte_runs(varying):
            while count:  # a run of adjacent varying bytes moves in one shift and mask
                take = min(count, 8 - filled)
                shift = 64 - 8 * (first + take)
                part = (column >> np.uint64(shift)) & np.uint64((1 << (8 * take)) - 1)
                current = part if current is None else (current << np.uint64(8 * take)) | part
                filled += take
                first, count = first + take, count - take
                if filled == 8:
                    packed.append(current)
                    current, filled = None, 0
    if current is not None:
        packed.append(current)
    return packed


def _byte_runs(varying: int) -> list[tuple[int, int]]:
    """(first byte, count) of each run of adjacent nonzero bytes of a big-endian word."""
    runs: list[tuple[int, int]] = []
    for byte in range(8):
        if (varying >> (56 - 8 * byte)) & 0xFF:
            if runs and runs[-1][0] + runs[-1][1] == byte:
                runs[-1] = (runs[-1][0], runs[-1][1] + 1)
            else:
                runs.append((byte, 1))
    return runs


def _rocksdb_options() -> Any:
    from rocksdict import BlockBasedOptions, DBCompressionType, Options

    opts = Options(raw_mode=True)
    opts.create_if_missing(True)
    opts.set_compression_type(DBCompressionType.lz4())
    table = BlockBasedOptions()
    table.set_format_version(5)  # Spark pins rocksdb.formatVersion=5; RocksDB 9.8.4 reads it
    opts.set_block_based_table_factory(table)
    return opts


def sorted_entries(keys: pa.Array, values: pa.Array) -> tuple[pa.Array, pa.Array]:
    """The entries in RocksDB's BytewiseComparator order."""
    keys, values = keys.cast(pa.large_binary()), values.cast(pa.large_binary())
    if not len(keys):
        return keys, values
    order = _bytewise_order(keys)
    return keys.take(order), values.take(order)


def _build_rocksdb(local: str, batches: Iterable[tuple[pa.Array, pa.Array]]) -> None:
    """A RocksDB database holding the entries (batches of keys and values, sorted bytewise
    across batches) in one SST: written by :class:`~statectl.backends.sst.SstWriter` and
    ingested (no memtable, no compaction), with an empty WAL."""
    from rocksdict import IngestExternalFileOptions, Rdict

    opts = _rocksdb_options()
    sst = local + ".ingest.sst"
    with open(sst, "wb") as out:
        writer = SstWriter(out)
        for keys, values in batches:
            writer.add(keys, values)
        if writer.entries:
            writer.finish()
    db = Rdict(local, opts)
    try:
        if writer.entries:
            ingest = IngestExternalFileOptions()
            ingest.set_move_files(True)  # a hard link, not a copy of the file
            db.ingest_external_file([sst], ingest)
        db.flush()
    finally:
        db.close()
        if os.path.exists(sst):
            os.remove(sst)


def _upload_ssts(
    io: FileIO, store_dir: str, db_dir: str, written: list[str]
) -> tuple[list[dict[str, Any]], list[str]]:
    """Put the database's SSTs under ``SSTs/`` with unique names (appended to ``written``);
    returns their metadata entries and the local files the zip carries."""
    sst_files = []
    zipped = []
    for name in sorted(os.listdir(db_dir)):
        path = os.path.join(db_dir, name)
        if name.endswith(".sst"):
            dfs_name = f"{name[:-4]}-{uuid.uuid4()}.sst"
            target = posixpath.join(store_dir, "SSTs", dfs_name)
            io.put_atomic(path, target)  # streamed: an SST can be large
            written.append(target)
            sst_files.append(
                {
                    "localFileName": name,
                    "dfsSstFileName": dfs_name,
                    "sizeBytes": os.path.getsize(path),
                }
            )
        elif _ZIPPED.match(name):
            zipped.append(path)
    return sst_files, zipped


def write_rocksdb_snapshot(
    io: FileIO,
    store_dir: str,
    version: int,
    keys: pa.Array | None,
    values: pa.Array | None,
    *,
    column_families: dict[str, int] | None = None,
    num_internal_keys: int = 0,
    unique_id: str | None = None,
    batches: Iterable[tuple[pa.Array, pa.Array]] | None = None,
    num_keys: int | None = None,
) -> list[str]:
    """``SSTs/<n>-<uuid>.sst`` files, then ``<version>.zip`` (Spark's snapshot layout).

    ``keys``/``values`` are the exact bytes in RocksDB (encoding-version byte, and the 2-byte
    virtual column family id for ``column_families`` stores). ``column_families`` is the
    name -> id mapping recorded in the zip's metadata; names starting with ``$`` are Spark's
    internal families, and ``num_internal_keys`` counts their entries. Instead of arrays,
    ``batches`` may give the entries already sorted (an external sort's merged batches of keys
    and values), ``num_keys`` of them.
    """
    if batches is None:
        assert keys is not None and values is not None
        with phase("sort"):
            batches, num_keys = [sorted_entries(keys, values)], len(keys)
    written: list[str] = []
    with tempfile.TemporaryDirectory(prefix="statectl-rocksdb-") as local:
        db_dir = os.path.join(local, "db")
        with phase("SST write"):
            _build_rocksdb(db_dir, batches)
        with phase("upload"):
            sst_files, zipped = _upload_ssts(io, store_dir, db_dir, written)
        cfs = column_families or {}
        meta = {
            "sstFiles": sst_files,
            "numKeys": (num_keys or 0) - num_internal_keys,
            "numInternalKeys": num_internal_keys,
            "columnFamilyMapping": cfs,
            "columnFamilyTypeMap": {name: name.startswith("$") for name in cfs},
            "maxColumnFamilyId": max(cfs.values(), default=0),
        }
        buf = _io.BytesIO()
        with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as z:
            for path in zipped:
                z.write(path, os.path.basename(path))
            z.writestr("metadata", "v1\n" + json.dumps(meta, separators=(",", ":")))
    name = f"{version}_{unique_id}.zip" if unique_id else f"{version}.zip"
    target = posixpath.join(store_dir, name)
    data = buf.getvalue()
    with phase("upload"):
        io.write_atomic(target, data)
    written.append(target)
    if unique_id:
        # Checkpoint format v2: Spark 4.1+ writes and verifies a JSON CRC32C <zip>.crc (never
        # over SSTs); written after the zip, so a crash leaves a zip without one, which Spark
        # accepts, and never a checksum of a file that is not there.
        crc = spark_crc_path(target)
        io.write_atomic(crc, spark_checksum_file(data, int(time.time() * 1000)))
        written.append(crc)
    return written

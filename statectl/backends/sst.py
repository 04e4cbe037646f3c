"""A RocksDB SST file (BlockBasedTable, format_version 5) written from Arrow arrays.

RocksDB's own ``SstFileWriter`` takes one Python call per entry, the restore's hot spot. This
writer builds every entry of a batch at once (numpy for the varint lengths and block cuts, one
Arrow ``binary_join_element_wise`` for the bytes) and loops only per ~4 KiB data block
(compression and checksum). The file is what ``SstFileWriter`` writes, in the parts RocksDB
reads (``table/block_based/block_based_table_builder.cc``, ``table/format.cc``,
``table/meta_blocks.cc``):

* data blocks: entries ``varint32 shared (always 0) | varint32 key length | varint32 value
  length | internal key | value``, the internal key being the user key and 8 bytes
  ``(seqno 0 << 8) | kTypeValue`` little-endian; a restart every 16 entries; then the restart
  offsets (uint32 LE) and their count;
* every block is followed by a 5-byte trailer: compression type, masked CRC32C of the block
  and the type byte. Blocks are LZ4 compressed (``compress_format_version`` 2: a varint32
  of the raw size, then the LZ4 block) where that saves an eighth, as RocksDB decides;
* the index block: one entry per data block, its last internal key -> its BlockHandle
  (``varint64 offset | varint64 size``); whole keys and handles, which the properties
  ``rocksdb.index.key.is.user.key`` = 0 and ``rocksdb.index.value.is.delta.encoded`` = 0
  tell the reader;
* the properties block (what ``SstFileWriter`` records, including the external-file
  properties ingestion requires: ``rocksdb.external_sst_file.version`` = 2 and
  ``rocksdb.external_sst_file.global_seqno`` = 0), the metaindex block pointing at it, and
  the 53-byte footer (checksum type CRC32C, metaindex and index handles padded to 40 bytes,
  format_version 5, the block-based table magic number).

The oracle is RocksDB: tests/test_sst_writer.py ingests these files and reads every entry back.
"""

from __future__ import annotations

import random
import socket
import string
import struct
from typing import BinaryIO

import google_crc32c
import lz4.block
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

BLOCK_SIZE = 4096  # RocksDB's default block_size; Spark's blockSizeKB defaults to 4 too
RESTART_INTERVAL = 16  # RocksDB's default block_restart_interval
# Rows encoded per step: bounds the temporary arrays, keeps the block loop's input warm.
STEP_ROWS = 1 << 16
MAGIC = 0x88E241B785F4CFF7  # kBlockBasedTableMagicNumber
FORMAT_VERSION = 5  # Spark pins rocksdb formatVersion=5
CRC32C = 1  # ChecksumType kCRC32c
NO_COMPRESSION, LZ4 = 0, 4  # CompressionType values in the block trailer
_KINDS = {NO_COMPRESSION: b"\x00", LZ4: b"\x04"}
# The internal key's 8-byte trailer: sequence number 0, value type kTypeValue (1).
VALUE_TRAILER = struct.pack("<Q", (0 << 8) | 1)
COLUMN_FAMILY_UNKNOWN = 0x7FFFFFFF  # SstFileWriter without a column family handle
# BlockBasedTableOptions' compression_options as SstFileWriter records them (LZ4, defaults).
_COMPRESSION_OPTIONS = (
    b"window_bits=-14; level=32767; strategy=0; max_dict_bytes=0; zstd_max_train_bytes=0; "
    b"enabled=0; max_dict_buffer_bytes=0; use_zstd_dict_trainer=1; "
)


def _varint(n: int) -> bytes:
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


_SIZES = [_varint(n) for n in range(1 << 14)]  # the raw-size prefix of a compressed block


def _varint_sizes(n: np.ndarray) -> np.ndarray:
    """Bytes of each number's varint (up to 64 bits)."""
    size = np.ones(len(n), dtype=np.int64)
    top = int(n.max(initial=0))
    for bits in range(7, 64, 7):
        if top < (1 << bits):  # lengths are small: usually one or two passes
            break
        size += n >= (1 << bits)
    return size


def _varints(columns: list[np.ndarray]) -> pa.Array:
    """A large_binary array whose row i is the varints of ``columns[0][i], columns[1][i]...``
    back to back (numbers ≥ 0), built with a few numpy passes per varint byte."""
    n = len(columns[0])
    sizes = [_varint_sizes(c) for c in columns]
    offsets = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(sum(sizes), out=offsets[1:])
    data = np.empty(int(offsets[-1]), dtype=np.uint8)
    at = offsets[:-1].copy()
    for col, size in zip(columns, sizes, strict=True):
        rest = col.astype(np.uint64)
        for i in range(int(size.max(initial=1))):
            live = size > i
            more = size > i + 1
            byte = (rest & np.uint64(0x7F)).astype(np.uint8) | (more.astype(np.uint8) << 7)
            data[at[live] + i] = byte[live]
            rest >>= np.uint64(7)
        at += size
    return pa.LargeBinaryArray.from_buffers(
        pa.large_binary(), n, [None, pa.py_buffer(offsets), pa.py_buffer(data)]
    )


def _offsets(a: pa.Array) -> np.ndarray:
    """A large_binary array's n+1 offsets (relative to its data buffer)."""
    return np.frombuffer(a.buffers()[1], dtype=np.int64)[a.offset : a.offset + len(a) + 1]


def _lengths(a: pa.Array) -> np.ndarray:
    return np.diff(_offsets(a))


def _entries(keys: pa.Array, values: pa.Array, key_suffix: bytes) -> pa.Array:
    """Every row's block entry (shared 0, lengths, key + ``key_suffix``, value), one array
    whose data buffer is the entries back to back."""
    key_len = _lengths(keys) + len(key_suffix)
    lengths = _varints([key_len, _lengths(values)])
    shared, suffix, none = (pa.scalar(b, pa.large_binary()) for b in (b"\0", key_suffix, b""))
    return pc.binary_join_element_wise(shared, lengths, keys, suffix, values, none)


def _blocks(entries: pa.Array, bounds: np.ndarray, interval: int) -> pa.Array:
    """Block bodies, one row per block: entries ``bounds[b]:bounds[b+1]``, then the block's
    restart offsets (every ``interval``-th entry) and their count, uint32 LE. Built with numpy
    and one Arrow join, no loop per block."""
    starts = _offsets(entries)
    counts = np.diff(bounds)
    first = np.repeat(bounds[:-1], counts)  # each entry's block's first entry
    is_restart = (np.arange(len(entries)) - first) % interval == 0
    restarts = (counts + interval - 1) // interval
    # Each block's tail: its restarts, then their count, in one uint32 array for all blocks.
    tail_ends = np.cumsum(restarts + 1)
    tails = np.empty(int(tail_ends[-1]), dtype="<u4")
    block = np.repeat(np.arange(len(counts)), counts)[is_restart]
    tails[np.arange(len(block)) + block] = (starts[:-1] - starts[first])[is_restart]
    tails[tail_ends - 1] = restarts
    tail_offsets = np.concatenate(([0], tail_ends)).astype(np.int64) * 4
    body = pa.LargeBinaryArray.from_buffers(
        pa.large_binary(), len(counts), [None, pa.py_buffer(starts[bounds]), entries.buffers()[2]]
    )
    tail = pa.LargeBinaryArray.from_buffers(
        pa.large_binary(), len(counts), [None, pa.py_buffer(tail_offsets), pa.py_buffer(tails)]
    )
    return pc.binary_join_element_wise(body, tail, pa.scalar(b"", pa.large_binary()))


class SstWriter:
    """Writes sorted entries to one SST: :meth:`add` batches in key order, then :meth:`finish`.

    Keys are user keys (RocksDB's bytes, sorted bytewise, unique); every entry gets sequence
    number 0, as ``SstFileWriter`` gives them.
    """

    def __init__(self, out: BinaryIO) -> None:
        self.out = out
        self.offset = 0
        self.entries = 0
        self.raw_key_size = self.raw_value_size = 0
        self.index_keys: list[pa.Array] = []  # each data block's last user key
        self.index_handles: list[np.ndarray] = []  # (offset, size) rows per data block
        self.last_key: bytes | None = None

    def _write_blocks(self, bodies: pa.Array, compress: bool = True) -> np.ndarray:
        """The blocks, each with its trailer; returns their BlockHandles (offset, size
        without the trailer), one row per block."""
        offsets = _offsets(bodies).tolist()  # Python ints: numpy scalars are slow to index
        data = memoryview(bodies.buffers()[2])
        sizes: list[int] = []
        out: list[bytes] = []
        crc32c, extend, block_compress = (
            google_crc32c.value,
            google_crc32c.extend,
            lz4.block.compress,
        )
        for b in range(len(bodies)):
            view = data[offsets[b] : offsets[b + 1]]
            body, kind = None, NO_COMPRESSION
            if compress:
                raw = len(view)
                size = _SIZES[raw] if raw < len(_SIZES) else _varint(raw)
                packed = size + block_compress(view, store_size=False)
                # RocksDB keeps a compressed block only when it saves at least an eighth.
                if len(packed) < raw - raw // 8:
                    body, kind = packed, LZ4
            if body is None:
                body = bytes(view)  # google_crc32c takes bytes, not a memoryview
            out.append(body)
            crc = extend(crc32c(body), _KINDS[kind])
            masked = ((((crc >> 15) | (crc << 17)) & 0xFFFFFFFF) + 0xA282EAD8) & 0xFFFFFFFF
            out.append(struct.pack("<BI", kind, masked))  # crc32c::Mask, inlined: per block
            sizes.append(len(body))
        self.out.write(b"".join(out))
        handles = np.empty((len(sizes), 2), dtype=np.int64)
        handles[:, 1] = sizes
        handles[:, 0] = self.offset + np.cumsum(handles[:, 1] + 5) - (handles[:, 1] + 5)
        self.offset += int((handles[:, 1] + 5).sum())
        return handles

    def add(self, keys: pa.Array, values: pa.Array) -> None:
        """Entries whose keys sort after every key added before."""
        keys, values = keys.cast(pa.large_binary()), values.cast(pa.large_binary())
        for start in range(0, len(keys), STEP_ROWS):
            self._add(keys.slice(start, STEP_ROWS), values.slice(start, STEP_ROWS))

    def _add(self, keys: pa.Array, values: pa.Array) -> None:
        n = len(keys)
        if not n:
            return
        # SstFileWriter refuses keys out of order; so does this writer, with one vectorized
        # comparison: an SST with unsorted keys would read back wrong, silently.
        first = keys[0].as_py()
        if (self.last_key is not None and first <= self.last_key) or (
            n > 1 and pc.any(pc.less_equal(keys.slice(1), keys.slice(0, n - 1))).as_py()
        ):
            raise ValueError("SST keys must be added in strictly increasing bytewise order")
        self.last_key = keys[n - 1].as_py()
        entries = _entries(keys, values, VALUE_TRAILER)
        starts = _offsets(entries)
        base = int(starts[0])
        # A block holds the entries that start within its 4 KiB window: blocks end at the
        # first entry boundary past BLOCK_SIZE, as RocksDB's flush policy cuts them.
        block_of = (starts[:-1] - base) // BLOCK_SIZE
        cuts = np.flatnonzero(np.diff(block_of)) + 1
        bounds = np.concatenate(([0], cuts, [n]))
        handles = self._write_blocks(_blocks(entries, bounds, RESTART_INTERVAL))
        self.index_keys.append(keys.take(pa.array(bounds[1:] - 1)))
        self.index_handles.append(handles)
        self.entries += n
        self.raw_key_size += int(_offsets(keys)[-1] - _offsets(keys)[0]) + 8 * n
        self.raw_value_size += int(_offsets(values)[-1] - _offsets(values)[0])

    def finish(self) -> int:
        """The index, properties and metaindex blocks and the footer; returns the entries."""
        if not self.entries:
            raise ValueError("an SST holds at least one entry")
        data_size = self.offset
        handles = np.concatenate(self.index_handles)
        # The index: separators are the blocks' last internal keys, restart interval 1.
        values = _varints([handles[:, 0], handles[:, 1]])
        entries = _entries(pa.concat_arrays(self.index_keys), values, VALUE_TRAILER)
        index = _blocks(entries, np.array([0, len(entries)]), 1)
        index_handle = self._write_blocks(index)[0]
        props = self._properties(
            data_size=data_size, index_size=int(np.diff(_offsets(index))[0]), blocks=len(handles)
        )
        props_handle = self._write_meta(_meta_block(props))
        metaindex = {b"rocksdb.properties": _varint(props_handle[0]) + _varint(props_handle[1])}
        metaindex_handle = self._write_meta(_meta_block(metaindex))
        handles_bytes = b"".join(_varint(x) for x in (*metaindex_handle, *index_handle))
        footer = bytes((CRC32C,)) + handles_bytes.ljust(40, b"\0")
        footer += struct.pack("<IQ", FORMAT_VERSION, MAGIC)
        self.out.write(footer)
        return self.entries

    def _write_meta(self, body: bytes) -> np.ndarray:
        return self._write_blocks(pa.array([body], pa.large_binary()), compress=False)[0]

    def _properties(self, *, data_size: int, index_size: int, blocks: int) -> dict[bytes, bytes]:
        v = _varint
        session = "".join(random.choices(string.digits + string.ascii_uppercase, k=20))
        return {
            b"rocksdb.block.based.table.index.type": struct.pack("<I", 0),  # kBinarySearch
            b"rocksdb.block.based.table.prefix.filtering": b"0",
            b"rocksdb.block.based.table.whole.key.filtering": b"1",
            b"rocksdb.column.family.id": v(COLUMN_FAMILY_UNKNOWN),
            b"rocksdb.comparator": b"leveldb.BytewiseComparator",
            b"rocksdb.compression": b"LZ4",
            b"rocksdb.compression_options": _COMPRESSION_OPTIONS,
            b"rocksdb.creating.db.identity": b"SST Writer",
            b"rocksdb.creating.host.identity": socket.gethostname().encode(),
            # With the original file number, RocksDB derives the file's unique id from it.
            b"rocksdb.creating.session.identity": session.encode(),
            b"rocksdb.creation.time": v(0),
            b"rocksdb.data.size": v(data_size),
            b"rocksdb.deleted.keys": v(0),
            b"rocksdb.external_sst_file.global_seqno": struct.pack("<Q", 0),
            b"rocksdb.external_sst_file.version": struct.pack("<I", 2),
            b"rocksdb.filter.size": v(0),
            b"rocksdb.fixed.key.length": v(0),
            b"rocksdb.format.version": v(FORMAT_VERSION),
            b"rocksdb.index.key.is.user.key": v(0),
            b"rocksdb.index.size": v(index_size),
            b"rocksdb.index.value.is.delta.encoded": v(0),
            b"rocksdb.key.largest.seqno": v(0),
            b"rocksdb.merge.operands": v(0),
            b"rocksdb.merge.operator": b"nullptr",
            b"rocksdb.num.data.blocks": v(blocks),
            b"rocksdb.num.entries": v(self.entries),
            b"rocksdb.num.filter_entries": v(0),
            b"rocksdb.num.range-deletions": v(0),
            b"rocksdb.oldest.key.time": v(0),
            b"rocksdb.original.file.number": v(1),
            b"rocksdb.prefix.extractor.name": b"nullptr",
            b"rocksdb.property.collectors": b"[]",
            b"rocksdb.raw.key.size": v(self.raw_key_size),
            b"rocksdb.raw.value.size": v(self.raw_value_size),
            b"rocksdb.tail.start.offset": v(data_size),
        }


def _meta_block(entries: dict[bytes, bytes]) -> bytes:
    """A block of plain (not internal) keys in bytewise order, every entry a restart: the
    properties and metaindex blocks, a few dozen entries."""
    body = bytearray()
    restarts = []
    for key in sorted(entries):
        restarts.append(len(body))
        value = entries[key]
        body += _varint(0) + _varint(len(key)) + _varint(len(value)) + key + value
    return bytes(body) + struct.pack(f"<{len(restarts) + 1}I", *restarts, len(restarts))

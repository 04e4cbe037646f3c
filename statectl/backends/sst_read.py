"""RocksDB SST files read without RocksDB: a snapshot's entries as Arrow arrays, vectorized.

rocksdict hands out one Python tuple per entry (about 0.75 µs each, the whole cost of reading
a RocksDB checkpoint: issue 27). A snapshot whose live SST files form one sorted run (their key
ranges do not overlap, as after a compaction into one level, or statectl's own single ingested
SST) holds each key's newest entry in exactly one file, in key order: its entries are the
files' entries, file after file. This module reads them from the BlockBasedTable files
directly (``table/block_based/block_based_table_builder.cc``, ``table/format.cc``):

* the footer (format_version 2 to 5, the block-based magic), the metaindex and properties
  blocks, and the index block (one entry per data block: its last key -> BlockHandle;
  restart interval 1 when its values are delta-encoded, as RocksDB writes them);
* each data block's trailer checksum (CRC32C or XXH3) verified as RocksDB verifies it, then
  LZ4 decompressed (``compress_format_version`` 2: the raw size as a varint, then the block);
* the entries of many blocks at once: every restart group is walked in parallel (one numpy
  step per entry of a group, usually 16), the prefix-compressed keys rebuilt in a byte matrix
  a row per entry (each step copies the shared prefix from the row above), the values cut
  out of the blocks by one Arrow ``take``.

What this reader does not handle raises :class:`Unsupported` before any entry is read, and the
caller reads the snapshot with RocksDB instead: overlapping files (an LSM merge), merge
operands, range deletions, a non-empty WAL, another comparator, index type, compression or
checksum type, format_version 6. Within the run, an older entry of a key repeated (a snapshot
held during compaction) is dropped and deletions remove their key, as RocksDB reads them.
"""

from __future__ import annotations

import itertools
import os
import struct
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import cramjam
import google_crc32c
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import xxhash

from statectl.errors import CorruptFileError

MAGIC = 0x88E241B785F4CFF7  # kBlockBasedTableMagicNumber
FOOTER = 53  # format_version >= 1: checksum type, two handles padded to 40, version, magic
CRC32C, XXH3 = 1, 4
TYPE_DELETION, TYPE_VALUE, TYPE_SINGLE_DELETION = 0, 1, 7
NO_COMPRESSION, LZ4, LZ4HC = 0, 4, 5
_COMPRESSIONS = {b"NoCompression", b"LZ4", b"LZ4HC"}
# Bytes of the key matrix one step of the parse may hold (rows x longest key).
MATRIX_BYTES = 32 << 20
_XXH3_LAST_BYTE = 0x6B9083D9  # ModifyChecksumForLastByte's prime


class Unsupported(Exception):
    """A database this reader does not read: read it with RocksDB (the message says why)."""


@dataclass(frozen=True)
class Table:
    """One SST file's data blocks: (offset, size) per block, and how they are checked."""

    path: str
    size: int  # of the file (it is read a window at a time, never whole)
    handles: np.ndarray  # int64 (blocks, 2)
    checksum: int
    entries: int
    key_bytes: int  # of internal keys, all entries together
    value_bytes: int


def _varint(b: bytes, i: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if i >= len(b) or shift > 63:
            raise IndexError("varint past the end")
        c = b[i]
        i += 1
        value |= (c & 0x7F) << shift
        shift += 7
        if c < 0x80:
            return value, i


def _handle(b: bytes, i: int) -> tuple[int, int, int]:
    offset, i = _varint(b, i)
    size, i = _varint(b, i)
    return offset, size, i


def _checked(data: bytes, checksum: int, path: str, offset: int, size: int) -> tuple[int, int, int]:
    """The block at ``offset`` checked against its trailer's checksum: (compression type, where
    its payload starts, its size once decompressed)."""
    if offset < 0 or size < 0 or offset + size + 5 > len(data):
        raise CorruptFileError("a block handle points past the end of the file", path)
    view = memoryview(data)[offset : offset + size]
    kind = data[offset + size]
    (stored,) = struct.unpack_from("<I", data, offset + size + 1)
    if checksum == XXH3:
        actual = (xxhash.xxh3_64_intdigest(view) & 0xFFFFFFFF) ^ (
            (kind * _XXH3_LAST_BYTE) & 0xFFFFFFFF
        )
    else:
        crc = google_crc32c.extend(google_crc32c.value(bytes(view)), bytes((kind,)))
        actual = ((((crc >> 15) | (crc << 17)) & 0xFFFFFFFF) + 0xA282EAD8) & 0xFFFFFFFF
    if actual != stored:
        raise CorruptFileError(f"block checksum mismatch at offset {offset}", path)
    if kind == NO_COMPRESSION:
        return kind, offset, size
    if kind not in (LZ4, LZ4HC):
        raise CorruptFileError(f"block compression type {kind} is not LZ4", path)
    raw, start = _varint(data, offset)  # compress_format_version 2: the raw size first
    return kind, start, raw


def _block(data: bytes, checksum: int, path: str, offset: int, size: int) -> bytes:
    """The block at ``offset``, checked and decompressed."""
    kind, start, raw = _checked(data, checksum, path, offset, size)
    out = np.empty(raw, dtype=np.uint8)
    _decompress_into(data, kind, start, offset + size, out, path)
    return out.tobytes()


def _decompress_into(
    data: bytes, kind: int, start: int, end: int, out: np.ndarray, path: str
) -> None:
    """The payload ``data[start:end]`` decompressed into ``out`` (exactly its size)."""
    if kind == NO_COMPRESSION:
        out[:] = np.frombuffer(data, dtype=np.uint8, count=end - start, offset=start)
        return
    try:
        n = cramjam.lz4.decompress_block_into(memoryview(data)[start:end], out.data)
    except cramjam.DecompressionError:
        n = -1
    if n != len(out):
        raise CorruptFileError(f"LZ4 block at offset {start} is damaged", path)


def _meta_entries(block: bytes, path: str) -> dict[bytes, bytes]:
    """A metaindex or properties block's entries (a few dozen: parsed in Python)."""
    (restarts,) = struct.unpack_from("<I", block, len(block) - 4)
    end = len(block) - 4 - 4 * restarts
    out: dict[bytes, bytes] = {}
    key = b""
    i = 0
    while i < end:
        shared, i = _varint(block, i)
        unshared, i = _varint(block, i)
        size, i = _varint(block, i)
        key = key[:shared] + block[i : i + unshared]
        i += unshared
        out[key] = block[i : i + size]
        i += size
    if i != end:
        raise CorruptFileError("a meta block's entries overrun it", path)
    return out


def _int_property(props: dict[bytes, bytes], name: bytes) -> int:
    raw = props.get(name)
    return 0 if raw is None else _varint(raw, 0)[0]


def _pread(fd: int, offset: int, size: int, path: str) -> bytes:
    data = os.pread(fd, size, offset)
    if len(data) != size or offset < 0:
        raise CorruptFileError("a block handle points past the end of the file", path)
    return data


def _read_block(fd: int, checksum: int, path: str, offset: int, size: int) -> bytes:
    """The (meta or index) block at ``offset`` of the file, read, checked, decompressed."""
    return _block(_pread(fd, offset, size + 5, path), checksum, path, 0, size)


def open_table(path: str) -> Table:
    """The file's footer, properties and index; :class:`Unsupported` for what this reader
    does not read. Only those blocks are read."""
    fd = os.open(path, os.O_RDONLY)
    try:
        return _parse_table(path, fd, os.fstat(fd).st_size)
    except (IndexError, struct.error):
        raise CorruptFileError("SST file is truncated or damaged", path) from None
    finally:
        os.close(fd)


def _parse_table(path: str, fd: int, file_size: int) -> Table:
    if file_size < FOOTER:
        raise CorruptFileError("SST file is shorter than its footer", path)
    footer = _pread(fd, file_size - FOOTER, FOOTER, path)
    version, magic = struct.unpack("<IQ", footer[-12:])
    if magic != MAGIC or not 2 <= version <= 5:
        raise Unsupported(f"table format_version {version}")
    checksum = footer[0]
    if checksum not in (CRC32C, XXH3):
        raise Unsupported(f"checksum type {checksum}")
    meta_off, meta_size, i = _handle(footer, 1)
    index_off, index_size, _ = _handle(footer, i)
    metaindex = _meta_entries(_read_block(fd, checksum, path, meta_off, meta_size), path)
    if b"rocksdb.properties" not in metaindex:
        raise Unsupported("no properties block")
    if b"rocksdb.range_del" in metaindex:
        raise Unsupported("range deletions")
    props_off, props_size, _ = _handle(metaindex[b"rocksdb.properties"], 0)
    props = _meta_entries(_read_block(fd, checksum, path, props_off, props_size), path)
    _check_properties(props)
    index = _index_handles(
        _read_block(fd, checksum, path, index_off, index_size),
        props.get(b"rocksdb.index.value.is.delta.encoded") == b"\x01",
        path,
    )
    if len(index) and (
        int((index[:, 0] + index[:, 1] + 5).max()) > file_size or int(index.min()) < 0
    ):
        raise CorruptFileError("a data block handle points past the end of the file", path)
    entries = _int_property(props, b"rocksdb.num.entries")
    key_bytes = _int_property(props, b"rocksdb.raw.key.size")
    value_bytes = _int_property(props, b"rocksdb.raw.value.size")
    return Table(path, file_size, index, checksum, entries, key_bytes, value_bytes)


def _check_properties(props: dict[bytes, bytes]) -> None:
    if props.get(b"rocksdb.comparator", b"leveldb.BytewiseComparator") != (
        b"leveldb.BytewiseComparator"
    ):
        raise Unsupported("comparator")
    if props.get(b"rocksdb.column.family.name", b"default") != b"default":
        raise Unsupported("a column family other than default")
    if props.get(b"rocksdb.compression", b"LZ4") not in _COMPRESSIONS:
        raise Unsupported("compression")
    if struct.unpack("<I", props.get(b"rocksdb.block.based.table.index.type", bytes(4)))[0]:
        raise Unsupported("index type")
    for name in (b"rocksdb.merge.operands", b"rocksdb.num.range-deletions"):
        if _int_property(props, name):
            raise Unsupported(name.decode())


def _index_handles(block: bytes, delta: bool, path: str) -> np.ndarray:
    """(offset, size) of every data block, from the index block (its keys are not needed: the
    blocks are read in order). Every entry must be a restart (index_block_restart_interval 1,
    RocksDB's default; delta-encoded values are whole only there), so all are parsed at once."""
    buf = np.frombuffer(block + bytes(32), dtype=np.uint8)
    (count,) = struct.unpack_from("<I", block, len(block) - 4)
    end = len(block) - 4 - 4 * count
    if count < 1 or end < 0:
        raise CorruptFileError("the index block has no restarts", path)
    at = np.frombuffer(block, dtype="<u4", count=count, offset=end).astype(np.int64)
    try:
        _, pos = _varints_at(buf, at)  # shared key bytes: the keys are skipped
        unshared, pos = _varints_at(buf, pos)
        if not delta:
            _, pos = _varints_at(buf, pos)  # the value's length: a handle follows
        offset, pos = _varints_at(buf, pos + unshared, 10)
        size, pos = _varints_at(buf, pos, 10)
    except ValueError:
        raise CorruptFileError("the index block is damaged", path) from None
    following = np.append(at[1:], end)
    if (pos > following).any():
        raise CorruptFileError("the index block's entries overrun their restarts", path)
    if (pos < following).any():
        raise Unsupported("index entries between restarts")
    return np.stack([offset, size], axis=1)


# -- data blocks ---------------------------------------------------------------------------
def _varints_at(
    buf: np.ndarray, pos: np.ndarray, longest: int = 5
) -> tuple[np.ndarray, np.ndarray]:
    """The varint (of at most ``longest`` bytes: 5 for 32 bits, 10 for 64) at each position of
    ``buf`` (padded with zeros past its end), and the position after it."""
    byte = buf[pos].astype(np.int64)
    if not (byte & 0x80).any():  # the usual case: every number below 128
        return byte, pos + 1
    value = byte & 0x7F
    more = byte >= 0x80
    size = np.ones(len(pos), dtype=np.int64)
    for shift in range(7, 7 * longest, 7):
        byte = buf[pos + size].astype(np.int64)
        value |= np.where(more, (byte & 0x7F) << shift, 0)
        size += more
        more &= byte >= 0x80
        if not more.any():
            return value, pos + size
    raise ValueError(f"varint longer than {longest} bytes")


@dataclass
class _Entries:
    """The entries of a run of blocks in step-major order (every restart group's first entry,
    then every group's second, ...): each one's group, shared key bytes, unshared key bytes
    (at ``key_at`` in the buffer) and value size; step ``s`` is rows ``bounds[s]:bounds[s+1]``,
    and ``at`` is each entry's position in file order."""

    group: np.ndarray
    shared: np.ndarray
    unshared: np.ndarray
    key_at: np.ndarray
    value_size: np.ndarray
    bounds: list[int]
    at: np.ndarray

    def in_file_order(self, a: np.ndarray) -> np.ndarray:
        out = np.empty_like(a)
        out[self.at] = a
        return out


def _groups(buf: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> tuple[np.ndarray, ...]:
    """The restart groups of blocks ``starts[b]:ends[b]`` of ``buf``: (start, end) of each,
    in buffer order."""
    count = buf[(ends - 4)[:, None] + np.arange(4)].view("<u4").ravel().astype(np.int64)
    if (count >> 31).any():
        raise Unsupported("a data block hash index")
    entries_end = ends - 4 - 4 * count
    if (count < 1).any() or (entries_end < starts).any():
        raise ValueError("restart count")
    block = np.repeat(np.arange(len(starts)), count)
    first = np.cumsum(count) - count
    at = entries_end[block] + 4 * (np.arange(len(block)) - first[block])
    restart = buf[at[:, None] + np.arange(4)].view("<u4").ravel().astype(np.int64)
    group_start = starts[block] + restart
    group_end = np.empty_like(group_start)
    group_end[:-1] = group_start[1:]
    last = first + count - 1
    group_end[last] = entries_end
    if (group_end <= group_start).any() or (restart[first] != 0).any():
        raise ValueError("restart offsets")
    return group_start, group_end


def _walk(buf: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> _Entries:
    """Every entry of the restart groups ``starts[g]:ends[g]``, all groups walked at once."""
    pos, group = starts.copy(), np.arange(len(starts))
    parts: list[tuple[np.ndarray, ...]] = []
    bounds = [0]
    while len(group):
        shared, at = _varints_at(buf, pos)
        unshared, at = _varints_at(buf, at)
        value_size, at = _varints_at(buf, at)
        after = at + unshared + value_size
        end = ends[group]
        if (after > end).any():
            raise ValueError("an entry overruns its restart group")
        parts.append((group, shared, unshared, at, value_size))
        bounds.append(bounds[-1] + len(group))
        more = after < end
        pos, group = after[more], group[more]
    group, shared, unshared, key_at, value_size = (
        np.concatenate(c) for c in zip(*parts, strict=True)
    )
    # File order: by group, then step; each group's entries are its first steps.
    count = np.bincount(group, minlength=len(starts))
    steps = np.repeat(np.arange(len(bounds) - 1), np.diff(bounds))
    at = (np.cumsum(count) - count)[group] + steps
    return _Entries(group, shared, unshared, key_at, value_size, bounds, at)


# Masks of a word's first 0..8 bytes (little-endian: the first bytes are the low ones).
_PREFIX_MASKS = np.array([(1 << (8 * b)) - 1 for b in range(8)] + [(1 << 64) - 1], dtype=np.uint64)


def _words(a: np.ndarray) -> np.ndarray:
    """The 8 bytes at every byte offset of a contiguous uint8 array, as little-endian uint64s
    (an overlapping view: indexing it loads or stores 8 unaligned bytes at once)."""
    return np.ndarray((len(a) - 7,), dtype="<u8", buffer=a, strides=(1,))


def _copy_ranges(
    dst: np.ndarray, dst_at: np.ndarray, src: np.ndarray, src_at: np.ndarray, sizes: np.ndarray
) -> None:
    """``dst[dst_at[i]:][:sizes[i]] = src[src_at[i]:][:sizes[i]]`` for every i, in order, 8
    bytes at a time, all ranges as many words as the longest (or, when that wastes much, each
    its own): a copy writes up to that many bytes past its range, so ranges must be in rising
    ``dst_at`` order (a later range overwrites what an earlier one wrote past its end) or have
    the room; ``dst`` has it at its end, and ``src`` is readable that far."""
    count = (sizes + 7) // 8
    widest = int(count.max(initial=0))
    if widest * len(sizes) <= 2 * int(count.sum()) + len(sizes):
        offset = 8 * np.arange(widest)
        _words(dst)[dst_at[:, None] + offset] = _words(src)[src_at[:, None] + offset]
        return
    entry = np.repeat(np.arange(len(sizes)), count)
    within = 8 * (np.arange(len(entry)) - (np.cumsum(count) - count)[entry])
    _words(dst)[dst_at[entry] + within] = _words(src)[src_at[entry] + within]


def _widest(sizes: np.ndarray) -> int:
    """Bytes :func:`_copy_ranges` may read and write per range."""
    return 8 * int(((sizes + 7) // 8).max(initial=0))


def _keys(buf: np.ndarray, e: _Entries) -> tuple[pa.Array, np.ndarray]:
    """The user keys (in file order) and each entry's type. The keys are rebuilt in a matrix
    of 8-byte words, a row per entry in step-major order: the unshared bytes copied from the
    blocks, then step by step each key's shared prefix ORed in from its group's key of the
    step before, complete by then; then cut out of the rows in file order. The 8-byte trailers
    (sequence number and type) are read from the blocks, not rebuilt, unless a key shares
    bytes of the trailer before it (two entries of one user key): then the whole internal
    keys are rebuilt."""
    if not e.shared.any():
        return _unshared_keys(buf, e)
    n = len(e.group)
    user = e.shared + e.unshared - 8
    if (user < 0).any() or (e.shared[: e.bounds[1]] != 0).any():
        raise ValueError("an entry's key is shorter than its trailer, or a restart shares bytes")
    whole = bool((e.unshared < 8).any())
    own = e.unshared if whole else e.unshared - 8  # the bytes each row is given
    if n and int(e.key_at.max()) + _widest(own) + 8 > len(buf):
        buf = np.concatenate([buf, np.zeros(_widest(own) + 8, dtype=np.uint8)])
    # Rows wide enough for each step's copies to overrun within their row.
    steps = list(itertools.pairwise(e.bounds))
    reach = max(int((e.shared[lo:hi] + _widest(own[lo:hi])).max()) for lo, hi in steps)
    width = 8 * ((max(reach, int(user.max()) + 8) + 7) // 8 + 1)
    matrix = np.zeros((n, width // 8), dtype=np.uint64)
    flat = matrix.reshape(-1).view(np.uint8)
    for lo, hi in steps:
        at = np.arange(lo, hi) * width + e.shared[lo:hi]
        _copy_ranges(flat, at, buf, e.key_at[lo:hi], own[lo:hi])
    for (before, lo), (_, hi) in itertools.pairwise(steps):
        _share(matrix, e, e.shared + own, before, lo, hi)
    if whole:
        kinds = e.in_file_order(flat[np.arange(n) * width + user])
    else:
        kinds = e.in_file_order(buf[e.key_at + own])
    # The rows' keys, then their padding, alternately: the keys taken in file order.
    bounds = np.empty(2 * n + 1, dtype=np.int64)
    bounds[0:-1:2] = np.arange(n) * width
    bounds[1::2] = bounds[0:-1:2] + user
    bounds[-1] = n * width
    rows = pa.LargeBinaryArray.from_buffers(
        pa.large_binary(), 2 * n, [None, pa.py_buffer(bounds), pa.py_buffer(flat)]
    )
    return rows.take(pa.array(2 * e.in_file_order(np.arange(n)))), kinds


def _share(
    matrix: np.ndarray, e: _Entries, lengths: np.ndarray, before: int, lo: int, hi: int
) -> None:
    """Rows ``lo:hi`` (one step) get their shared prefixes from their groups' rows of the step
    before (``before:lo``), only the words a prefix reaches."""
    shared = e.shared[lo:hi]
    if hi - lo == lo - before:  # every group of the step before goes on: the same rows
        prev: slice | np.ndarray = slice(before, lo)
        prev_lengths = lengths[before:lo]
    else:
        prev = before + np.searchsorted(e.group[before:lo], e.group[lo:hi])
        prev_lengths = lengths[prev]
    if (shared > prev_lengths).any():
        raise ValueError("a key shares more bytes than the key before it has")
    words = (int(shared.max(initial=0)) + 7) // 8
    if not words:
        return
    mask = _PREFIX_MASKS[np.clip(shared[:, None] - 8 * np.arange(words), 0, 8)]
    matrix[lo:hi, :words] |= matrix[prev, :words] & mask


def _cut(raw: pa.Buffer, starts: np.ndarray, sizes: np.ndarray) -> pa.Array:
    """``raw[starts[i]:][:sizes[i]]`` for every i (ranges in rising order, not overlapping):
    an array alternating the ranges and the bytes between them (its offsets rise), of which
    every other row is taken."""
    n = len(starts)
    bounds = np.empty(2 * n + 1, dtype=np.int64)
    bounds[0:-1:2] = starts
    bounds[1::2] = starts + sizes
    bounds[-1] = bounds[-2]
    both = pa.LargeBinaryArray.from_buffers(
        pa.large_binary(), 2 * n, [None, pa.py_buffer(bounds), raw]
    )
    return both.take(pa.array(np.arange(0, 2 * n, 2)))


def _values(raw: pa.Buffer, e: _Entries) -> pa.Array:
    """The values, cut out of the blocks."""
    return _cut(raw, e.in_file_order(e.key_at + e.unshared), e.in_file_order(e.value_size))


def _unshared_keys(buf: np.ndarray, e: _Entries) -> tuple[pa.Array, np.ndarray]:
    """:func:`_keys` when no key shares bytes with the one before (statectl's own SSTs): each
    user key is cut out of the blocks whole, and its type is the byte after it."""
    starts, user = e.in_file_order(e.key_at), e.in_file_order(e.unshared - 8)
    if (user < 0).any():
        raise ValueError("an entry's key is shorter than its trailer")
    return _cut(pa.py_buffer(buf), starts, user), buf[starts + user]


def _parse_blocks(
    table: Table, fd: int, first: int, last: int
) -> tuple[pa.Array, pa.Array, np.ndarray]:
    """Keys, values and entry types of data blocks ``first:last`` (read from the file as one
    window: data blocks follow each other)."""
    checksum, path = table.checksum, table.path
    handles = table.handles[first:last]
    base = int(handles[0, 0])
    window = int((handles[:, 0] + handles[:, 1]).max()) + 5 - base
    data = _pread(fd, base, window, path)
    handles = (handles - [base, 0]).tolist()
    blocks = [_checked(data, checksum, path, o, s) for o, s in handles]
    sizes = np.array([raw for _, _, raw in blocks], dtype=np.int64)
    ends = np.cumsum(sizes)
    starts = ends - sizes
    # Every block decompressed into its place in one buffer, padded with zeros: varints are
    # read a byte past an end.
    buf = np.empty(int(ends[-1]) + 16, dtype=np.uint8)
    buf[-16:] = 0
    for (kind, start, _), (o, s), a, b in zip(
        blocks, handles, starts.tolist(), ends.tolist(), strict=True
    ):
        _decompress_into(data, kind, start, o + s, buf[a:b], path)
    try:
        entries = _walk(buf, *_groups(buf, starts, ends))
        keys, kinds = _keys(buf, entries)
    except (ValueError, IndexError) as e:
        raise CorruptFileError(f"a data block is damaged ({e})", table.path) from None
    return keys, _values(pa.py_buffer(buf), entries), kinds


def _blocks_per_step(table: Table, max_bytes: int) -> int:
    """Data blocks parsed at once: their key matrix within ``MATRIX_BYTES``, judged by the
    file's average entry (the matrix is as wide as the longest key), and, when ``max_bytes``
    is given, their entries within a quarter of it (a step holds the blocks as read, as
    decompressed, and their keys and values)."""
    blocks = max(1, len(table.handles))
    per_block = max(1, table.entries // blocks)
    width = max(64, 2 * table.key_bytes // max(1, table.entries))
    step = max(1, MATRIX_BYTES // (per_block * width))
    if max_bytes:
        raw_per_block = max(1, (table.key_bytes + table.value_bytes) // blocks)
        step = min(step, max(1, max_bytes // (4 * raw_per_block)))
    return step


class Run:
    """The entries of SST files whose key ranges do not overlap, in key order: for each key
    its newest entry, deletions dropped (an older entry of a key always follows the newer
    one within a file, and no key is in two files)."""

    def __init__(self, paths: list[str], max_bytes: int = 0) -> None:
        self.paths = paths  # each file is read a window of blocks at a time
        self.max_bytes = max_bytes  # what a window may cost (0: MATRIX_BYTES bounds it)
        self.last: bytes | None = None  # the key of the entry before the current chunk

    def __iter__(self) -> Iterator[tuple[pa.Array, pa.Array]]:
        for path in self.paths:
            table = open_table(path)
            step = _blocks_per_step(table, self.max_bytes)
            fd = os.open(path, os.O_RDONLY)
            try:
                for first in range(0, len(table.handles), step):
                    keys, values, kinds = _parse_blocks(table, fd, first, first + step)
                    if len(keys):
                        yield self._live(table, keys, values, kinds)
            finally:
                os.close(fd)

    def _live(
        self, table: Table, keys: pa.Array, values: pa.Array, kinds: np.ndarray
    ) -> tuple[pa.Array, pa.Array]:
        n = len(keys)
        newest = np.ones(n, dtype=bool)
        if n > 1:
            newest[1:] = ~pc.equal(keys.slice(1), keys.slice(0, n - 1)).to_numpy(
                zero_copy_only=False
            )
        first = keys[0].as_py()
        if self.last is not None and first == self.last:
            newest[0] = False
        self.last = keys[n - 1].as_py()
        unknown = ~np.isin(kinds, (TYPE_VALUE, TYPE_DELETION, TYPE_SINGLE_DELETION))
        if unknown.any():
            raise CorruptFileError(
                f"entry type {int(kinds[unknown][0])} is not a value or a deletion", table.path
            )
        keep = newest & (kinds == TYPE_VALUE)
        if keep.all():
            return keys, values
        mask = pa.array(keep)
        return keys.filter(mask), values.filter(mask)


def sorted_run(directory: str, live_files: list[dict[str, Any]], max_bytes: int = 0) -> Run:
    """The live SST files of a database directory as one :class:`Run`, or :class:`Unsupported`
    when they overlap or something else needs RocksDB itself (a WAL with entries: its
    records are only in the memtable)."""
    for name in os.listdir(directory):
        if name.endswith(".log") and os.path.getsize(os.path.join(directory, name)):
            raise Unsupported("a write-ahead log with entries")
    files = sorted(live_files, key=lambda f: (f["start_key"], f["end_key"]))
    for a, b in itertools.pairwise(files):
        if a["end_key"] >= b["start_key"]:
            raise Unsupported("SST files overlap")
    paths = [os.path.join(directory, os.path.basename(f["name"])) for f in files]
    for path in paths:  # what this reader cannot read is known before any entry is read
        open_table(path)
    return Run(paths, max_bytes)

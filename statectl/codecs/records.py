"""Record streams inside Spark's state files (what is left once the codec stream is removed):
the :class:`RecordBatch` every reader returns, and the v1 stream, read and written.

* HDFS ``.delta``/``.snapshot``, RocksDB changelog v1 (and v3 after its header):
  ``int32 BE klen | key | int32 BE vlen | value``; a negative ``vlen`` is a removal (Spark writes
  -1); ``int32 -1`` ends the stream. Parsed whole, in chunks, or streamed from codec blocks.
* RocksDB changelog v2 (and v4 after its header): ``byte type | int32 klen | key | int32 vlen |
  value`` with type 0x01 put, 0x10 delete (vlen -1, no value), 0x11 merge, 0x20 delete-range
  (key = begin, value = end, 4.x); a 0x00 type byte ends the stream. Changelog headers and
  this typed stream: :mod:`statectl.codecs.changelog`.

Record boundaries are found in :mod:`statectl.codecs.record_scan`; replaying batches (last
writer wins) is :mod:`statectl.codecs.record_replay`.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import TypeAlias

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from statectl.codecs.record_scan import (
    be32_at,
    extract_records,
    raise_truncated,
    scan_records,
    scan_window_v1,
)
from statectl.errors import CorruptFileError

OP_PUT, OP_DELETE, OP_MERGE, OP_DELETE_RANGE = 0, 1, 2, 3


@dataclass
class RecordBatch:
    """The records of one file, in file order."""

    ops: np.ndarray  # uint8, one of OP_*
    keys: pa.LargeBinaryArray  # key bytes exactly as stored (delete-range: the begin key)
    values: pa.LargeBinaryArray  # value bytes; null where op == OP_DELETE (range: the end key)
    lineage: list[dict] | None = None  # changelog v3/v4 lineage, else None
    version: int = 1  # 1..4 (1 for delta/snapshot)

    def __len__(self) -> int:
        return len(self.ops)


# -- reading: public API ----------------------------------------------------------------------
def parse_state_records(
    raw: bytes | memoryview,
    path: str | None = None,
    *,
    allow_deletes: bool = True,
    start: int = 0,
    lineage: list[dict] | None = None,
    version: int = 1,
) -> RecordBatch:
    """A v1 record stream (HDFS delta/snapshot, changelog v1/v3 body from ``start``).

    A snapshot (``allow_deletes=False``) with a removal is corrupt, as Spark's
    ``readSnapshotFile`` says. The end marker must end the data.
    """
    arr = np.frombuffer(raw, dtype=np.uint8)
    rs, end = scan_records(raw, arr, start, False, path)
    if end + 4 != len(arr):
        raise CorruptFileError(
            f"{len(arr) - end - 4} unexpected bytes after the end marker at byte {end}", path
        )
    klen = be32_at(arr, rs)
    vlen = be32_at(arr, rs + 4 + klen)
    deleted = vlen < 0
    if not allow_deletes and deleted.any():
        at = int(rs[np.argmax(deleted)])
        raise CorruptFileError(
            f"removal record at byte {at} in a snapshot (Spark rejects snapshots with removals)",
            path,
        )
    keys, values = extract_records(raw, rs, rs + 4, klen, vlen, end, deleted)
    ops = deleted.astype(np.uint8)  # OP_PUT = 0, OP_DELETE = 1
    return RecordBatch(ops, keys, values, lineage, version)


def iter_state_records(
    raw: bytes | memoryview, path: str | None = None, *, allow_deletes: bool = True, max_bytes: int
) -> Iterator[RecordBatch]:
    """:func:`parse_state_records` of a whole HDFS delta/snapshot, in chunks of about
    ``max_bytes`` of keys and values: the file is scanned once, each chunk's keys and values
    are copied out only when it is consumed (a bounded read never holds them all)."""
    arr = np.frombuffer(raw, dtype=np.uint8)
    rs, end = scan_records(raw, arr, 0, False, path)
    if end + 4 != len(arr):
        raise CorruptFileError(
            f"{len(arr) - end - 4} unexpected bytes after the end marker at byte {end}", path
        )
    n = len(rs)
    step = max(1, max_bytes // max(1, end // max(1, n)))
    for i in range(0, n, step):
        j = min(n, i + step)
        sub = rs[i:j]
        klen = be32_at(arr, sub)
        vlen = be32_at(arr, sub + 4 + klen)
        deleted = vlen < 0
        if not allow_deletes and deleted.any():
            at = int(sub[np.argmax(deleted)])
            raise CorruptFileError(
                f"removal record at byte {at} in a snapshot (Spark rejects snapshots with "
                "removals)",
                path,
            )
        stop = int(rs[j]) if j < n else end
        keys, values = extract_records(raw, sub, sub + 4, klen, vlen, stop, deleted)
        yield RecordBatch(deleted.astype(np.uint8), keys, values)


def iter_record_stream(
    pieces: Iterable[bytes | memoryview],
    path: str | None = None,
    *,
    allow_deletes: bool = True,
    max_bytes: int,
    start: int = 0,
) -> Iterator[RecordBatch]:
    """A v1 record stream arriving in ``pieces`` (decompressed codec blocks), as chunks of the
    records of about ``max_bytes`` of data: never the whole stream in memory. The same checks
    as :func:`parse_state_records` (end marker, removals in snapshots, truncation); the scan
    is the exact loop (no speculation), used for files larger than the budget only."""
    source = iter(pieces)
    buf = b""
    base = 0  # stream offset of buf[0]
    done = False
    window = max(64 << 10, max_bytes)
    while True:
        buf, done = _fill(buf, source, window, done)
        skip = min(start, len(buf))
        start -= skip
        rs, pos, ended = scan_window_v1(buf, skip, base, path)
        batch = _v1_batch(buf, rs, pos, base, allow_deletes, path) if len(rs) else None
        if not ended and not done:  # the window's unread tail only: not held while the caller works
            buf = buf[pos:]
            base += pos
            pos = 0
        if batch is not None:
            yield batch
            del batch
        if ended:
            extra = len(buf) - pos - 4 + sum(len(p) for p in source)
            if extra:
                raise CorruptFileError(
                    f"{extra} unexpected bytes after the end marker at byte {base + pos}", path
                )
            return
        if done:
            raise_truncated(base + len(buf), base + pos, [base + int(r) for r in rs[-1:]], path)
        if not len(rs):
            window *= 2  # a record larger than the window: read more


def _fill(
    buf: bytes, source: Iterator[bytes | memoryview], window: int, done: bool
) -> tuple[bytes, bool]:
    """``buf`` and the next pieces of ``source`` until ``window`` bytes (or its end: done)."""
    parts = [buf]
    size = len(buf)
    while not done and size < window:
        piece = next(source, None)
        if piece is None:
            done = True
        else:
            parts.append(bytes(piece))
            size += len(piece)
    return b"".join(parts), done


def _v1_batch(
    buf: bytes, rs: np.ndarray, end: int, base: int, allow_deletes: bool, path: str | None
) -> RecordBatch:
    """The v1 records starting at ``rs`` in ``buf`` (``base``: its stream offset)."""
    arr = np.frombuffer(buf, dtype=np.uint8)
    klen = be32_at(arr, rs)
    vlen = be32_at(arr, rs + 4 + klen)
    deleted = vlen < 0
    if not allow_deletes and deleted.any():
        at = base + int(rs[np.argmax(deleted)])
        raise CorruptFileError(
            f"removal record at byte {at} in a snapshot (Spark rejects snapshots with removals)",
            path,
        )
    keys, values = extract_records(buf, rs, rs + 4, klen, vlen, end, deleted)
    return RecordBatch(deleted.astype(np.uint8), keys, values)


# -- writing ----------------------------------------------------------------------------------
BinaryLike: TypeAlias = pa.Array | pa.ChunkedArray | Sequence[bytes | None]
# The empty byte string: the separator of Arrow's element-wise joins, a deleted value's bytes.
NO_BYTES = pa.scalar(b"", pa.large_binary())


def as_large_binary(a: BinaryLike) -> pa.LargeBinaryArray:
    if isinstance(a, pa.ChunkedArray):
        a = a.combine_chunks() if a.num_chunks != 1 else a.chunk(0)
    if not isinstance(a, pa.Array):
        a = pa.array(list(a), type=pa.large_binary())
    if a.type != pa.large_binary():
        a = a.cast(pa.large_binary())
    return a


def _lengths(a: pa.LargeBinaryArray) -> np.ndarray:
    offsets = np.frombuffer(a.buffers()[1], dtype=np.int64)[a.offset : a.offset + len(a) + 1]
    return np.diff(offsets)


def _fixed(rows: np.ndarray) -> pa.LargeBinaryArray:
    """A (n, w) uint8 array as n binary elements of w bytes each (zero-copy)."""
    n, w = rows.shape
    offsets = np.arange(0, n * w + 1, w, dtype=np.int64)
    return pa.LargeBinaryArray.from_buffers(
        pa.large_binary(),
        n,
        [None, pa.py_buffer(offsets), pa.py_buffer(np.ascontiguousarray(rows))],
    )


def _be32_rows(v: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(v.astype(">i4")).view(np.uint8).reshape(-1, 4)


def _tail(n: int, tail: bytes) -> pa.LargeBinaryArray:
    """``n`` elements, all empty but the last, which is ``tail`` (zero-copy but the offsets)."""
    offsets = np.zeros(n + 1, dtype=np.int64)
    offsets[-1] = len(tail)
    return pa.LargeBinaryArray.from_buffers(
        pa.large_binary(), n, [None, pa.py_buffer(offsets), pa.py_buffer(tail)]
    )


def _prepare(
    keys: BinaryLike, values: BinaryLike, deletes: np.ndarray | Sequence[bool] | None
) -> tuple[pa.LargeBinaryArray, pa.LargeBinaryArray, np.ndarray]:
    keys = as_large_binary(keys)
    values = as_large_binary(values)
    if len(keys) != len(values):
        raise ValueError(f"{len(keys)} keys but {len(values)} values")
    deleted = np.zeros(len(keys), dtype=bool)
    if values.null_count:
        deleted |= ~np.asarray(values.is_valid().to_numpy(zero_copy_only=False), dtype=bool)
    if deletes is not None:
        deleted |= np.asarray(deletes, dtype=bool)
    if keys.null_count:
        raise ValueError("a key is null")
    return keys, values, deleted


def write_state_records(
    keys: BinaryLike,
    values: BinaryLike,
    deletes: np.ndarray | Sequence[bool] | None = None,
    *,
    prefix: bytes = b"",
) -> bytes:
    """A v1 record stream with its end marker: ``.delta``/``.snapshot``/changelog v1 bytes.

    A record is a removal (``vlen -1``) where ``deletes`` is true or the value is null.
    ``prefix`` goes before every key and value (RocksDB's 0x00 encoding-version byte).
    """
    return record_stream(keys, values, deletes, prefix=prefix, end=True).to_pybytes()


def record_stream(
    keys: BinaryLike,
    values: BinaryLike,
    deletes: np.ndarray | Sequence[bool] | None = None,
    *,
    prefix: bytes = b"",
    end: bool = False,
) -> pa.Buffer:
    """:func:`write_state_records`' records as an Arrow buffer (not copied into ``bytes``),
    with the end marker only when ``end``: a streamed writer appends batch after batch."""
    keys, values, deleted = _prepare(keys, values, deletes)
    n = len(keys)
    marker = b"\xff\xff\xff\xff" if end else b""
    if n == 0:
        return pa.py_buffer(marker)
    p = len(prefix)
    klen = _lengths(keys) + p
    vlen = np.where(deleted, -1, _lengths(values) + p)
    # One Arrow join of the record's parts, row by row: its data buffer is the stream
    # (2.6x an interleaving take of the same parts, issue 27).
    head = pa.scalar(prefix, pa.large_binary())
    value_head: pa.Scalar | pa.Array = head
    if deleted.any():  # a removal is its key and length -1: no value bytes, no prefix
        gone = pa.array(deleted)
        value_head = pc.if_else(gone, NO_BYTES, head)
        values = pc.if_else(gone, NO_BYTES, values)
    parts: list[pa.Scalar | pa.Array] = [_fixed(_be32_rows(klen))]
    parts += [head, keys] if p else [keys]
    parts.append(_fixed(_be32_rows(vlen)))
    parts += [value_head, values] if p else [values]
    if end:
        parts.append(_tail(n, marker))
    joined = pc.binary_join_element_wise(*parts, NO_BYTES)
    offsets = np.frombuffer(joined.buffers()[1], dtype=np.int64)[: n + 1]
    return joined.buffers()[2][int(offsets[0]) : int(offsets[-1])]

"""Record streams inside Spark's state files (what is left once the codec stream is removed).

* HDFS ``.delta``/``.snapshot``, RocksDB changelog v1 (and v3 after its header):
  ``int32 BE klen | key | int32 BE vlen | value``; a negative ``vlen`` is a removal (Spark writes
  -1); ``int32 -1`` ends the stream.
* RocksDB changelog v2 (and v4 after its header): ``byte type | int32 klen | key | int32 vlen |
  value`` with type 0x01 put, 0x10 delete (vlen -1, no value), 0x11 merge, 0x20 delete-range
  (key = begin, value = end, 4.x); a 0x00 type byte ends the stream.

Finding record boundaries is the only sequential step. A constant record stride is detected and
verified vectorially; otherwise a tight loop collects the record starts only. Everything else is
vectorized: lengths are read at all record starts at once, and keys and values are copied out by
Arrow's ``take`` over a zero-copy "segments" view of the buffer (every record split into header,
key, length and value segments), so no Python code touches a row.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import TypeAlias

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from numpy.lib.stride_tricks import sliding_window_view

from statectl.errors import CorruptFileError, UnsupportedError

OP_PUT, OP_DELETE, OP_MERGE, OP_DELETE_RANGE = 0, 1, 2, 3
TYPE_EOF, TYPE_PUT, TYPE_DELETE, TYPE_MERGE, TYPE_DELETE_RANGE = 0x00, 0x01, 0x10, 0x11, 0x20
_TYPE_TO_OP = np.full(256, 255, dtype=np.uint8)  # 255 = not a record type
_TYPE_TO_OP[[TYPE_PUT, TYPE_DELETE, TYPE_MERGE, TYPE_DELETE_RANGE]] = [
    OP_PUT,
    OP_DELETE,
    OP_MERGE,
    OP_DELETE_RANGE,
]
_INT = struct.Struct(">i")
_EMPTY = pa.array([], type=pa.large_binary())
CHANGELOG_VERSIONS = (1, 2, 3, 4)


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


# -- reading: vectorized helpers ---------------------------------------------------------------
def _be32_at(arr: np.ndarray, pos: np.ndarray) -> np.ndarray:
    """Big-endian int32 at every position (all ``pos + 4 <= len(arr)``), as int64."""
    if len(pos) == 0:
        return np.zeros(0, dtype=np.int64)
    return sliding_window_view(arr, 4)[pos].view(">i4").reshape(-1).astype(np.int64)


def _segments(raw: bytes | memoryview, bounds: np.ndarray) -> pa.LargeBinaryArray:
    """A zero-copy binary array whose element j is ``raw[bounds[j]:bounds[j+1]]``."""
    return pa.LargeBinaryArray.from_buffers(
        pa.large_binary(), len(bounds) - 1, [None, pa.py_buffer(bounds), pa.py_buffer(raw)]
    )


def _extract(
    raw: bytes | memoryview,
    rs: np.ndarray,
    ks: np.ndarray,
    klen: np.ndarray,
    vlen: np.ndarray,
    end: int,
    null_values: np.ndarray | None,
) -> tuple[pa.LargeBinaryArray, pa.LargeBinaryArray]:
    """Keys and values of records starting at ``rs`` (record i: header up to ``ks``, key,
    4-byte value length, value up to the next record or ``end``), copied out by Arrow take."""
    n = len(rs)
    if n == 0:
        return _EMPTY, _EMPTY
    bounds = np.empty(4 * n + 1, dtype=np.int64)
    bounds[0:-1:4] = rs
    bounds[1:-1:4] = ks
    bounds[2:-1:4] = ks + klen
    bounds[3:-1:4] = ks + klen + 4
    bounds[-1] = end
    seg = _segments(raw, bounds)
    keys = seg.take(pa.array(np.arange(1, 4 * n, 4, dtype=np.int64)))
    vidx = np.arange(3, 4 * n, 4, dtype=np.int64)
    if null_values is not None and null_values.any():
        values = seg.take(pa.array(vidx, mask=null_values))
    else:
        values = seg.take(pa.array(vidx))
    return keys, values


# -- reading: record boundaries -----------------------------------------------------------------
# Record i of a v1 stream starts with its key length; of a typed stream, with its type byte, so
# the key length sits ``_KOFF[typed]`` bytes in and the key ``_HEAD[typed]`` bytes in.
_KOFF = (0, 1)
_HEAD = (4, 5)
_PROBE = 16  # records read exactly before guessing which size is constant
_MIN_RUN = 256  # a speculative run that verifies fewer records than this is not worth retrying


def _constant_stride(
    raw: bytes | memoryview, arr: np.ndarray, start: int, typed: bool
) -> np.ndarray | None:
    """Record starts if every record has the first record's key and value sizes, else None."""
    size = len(arr)
    head = _HEAD[typed]
    tail = 1 if typed else 4  # end record: type byte 0 / int32 -1
    lengths = _first_lengths(raw, arr, start, typed, tail)
    if lengths is None:
        return None
    klen, vlen = lengths
    stride = head + klen + 4 + vlen
    body = size - start - tail
    if body % stride or not _ends_with_marker(raw, arr, typed):
        return None
    rs = start + stride * np.arange(body // stride, dtype=np.int64)
    if not (_be32_at(arr, rs + _KOFF[typed]) == klen).all():
        return None
    if not (_be32_at(arr, rs + head + klen) == vlen).all():
        return None
    return rs


def _first_lengths(
    raw: bytes | memoryview, arr: np.ndarray, start: int, typed: bool, tail: int
) -> tuple[int, int] | None:
    """(key length, value length) of the record at ``start`` when it is a complete put,
    followed by at least the end marker's ``tail`` bytes; else None."""
    size, head = len(arr), _HEAD[typed]
    if size - start < head + 4 + tail or (typed and arr[start] == TYPE_EOF):
        return None
    (klen,) = _INT.unpack_from(raw, start + _KOFF[typed])
    if klen < 0 or start + head + klen + 4 > size:
        return None
    (vlen,) = _INT.unpack_from(raw, start + head + klen)
    return None if vlen < 0 else (klen, vlen)


def _ends_with_marker(raw: bytes | memoryview, arr: np.ndarray, typed: bool) -> bool:
    """The stream's last bytes are the end marker: type byte 0, or int32 -1 (v1)."""
    if typed:
        return bool(arr[len(arr) - 1] == TYPE_EOF)
    return bool(_INT.unpack_from(raw, len(arr) - 4)[0] == -1)


def _scan(
    raw: bytes | memoryview, arr: np.ndarray, start: int, typed: bool, path: str | None
) -> tuple[np.ndarray, int]:
    """(record starts, position of the end marker / end record).

    Fast paths first: a constant stride verified at once. Otherwise the scan is sequential,
    made cheaper by speculation: if the first records all share their value size (typical:
    fixed-width aggregation values behind string keys) or key size, a loop that reads only the
    other length runs ahead, and one vectorized check confirms the guessed length at every
    record it found. The verified prefix is kept and the scan resumes exactly where the guess
    first failed (e.g. at a removal), so the result is always that of the exact loop, which
    also produces every error message.
    """
    rs = _constant_stride(raw, arr, start, typed)
    if rs is not None:
        return rs, len(arr) - (1 if typed else 4)
    parts: list[np.ndarray] = []
    pos = start
    while True:
        probe, sizes, pos, done = _probe(raw, pos, typed, path)
        parts.append(np.array(probe, dtype=np.int64))
        if done:
            break
        run, pos = _speculate(raw, arr, pos, typed, sizes)
        parts.append(run)
        if len(run) < _MIN_RUN:
            rest, pos = (_exact_typed if typed else _exact_v1)(raw, pos, path)
            parts.append(np.array(rest, dtype=np.int64))
            break
    return np.concatenate(parts), pos


def _probe(
    raw: bytes | memoryview, pos: int, typed: bool, path: str | None
) -> tuple[list[int], list[tuple[int, int]], int, bool]:
    """Up to ``_PROBE`` records read exactly: (starts, (klen, vlen) pairs, next position, at end)."""
    unpack = _INT.unpack_from
    koff, head = _KOFF[typed], _HEAD[typed]
    starts: list[int] = []
    sizes: list[tuple[int, int]] = []
    try:
        for _ in range(_PROBE):
            if typed and raw[pos] == TYPE_EOF:
                return starts, sizes, pos, True
            (k,) = unpack(raw, pos + koff)
            if k < 0:
                if typed:
                    raise CorruptFileError(
                        f"invalid key size {k} in the record at byte {pos}", path
                    )
                if k != -1:
                    raise CorruptFileError(f"invalid key size {k} at byte {pos}", path)
                return starts, sizes, pos, True
            (v,) = unpack(raw, pos + head + k)
            starts.append(pos)
            sizes.append((k, v))
            pos += head + k + 4 + (v if v > 0 else 0)
    except (struct.error, IndexError):
        _raise_truncated(len(raw), pos, starts, path)
    return starts, sizes, pos, False


def _speculate(
    raw: bytes | memoryview, arr: np.ndarray, pos: int, typed: bool, sizes: list[tuple[int, int]]
) -> tuple[np.ndarray, int]:
    """Records from ``pos`` found by guessing one length constant: (verified starts, where the
    exact scan must resume). Returns no records when the probe shows no constant length."""
    koff, head = _KOFF[typed], _HEAD[typed]
    vsizes = {v for _, v in sizes}
    ksizes = {k for k, _ in sizes}
    if len(vsizes) == 1 and min(vsizes) >= 0:
        (value,) = vsizes
        found, stop = (_guess_value_typed if typed else _guess_value_v1)(raw, pos, head + 4 + value)
        rs = np.array(found, dtype=np.int64)
        klen = _be32_at(arr, rs + koff)
        vpos = rs + head + klen
        ok = vpos + 4 <= len(arr)
        ok[ok] = _be32_at(arr, vpos[ok]) == value
    elif len(ksizes) == 1:
        (key,) = ksizes
        found, stop = (_guess_key_typed if typed else _guess_key_v1)(raw, pos, key, len(arr))
        rs = np.array(found, dtype=np.int64)
        ok = _be32_at(arr, rs + koff) == key
    else:
        return np.zeros(0, dtype=np.int64), pos
    if ok.all():
        return rs, stop
    bad = int(np.argmin(ok))
    return rs[:bad], int(rs[bad])


# The sequential loops. Kept minimal on purpose: each iteration is a few bytecodes.
def _exact_v1(raw: bytes | memoryview, pos: int, path: str | None) -> tuple[list[int], int]:
    unpack = _INT.unpack_from
    starts: list[int] = []
    add = starts.append
    try:
        while True:
            (k,) = unpack(raw, pos)
            if k < 0:
                break
            add(pos)
            (v,) = unpack(raw, pos + 4 + k)
            pos += 8 + k + (v if v > 0 else 0)
    except struct.error:
        _raise_truncated(len(raw), pos, starts, path)
    if k != -1:
        raise CorruptFileError(f"invalid key size {k} at byte {pos}", path)
    return starts, pos


def _exact_typed(raw: bytes | memoryview, pos: int, path: str | None) -> tuple[list[int], int]:
    unpack = _INT.unpack_from
    starts: list[int] = []
    add = starts.append
    try:
        while raw[pos]:
            (k,) = unpack(raw, pos + 1)
            if k < 0:  # would move backwards
                raise CorruptFileError(f"invalid key size {k} in the record at byte {pos}", path)
            add(pos)
            (v,) = unpack(raw, pos + 5 + k)
            pos += 9 + k + (v if v > 0 else 0)
    except (struct.error, IndexError):
        _raise_truncated(len(raw), pos, starts, path)
    return starts, pos


def _guess_value_v1(raw: bytes | memoryview, pos: int, step: int) -> tuple[list[int], int]:
    unpack = _INT.unpack_from
    starts: list[int] = []
    add = starts.append
    try:
        while True:
            (k,) = unpack(raw, pos)
            if k < 0:
                break
            add(pos)
            pos += k + step
    except struct.error:
        pass
    return starts, pos


def _guess_value_typed(raw: bytes | memoryview, pos: int, step: int) -> tuple[list[int], int]:
    unpack = _INT.unpack_from
    starts: list[int] = []
    add = starts.append
    try:
        while raw[pos]:
            (k,) = unpack(raw, pos + 1)
            if k < 0:
                break
            add(pos)
            pos += k + step
    except (struct.error, IndexError):
        pass
    return starts, pos


def _guess_key_v1(raw: bytes | memoryview, pos: int, key: int, size: int) -> tuple[list[int], int]:
    unpack = _INT.unpack_from
    starts: list[int] = []
    add = starts.append
    voff = 4 + key
    step = 8 + key
    last = size - 4  # where a well-formed stream has its end marker
    try:
        while pos != last:  # pos only grows: a wrong guess ends in struct.error at worst
            (v,) = unpack(raw, pos + voff)
            add(pos)
            pos += step + (v if v > 0 else 0)
    except struct.error:
        pass
    return starts, pos


def _guess_key_typed(
    raw: bytes | memoryview, pos: int, key: int, size: int
) -> tuple[list[int], int]:
    del size  # the type byte marks the end
    unpack = _INT.unpack_from
    starts: list[int] = []
    add = starts.append
    voff = 5 + key
    step = 9 + key
    try:
        while raw[pos]:
            (v,) = unpack(raw, pos + voff)
            add(pos)
            pos += step + (v if v > 0 else 0)
    except (struct.error, IndexError):
        pass
    return starts, pos


def _raise_truncated(size: int, pos: int, starts: list[int], path: str | None) -> None:
    """The error for a scan that ran out of data at ``pos`` (``starts``: records so far)."""
    if pos == size:
        raise CorruptFileError(
            f"missing end marker: the data ends at byte {size} after the last complete record "
            "(file truncated?)",
            path,
        )
    at = starts[-1] if pos > size and starts else pos  # the last record's value ran past the end
    raise CorruptFileError(
        f"truncated: the record at byte {at} runs past the end of the data ({size} bytes)", path
    )


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
    rs, end = _scan(raw, arr, start, False, path)
    if end + 4 != len(arr):
        raise CorruptFileError(
            f"{len(arr) - end - 4} unexpected bytes after the end marker at byte {end}", path
        )
    klen = _be32_at(arr, rs)
    vlen = _be32_at(arr, rs + 4 + klen)
    deleted = vlen < 0
    if not allow_deletes and deleted.any():
        at = int(rs[np.argmax(deleted)])
        raise CorruptFileError(
            f"removal record at byte {at} in a snapshot (Spark rejects snapshots with removals)",
            path,
        )
    keys, values = _extract(raw, rs, rs + 4, klen, vlen, end, deleted)
    ops = deleted.astype(np.uint8)  # OP_PUT = 0, OP_DELETE = 1
    return RecordBatch(ops, keys, values, lineage, version)


def iter_state_records(
    raw: bytes | memoryview, path: str | None = None, *, allow_deletes: bool = True, max_bytes: int
) -> Iterator[RecordBatch]:
    """:func:`parse_state_records` of a whole HDFS delta/snapshot, in chunks of about
    ``max_bytes`` of keys and values: the file is scanned once, each chunk's keys and values
    are copied out only when it is consumed (a bounded read never holds them all)."""
    arr = np.frombuffer(raw, dtype=np.uint8)
    rs, end = _scan(raw, arr, 0, False, path)
    if end + 4 != len(arr):
        raise CorruptFileError(
            f"{len(arr) - end - 4} unexpected bytes after the end marker at byte {end}", path
        )
    n = len(rs)
    step = max(1, max_bytes // max(1, end // max(1, n)))
    for i in range(0, n, step):
        j = min(n, i + step)
        sub = rs[i:j]
        klen = _be32_at(arr, sub)
        vlen = _be32_at(arr, sub + 4 + klen)
        deleted = vlen < 0
        if not allow_deletes and deleted.any():
            at = int(sub[np.argmax(deleted)])
            raise CorruptFileError(
                f"removal record at byte {at} in a snapshot (Spark rejects snapshots with "
                "removals)",
                path,
            )
        stop = int(rs[j]) if j < n else end
        keys, values = _extract(raw, sub, sub + 4, klen, vlen, stop, deleted)
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
        rs, pos, ended = _window_v1(buf, skip, base, path)
        if len(rs):
            yield _v1_batch(buf, rs, pos, base, allow_deletes, path)
        if ended:
            extra = len(buf) - pos - 4 + sum(len(p) for p in source)
            if extra:
                raise CorruptFileError(
                    f"{extra} unexpected bytes after the end marker at byte {base + pos}", path
                )
            return
        if done:
            _raise_truncated(base + len(buf), base + pos, [base + int(r) for r in rs[-1:]], path)
        if not len(rs):
            window *= 2  # a record larger than the window: read more
        buf = buf[pos:]
        base += pos


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
    klen = _be32_at(arr, rs)
    vlen = _be32_at(arr, rs + 4 + klen)
    deleted = vlen < 0
    if not allow_deletes and deleted.any():
        at = base + int(rs[np.argmax(deleted)])
        raise CorruptFileError(
            f"removal record at byte {at} in a snapshot (Spark rejects snapshots with removals)",
            path,
        )
    keys, values = _extract(buf, rs, rs + 4, klen, vlen, end, deleted)
    return RecordBatch(deleted.astype(np.uint8), keys, values)


def _window_v1(raw: bytes, pos: int, base: int, path: str | None) -> tuple[np.ndarray, int, bool]:
    """Starts of the complete v1 records in ``raw`` from ``pos``: (starts, where the first
    incomplete record or the end marker is, whether it is the end marker).

    As :func:`_scan`, cheaper by speculation: when the first records share their value size,
    a loop reading only key lengths runs ahead and one vectorized check confirms every record
    it found (complete in the window, value length as guessed); the exact loop takes over
    where the guess first fails, so the result is always the exact loop's."""
    probe, pos, ended = _window_exact(raw, pos, base, path, _PROBE)
    if ended or len(probe) < _PROBE:
        return probe, pos, ended
    arr = np.frombuffer(raw, dtype=np.uint8)
    vsizes = _be32_at(arr, probe + 4 + _be32_at(arr, probe))
    run = np.zeros(0, dtype=np.int64)
    if (vsizes == vsizes[0]).all() and vsizes[0] >= 0:
        value = int(vsizes[0])
        found, _ = _guess_value_v1(raw, pos, 8 + value)
        run = _complete_v1(arr, np.array(found, dtype=np.int64), value)
        if len(run):
            pos = int(run[-1]) + 8 + int(_be32_at(arr, run[-1:])[0]) + value
    rest, pos, ended = _window_exact(raw, pos, base, path, None)
    return np.concatenate([probe, run, rest]), pos, ended


def _complete_v1(arr: np.ndarray, rs: np.ndarray, value: int) -> np.ndarray:
    """The leading records of guessed starts ``rs`` that are complete in ``arr`` and have the
    guessed value length (every start has its 4-byte key length in ``arr``)."""
    if not len(rs):
        return rs
    n = len(arr)
    vpos = rs + 4 + _be32_at(arr, rs)
    ok = (vpos + 4 + value) <= n
    ok[ok] = _be32_at(arr, vpos[ok]) == value
    if ok.all():
        return rs
    return rs[: int(np.argmin(ok))]


def _window_exact(
    raw: bytes, pos: int, base: int, path: str | None, limit: int | None
) -> tuple[np.ndarray, int, bool]:
    """:func:`_window_v1`'s exact loop, for at most ``limit`` records (None: to the end)."""
    unpack = _INT.unpack_from
    n = len(raw)
    starts: list[int] = []
    add = starts.append
    left = -1 if limit is None else limit
    while pos + 4 <= n and left:
        (k,) = unpack(raw, pos)
        if k < 0:
            if k != -1:
                raise CorruptFileError(f"invalid key size {k} at byte {base + pos}", path)
            return np.array(starts, dtype=np.int64), pos, True
        if pos + 8 + k > n:
            break
        (v,) = unpack(raw, pos + 4 + k)
        nxt = pos + 8 + k + (v if v > 0 else 0)
        if nxt > n:
            break
        add(pos)
        pos = nxt
        left -= 1
    return np.array(starts, dtype=np.int64), pos, False


def _parse_typed(
    raw: bytes | memoryview, start: int, path: str | None, lineage: list[dict] | None, version: int
) -> RecordBatch:
    arr = np.frombuffer(raw, dtype=np.uint8)
    rs, end = _scan(raw, arr, start, True, path)
    if end + 1 != len(arr):
        raise CorruptFileError(
            f"{len(arr) - end - 1} unexpected bytes after the end record at byte {end}", path
        )
    ops = _TYPE_TO_OP[arr[rs]]
    if (ops == 255).any():
        at = int(rs[np.argmax(ops == 255)])
        raise CorruptFileError(f"unknown changelog record type 0x{arr[at]:02x} at byte {at}", path)
    klen = _be32_at(arr, rs + 1)
    vlen = _be32_at(arr, rs + 5 + klen)
    deleted = ops == OP_DELETE
    bad = np.where(deleted, vlen != -1, vlen < 0)  # Spark: assert(-1) / NegativeArraySize
    if bad.any():
        at = int(rs[np.argmax(bad)])
        raise CorruptFileError(
            f"invalid value size {int(vlen[np.argmax(bad)])} in the record at byte {at}", path
        )
    keys, values = _extract(raw, rs, rs + 5, klen, vlen, end, deleted)
    return RecordBatch(ops, keys, values, lineage, version)


def _read_java_utf(raw: bytes | memoryview, pos: int) -> tuple[str, int] | None:
    """``DataInputStream.readUTF`` at ``pos``: (text, next position), or None where Java throws
    EOFException or UTFDataFormatException (Spark's version detection catches both)."""
    if pos + 2 > len(raw):
        return None
    n = (raw[pos] << 8) | raw[pos + 1]
    data = bytes(raw[pos + 2 : pos + 2 + n])
    if len(data) < n:
        return None
    units: list[int] = []
    i = 0
    while i < n:  # only header strings: short
        unit, size = _utf_unit(data, i)
        if not size:
            return None
        units.append(unit)
        i += size
    text = struct.pack(f"<{len(units)}H", *units).decode("utf-16-le", "surrogatepass")
    return text, pos + 2 + n


def _utf_unit(data: bytes, i: int) -> tuple[int, int]:
    """The UTF-16 unit whose modified UTF-8 form starts at ``data[i]`` and that form's length;
    length 0 where ``readUTF`` throws UTFDataFormatException."""
    c = data[i]
    if c < 0x80:
        return c, 1
    if c >> 5 == 0b110:
        if i + 2 > len(data) or data[i + 1] & 0xC0 != 0x80:
            return 0, 0
        return ((c & 0x1F) << 6) | (data[i + 1] & 0x3F), 2
    if c >> 4 == 0b1110:
        if i + 3 > len(data) or data[i + 1] & 0xC0 != 0x80 or data[i + 2] & 0xC0 != 0x80:
            return 0, 0
        return ((c & 0x0F) << 12) | ((data[i + 1] & 0x3F) << 6) | (data[i + 2] & 0x3F), 3
    return 0, 0


def _java_short(text: str) -> int | None:
    """``Short.parseShort`` (decimal), or None where it throws NumberFormatException."""
    digits = text[1:] if text[:1] in ("+", "-") else text
    if not digits or not all(ch.isdecimal() for ch in digits):
        return None
    value = int(text)
    return value if -(1 << 15) <= value < 1 << 15 else None


def changelog_version(
    raw: bytes | memoryview, path: str | None = None
) -> tuple[int, int, list[dict] | None]:
    """(version, body start, lineage), decided like ``StateStoreChangelogReaderFactory``.

    Spark reads one ``readUTF``: EOF, malformed modified UTF-8, a string not starting with
    ``v`` or a non-number after it all mean v1 (read from the first byte). Otherwise the number
    is the version (only 1-4 exist); the v2-v4 readers re-read the string and insist that it is
    exactly ``v<n>``, and v3/v4 then read the lineage JSON with a second ``readUTF``.
    """
    head = _read_java_utf(raw, 0)
    if head is None or not head[0].startswith("v"):
        return 1, 0, None
    tag, pos = head
    version = _java_short(tag[1:])
    if version is None or version == 1:
        return 1, 0, None
    if version not in CHANGELOG_VERSIONS:
        raise UnsupportedError(f"changelog format version {version} (statectl reads v1-v4)", path)
    if tag != f"v{version}":
        raise CorruptFileError(f"changelog header {tag!r} is not 'v{version}'", path)
    if version == 2:
        return 2, pos, None
    lineage, start = _read_lineage(raw, pos, version, path)
    return version, start, lineage


def _read_lineage(
    raw: bytes | memoryview, pos: int, version: int, path: str | None
) -> tuple[list[dict], int]:
    """The lineage JSON of a v3/v4 changelog header at ``pos``, and where the body starts."""
    text = _read_java_utf(raw, pos)
    if text is None:
        raise CorruptFileError(f"changelog v{version}: truncated or malformed lineage", path)
    try:
        lineage = json.loads(text[0])
    except json.JSONDecodeError:
        raise CorruptFileError(f"changelog v{version}: lineage is not JSON", path) from None
    if not isinstance(lineage, list) or not all(isinstance(e, dict) for e in lineage):
        raise CorruptFileError(
            f"changelog v{version}: lineage is not a JSON array of objects", path
        )
    return lineage, text[1]


def parse_changelog(raw: bytes | memoryview, path: str | None = None) -> RecordBatch:
    """A RocksDB ``.changelog`` (after the codec stream), any of versions 1-4."""
    version, start, lineage = changelog_version(raw, path)
    if version in (1, 3):
        return parse_state_records(raw, path, start=start, lineage=lineage, version=version)
    return _parse_typed(raw, start, path, lineage, version)


# -- writing ----------------------------------------------------------------------------------
BinaryLike: TypeAlias = pa.Array | pa.ChunkedArray | Sequence[bytes | None]


def _large_binary(a: BinaryLike) -> pa.LargeBinaryArray:
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


def _interleave(pieces: list[tuple[pa.LargeBinaryArray, np.ndarray]], tail: bytes) -> bytes:
    """Concatenate, for each record i, ``piece[j][idx_j[i]]`` for every piece j in order, then
    ``tail``; one Arrow take does the copying."""
    n = len(pieces[0][1])
    arrays = [p for p, _ in pieces] + [pa.array([tail], pa.large_binary())]
    base = np.cumsum([0] + [len(a) for a in arrays])
    order = np.empty(len(pieces) * n + 1, dtype=np.int64)
    for j, (_, idx) in enumerate(pieces):
        order[j : len(order) - 1 : len(pieces)] = base[j] + idx
    order[-1] = base[-2]
    taken = pa.concat_arrays(arrays).take(pa.array(order))
    offsets = np.frombuffer(taken.buffers()[1], dtype=np.int64)
    data = taken.buffers()[2]
    return data[int(offsets[0]) : int(offsets[-1])].to_pybytes()


def _prepare(
    keys: BinaryLike, values: BinaryLike, deletes: np.ndarray | Sequence[bool] | None
) -> tuple[pa.LargeBinaryArray, pa.LargeBinaryArray, np.ndarray]:
    keys = _large_binary(keys)
    values = _large_binary(values)
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
    keys, values, deleted = _prepare(keys, values, deletes)
    n = len(keys)
    if n == 0:
        return b"\xff\xff\xff\xff"
    p = len(prefix)
    klen = _lengths(keys) + p
    vlen = np.where(deleted, -1, _lengths(values) + p)
    ints = _fixed(_be32_rows(np.stack([klen, vlen], axis=1).reshape(-1)))
    ar = np.arange(n, dtype=np.int64)
    vidx = np.where(deleted, n, ar)  # a removal takes the empty element appended below
    vals = pa.concat_arrays([values.fill_null(b""), pa.array([b""], pa.large_binary())])
    pieces = [(ints, 2 * ar), (keys, ar), (ints, 2 * ar + 1), (vals, vidx)]
    if p:
        pre = pa.array([prefix, b""], pa.large_binary())
        pieces.insert(1, (pre, np.zeros(n, dtype=np.int64)))
        pieces.insert(4, (pre, deleted.astype(np.int64)))
    return _interleave(pieces, b"\xff\xff\xff\xff")


# -- replay -----------------------------------------------------------------------------------
def last_writer_wins(
    batches: list[RecordBatch], merge_delimiter: bytes = b"", unique: bool = False
) -> tuple[pa.LargeBinaryArray, pa.LargeBinaryArray]:
    """Apply batches in order (snapshot first): the live keys and their final values, ordered
    by each key's last record.

    Vectorized for puts and deletes: dictionary-encode all keys, keep each key's last record,
    drop removals. Delete-range records become deletes of every known key in ``[begin, end)``
    (bytewise, like RocksDB's comparator). Keys with MERGE records (list state) are resolved in
    a loop: the value after the last put (none after a delete), then each operand appended
    with ``merge_delimiter`` between, as RocksDB's StringAppendOperator does.
    ``unique=True`` promises that a single all-put batch has no repeated key (a snapshot).
    """
    keys, values, _ = replay(batches, merge_delimiter, unique)
    return keys, values


def replay(
    batches: list[RecordBatch], merge_delimiter: bytes = b"", unique: bool = False
) -> tuple[pa.LargeBinaryArray, pa.LargeBinaryArray, np.ndarray]:
    """:func:`last_writer_wins` plus, per live key, the index of its last record in the
    concatenated batches (what a bounded replay orders its output by)."""
    batches = [b for b in batches if len(b)]
    if not batches:
        return _EMPTY, _EMPTY, np.zeros(0, dtype=np.int64)
    if unique and len(batches) == 1 and not batches[0].ops.any():
        return batches[0].keys, batches[0].values, np.arange(len(batches[0]), dtype=np.int64)
    keys, values, ops = _concat_batches(batches)
    uniq, ev = _key_events(keys, values, ops)
    final = _last_events(ev, len(uniq))
    merge_kids = np.unique(ev.kid[ev.op == OP_MERGE])
    if len(merge_kids) == 0:
        final = final[ev.op[final] == OP_PUT]
        rows = pa.array(ev.row[final])
        return keys.take(rows), values.take(rows), ev.row[final]
    return _replay_merges(ev, final, merge_kids, uniq, values, merge_delimiter)


def _concat_batches(
    batches: list[RecordBatch],
) -> tuple[pa.LargeBinaryArray, pa.LargeBinaryArray, np.ndarray]:
    keys = _concat([b.keys for b in batches])
    values = _concat([b.values for b in batches])
    return keys, values, np.concatenate([b.ops for b in batches]).astype(np.uint8, copy=False)


def _last_events(ev: _Events, n_keys: int) -> np.ndarray:
    """The last event of every key, in event order."""
    last = np.full(n_keys, -1, dtype=np.int64)
    np.maximum.at(last, ev.kid, np.arange(len(ev.row), dtype=np.int64))
    return np.sort(last[last >= 0])


def _key_events(
    keys: pa.LargeBinaryArray, values: pa.LargeBinaryArray, ops: np.ndarray
) -> tuple[pa.Array, _Events]:
    """The distinct keys, and the records as events on their ids. Delete-range rows turn into
    deletes of the keys they cover."""
    encoded = pc.dictionary_encode(keys)
    uniq = encoded.dictionary
    kid = np.asarray(encoded.indices.to_numpy(zero_copy_only=False), dtype=np.int64)
    ev_row, ev_kid, ev_op = np.arange(len(ops), dtype=np.int64), kid, ops
    ranges = np.flatnonzero(ops == OP_DELETE_RANGE)
    if len(ranges):
        ev_row, ev_kid, ev_op = _expand_ranges(ranges, keys, values, uniq, ev_row, kid, ops)
    return uniq, _Events(ev_row, ev_kid, ev_op)


@dataclass(frozen=True)
class _Events:
    """The replayed records: (row in the concatenated batches, key id, op) per event."""

    row: np.ndarray
    kid: np.ndarray
    op: np.ndarray


def _replay_merges(
    ev: _Events,
    final: np.ndarray,
    merge_kids: np.ndarray,
    uniq: pa.Array,
    values: pa.LargeBinaryArray,
    merge_delimiter: bytes,
) -> tuple[pa.LargeBinaryArray, pa.LargeBinaryArray, np.ndarray]:
    """:func:`replay`'s result when some keys have merge records: their values are combined
    from their records (``_resolve_merges``), the other keys' are their last put."""
    ev_row, ev_kid, ev_op = ev.row, ev.kid, ev.op
    merged = _resolve_merges(merge_kids, ev_row, ev_kid, ev_op, values, merge_delimiter)
    is_merge_key = np.zeros(len(uniq), dtype=bool)
    is_merge_key[merge_kids] = True
    out_kid = ev_kid[final]
    plain = ~is_merge_key[out_kid]
    live = np.where(plain, ev_op[final] == OP_PUT, False)
    merged_values: list[bytes | None] = [merged.get(int(k)) for k in out_kid[~plain]]
    live[~plain] = [v is not None for v in merged_values]
    # Final values: plain rows from ``values``, merged rows from the list, in ``final`` order.
    plain_vals = values.take(pa.array(ev_row[final[plain & live]]))
    merge_vals = pa.array([v for v in merged_values if v is not None], pa.large_binary())
    both = pa.concat_arrays([plain_vals, merge_vals])
    slot = np.empty(int(live.sum()), dtype=np.int64)
    live_plain = plain[live]
    slot[live_plain] = np.arange(int(live_plain.sum()))
    slot[~live_plain] = len(plain_vals) + np.arange(int((~live_plain).sum()))
    return uniq.take(pa.array(out_kid[live])), both.take(pa.array(slot)), ev_row[final[live]]


def _concat(arrays: list[pa.Array]) -> pa.LargeBinaryArray:
    arrays = [_large_binary(a) for a in arrays]
    return arrays[0] if len(arrays) == 1 else pa.concat_arrays(arrays)


def _expand_ranges(
    ranges: np.ndarray,
    keys: pa.LargeBinaryArray,
    values: pa.LargeBinaryArray,
    uniq: pa.Array,
    ev_row: np.ndarray,
    kid: np.ndarray,
    ops: np.ndarray,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Replace each delete-range row by deletes of every key id in ``[begin, end)``."""
    rows = [ev_row[ops != OP_DELETE_RANGE]]
    kids = [kid[ops != OP_DELETE_RANGE]]
    kinds = [ops[ops != OP_DELETE_RANGE]]
    for r in ranges.tolist():  # delete-range records are rare (a loop per record, not per key)
        begin = keys[r]
        end = values[r]
        covered = pc.and_(pc.greater_equal(uniq, begin), pc.less(uniq, end))
        ids = np.flatnonzero(np.asarray(covered.to_numpy(zero_copy_only=False), dtype=bool))
        rows.append(np.full(len(ids), r, dtype=np.int64))
        kids.append(ids.astype(np.int64))
        kinds.append(np.full(len(ids), OP_DELETE, dtype=np.uint8))
    ev_row = np.concatenate(rows)
    order = np.argsort(ev_row, kind="stable")
    return ev_row[order], np.concatenate(kids)[order], np.concatenate(kinds)[order]


def _resolve_merges(
    merge_kids: np.ndarray,
    ev_row: np.ndarray,
    ev_kid: np.ndarray,
    ev_op: np.ndarray,
    values: pa.LargeBinaryArray,
    delimiter: bytes,
) -> dict[int, bytes | None]:
    """Final value of every key with merges (None = absent): a loop over those keys' events."""
    sel = np.flatnonzero(np.isin(ev_kid, merge_kids))
    row_vals = values.take(pa.array(ev_row[sel])).to_pylist()
    state: dict[int, bytes | None] = {}
    for k, op, v in zip(ev_kid[sel].tolist(), ev_op[sel].tolist(), row_vals, strict=True):
        if op == OP_PUT:
            state[k] = v
        elif op == OP_MERGE:
            cur = state.get(k)
            state[k] = v if cur is None else cur + delimiter + v
        else:
            state[k] = None
    return state

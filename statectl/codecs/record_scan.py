"""Record boundaries in Spark's state record streams, and the vectorized copy of their keys
and values (the two stream layouts are described in :mod:`statectl.codecs.records`).

Finding record boundaries is the only sequential step. A constant record stride is detected and
verified vectorially; otherwise a tight loop collects the record starts only. Everything else is
vectorized: lengths are read at all record starts at once, and keys and values are copied out by
Arrow's ``take`` over a zero-copy "segments" view of the buffer (every record split into header,
key, length and value segments), so no Python code touches a row.
"""

from __future__ import annotations

import struct

import numpy as np
import pyarrow as pa
from numpy.lib.stride_tricks import as_strided

from statectl.codecs.unaligned import loads
from statectl.errors import CorruptFileError

TYPE_EOF, TYPE_PUT, TYPE_DELETE, TYPE_MERGE, TYPE_DELETE_RANGE = 0x00, 0x01, 0x10, 0x11, 0x20
_INT = struct.Struct(">i")
EMPTY = pa.array([], type=pa.large_binary())


# -- reading: vectorized helpers ---------------------------------------------------------------
def be32_at(arr: np.ndarray, pos: np.ndarray) -> np.ndarray:
    """Big-endian int32 at every position (all ``pos + 4 <= len(arr)``), as int64."""
    if len(pos) == 0:
        return np.zeros(0, dtype=np.int64)
    return loads(arr, ">i4")[pos].astype(np.int64)


def _segments(raw: bytes | memoryview, bounds: np.ndarray) -> pa.LargeBinaryArray:
    """A zero-copy binary array whose element j is ``raw[bounds[j]:bounds[j+1]]``."""
    return pa.LargeBinaryArray.from_buffers(
        pa.large_binary(), len(bounds) - 1, [None, pa.py_buffer(bounds), pa.py_buffer(raw)]
    )


def extract_records(
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
        return EMPTY, EMPTY
    if null_values is None or not null_values.any():
        runs = _strided_copy(raw, rs, ks, klen, end)
        if runs is not None:
            return runs
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


_MIN_STRIDED_RUN = 64  # records per run on average, below which Arrow's take is cheaper


def _strided_copy(
    raw: bytes | memoryview, rs: np.ndarray, ks: np.ndarray, klen: np.ndarray, end: int
) -> tuple[pa.LargeBinaryArray, pa.LargeBinaryArray] | None:
    """:func:`extract_records` (no null values) by runs of records of one key and one value
    size: such a run is evenly spaced, so its keys (and values) are a strided 2-D view of the
    buffer, copied into place by numpy (2-3x faster than Arrow's take of each segment). None
    when runs are too short on average to pay off."""
    n = len(rs)
    nxt = np.empty(n, dtype=np.int64)
    nxt[:-1] = rs[1:]
    nxt[-1] = end
    vstart = ks + klen + 4
    vlen = nxt - vstart
    change = np.flatnonzero((klen[1:] != klen[:-1]) | (vlen[1:] != vlen[:-1])) + 1
    if (len(change) + 1) * _MIN_STRIDED_RUN > n or int(klen.min()) < 0 or int(vlen.min()) < 0:
        return None
    arr = np.frombuffer(raw, dtype=np.uint8)
    # The strided views read unchecked: every record must lie in the buffer, its key a fixed
    # header size in (so a run's records are evenly spaced); else Arrow's checked take.
    head = ks - rs
    if end > len(arr) or int(rs[0]) < 0 or (head != head[0]).any() or (head < 0).any():
        return None
    firsts = np.concatenate([[0], change]).tolist()
    lasts = [*change.tolist(), n]
    keys = _copy_runs(arr, ks, klen, firsts, lasts)
    values = _copy_runs(arr, vstart, vlen, firsts, lasts)
    return keys, values


def _copy_runs(
    arr: np.ndarray, starts: np.ndarray, lengths: np.ndarray, firsts: list[int], lasts: list[int]
) -> pa.LargeBinaryArray:
    """Binary elements ``arr[starts[i] : starts[i] + lengths[i]]``, evenly spaced within each
    run ``firsts[r]:lasts[r]`` of one length."""
    offsets = np.empty(len(starts) + 1, dtype=np.int64)
    offsets[0] = 0
    np.cumsum(lengths, out=offsets[1:])
    data = np.empty(int(offsets[-1]), dtype=np.uint8)
    for i, j in zip(firsts, lasts, strict=True):
        width = int(lengths[i])
        if not width:
            continue
        count = j - i
        step = int(starts[i + 1] - starts[i]) if count > 1 else 0
        src = as_strided(arr[int(starts[i]) :], (count, width), (step, 1), writeable=False)
        data[int(offsets[i]) : int(offsets[j])].reshape(count, width)[...] = src
    return pa.LargeBinaryArray.from_buffers(
        pa.large_binary(), len(starts), [None, pa.py_buffer(offsets), pa.py_buffer(data)]
    )


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
    if not (be32_at(arr, rs + _KOFF[typed]) == klen).all():
        return None
    if not (be32_at(arr, rs + head + klen) == vlen).all():
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


def scan_records(
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
        raise_truncated(len(raw), pos, starts, path)
    return starts, sizes, pos, False


def _speculate(
    raw: bytes | memoryview, arr: np.ndarray, pos: int, typed: bool, sizes: list[tuple[int, int]]
) -> tuple[np.ndarray, int]:
    """Records from ``pos`` found by guessing one length constant: (verified starts, where the
    exact scan must resume). Returns no records when the probe shows no constant length."""
    koff, head = _KOFF[typed], _HEAD[typed]
    vsizes = {v for _, v in sizes}
    ksizes = {k for k, _ in sizes}
    strided = np.zeros(0, dtype=np.int64)
    if len(vsizes) == 1 and min(vsizes) >= 0:
        (value,) = vsizes
        if not typed:
            strided, pos = stride_runs_v1(arr, pos, value)
        found, stop = (_guess_value_typed if typed else _guess_value_v1)(raw, pos, head + 4 + value)
        rs = np.array(found, dtype=np.int64)
        klen = be32_at(arr, rs + koff)
        vpos = rs + head + klen
        ok = vpos + 4 <= len(arr)
        ok[ok] = be32_at(arr, vpos[ok]) == value
    elif len(ksizes) == 1:
        (key,) = ksizes
        found, stop = (_guess_key_typed if typed else _guess_key_v1)(raw, pos, key, len(arr))
        rs = np.array(found, dtype=np.int64)
        ok = be32_at(arr, rs + koff) == key
    else:
        return np.zeros(0, dtype=np.int64), pos
    if ok.all():
        return np.concatenate([strided, rs]), stop
    bad = int(np.argmin(ok))
    return np.concatenate([strided, rs[:bad]]), int(rs[bad])


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
        raise_truncated(len(raw), pos, starts, path)
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
        raise_truncated(len(raw), pos, starts, path)
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


def raise_truncated(size: int, pos: int, starts: list[int], path: str | None) -> None:
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


def scan_window_v1(
    raw: bytes, pos: int, base: int, path: str | None
) -> tuple[np.ndarray, int, bool]:
    """Starts of the complete v1 records in ``raw`` from ``pos``: (starts, where the first
    incomplete record or the end marker is, whether it is the end marker).

    As :func:`scan_records`, cheaper by speculation: when the first records share their value size,
    a loop reading only key lengths runs ahead and one vectorized check confirms every record
    it found (complete in the window, value length as guessed); the exact loop takes over
    where the guess first fails, so the result is always the exact loop's."""
    probe, pos, ended = _window_exact(raw, pos, base, path, _PROBE)
    if ended or len(probe) < _PROBE:
        return probe, pos, ended
    arr = np.frombuffer(raw, dtype=np.uint8)
    vsizes = be32_at(arr, probe + 4 + be32_at(arr, probe))
    run = np.zeros(0, dtype=np.int64)
    if (vsizes == vsizes[0]).all() and vsizes[0] >= 0:
        value = int(vsizes[0])
        strided, pos = stride_runs_v1(arr, pos, value)
        found, _ = _guess_value_v1(raw, pos, 8 + value)
        run = _complete_v1(arr, np.array(found, dtype=np.int64), value)
        if len(run):
            pos = int(run[-1]) + 8 + int(be32_at(arr, run[-1:])[0]) + value
        run = np.concatenate([strided, run])
    rest, pos, ended = _window_exact(raw, pos, base, path, None)
    return np.concatenate([probe, run, rest]), pos, ended


_STRIDE_BLOCK = 1024  # candidates verified at once
_STRIDE_MIN_RUN = 64  # runs shorter than this on average: the loop is cheaper


def stride_runs_v1(arr: np.ndarray, pos: int, value: int) -> tuple[np.ndarray, int]:
    """Complete v1 records from ``pos`` whose value size is ``value``, found a block at a
    time by guessing that each record has the key size of the one before (issue 27: string
    keys of one padded length but a few, behind fixed-size aggregation values; one verified
    numpy pass per run instead of a Python step per record): (their starts, the position
    after them). Every start is verified (key size as guessed, value size ``value``, complete
    in ``arr``), so the result is the exact loop's prefix; it stops at the first record that
    breaks the pattern, or once runs average under ``_STRIDE_MIN_RUN`` records."""
    n = len(arr)
    # Big-endian int32 views at each byte offset mod 4: a record stride that is a multiple
    # of 4 reads every candidate's sizes as a strided slice, no gather.
    views = [np.frombuffer(arr[a : a + 4 * ((n - a) // 4)], dtype=">i4") for a in range(4)]
    found: list[np.ndarray] = []
    runs = records = 0
    while pos + 8 <= n:
        key = int(views[pos % 4][pos // 4])
        stride = 8 + key + value
        if key < 0 or stride % 4 or pos + stride > n:
            break
        vat = pos + 4 + key
        if int(views[vat % 4][vat // 4]) != value:
            break
        count = min(_STRIDE_BLOCK, (n - pos) // stride)
        step = stride // 4
        keys = views[pos % 4][pos // 4 :: step][:count]
        vals = views[vat % 4][vat // 4 :: step][:count]
        ok = (keys == key) & (vals == value)
        good = count if bool(ok.all()) else int(np.argmin(ok))
        found.append(pos + stride * np.arange(good, dtype=np.int64))
        pos += stride * good
        runs, records = runs + 1, records + good
        if runs >= 8 and records < _STRIDE_MIN_RUN * runs:
            break
    return (np.concatenate(found) if found else np.zeros(0, dtype=np.int64)), pos


def _complete_v1(arr: np.ndarray, rs: np.ndarray, value: int) -> np.ndarray:
    """The leading records of guessed starts ``rs`` that are complete in ``arr`` and have the
    guessed value length (every start has its 4-byte key length in ``arr``)."""
    if not len(rs):
        return rs
    n = len(arr)
    vpos = rs + 4 + be32_at(arr, rs)
    ok = (vpos + 4 + value) <= n
    ok[ok] = be32_at(arr, vpos[ok]) == value
    if ok.all():
        return rs
    return rs[: int(np.argmin(ok))]


def _window_exact(
    raw: bytes, pos: int, base: int, path: str | None, limit: int | None
) -> tuple[np.ndarray, int, bool]:
    """:func:`scan_window_v1`'s exact loop, for at most ``limit`` records (None: to the end)."""
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

"""Spark's ``Murmur3Hash`` (x86_32, seed 42) over Arrow columns, and state partition placement.

A stateful operator keeps a key in partition ``pmod(hash(key columns), N)`` (``HashPartitioning``
of ``StatefulOpClusteredDistribution``). ``hash`` folds the columns left to right, each hashed
with the running hash as its seed; a null leaves the running hash unchanged. Per type (catalyst
``HashExpression``/``Murmur3HashFunction``): boolean/byte/short/int/date -> ``hashInt``;
long/timestamp/day-time interval -> ``hashLong``; float/double -> the bits, with -0.0 as 0.0 and
Java's canonical NaN; string/binary -> ``hashUnsafeBytes``; decimal -> ``hashLong(unscaled)`` if
the *declared* precision is <= 18, else ``hashUnsafeBytes(BigInteger.toByteArray(unscaled))``;
struct/array/map -> fold over fields / elements / key0, value0, key1, ...

Every row is hashed at once with uint32 numpy arithmetic. Byte strings go word by word across
all rows (a loop over word positions, not rows; rows sorted by length so that each step works
on a prefix), and so do the elements of arrays and maps.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeAlias

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from statectl.codecs.unaligned import loads, loads_at
from statectl.errors import UnsupportedError

C1 = np.uint32(0xCC9E2D51)
C2 = np.uint32(0x1B873593)
SEED = 42
MAX_LONG_DIGITS = 18  # Decimal.MAX_LONG_DIGITS: larger declared precisions hash the bytes
_FLOAT_NAN = np.uint32(0x7FC00000)  # Float.floatToIntBits(NaN)
_DOUBLE_NAN = np.uint64(0x7FF8000000000000)  # Double.doubleToLongBits(NaN)

Columns: TypeAlias = pa.StructArray | pa.Table | pa.RecordBatch | list[pa.Array | pa.ChunkedArray]


# -- the hash primitives (uint32 arrays; numpy wraps on overflow) --------------------------------
def _rotl(x: np.ndarray, r: int) -> np.ndarray:
    return (x << np.uint32(r)) | (x >> np.uint32(32 - r))


def _mix_k1(k: np.ndarray) -> np.ndarray:
    return _rotl(k * C1, 15) * C2


def _mix_h1(h: np.ndarray, k: np.ndarray) -> np.ndarray:
    return _rotl(h ^ k, 13) * np.uint32(5) + np.uint32(0xE6546B64)


def _mix_word(h: np.ndarray, k: np.ndarray) -> None:
    """``h = _mix_h1(h, _mix_k1(k))`` in place (``k`` a fresh array, overwritten): the word
    loop of :func:`hash_bytes` runs once per 4 bytes of the longest key, so temporaries count."""
    k *= C1
    r = k >> np.uint32(17)
    k <<= np.uint32(15)
    k |= r
    k *= C2
    h ^= k
    np.right_shift(h, np.uint32(19), out=r)
    h <<= np.uint32(13)
    h |= r
    h *= np.uint32(5)
    h += np.uint32(0xE6546B64)


def _fmix(h: np.ndarray, length: np.ndarray | int) -> np.ndarray:
    h = h ^ np.asarray(length).astype(np.uint32)
    h = h ^ (h >> np.uint32(16))
    h = h * np.uint32(0x85EBCA6B)
    h = h ^ (h >> np.uint32(13))
    h = h * np.uint32(0xC2B2AE35)
    return h ^ (h >> np.uint32(16))


def hash_int(v: np.ndarray, seed: np.ndarray) -> np.ndarray:
    """``Murmur3_x86_32.hashInt`` of int32 values (any integer dtype, taken modulo 2**32)."""
    with np.errstate(over="ignore"):
        return _fmix(_mix_h1(seed, _mix_k1(v.astype(np.uint32))), 4)


def hash_long(v: np.ndarray, seed: np.ndarray) -> np.ndarray:
    """``Murmur3_x86_32.hashLong``: the low word, then the high word."""
    u = v.astype(np.int64).view(np.uint64)
    low = (u & np.uint64(0xFFFFFFFF)).astype(np.uint32)
    high = (u >> np.uint64(32)).astype(np.uint32)
    with np.errstate(over="ignore"):
        return _fmix(_mix_h1(_mix_h1(seed, _mix_k1(low)), _mix_k1(high)), 8)


def hash_bytes(arr: pa.Array, seed: np.ndarray) -> np.ndarray:
    """``Murmur3_x86_32.hashUnsafeBytes`` of every element of a binary/string array: the
    aligned 4-byte little-endian words, then each remaining byte as a *signed* int (Spark's
    legacy tail handling, not standard Murmur3), then ``fmix`` with the byte length."""
    arr = _as_large_binary(arr)
    n = len(arr)
    offsets = np.frombuffer(arr.buffers()[1], dtype=np.int64)[arr.offset : arr.offset + n + 1]
    data_buf = arr.buffers()[2]
    data = (
        np.frombuffer(data_buf, dtype=np.uint8) if data_buf is not None else np.zeros(0, np.uint8)
    )
    starts = offsets[:-1]
    lengths = offsets[1:] - starts
    words = lengths >> 2
    h = seed.astype(np.uint32, copy=True)
    with np.errstate(over="ignore"):
        max_words = int(words.max(initial=0))
        if max_words:
            words_at = loads(data, "<u4")
            if int(words.min()) == max_words:  # equal word counts: every row every step
                for w in range(max_words):
                    _mix_word(h, words_at[starts + 4 * w])
            else:  # longest first, so the rows still going at word w are a prefix
                order = np.argsort(-words, kind="stable")
                hs, st = h[order], starts[order]
                live = n - np.cumsum(np.bincount(words, minlength=max_words + 1))
                for w in range(max_words):
                    m = int(live[w])
                    _mix_word(hs[:m], words_at[st[:m] + 4 * w])
                h[order] = hs
        tail = lengths & 3
        if tail.any():
            # Every row's tail bytes in one load of the 4 bytes they start (bytes past a row
            # are never mixed), then each byte position mixed into the rows that have it:
            # gathers of the rows that have a byte, and their scatter back, were half the
            # hash of 5M short strings.
            tail_word = loads_at(data, "<u4", starts + 4 * words)
            for t in range(3):
                has = tail > t
                if not has.any():
                    break
                byte = (tail_word >> np.uint32(8 * t)).astype(np.uint8).view(np.int8)
                mixed = _mix_h1(h, _mix_k1(byte.astype(np.int32).view(np.uint32)))
                h = np.where(has, mixed, h)
        return _fmix(h, lengths)


# -- column dispatch ------------------------------------------------------------------------------
def _as_large_binary(arr: pa.Array) -> pa.Array:
    t = arr.type
    if pa.types.is_large_binary(t):
        return arr
    if pa.types.is_large_string(t):
        return arr.view(pa.large_binary())
    if pa.types.is_string(t) or pa.types.is_string_view(t):
        return arr.cast(pa.large_string()).view(pa.large_binary())
    return arr.cast(pa.large_binary())


def _valid(arr: pa.Array) -> np.ndarray | None:
    """Row validity as bools, or None when no row is null."""
    if arr.null_count == 0:
        return None
    return np.asarray(arr.is_valid().to_numpy(zero_copy_only=False), dtype=bool)


def _fixed_values(arr: pa.Array, dtype: type) -> np.ndarray:
    """The values buffer of a fixed-width array, zero-copy (values under nulls are garbage)."""
    width = np.dtype(dtype).itemsize
    buf = arr.buffers()[1]
    return np.frombuffer(buf, dtype=dtype, count=len(arr), offset=arr.offset * width)


def hash_column(arr: pa.Array | pa.ChunkedArray, seed: np.ndarray) -> np.ndarray:
    """Fold one column into the running hash ``seed`` (uint32 per row); nulls keep the seed."""
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks()
    if pa.types.is_dictionary(arr.type):
        arr = arr.dictionary_decode()
    seed = np.asarray(seed, dtype=np.uint32)
    if len(arr) == 0 or pa.types.is_null(arr.type):
        return seed.copy()
    valid = _valid(arr)
    h = _hash_values(arr, seed)
    return h if valid is None else np.where(valid, h, seed)


def _hash_values(arr: pa.Array, seed: np.ndarray) -> np.ndarray:
    """The hash of every row as if none were null (the caller restores nulls)."""
    for matches, hash_of in _HASHERS:
        if matches(arr.type):
            return hash_of(arr, seed)
    raise UnsupportedError(f"cannot compute Spark's hash of Arrow type {arr.type}")


def _hash_boolean(arr: pa.Array, seed: np.ndarray) -> np.ndarray:
    return hash_int(np.asarray(arr.fill_null(False).to_numpy(zero_copy_only=False)), seed)


def _hash_small_int(arr: pa.Array, seed: np.ndarray) -> np.ndarray:
    """byte, short, int: hashed as Spark's int."""
    return hash_int(_fixed_values(arr, arr.type.to_pandas_dtype()), seed)


def _hash_date(arr: pa.Array, seed: np.ndarray) -> np.ndarray:
    """Days since the epoch, an int (a date64 is made a date32 first)."""
    if pa.types.is_date64(arr.type):
        arr = arr.cast(pa.date32())
    return hash_int(_fixed_values(arr, np.int32), seed)


def _hash_long(arr: pa.Array, seed: np.ndarray) -> np.ndarray:
    return hash_long(_fixed_values(arr, np.int64), seed)


def _hash_micros(arr: pa.Array, seed: np.ndarray) -> np.ndarray:
    """Timestamps (Spark keeps microseconds since the epoch, UTC) and durations
    (DayTimeIntervalType: microseconds): a long of microseconds."""
    t = arr.type
    if t.unit != "us":
        target = pa.timestamp("us", t.tz) if pa.types.is_timestamp(t) else pa.duration("us")
        arr = pc.cast(arr, target, safe=False)
    return hash_long(_fixed_values(arr, np.int64), seed)


def _hash_float(arr: pa.Array, seed: np.ndarray) -> np.ndarray:
    bits = _fixed_values(arr, np.float32).copy()
    bits[bits == 0] = 0.0  # -0.0f hashes as 0.0f
    bits = bits.view(np.uint32)
    bits[np.isnan(bits.view(np.float32))] = _FLOAT_NAN  # floatToIntBits canonical NaN
    return hash_int(bits, seed)


def _hash_double(arr: pa.Array, seed: np.ndarray) -> np.ndarray:
    bits = _fixed_values(arr, np.float64).copy()
    bits[bits == 0] = 0.0
    bits = bits.view(np.uint64)
    bits[np.isnan(bits.view(np.float64))] = _DOUBLE_NAN
    return hash_long(bits.view(np.int64), seed)


def _hash_struct(arr: pa.Array, seed: np.ndarray) -> np.ndarray:
    """Fields fold left: each field's hash seeds the next one's."""
    h = seed.copy()
    for i in range(arr.type.num_fields):
        h = hash_column(arr.field(i), h)
    return h


def _hash_map(arr: pa.Array, seed: np.ndarray) -> np.ndarray:
    return _hash_nested(arr, [arr.keys, arr.items], seed)


def _hash_list(arr: pa.Array, seed: np.ndarray) -> np.ndarray:
    if pa.types.is_fixed_size_list(arr.type):
        arr = arr.cast(pa.list_(arr.type.value_field))
    return _hash_nested(arr, [arr.values], seed)


def _any_of(*predicates: Callable[[pa.DataType], bool]) -> Callable[[pa.DataType], bool]:
    return lambda t: any(p(t) for p in predicates)


_T = pa.types
# Arrow types by Spark's hash of the values they hold, in the order tried.
_HASHERS: tuple[tuple[Callable[[pa.DataType], bool], Callable[..., np.ndarray]], ...] = (
    (_T.is_boolean, _hash_boolean),
    (_any_of(_T.is_int8, _T.is_int16, _T.is_int32), _hash_small_int),
    (_any_of(_T.is_date32, _T.is_date64), _hash_date),
    (_T.is_int64, _hash_long),
    (_any_of(_T.is_timestamp, _T.is_duration), _hash_micros),
    (_T.is_float32, _hash_float),
    (_T.is_float64, _hash_double),
    (
        _any_of(
            _T.is_string,
            _T.is_large_string,
            _T.is_string_view,
            _T.is_binary,
            _T.is_large_binary,
            _T.is_binary_view,
            _T.is_fixed_size_binary,
        ),
        lambda arr, seed: hash_bytes(arr, seed),
    ),
    (_T.is_decimal, lambda arr, seed: _hash_decimal(arr, seed)),
    (_T.is_struct, _hash_struct),
    (_T.is_map, _hash_map),
    (_any_of(_T.is_list, _T.is_large_list, _T.is_fixed_size_list), _hash_list),
)


def _hash_decimal(arr: pa.Array, seed: np.ndarray) -> np.ndarray:
    t = arr.type
    if t.precision > 38:
        raise UnsupportedError(f"decimal precision {t.precision} > 38 is not a Spark type")
    if not pa.types.is_decimal128(t):
        arr = arr.cast(pa.decimal128(t.precision, t.scale))
    words = np.frombuffer(arr.buffers()[1], dtype="<i8", count=2 * len(arr), offset=16 * arr.offset)
    low = words[0::2]
    if t.precision <= MAX_LONG_DIGITS:
        return hash_long(low, seed)  # Decimal.toUnscaledLong
    # BigInteger.toByteArray of the unscaled value: minimal big-endian two's complement, i.e.
    # the 16-byte big-endian form without the leading bytes that only repeat the sign.
    be = words.reshape(-1, 2)[:, ::-1].astype(">i8").view(np.uint8).reshape(-1, 16)
    sign = np.where(be[:, :1] >= 0x80, 0xFF, 0x00).astype(np.uint8)
    redundant = (be[:, :15] == sign) & ((be[:, 1:] >> 7) == (sign & 1))
    skip = np.where(redundant.all(axis=1), 15, np.argmin(redundant, axis=1))  # leading run
    lengths = 16 - skip
    keep = np.arange(16) >= skip[:, None]
    offsets = np.zeros(len(arr) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    blobs = pa.LargeBinaryArray.from_buffers(
        pa.large_binary(), len(arr), [None, pa.py_buffer(offsets), pa.py_buffer(be[keep])]
    )
    return hash_bytes(blobs, seed)


def _hash_nested(arr: pa.Array, children: list[pa.Array], seed: np.ndarray) -> np.ndarray:
    """Arrays fold over their elements, maps over key0, value0, key1, value1, ...: step j
    hashes element j of every row that has one (rows sorted by length, a prefix per step)."""
    n = len(arr)
    offsets = np.asarray(arr.offsets.to_numpy(zero_copy_only=False), dtype=np.int64)[: n + 1]
    lengths = offsets[1:] - offsets[:-1]
    valid = _valid(arr)
    if valid is not None:
        lengths = np.where(valid, lengths, 0)  # a null list's offsets may span anything
    max_len = int(lengths.max(initial=0))
    h = seed.copy()
    if max_len == 0:
        return h
    order = np.argsort(-lengths, kind="stable")
    live = n - np.cumsum(np.bincount(lengths, minlength=max_len + 1))
    hs, first = h[order], offsets[:-1][order]
    for j in range(max_len):
        m = int(live[j])
        idx = pa.array(first[:m] + j)
        for child in children:
            hs[:m] = hash_column(child.take(idx), hs[:m])
    h[order] = hs
    return h


# -- public API ----------------------------------------------------------------------------------
def _columns(columns: Columns) -> list[pa.Array]:
    if isinstance(columns, (pa.Table, pa.RecordBatch)):
        cols = list(columns.columns)
    elif isinstance(columns, pa.ChunkedArray) and pa.types.is_struct(columns.type):
        return _columns(columns.combine_chunks())
    elif isinstance(columns, pa.StructArray):
        cols = [columns.field(i) for i in range(columns.type.num_fields)]
    else:
        cols = list(columns)
    return [c.combine_chunks() if isinstance(c, pa.ChunkedArray) else c for c in cols]


def spark_hash(columns: Columns, seed: int = SEED) -> np.ndarray:
    """``hash(c1, c2, ...)`` as Spark computes it, for every row: int32.

    A struct array or table stands for its columns (the fields of a grouping key).
    """
    cols = _columns(columns)
    n = len(columns) if not cols else len(cols[0])
    if any(len(c) != n for c in cols):
        raise ValueError("columns of different lengths")
    h = np.full(n, seed & 0xFFFFFFFF, dtype=np.uint32)
    for c in cols:
        h = hash_column(c, h)
    return h.view(np.int32)


def partition_ids(keys: Columns, num_partitions: int) -> np.ndarray:
    """``pmod(hash(keys), n)``: the state partition Spark puts each key in (int32)."""
    return pmod(spark_hash(keys), num_partitions)


def pmod(hashes: np.ndarray, num_partitions: int) -> np.ndarray:
    """``pmod(hash, n)`` of :func:`spark_hash`'s values: one hash serves several partition
    counts (a migrate checks the source's placement and computes the target's)."""
    if num_partitions <= 0:
        raise ValueError(f"number of partitions must be positive, got {num_partitions}")
    return np.mod(hashes.astype(np.int64), num_partitions).astype(np.int32)

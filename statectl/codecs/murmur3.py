"""Spark's ``Murmur3Hash`` (x86_32, seed 42) over Arrow columns, and state partition placement.

A stateful operator's key lives in partition ``pmod(hash(key columns), N)``. Columns fold left
to right, each hashed with the running hash as its seed; a null leaves the hash unchanged;
structs and arrays fold over their fields/elements. All rows are hashed at once with uint32
numpy arithmetic; strings and binaries go word by word across all rows (a loop over word
positions, not over rows).
"""

from __future__ import annotations

import decimal

import numpy as np
import pyarrow as pa

from statectl.errors import UnsupportedError

C1 = np.uint32(0xCC9E2D51)
C2 = np.uint32(0x1B873593)
SEED = 42


def _rotl(x: np.ndarray, r: int) -> np.ndarray:
    return (x << np.uint32(r)) | (x >> np.uint32(32 - r))


def _mix_k1(k: np.ndarray) -> np.ndarray:
    return _rotl(k * C1, 15) * C2


def _mix_h1(h: np.ndarray, k: np.ndarray) -> np.ndarray:
    return _rotl(h ^ k, 13) * np.uint32(5) + np.uint32(0xE6546B64)


def _fmix(h: np.ndarray, length: np.ndarray | int) -> np.ndarray:
    h = h ^ np.asarray(length, dtype=np.uint32)
    h = h ^ (h >> np.uint32(16))
    h = h * np.uint32(0x85EBCA6B)
    h = h ^ (h >> np.uint32(13))
    h = h * np.uint32(0xC2B2AE35)
    return h ^ (h >> np.uint32(16))


def hash_int(v: np.ndarray, seed: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):
        return _fmix(_mix_h1(seed, _mix_k1(v.astype(np.int64).astype(np.uint32))), 4)


def hash_long(v: np.ndarray, seed: np.ndarray) -> np.ndarray:
    u = v.astype(np.int64).view(np.uint64)
    low = (u & np.uint64(0xFFFFFFFF)).astype(np.uint32)
    high = (u >> np.uint64(32)).astype(np.uint32)
    with np.errstate(over="ignore"):
        return _fmix(_mix_h1(_mix_h1(seed, _mix_k1(low)), _mix_k1(high)), 8)


def hash_bytes(arr: pa.Array, seed: np.ndarray) -> np.ndarray:
    """Spark's hashUnsafeBytes: aligned LE words, then each tail byte as a signed int."""
    arr = arr.cast(pa.large_binary())
    n = len(arr)
    _, off_buf, data_buf = arr.buffers()
    offsets = np.frombuffer(off_buf, dtype=np.int64)[arr.offset : arr.offset + n + 1]
    data = (
        np.frombuffer(data_buf, dtype=np.uint8) if data_buf is not None else np.zeros(0, np.uint8)
    )
    data = np.concatenate([data, np.zeros(8, np.uint8)])
    starts = offsets[:-1]
    lengths = np.diff(offsets)
    h = seed.copy()
    words = lengths // 4
    with np.errstate(over="ignore"):
        for w in range(int(words.max(initial=0))):
            live = words > w
            pos = starts[live] + 4 * w
            b = data[pos[:, None] + np.arange(4)].astype(np.uint32)
            k = b[:, 0] | (b[:, 1] << 8) | (b[:, 2] << 16) | (b[:, 3] << 24)
            h[live] = _mix_h1(h[live], _mix_k1(k))
        tail = lengths - words * 4
        for t in range(3):
            live = tail > t
            pos = starts[live] + words[live] * 4 + t
            k = data[pos].astype(np.int8).astype(np.int32).astype(np.uint32)
            h[live] = _mix_h1(h[live], _mix_k1(k))
        return _fmix(h, lengths.astype(np.uint32))


def _valid(arr: pa.Array) -> np.ndarray:
    if arr.null_count == 0:
        return np.ones(len(arr), dtype=bool)
    return np.asarray(arr.is_valid().to_numpy(zero_copy_only=False), dtype=bool)


def _fill(arr: pa.Array, dtype: np.dtype) -> np.ndarray:
    return np.asarray(arr.fill_null(0).to_numpy(zero_copy_only=False)).astype(dtype)


def hash_column(
    arr: pa.Array, seed: np.ndarray, declared_precision: int | None = None
) -> np.ndarray:
    """Fold one column into the running hash ``seed`` (uint32 per row); nulls keep the seed."""
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks()
    t = arr.type
    valid = _valid(arr)
    if pa.types.is_null(t):
        return seed
    if pa.types.is_boolean(t):
        h = hash_int(_fill(arr.cast(pa.int32()), np.int32), seed)
    elif pa.types.is_int8(t) or pa.types.is_int16(t) or pa.types.is_int32(t):
        h = hash_int(_fill(arr, np.int32), seed)
    elif pa.types.is_date32(t):
        h = hash_int(_fill(arr.cast(pa.int32()), np.int32), seed)
    elif pa.types.is_int64(t):
        h = hash_long(_fill(arr, np.int64), seed)
    elif pa.types.is_timestamp(t) or pa.types.is_duration(t):
        h = hash_long(_fill(arr.cast(pa.int64()), np.int64), seed)
    elif pa.types.is_float32(t):
        f = _fill(arr, np.float32)
        f = np.where(f == 0, np.float32(0), f)  # -0.0 hashes as 0.0
        h = hash_int(f.view(np.int32), seed)
    elif pa.types.is_float64(t):
        f = _fill(arr, np.float64)
        f = np.where(f == 0, 0.0, f)
        h = hash_long(f.view(np.int64), seed)
    elif pa.types.is_string(t) or pa.types.is_large_string(t):
        h = hash_bytes(arr.cast(pa.large_string()).cast(pa.large_binary()), seed)
    elif pa.types.is_binary(t) or pa.types.is_large_binary(t):
        h = hash_bytes(arr, seed)
    elif pa.types.is_decimal(t):
        h = _hash_decimal(arr, seed)
    elif pa.types.is_struct(t):
        h = seed.copy()
        for i in range(t.num_fields):
            child = arr.field(i)
            h = hash_column(child, h)
    elif pa.types.is_list(t) or pa.types.is_large_list(t):
        h = _hash_list(arr, seed)
    elif pa.types.is_map(t):
        h = _hash_map(arr, seed)
    else:
        raise UnsupportedError(f"cannot compute Spark's partition hash of Arrow type {t}")
    return np.where(valid, h, seed)


def _hash_decimal(arr: pa.Array, seed: np.ndarray) -> np.ndarray:
    t = arr.type
    words = np.frombuffer(arr.buffers()[1], dtype=np.int64)[
        2 * arr.offset : 2 * (arr.offset + len(arr))
    ]
    low = words[0::2]
    if t.precision <= 18:
        return hash_long(low, seed)
    # BigInteger.toByteArray of the unscaled value: minimal big-endian two's complement.
    out = seed.copy()
    ctx = decimal.Context(prec=100)  # the default 28 digits would round decimal(38, s)
    values = [None if v is None else int(v.scaleb(t.scale, context=ctx)) for v in arr.to_pylist()]
    blobs = [
        b"" if v is None else v.to_bytes((v.bit_length() + 8) // 8, "big", signed=True)
        for v in values
    ]
    hashed = hash_bytes(pa.array(blobs, pa.large_binary()), seed)
    valid = np.array([v is not None for v in values], dtype=bool)
    out[valid] = hashed[valid]
    return out


def _hash_list(arr: pa.Array, seed: np.ndarray) -> np.ndarray:
    """Fold over elements in order: element j of each row, for j up to the longest list."""
    offsets = np.asarray(arr.offsets.to_numpy(zero_copy_only=False), dtype=np.int64)
    values = arr.values
    lengths = np.diff(offsets)
    h = seed.copy()
    for j in range(int(lengths.max(initial=0))):
        live = np.nonzero(lengths > j)[0]
        elems = values.take(pa.array(offsets[live] + j))
        h[live] = hash_column(elems, h[live])
    return h


def _hash_map(arr: pa.Array, seed: np.ndarray) -> np.ndarray:
    offsets = np.asarray(arr.offsets.to_numpy(zero_copy_only=False), dtype=np.int64)
    keys, items = arr.keys, arr.items
    lengths = np.diff(offsets)
    h = seed.copy()
    for j in range(int(lengths.max(initial=0))):
        live = np.nonzero(lengths > j)[0]
        idx = pa.array(offsets[live] + j)
        h[live] = hash_column(keys.take(idx), h[live])
        h[live] = hash_column(items.take(idx), h[live])
    return h


def spark_hash(columns: pa.StructArray | pa.Table | list[pa.Array], seed: int = SEED) -> np.ndarray:
    """``hash(c1, c2, ...)`` as Spark computes it, for every row: int32."""
    if isinstance(columns, pa.Table):
        cols = [c.combine_chunks() for c in columns.columns]
    elif isinstance(columns, pa.StructArray):
        cols = [columns.field(i) for i in range(columns.type.num_fields)]
    else:
        cols = list(columns)
    n = len(cols[0]) if cols else 0
    h = np.full(n, seed, dtype=np.uint32)
    for c in cols:
        h = hash_column(c, h)
    return h.view(np.int32)


def partition_ids(
    keys: pa.StructArray | pa.Table | list[pa.Array], num_partitions: int
) -> np.ndarray:
    """``pmod(hash(keys), n)``: the state partition Spark puts each key in."""
    h = spark_hash(keys).astype(np.int64)
    return (np.mod(h, num_partitions)).astype(np.int32)

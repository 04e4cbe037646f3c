"""Arrow -> UnsafeRow (and UnsafeArrayData / UnsafeMapData) bytes, column by column, the
bytes Spark's ``UnsafeRowWriter`` writes (the layout: :mod:`statectl.codecs.unsaferow_layout`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from statectl.codecs.sparktypes import (
    FIXED_KINDS,
    SparkType,
    decimal_of,
    kind,
    nested,
    parse_schema,
    physical,
    to_arrow_type,
)
from statectl.codecs.unsaferow_layout import (
    MASK32,
    Valid,
    bitmap,
    bitset_bytes,
    element_size,
    exclusive_cumsum,
    pad8,
    valid_and,
)
from statectl.errors import UnsupportedError

_FLOAT_NAN = np.uint32(0x7FC00000)  # Float.NaN, Double.NaN: Java's canonical NaN bit patterns
_DOUBLE_NAN = np.int64(0x7FF8000000000000)


@dataclass
class _Payload:
    """Variable-length values: value i is ``data[start[i] : start[i] + size[i]]``."""

    data: np.ndarray
    start: np.ndarray
    size: np.ndarray


def encode_unsafe_rows(
    data: pa.StructArray | pa.Table | pa.RecordBatch | pa.ChunkedArray,
    schema: str | bytes | dict,
    *,
    normalize_floats: bool = False,
) -> pa.LargeBinaryArray:
    """UnsafeRow bytes for every row, exactly as Spark's UnsafeRowWriter lays them out.

    A null struct gives a null element. Columns are cast to ``to_arrow_type(schema)`` first.
    NaN is written as Java's canonical NaN (the planner normalizes grouping and join keys so);
    ``normalize_floats`` also turns -0.0 into 0.0, as Spark's NormalizeFloatingNumbers does for
    keys. Without it, bytes equal UnsafeRowWriter's for every value but non-canonical NaNs.
    """
    struct = parse_schema(schema)
    arr = _as_struct(data, to_arrow_type(struct))
    payload = _encode_struct(arr, struct, normalize_floats)
    offsets = exclusive_cumsum(payload.size)
    valid = _validity(arr)
    return pa.Array.from_buffers(
        pa.large_binary(),
        len(arr),
        [bitmap(valid), pa.py_buffer(offsets), pa.py_buffer(payload.data)],
    )


def _as_struct(data: Any, arrow_t: pa.DataType) -> pa.StructArray:
    if isinstance(data, (pa.Table, pa.RecordBatch)):
        columns = [c.combine_chunks() if isinstance(c, pa.ChunkedArray) else c for c in data.columns]  # fmt: skip
        if not columns:
            data = pa.array([{}] * data.num_rows, pa.struct([]))
        else:
            data = pa.StructArray.from_arrays(columns, fields=list(data.schema))
    if isinstance(data, pa.ChunkedArray):
        data = data.combine_chunks() if data.num_chunks != 1 else data.chunk(0)
    if not pa.types.is_struct(data.type):
        raise UnsupportedError(f"cannot encode {data.type} as UnsafeRows: expected a struct")
    if not data.type.equals(arrow_t):
        try:
            data = data.cast(arrow_t)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError) as e:
            raise UnsupportedError(f"cannot encode {data.type} as {arrow_t}: {e}") from None
    return data


def _validity(arr: pa.Array) -> Valid:
    if arr.null_count == 0:
        return None
    return arr.is_valid().to_numpy(zero_copy_only=False)


def _encode_struct(arr: pa.Array, struct: SparkType, normalize: bool) -> _Payload:
    """UnsafeRows of a struct array; null structs get no bytes."""
    fields = nested(struct)["fields"]
    valid = _validity(arr)
    rows = _RowWriter(len(arr), len(fields), normalize)
    for i, f in enumerate(fields):
        child = arr.field(i)
        rows.put(i, child, f["type"], valid_and(valid, _validity(child)))
    return rows.finish(valid)


class _RowWriter:
    """The UnsafeRows of ``n`` rows of ``width`` fields, a field (column) at a time: null bits,
    fixed-width slots, and the variable-length region each row's ``cursor`` grows."""

    def __init__(self, n: int, width: int, normalize: bool) -> None:
        self.n, self.width, self.normalize = n, width, normalize
        self.bitset = bitset_bytes(width)
        self.slots = np.zeros((n, width), dtype=np.int64)
        self.null_words = np.zeros((n, self.bitset // 8), dtype=np.int64)
        self.cursor = np.full(n, self.bitset + 8 * width, dtype=np.int64)  # next free byte
        self.pieces: list[tuple[np.ndarray, _Payload]] = []

    def put(self, i: int, child: pa.Array, t: SparkType, valid: Valid) -> None:
        """Field ``i`` of every row: ``child`` of Spark type ``t`` (``valid``: non-null)."""
        k = kind(t)
        if k == "void":
            self.null_words[:, i >> 6] |= np.int64(1) << (i & 63)
            return
        if valid is not None:
            self.null_words[:, i >> 6] |= (~valid).astype(np.int64) << (i & 63)
        dec = decimal_of(t)
        if k in FIXED_KINDS or (dec and dec[0] <= 18):
            self.slots[:, i] = _fixed_words(child, k, 8, self.normalize, valid)
            return
        payload = _payload(child, t, valid, self.normalize)
        slot_word = (self.cursor << 32) | payload.size
        # A null field's slot is 0, but a null big decimal still points at its 16 bytes.
        self.slots[:, i] = slot_word if dec or valid is None else np.where(valid, slot_word, 0)
        self.pieces.append((self.cursor.copy(), payload))
        # UnsafeRowWriter always reserves 16 bytes for a big decimal, null or not.
        self.cursor += np.full(self.n, 16, dtype=np.int64) if dec else pad8(payload.size)

    def finish(self, valid: Valid) -> _Payload:
        """The rows laid out one after another (null rows: no bytes)."""
        cursor = self.cursor if valid is None else np.where(valid, self.cursor, 0)
        row_off = exclusive_cumsum(cursor)
        out = np.zeros(int(row_off[-1]), dtype=np.uint8)
        words = out.view("<i8")
        live = np.arange(self.n) if valid is None else np.flatnonzero(valid)
        first_word = row_off[:-1][live] >> 3
        for k_word in range(self.bitset // 8):
            words[first_word + k_word] = self.null_words[live, k_word]
        for i in range(self.width):
            words[first_word + self.bitset // 8 + i] = self.slots[live, i]
        for rel, payload in self.pieces:
            size = payload.size if valid is None else np.where(valid, payload.size, 0)
            _scatter(out, row_off[:-1] + rel, payload.data, payload.start, size)
        return _Payload(out, row_off[:-1], cursor)


def _fixed_words(arr: pa.Array, k: str, width: int, normalize: bool, valid: Valid) -> np.ndarray:
    """Values as the integer whose low ``width`` bytes Spark writes (nulls as 0)."""
    if k == "boolean":
        values = arr.fill_null(False).to_numpy(zero_copy_only=False).astype(np.uint8)
    elif pa.types.is_decimal(arr.type):
        values = _decimal_words(arr)[:, 0]
    elif k in ("float", "double"):
        values = arr.fill_null(0).to_numpy(zero_copy_only=False)
        values = _canonical_floats(values, normalize)
    else:
        storage = {1: pa.int8(), 2: pa.int16(), 4: pa.int32(), 8: pa.int64()}[FIXED_KINDS[k]]
        values = arr.view(storage).fill_null(0).to_numpy(zero_copy_only=False)
    if valid is not None:
        values = np.where(valid, values, 0).astype(values.dtype)
    unsigned = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}[values.dtype.itemsize]
    # Zero-extend: Spark zeroes the slot, then writes only the value's own bytes.
    raw = values.view(unsigned)
    if width == 8:
        return raw.astype(np.uint64).view(np.int64)
    return raw


def _canonical_floats(values: np.ndarray, normalize: bool) -> np.ndarray:
    bits = values.view(np.uint32 if values.dtype == np.float32 else np.int64).copy()
    nan = np.isnan(values)
    if nan.any():
        bits[nan] = _FLOAT_NAN if values.dtype == np.float32 else _DOUBLE_NAN
    if normalize:
        bits[values == 0] = 0  # -0.0 → 0.0
    return bits.view(values.dtype)


def _decimal_words(arr: pa.Array) -> np.ndarray:
    """(n, 2) int64 little-endian halves of decimal128 values (nulls unspecified)."""
    words = np.frombuffer(arr.buffers()[1], dtype=np.int64).reshape(-1, 2)
    return words[arr.offset : arr.offset + len(arr)]


def _payload(arr: pa.Array, t: SparkType, valid: Valid, normalize: bool) -> _Payload:
    """The unpadded variable-length bytes of every value (nulls: size 0)."""
    k = kind(t)
    n = len(arr)
    if k in ("string", "binary"):
        large = arr.cast(pa.large_binary())
        bufs = large.buffers()
        offsets = np.frombuffer(bufs[1], np.int64)[large.offset : large.offset + n + 1]
        data = np.frombuffer(bufs[2], np.uint8) if bufs[2] is not None else np.zeros(0, np.uint8)
        size = offsets[1:] - offsets[:-1]
        return _Payload(data, offsets[:-1], size if valid is None else np.where(valid, size, 0))
    if k == "decimal":
        return _big_decimal_bytes(_decimal_words(arr), valid)
    if k == "calendarinterval":
        block = np.zeros((n, 2), dtype=np.int64)
        months = arr.field(0).fill_null(0).to_numpy(zero_copy_only=False).astype(np.int64)
        days = arr.field(1).fill_null(0).to_numpy(zero_copy_only=False).astype(np.int64)
        block[:, 0] = (months & MASK32) | (days << 32)
        block[:, 1] = arr.field(2).fill_null(0).to_numpy(zero_copy_only=False)
        size = np.full(n, 16, np.int64) if valid is None else np.where(valid, 16, 0)
        return _Payload(block.view(np.uint8).reshape(-1), np.arange(n, dtype=np.int64) * 16, size)
    if k == "struct":
        return _encode_struct(arr, t, normalize)
    if k == "array":
        return _encode_array(arr, nested(t)["elementType"], normalize)
    return _encode_map(arr, t, normalize)


def _big_decimal_bytes(words: np.ndarray, valid: Valid) -> _Payload:
    """BigInteger.toByteArray of decimal128 unscaled values: minimal big-endian bytes."""
    n = len(words)
    be = np.ascontiguousarray(words[:, ::-1]).byteswap().view(np.uint8).reshape(n, 16)
    negative = words[:, 1] < 0
    sign = np.where(negative, 0xFF, 0).astype(np.uint8)
    # Leading bytes that only repeat the sign can go, as long as the next byte keeps its bit.
    redundant = np.cumprod(be == sign[:, None], axis=1).sum(axis=1)
    length = 16 - np.minimum(redundant, 15)
    first = be[np.arange(n), 16 - length]
    length += ((first >> 7).astype(bool) != negative) & (length < 16)
    length = length.astype(np.int64)
    if valid is not None:
        length = np.where(valid, length, 0)
    return _Payload(be.reshape(-1), np.arange(n, dtype=np.int64) * 16 + 16 - length, length)


def _elements(arr: pa.Array, valid: Valid) -> tuple[np.ndarray, np.ndarray]:
    """(int64 element counts, positions in the child array) of a list or map array."""
    offsets = arr.offsets.to_numpy(zero_copy_only=False).astype(np.int64)
    count = offsets[1:] - offsets[:-1]
    if valid is not None:
        count = np.where(valid, count, 0)
    starts = exclusive_cumsum(count)
    take = np.repeat(offsets[:-1] - starts[:-1], count) + np.arange(int(starts[-1]))
    return count, take


def _encode_array(arr: pa.Array, elem: SparkType, normalize: bool) -> _Payload:
    valid = _validity(arr)
    count, take = _elements(arr, valid)
    values = arr.values.take(pa.array(take))
    return _encode_array_data(count, values, elem, normalize, valid)


def _encode_array_data(
    count: np.ndarray, values: pa.Array, elem: SparkType, normalize: bool, valid: Valid
) -> _Payload:
    """UnsafeArrayData for arrays of ``count`` elements taken in order from ``values``;
    null arrays (``valid`` False, count 0) get no bytes."""
    n = len(count)
    es = element_size(elem)
    k = kind(elem)
    first = exclusive_cumsum(count)
    owner = np.repeat(np.arange(n, dtype=np.int64), count)
    j = np.arange(len(values), dtype=np.int64) - first[:-1][owner]
    bitset = bitset_bytes(count)
    fixed_end = 8 + bitset + pad8(count * es)
    elem_valid = _validity(values)
    dec = decimal_of(elem)
    fixed = k in FIXED_KINDS or k == "void" or bool(dec and dec[0] <= 18)
    payload = None if fixed else _payload(values, elem, elem_valid, normalize)
    cum, var_room = _variable_room(payload, first)
    length = fixed_end + var_room
    if valid is not None:
        length = np.where(valid, length, 0)
    arr_off = exclusive_cumsum(length)
    out = np.zeros(int(arr_off[-1]), dtype=np.uint8)
    live = np.arange(n) if valid is None else np.flatnonzero(valid)
    out.view("<i8")[arr_off[:-1][live] >> 3] = count[live]
    start_e = arr_off[:-1][owner]
    _set_element_null_bits(out, start_e, j, elem_valid)
    slot = start_e + 8 + bitset[owner] + j * es
    if payload is None or cum is None:
        _write_fixed_elements(out, slot, values, k, es, normalize, elem_valid)
    else:
        rel = fixed_end[owner] + (cum[:-1] - cum[first[:-1]][owner])
        _write_variable(out, slot, start_e + rel, rel, payload, elem_valid)
    return _Payload(out, arr_off[:-1], length)


def _variable_room(
    payload: _Payload | None, first: np.ndarray
) -> tuple[np.ndarray | None, np.ndarray]:
    """Where each element's variable-length bytes start, counted from the first element's of
    all arrays (``cum``; None for fixed-width elements), and each array's total of them (no
    16-byte reservation for decimals inside arrays)."""
    if payload is None:
        return None, np.zeros(len(first) - 1, dtype=np.int64)
    cum = exclusive_cumsum(pad8(payload.size))
    return cum, cum[first[1:]] - cum[first[:-1]]


def _set_element_null_bits(
    out: np.ndarray, start_e: np.ndarray, j: np.ndarray, valid: Valid
) -> None:
    """Null bit j of an array lives in byte 8 + j//8 of it (the array starts at ``start_e``)."""
    if valid is None:
        return
    null = ~valid
    np.bitwise_or.at(out, start_e[null] + 8 + (j[null] >> 3), (1 << (j[null] & 7)).astype(np.uint8))  # fmt: skip


def _write_fixed_elements(
    out: np.ndarray,
    slot: np.ndarray,
    values: pa.Array,
    k: str,
    es: int,
    normalize: bool,
    valid: Valid,
) -> None:
    if k != "void" and len(values):
        vals = _fixed_words(values, k, es, normalize, valid)
        out.view(vals.dtype)[slot // es] = vals


def _write_variable(
    out: np.ndarray,
    slot: np.ndarray,
    at: np.ndarray,
    rel: np.ndarray,
    payload: _Payload,
    valid: Valid,
) -> None:
    """Values in the variable-length region: each slot gets (offset ``rel`` << 32 | size), 0
    when null; the bytes go to ``at``."""
    slot_word = (rel << 32) | payload.size
    out.view("<i8")[slot >> 3] = slot_word if valid is None else np.where(valid, slot_word, 0)
    _scatter(out, at, payload.data, payload.start, payload.size)


def _encode_map(arr: pa.Array, t: SparkType, normalize: bool) -> _Payload:
    t = physical(t)
    valid = _validity(arr)
    count, take = _elements(arr, valid)
    index = pa.array(take)
    keys = _encode_array_data(count, arr.keys.take(index), nested(t)["keyType"], normalize, valid)
    items = _encode_array_data(
        count, arr.items.take(index), nested(t)["valueType"], normalize, valid
    )
    n = len(arr)
    length = 8 + keys.size + items.size
    if valid is not None:
        length = np.where(valid, length, 0)
    off = exclusive_cumsum(length)
    out = np.zeros(int(off[-1]), dtype=np.uint8)
    live = np.arange(n) if valid is None else np.flatnonzero(valid)
    out.view("<i8")[off[:-1][live] >> 3] = keys.size[live]
    _scatter(out, off[:-1] + 8, keys.data, keys.start, keys.size)
    _scatter(out, off[:-1] + 8 + keys.size, items.data, items.start, items.size)
    return _Payload(out, off[:-1], length)


def _scatter(
    out: np.ndarray, dest: np.ndarray, src: np.ndarray, src_start: np.ndarray, size: np.ndarray
) -> None:
    """out[dest[i] : dest[i] + size[i]] = src[src_start[i] : src_start[i] + size[i]], for all i.

    Every destination is 8-byte aligned and zeroed (UnsafeRow data is word aligned), so the
    copy moves whole words, masking the bytes past each value: several times fewer elements
    than a byte-by-byte gather.
    """
    size = np.asarray(size, dtype=np.int64)
    words = (size + 7) >> 3
    total = int(words.sum())
    if total == 0:
        return
    end = int((src_start + size).max())
    if len(src) < end + 8:  # room to read a whole last word
        src = np.concatenate([src[:end], np.zeros(8, np.uint8)])
    src_words = np.ndarray((len(src) - 7,), "<i8", src, 0, (1,))
    first = exclusive_cumsum(words)
    owner = np.repeat(np.arange(len(size), dtype=np.int64), words)
    w = np.arange(total, dtype=np.int64) - first[:-1][owner]
    value = src_words[src_start[owner] + 8 * w]
    left = size[owner] - 8 * w  # bytes of this value from this word on
    short = left < 8
    if short.any():
        value[short] &= (np.int64(1) << (8 * left[short])) - 1
    out.view("<i8")[(dest[owner] >> 3) + w] = value

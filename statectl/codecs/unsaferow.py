"""Spark's UnsafeRow (and UnsafeArrayData / UnsafeMapData) ⇄ Arrow, column by column.

Layout (catalyst ``UnsafeRow``, ``UnsafeRowWriter``, ``UnsafeArrayWriter``; all little-endian):

* row = null bitset (ceil(n/64) words) ‖ one 8-byte slot per field ‖ variable-length region.
  Fixed-width values sit in their zeroed slot; variable-length ones (string, binary, decimal
  with precision > 18, calendar interval, struct, array, map) store ``offset << 32 | size``,
  the offset counted from the start of the enclosing row (or array), and their bytes in the
  variable region, zero padded to a multiple of 8. A null field has its bit set and slot 0,
  except a row's decimal(p > 18): it keeps 16 zeroed bytes and the slot ``cursor << 32``.
* array = int64 count ‖ null bits (ceil(count/64) words) ‖ count × element size (1/2/4/8,
  padded to 8) ‖ variable region. Variable elements are 8-byte offset/size slots, the offset
  counted from the array start; a decimal(p > 18) element takes only its rounded length.
* map = int64 byte length of the key array ‖ key array ‖ value array.

Decoding never loops over rows: positions are numpy int64 arrays into one byte buffer and each
field (and nesting level) costs a handful of whole-array operations. Encoding builds the same
bytes the same way, column by column.
"""

from __future__ import annotations

from collections.abc import Callable
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
from statectl.errors import CorruptFileError, UnsupportedError

_SLACK = 16  # bytes a read may run past a row: narrow elements, strings are read as words
_I32_MAX = 2**31 - 1
_MASK32 = np.int64(0xFFFFFFFF)
_FLOAT_NAN = np.uint32(0x7FC00000)  # Float.NaN, Double.NaN: Java's canonical NaN bit patterns
_DOUBLE_NAN = np.int64(0x7FF8000000000000)

Valid = np.ndarray | None  # per-value validity; None means every value is valid


# -- helpers -------------------------------------------------------------------------------
def _bitmap(valid: Valid) -> pa.Buffer | None:
    if valid is None or valid.all():
        return None
    return pa.py_buffer(np.packbits(valid, bitorder="little"))


def _and(a: Valid, b: Valid) -> Valid:
    if a is None:
        return b
    return a if b is None else a & b


def _pad8(n: np.ndarray) -> np.ndarray:
    return (n + 7) & ~7


def _exclusive_cumsum(x: np.ndarray) -> np.ndarray:
    out = np.zeros(len(x) + 1, dtype=np.int64)
    np.cumsum(x, out=out[1:])
    return out


def _bitset_bytes(n: int | np.ndarray) -> Any:
    return ((n + 63) >> 6) << 3


def _stride(pos: np.ndarray) -> int | None:
    """The common difference when ``pos`` is an arithmetic progression (> 0), else None."""
    if len(pos) < 2:
        return None
    step = int(pos[1] - pos[0])
    if step <= 0 or int(pos[-1] - pos[0]) != step * (len(pos) - 1):
        return None
    return step if bool(np.all(np.diff(pos) == step)) else None


@dataclass(frozen=True)
class _Pos:
    """Absolute byte positions, one per value, and their stride when evenly spaced."""

    at: np.ndarray
    stride: int | None = None

    def __add__(self, k: int | np.ndarray) -> _Pos:
        return _Pos(self.at + k, self.stride if isinstance(k, int) else None)


class _Bytes:
    """Every row's bytes in one buffer, read as int64 words at any byte position."""

    def __init__(
        self, raw: np.ndarray, end: int, row_starts: np.ndarray, path: str | None, reach: int
    ) -> None:
        self.size = end  # bytes in use: rows end here
        # Reads may run up to _SLACK bytes past a row (narrow array elements and strings are
        # read as whole words), and null values are read at position 0, up to ``reach`` bytes
        # on. A buffer that has that room already (rows sliced from a bigger stream) is used
        # as it is; otherwise it is copied with zero padding.
        need = max(end, reach) + _SLACK
        if len(raw) >= need:
            self.buf = raw
        else:
            self.buf = np.empty(need, dtype=np.uint8)
            self.buf[:end] = raw[:end]
            self.buf[end:] = 0
        # An int64 starting at every byte offset (stride 1), so one fancy index reads a word
        # per row whatever its alignment; RocksDB's 1-byte prefixes leave rows unaligned.
        self.words = np.ndarray((len(self.buf) - 7,), "<i8", self.buf, 0, (1,))
        self.row_starts = row_starts
        self.path = path

    def read(self, pos: _Pos) -> np.ndarray:
        at = pos.at
        if pos.stride is not None and len(at) > 1:
            first = int(at[0])
            return np.array(self.words[first : first + pos.stride * (len(at) - 1) + 1 : pos.stride])
        return self.words[at]

    def check(self, bad: np.ndarray, at: np.ndarray, what: str, field: str) -> None:
        """Raise CorruptFileError for the first flagged value (one vectorized test per call)."""
        if not bad.any():
            return
        i = int(np.flatnonzero(bad)[0])
        row = int(np.searchsorted(self.row_starts, at[i], side="right")) - 1
        raise CorruptFileError(
            f"UnsafeRow {field}: {what} (row {max(row, 0)}, byte {int(at[i])}); the state "
            "data is corrupt or does not match its schema",
            self.path,
        )


@dataclass(frozen=True)
class _Region:
    """Where variable-length data of a row (or array) may live, as absolute positions."""

    base: np.ndarray  # offsets in slots are relative to this
    lo: np.ndarray  # first byte after the fixed region
    hi: np.ndarray  # end of the row or array


def _as_binary(rows: pa.Array | pa.ChunkedArray) -> pa.Array:
    if isinstance(rows, pa.ChunkedArray):
        rows = rows.combine_chunks() if rows.num_chunks != 1 else rows.chunk(0)
    if not (pa.types.is_binary(rows.type) or pa.types.is_large_binary(rows.type)):
        rows = rows.cast(pa.large_binary())
    return rows


def _binary_parts(rows: pa.Array) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """(int64 offsets of n+1, uint8 data, validity or None) of a (large) binary array."""
    n = len(rows)
    bufs = rows.buffers()
    off_type = np.int64 if pa.types.is_large_binary(rows.type) else np.int32
    offsets = np.frombuffer(bufs[1], dtype=off_type)[rows.offset : rows.offset + n + 1]
    offsets = offsets.astype(np.int64) if n else np.zeros(1, np.int64)
    data = np.frombuffer(bufs[2], dtype=np.uint8) if bufs[2] is not None else np.zeros(0, np.uint8)
    valid = rows.is_valid().to_numpy(zero_copy_only=False) if rows.null_count else None
    return offsets, data, valid


# -- decoding ------------------------------------------------------------------------------
def decode_unsafe_rows(
    rows: pa.Array | pa.ChunkedArray,
    schema: str | bytes | dict,
    path: str | None = None,
    skip_prefix: int = 0,
) -> pa.StructArray:
    """One UnsafeRow per element of ``rows`` → a struct array of ``to_arrow_type(schema)``.

    A null element gives a null struct. ``skip_prefix`` bytes are ignored at the start of every
    row (RocksDB's version byte, a column-family id). Bounds are checked: a field pointing
    outside its row raises CorruptFileError naming ``path``.
    """
    struct = parse_schema(schema, path)
    rows = _as_binary(rows)
    offsets, data, valid = _binary_parts(rows)
    fields = struct["fields"]
    need = skip_prefix + _bitset_bytes(len(fields)) + 8 * len(fields)
    lengths = offsets[1:] - offsets[:-1]
    short = lengths < need if valid is None else valid & (lengths < need)
    if short.any():
        i = int(np.flatnonzero(short)[0])
        raise CorruptFileError(
            f"state row {i} has {int(lengths[i]) - skip_prefix} bytes, the schema needs at "
            f"least {need - skip_prefix}: the schema does not match the data (or the file is "
            "corrupt)",
            path,
        )
    starts = offsets[:-1] + skip_prefix
    if valid is not None:
        starts = np.where(valid, starts, 0)
    buf = _Bytes(data, int(offsets[-1]), starts, path, _reach(struct))
    base = _Pos(starts, _stride(starts))
    return _decode_struct(buf, base, offsets[1:], valid, struct, "row")


def _reach(t: SparkType) -> int:
    """The largest fixed region (null bits + slots) of any struct in ``t``."""
    k = kind(t)
    t = physical(t)
    if k == "struct":
        fields = nested(t)["fields"]
        inner = max((_reach(f["type"]) for f in fields), default=0)
        return max(_bitset_bytes(len(fields)) + 8 * len(fields), inner)
    if k == "array":
        return _reach(nested(t)["elementType"])
    if k == "map":
        return max(_reach(nested(t)["keyType"]), _reach(nested(t)["valueType"]))
    return 0


def _decode_struct(
    buf: _Bytes, base: _Pos, end: np.ndarray, valid: Valid, struct: SparkType, name: str
) -> pa.Array:
    struct = physical(struct)
    fields = nested(struct)["fields"]
    n = len(base.at)
    bitset = _bitset_bytes(len(fields))
    header = bitset + 8 * len(fields)
    if name != "row":  # top-level lengths were checked by the caller, with a better message
        small = end - base.at < header
        buf.check(small if valid is None else small & valid, base.at, "nested row too short", name)
    null_words = [buf.read(base + 8 * k) for k in range(bitset // 8)]
    if valid is not None:
        null_words = [np.where(valid, w, 0) for w in null_words]
    region = _Region(base.at, base.at + header, end)
    children = []
    for i, f in enumerate(fields):
        bit = (null_words[i >> 6] >> (i & 63)) & 1
        child_valid = valid if not bit.any() else _and(valid, bit == 0)
        slot = base + (bitset + 8 * i)
        children.append(_decode_value(buf, f["type"], slot, region, child_valid, f"{name}.{f['name']}"))  # fmt: skip
    return pa.Array.from_buffers(to_arrow_type(struct), n, [_bitmap(valid)], children=children)


def _decode_value(
    buf: _Bytes, t: SparkType, slot: _Pos, region: _Region, valid: Valid, name: str
) -> pa.Array:
    """Values of Spark type ``t`` whose slot (or array element) is at ``slot``."""
    k = kind(t)
    arrow_t = to_arrow_type(t)
    if k == "void":
        return pa.nulls(len(slot.at))
    dec = decimal_of(t)
    if k in FIXED_KINDS or (dec and dec[0] <= 18):
        return _fixed_array(buf.read(slot), k, arrow_t, valid)
    word = buf.read(slot)
    offset, size = word >> 32, word & _MASK32
    start = region.base + offset
    bad = (start < region.lo) | (start + size > region.hi)
    buf.check(bad if valid is None else bad & valid, slot.at, "value points outside its row", name)
    if valid is not None:  # null slots may hold anything: park them on harmless positions
        start, size = np.where(valid, start, 0), np.where(valid, size, 0)
    return _VARIABLE[k](_Variable(buf, t, arrow_t, slot, start, size, valid, name))


@dataclass(frozen=True)
class _Variable:
    """Values stored in a row's variable-length region: ``size`` bytes from ``start`` each
    (their slots at ``slot``), checked to lie within the row."""

    buf: _Bytes
    t: SparkType
    arrow_t: pa.DataType
    slot: _Pos
    start: np.ndarray
    size: np.ndarray
    valid: Valid
    name: str

    def check(self, wrong: np.ndarray, what: str) -> None:
        self.buf.check(
            wrong if self.valid is None else wrong & self.valid, self.slot.at, what, self.name
        )


def _big_decimal_values(v: _Variable) -> pa.Array:
    v.check((v.size < 1) | (v.size > 16), "decimal not 1-16 bytes")
    return _big_decimal(v.buf, v.start, v.size, v.valid, v.arrow_t)


def _bytes_values(v: _Variable) -> pa.Array:
    return _var_bytes(v.buf, v.start, v.size, v.valid, v.arrow_t, v.name)


def _interval_values(v: _Variable) -> pa.Array:
    """CalendarInterval: months and days (two ints in one word), then microseconds."""
    v.check(v.size != 16, "interval is not 16 bytes")
    head, micros = v.buf.read(_Pos(v.start)), v.buf.read(_Pos(v.start + 8))
    children = [
        _fixed_array(head, "integer", pa.int32(), None),
        _fixed_array(head >> 32, "integer", pa.int32(), None),
        _fixed_array(micros, "long", pa.int64(), None),
    ]
    return pa.Array.from_buffers(v.arrow_t, len(v.slot.at), [_bitmap(v.valid)], children=children)


def _struct_values(v: _Variable) -> pa.Array:
    start = v.start
    return _decode_struct(v.buf, _Pos(start, _stride(start)), start + v.size, v.valid, v.t, v.name)


def _array_values(v: _Variable) -> pa.Array:
    elem = nested(v.t)["elementType"]
    offsets, values = _decode_elements(v.buf, v.start, v.size, v.valid, elem, v.name)
    offsets32 = pa.py_buffer(_offsets32(offsets, v.name))
    n = len(v.slot.at)
    return pa.Array.from_buffers(v.arrow_t, n, [_bitmap(v.valid), offsets32], children=[values])


def _map_values(v: _Variable) -> pa.Array:
    return _decode_map(v.buf, v.start, v.size, v.valid, v.t, v.arrow_t, v.name)


# The kinds stored in the variable-length region, by kind.
_VARIABLE: dict[str, Callable[[_Variable], pa.Array]] = {
    "decimal": _big_decimal_values,
    "string": _bytes_values,
    "binary": _bytes_values,
    "calendarinterval": _interval_values,
    "struct": _struct_values,
    "array": _array_values,
    "map": _map_values,
}


def _fixed_array(word: np.ndarray, k: str, arrow_t: pa.DataType, valid: Valid) -> pa.Array:
    """Arrow values from the little-endian words their bytes start."""
    n = len(word)
    if k == "boolean":
        data = np.packbits((word & 0xFF) != 0, bitorder="little")
    elif pa.types.is_decimal(arrow_t):
        data = np.empty((n, 2), dtype=np.int64)
        data[:, 0], data[:, 1] = word, word >> 63  # sign-extend to 128 bits
    else:
        width = arrow_t.bit_width // 8
        # Truncation keeps the low bytes: exactly the value a narrower slot holds.
        data = word.astype({1: np.int8, 2: np.int16, 4: np.int32, 8: np.int64}[width])
    return pa.Array.from_buffers(arrow_t, n, [_bitmap(valid), pa.py_buffer(data)])


def _big_decimal(
    buf: _Bytes, start: np.ndarray, size: np.ndarray, valid: Valid, arrow_t: pa.DataType
) -> pa.Array:
    """BigInteger.toByteArray (big-endian two's complement, 1..16 bytes) → decimal128."""
    # Read 16 bytes from the value's start as one big-endian 128-bit number, then shift the
    # bytes past its length out arithmetically (that also sign-extends).
    hi = buf.read(_Pos(start)).byteswap()
    lo = buf.read(_Pos(start + 8)).byteswap().view(np.uint64)
    shift = (16 - np.clip(size, 1, 16)) * 8  # 0..120 bits
    big = shift >= 64
    s_big = np.clip(shift - 64, 0, 63)
    s_small = np.clip(shift, 1, 63)
    lo_small = (lo >> s_small.astype(np.uint64)) | (hi.view(np.uint64) << (64 - s_small).astype(np.uint64))  # fmt: skip
    out = np.empty((len(start), 2), dtype=np.int64)
    out[:, 0] = np.where(big, hi >> s_big, np.where(shift == 0, lo.view(np.int64), lo_small.view(np.int64)))  # fmt: skip
    out[:, 1] = np.where(big, hi >> 63, np.where(shift == 0, hi, hi >> s_small))
    if valid is not None:
        out[~valid] = 0
    return pa.Array.from_buffers(arrow_t, len(start), [_bitmap(valid), pa.py_buffer(out)])


def _gather_binary(
    padded: np.ndarray,
    start: np.ndarray,
    size: np.ndarray,
    valid: Valid,
    arrow_t: pa.DataType,
) -> pa.Array:
    """Byte ranges of one buffer (with at least 16 slack bytes) as a binary/string array.

    Arrow's binary_view layout can point at the ranges where they are (values of up to 12 bytes
    are copied inline), and Arrow's C++ cast then compacts them: several times faster than a
    numpy byte gather.
    """
    n = len(start)
    size = size if valid is None else np.where(valid, size, 0)
    if len(padded) > _I32_MAX:  # views hold int32 offsets
        return _gather_binary_numpy(padded, start, size, valid, arrow_t)
    inline = np.ndarray((len(padded) - 11,), "V12", padded, 0, (1,))
    views = np.empty((n, 4), dtype=np.int32)
    views[:, 0] = size
    # Inline bytes past a value's size are not zeroed: the views only live until the cast.
    views[:, 1:] = inline[start].view(np.int32).reshape(n, 3)  # inline bytes, or the prefix
    long = size > 12
    if long.any():
        views[long, 2] = 0  # buffer index
        views[long, 3] = start[long]
    arr = pa.Array.from_buffers(
        pa.binary_view(), n, [_bitmap(valid), pa.py_buffer(views), pa.py_buffer(padded)]
    )
    return arr.cast(arrow_t)  # to string: Arrow checks the UTF-8 here


def _gather_binary_numpy(
    data: np.ndarray, start: np.ndarray, size: np.ndarray, valid: Valid, arrow_t: pa.DataType
) -> pa.Array:
    offsets = _exclusive_cumsum(size)
    total = int(offsets[-1])
    idx = np.repeat(start - offsets[:-1], size) + np.arange(total, dtype=np.int64)
    large = pa.large_string() if pa.types.is_string(arrow_t) else pa.large_binary()
    arr = pa.Array.from_buffers(
        large, len(start), [_bitmap(valid), pa.py_buffer(offsets), pa.py_buffer(data[idx])]
    )
    return arr.cast(arrow_t)


def _var_bytes(
    buf: _Bytes, start: np.ndarray, size: np.ndarray, valid: Valid, arrow_t: pa.DataType, name: str
) -> pa.Array:
    try:
        return _gather_binary(buf.buf, start, size, valid, arrow_t)
    except (pa.ArrowInvalid, pa.ArrowCapacityError) as e:
        if "utf8" in str(e).lower().replace("-", ""):
            # Spark does not check (e.g. CAST(X'FF' AS STRING)); Arrow strings must be UTF-8.
            raise UnsupportedError(
                f"UnsafeRow {name}: a string value is not valid UTF-8 ({e})", buf.path
            ) from None
        raise UnsupportedError(
            f"UnsafeRow {name}: too much data for one Arrow array ({e}); decode fewer rows at a "
            "time",
            buf.path,
        ) from None


def _offsets32(offsets: np.ndarray, name: str) -> np.ndarray:
    if offsets[-1] > _I32_MAX:
        raise UnsupportedError(f"{name}: more than 2^31 array elements; decode fewer rows at a time")  # fmt: skip
    return offsets.astype(np.int32)


def _decode_elements(
    buf: _Bytes, start: np.ndarray, size: np.ndarray, valid: Valid, elem: SparkType, name: str
) -> tuple[np.ndarray, pa.Array]:
    """UnsafeArrayData at ``start``: (int64 list offsets, flat element values)."""
    n = len(start)
    name = f"{name}[]"
    if valid is not None:  # positions derived for null maps may point anywhere
        start, size = np.where(valid, start, 0), np.where(valid, size, 0)
    small = size < 8
    buf.check(small if valid is None else small & valid, start, "array shorter than 8 bytes", name)
    count = buf.read(_Pos(start))
    if valid is not None:
        count = np.where(valid, count, 0)
    es = _element_size(elem)
    fixed_end = 8 + _bitset_bytes(count) + _pad8(count * es)
    bad = (count < 0) | (count > size) | (fixed_end > size)
    buf.check(bad if valid is None else bad & valid, start, "array header does not fit", name)
    offsets = _exclusive_cumsum(count)
    total = int(offsets[-1])
    owner = np.repeat(np.arange(n, dtype=np.int64), count)  # array index of every element
    j = np.arange(total, dtype=np.int64) - offsets[:-1][owner]  # index inside its array
    start_e = start[owner]
    if total and int(count.max()) <= 64:  # one null word per array: read it per array
        null_word = buf.read(_Pos(start + 8))[owner]
    else:
        null_word = buf.read(_Pos(start_e + 8 + ((j >> 6) << 3)))
    null = ((null_word >> (j & 63)) & 1).astype(bool)
    elem_valid = ~null if null.any() else None
    slots = start_e + (8 + _bitset_bytes(count))[owner] + j * es
    region = _Region(start_e, start_e + fixed_end[owner], start_e + size[owner])
    values = _decode_value(buf, elem, _Pos(slots), region, elem_valid, name)
    return offsets, values


def _element_size(t: SparkType) -> int:
    return FIXED_KINDS.get(kind(t), 8)


def _decode_map(
    buf: _Bytes,
    start: np.ndarray,
    size: np.ndarray,
    valid: Valid,
    t: SparkType,
    arrow_t: pa.DataType,
    name: str,
) -> pa.Array:
    t = physical(t)
    small = size < 24
    buf.check(small if valid is None else small & valid, start, "map shorter than 24 bytes", name)
    key_bytes = buf.read(_Pos(start))
    if valid is not None:
        key_bytes = np.where(valid, key_bytes, 8)
    bad = (key_bytes < 8) | (key_bytes > size - 16)
    buf.check(bad if valid is None else bad & valid, start, "map key array does not fit", name)
    k_off, keys = _decode_elements(
        buf, start + 8, key_bytes, valid, nested(t)["keyType"], f"{name}.key"
    )
    v_start = start + 8 + key_bytes
    v_off, items = _decode_elements(buf, v_start, size - 8 - key_bytes, valid, nested(t)["valueType"], f"{name}.value")  # fmt: skip
    if not np.array_equal(k_off, v_off):
        mismatch = (k_off[1:] - k_off[:-1]) != (v_off[1:] - v_off[:-1])
        buf.check(mismatch, start, "map has different key and value counts", name)
    if keys.null_count:
        raise CorruptFileError(f"UnsafeRow {name}: map with a null key", buf.path)
    entries_t = pa.struct([arrow_t.key_field, arrow_t.item_field])
    entries = pa.Array.from_buffers(entries_t, len(keys), [None], children=[keys, items])
    offsets32 = pa.py_buffer(_offsets32(k_off, name))
    return pa.Array.from_buffers(arrow_t, len(start), [_bitmap(valid), offsets32], children=[entries])  # fmt: skip


# -- encoding ------------------------------------------------------------------------------
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
    offsets = _exclusive_cumsum(payload.size)
    valid = _validity(arr)
    return pa.Array.from_buffers(
        pa.large_binary(),
        len(arr),
        [_bitmap(valid), pa.py_buffer(offsets), pa.py_buffer(payload.data)],
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
        rows.put(i, child, f["type"], _and(valid, _validity(child)))
    return rows.finish(valid)


class _RowWriter:
    """The UnsafeRows of ``n`` rows of ``width`` fields, a field (column) at a time: null bits,
    fixed-width slots, and the variable-length region each row's ``cursor`` grows."""

    def __init__(self, n: int, width: int, normalize: bool) -> None:
        self.n, self.width, self.normalize = n, width, normalize
        self.bitset = _bitset_bytes(width)
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
        self.cursor += np.full(self.n, 16, dtype=np.int64) if dec else _pad8(payload.size)

    def finish(self, valid: Valid) -> _Payload:
        """The rows laid out one after another (null rows: no bytes)."""
        cursor = self.cursor if valid is None else np.where(valid, self.cursor, 0)
        row_off = _exclusive_cumsum(cursor)
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
        block[:, 0] = (months & _MASK32) | (days << 32)
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
    starts = _exclusive_cumsum(count)
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
    es = _element_size(elem)
    k = kind(elem)
    first = _exclusive_cumsum(count)
    owner = np.repeat(np.arange(n, dtype=np.int64), count)
    j = np.arange(len(values), dtype=np.int64) - first[:-1][owner]
    bitset = _bitset_bytes(count)
    fixed_end = 8 + bitset + _pad8(count * es)
    elem_valid = _validity(values)
    dec = decimal_of(elem)
    fixed = k in FIXED_KINDS or k == "void" or bool(dec and dec[0] <= 18)
    payload = None if fixed else _payload(values, elem, elem_valid, normalize)
    cum, var_room = _variable_room(payload, first)
    length = fixed_end + var_room
    if valid is not None:
        length = np.where(valid, length, 0)
    arr_off = _exclusive_cumsum(length)
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
    cum = _exclusive_cumsum(_pad8(payload.size))
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
    off = _exclusive_cumsum(length)
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
    first = _exclusive_cumsum(words)
    owner = np.repeat(np.arange(len(size), dtype=np.int64), words)
    w = np.arange(total, dtype=np.int64) - first[:-1][owner]
    value = src_words[src_start[owner] + 8 * w]
    left = size[owner] - 8 * w  # bytes of this value from this word on
    short = left < 8
    if short.any():
        value[short] &= (np.int64(1) << (8 * left[short])) - 1
    out.view("<i8")[(dest[owner] >> 3) + w] = value

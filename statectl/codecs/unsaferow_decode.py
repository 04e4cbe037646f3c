"""UnsafeRow (and UnsafeArrayData / UnsafeMapData) bytes -> Arrow, column by column
(the layout: :mod:`statectl.codecs.unsaferow_layout`).

Decoding never loops over rows: positions are numpy int64 arrays into one byte buffer and each
field (and nesting level) costs a handful of whole-array operations; every slot, offset and size
read is checked, so corrupt or mismatched data fails with the field and the row.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

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
from statectl.errors import CorruptFileError, UnsupportedError

_SLACK = 16  # bytes a read may run past a row: narrow elements, strings are read as words
_I32_MAX = 2**31 - 1


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
    need = skip_prefix + bitset_bytes(len(fields)) + 8 * len(fields)
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
        return max(bitset_bytes(len(fields)) + 8 * len(fields), inner)
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
    bitset = bitset_bytes(len(fields))
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
        child_valid = valid if not bit.any() else valid_and(valid, bit == 0)
        slot = base + (bitset + 8 * i)
        children.append(_decode_value(buf, f["type"], slot, region, child_valid, f"{name}.{f['name']}"))  # fmt: skip
    return pa.Array.from_buffers(to_arrow_type(struct), n, [bitmap(valid)], children=children)


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
    offset, size = word >> 32, word & MASK32
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
    return pa.Array.from_buffers(v.arrow_t, len(v.slot.at), [bitmap(v.valid)], children=children)


def _struct_values(v: _Variable) -> pa.Array:
    start = v.start
    return _decode_struct(v.buf, _Pos(start, _stride(start)), start + v.size, v.valid, v.t, v.name)


def _array_values(v: _Variable) -> pa.Array:
    elem = nested(v.t)["elementType"]
    offsets, values = _decode_elements(v.buf, v.start, v.size, v.valid, elem, v.name)
    offsets32 = pa.py_buffer(_offsets32(offsets, v.name))
    n = len(v.slot.at)
    return pa.Array.from_buffers(v.arrow_t, n, [bitmap(v.valid), offsets32], children=[values])


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
    return pa.Array.from_buffers(arrow_t, n, [bitmap(valid), pa.py_buffer(data)])


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
    return pa.Array.from_buffers(arrow_t, len(start), [bitmap(valid), pa.py_buffer(out)])


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
        pa.binary_view(), n, [bitmap(valid), pa.py_buffer(views), pa.py_buffer(padded)]
    )
    return arr.cast(arrow_t)  # to string: Arrow checks the UTF-8 here


def _gather_binary_numpy(
    data: np.ndarray, start: np.ndarray, size: np.ndarray, valid: Valid, arrow_t: pa.DataType
) -> pa.Array:
    offsets = exclusive_cumsum(size)
    total = int(offsets[-1])
    idx = np.repeat(start - offsets[:-1], size) + np.arange(total, dtype=np.int64)
    large = pa.large_string() if pa.types.is_string(arrow_t) else pa.large_binary()
    arr = pa.Array.from_buffers(
        large, len(start), [bitmap(valid), pa.py_buffer(offsets), pa.py_buffer(data[idx])]
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
    es = element_size(elem)
    fixed_end = 8 + bitset_bytes(count) + pad8(count * es)
    bad = (count < 0) | (count > size) | (fixed_end > size)
    buf.check(bad if valid is None else bad & valid, start, "array header does not fit", name)
    offsets = exclusive_cumsum(count)
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
    slots = start_e + (8 + bitset_bytes(count))[owner] + j * es
    region = _Region(start_e, start_e + fixed_end[owner], start_e + size[owner])
    values = _decode_value(buf, elem, _Pos(slots), region, elem_valid, name)
    return offsets, values


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
    return pa.Array.from_buffers(arrow_t, len(start), [bitmap(valid), offsets32], children=[entries])  # fmt: skip

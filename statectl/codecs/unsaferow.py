"""Spark's UnsafeRow (and UnsafeArrayData / UnsafeMapData) decoded to Arrow, column by column.

Layout (all little-endian): a null bitset of ceil(n/64) 8-byte words, one 8-byte slot per field,
then a variable-length region. Fixed-width values live in their slot; variable-length ones
(string, binary, decimal with precision > 18, struct, array, map, interval) store
``offset << 32 | size`` with the offset relative to the start of the enclosing row or array.

Every function here works on all rows at once: positions are numpy int64 arrays into one uint8
buffer, so the cost is a handful of numpy operations per field, not per row.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa

from statectl.codecs.sparktypes import (
    atomic_name,
    decimal_of,
    is_interval_dt,
    is_interval_ym,
    parse_schema,
    to_arrow_field,
    to_arrow_type,
)
from statectl.errors import CorruptFileError, UnsupportedError

_FIXED = {
    "boolean": (1, np.bool_),
    "byte": (1, np.int8),
    "short": (2, np.dtype("<i2")),
    "integer": (4, np.dtype("<i4")),
    "date": (4, np.dtype("<i4")),
    "float": (4, np.dtype("<f4")),
    "long": (8, np.dtype("<i8")),
    "timestamp": (8, np.dtype("<i8")),
    "timestamp_ntz": (8, np.dtype("<i8")),
    "double": (8, np.dtype("<f8")),
}


class _Buf:
    """The byte buffer plus bounds-safe gathers (invalid rows point at harmless positions)."""

    def __init__(self, data: np.ndarray, path: str | None) -> None:
        # 16 zero bytes of padding so clipped reads of null rows never fall off the end.
        self.data = np.concatenate([data, np.zeros(16, np.uint8)])
        self.size = len(data)
        self.path = path

    def read(self, pos: np.ndarray, width: int, dtype: Any, valid: np.ndarray) -> np.ndarray:
        if len(pos) == 0:
            return np.zeros(0, dtype=dtype)
        bad = valid & ((pos < 0) | (pos + width > self.size))
        if bad.any():
            raise CorruptFileError(
                f"row data points outside its buffer (at byte {int(pos[bad][0])}); the state file is corrupt",
                self.path,
            )
        safe = np.where(valid, pos, 0)
        cols = self.data[safe[:, None] + np.arange(width)]
        return np.ascontiguousarray(cols).view(dtype).reshape(-1)

    def gather(
        self, starts: np.ndarray, sizes: np.ndarray, valid: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        """(int64 offsets, bytes) of the ranges of the valid rows; invalid rows are empty."""
        sizes = np.where(valid, sizes, 0)
        bad = valid & ((starts < 0) | (sizes < 0) | (starts + sizes > self.size))
        if bad.any():
            raise CorruptFileError(
                "a variable-length value points outside its row; the state file is corrupt",
                self.path,
            )
        offsets = np.zeros(len(sizes) + 1, dtype=np.int64)
        np.cumsum(sizes, out=offsets[1:])
        total = int(offsets[-1])
        if total == 0:
            return offsets, np.zeros(0, np.uint8)
        idx = np.repeat(starts - offsets[:-1], sizes) + np.arange(total, dtype=np.int64)
        return offsets, self.data[idx]


def _validity(valid: np.ndarray) -> pa.Buffer | None:
    return None if valid.all() else pa.py_buffer(np.packbits(valid, bitorder="little"))


def _null_bit(
    buf: _Buf, bitset_start: np.ndarray, index: np.ndarray | int, valid: np.ndarray
) -> np.ndarray:
    byte = buf.read(bitset_start + (np.asarray(index) >> 3), 1, np.uint8, valid)
    return ((byte >> (np.asarray(index) & 7)) & 1).astype(bool)


def _decimal_from_int64(values: np.ndarray, valid: np.ndarray, t: pa.DataType) -> pa.Array:
    words = np.empty((len(values), 2), dtype=np.int64)
    words[:, 0] = values
    words[:, 1] = values >> 63
    return pa.Array.from_buffers(t, len(values), [_validity(valid), pa.py_buffer(words)])


def _decimal_from_bytes(
    buf: _Buf, starts: np.ndarray, sizes: np.ndarray, valid: np.ndarray, t: pa.DataType
) -> pa.Array:
    """BigInteger.toByteArray (big-endian two's complement, <= 16 bytes) -> decimal128."""
    n = len(starts)
    sizes = np.where(valid, sizes, 0)
    if np.any(sizes > 16):
        raise CorruptFileError("decimal value longer than 16 bytes", buf.path)
    first = buf.read(starts, 1, np.uint8, valid & (sizes > 0))
    negative = valid & (sizes > 0) & (first >= 0x80)
    be = (
        np.where(negative[:, None], np.uint8(0xFF), np.uint8(0)).astype(np.uint8).repeat(16, axis=1)
    )
    for j in range(16):
        have = valid & (j >= 16 - sizes)
        if have.any():
            col = buf.read(starts + sizes - 16 + j, 1, np.uint8, have)
            be[have, j] = col[have]
    le = np.ascontiguousarray(be[:, ::-1])
    return pa.Array.from_buffers(t, n, [_validity(valid), pa.py_buffer(le)])


def _decode_value(
    buf: _Buf, slot: np.ndarray, rel_base: np.ndarray, t: Any, valid: np.ndarray
) -> pa.Array:
    """Values of Spark type ``t`` whose slots (or array elements) start at ``slot``."""
    n = len(slot)
    arrow_t = to_arrow_type(t)
    dec = decimal_of(t)
    name = atomic_name(t)
    if name == "void":
        return pa.nulls(n)
    if dec and dec[0] <= 18:
        return _decimal_from_int64(buf.read(slot, 8, np.dtype("<i8"), valid), valid, arrow_t)
    if name in _FIXED or (name is not None and is_interval_ym(name)):
        width, dtype = _FIXED.get(name, (4, np.dtype("<i4")))
        values = buf.read(slot, width, dtype, valid)
        if name in ("date", "timestamp", "timestamp_ntz") or is_interval_ym(name):
            return pa.Array.from_buffers(
                arrow_t, n, [_validity(valid), pa.py_buffer(np.ascontiguousarray(values))]
            )
        return pa.array(values, type=arrow_t, mask=~valid if not valid.all() else None)
    if name is not None and is_interval_dt(name):
        values = buf.read(slot, 8, np.dtype("<i8"), valid)
        return pa.Array.from_buffers(arrow_t, n, [_validity(valid), pa.py_buffer(values)])
    # Variable-length: offset/size in the slot, offset relative to the enclosing row/array.
    word = buf.read(slot, 8, np.dtype("<i8"), valid)
    start = rel_base + (word >> 32)
    size = word & 0xFFFFFFFF
    if dec:
        return _decimal_from_bytes(buf, start, size, valid, arrow_t)
    if name in ("string", "binary"):
        offsets, data = buf.gather(start, size, valid)
        large = pa.large_string() if name == "string" else pa.large_binary()
        arr = pa.Array.from_buffers(
            large, n, [_validity(valid), pa.py_buffer(offsets), pa.py_buffer(data)]
        )
        try:
            return arr.cast(arrow_t)
        except pa.ArrowInvalid as e:
            raise CorruptFileError(f"invalid string data in state row ({e})", buf.path) from None
    if name == "calendarinterval":
        months = buf.read(start, 4, np.dtype("<i4"), valid)
        days = buf.read(start + 4, 4, np.dtype("<i4"), valid)
        micros = buf.read(start + 8, 8, np.dtype("<i8"), valid)
        return pa.StructArray.from_arrays(
            [pa.array(months), pa.array(days), pa.array(micros)],
            fields=list(arrow_t),
            mask=pa.array(~valid) if not valid.all() else None,
        )
    if name is not None:
        raise UnsupportedError(f"Spark type {t!r} is not supported in state by statectl", buf.path)
    kind = t.get("type")
    if kind == "udt":
        return _decode_value(buf, slot, rel_base, t["sqlType"], valid)
    if kind == "struct":
        return _decode_struct(buf, start, t["fields"], valid)
    if kind == "array":
        return _decode_array(buf, start, t["elementType"], valid)
    if kind == "map":
        key_bytes = buf.read(start, 8, np.dtype("<i8"), valid)
        keys = _decode_array(buf, start + 8, t["keyType"], valid)
        items = _decode_array(buf, start + 8 + key_bytes, t["valueType"], valid)
        if not np.array_equal(np.asarray(keys.offsets), np.asarray(items.offsets)):
            raise CorruptFileError("map with different key and value counts", buf.path)
        return pa.MapArray.from_arrays(
            keys.offsets,
            keys.flatten(),
            items.flatten(),
            type=arrow_t,
            mask=pa.array(~valid) if not valid.all() else None,
        )
    raise UnsupportedError(f"Spark type {kind!r} is not supported in state by statectl", buf.path)


def _element_size(t: Any) -> int:
    name = atomic_name(t)
    if name in ("boolean", "byte"):
        return 1
    if name == "short":
        return 2
    if name in ("integer", "float", "date") or (name is not None and is_interval_ym(name)):
        return 4
    return 8


def _decode_array(buf: _Buf, start: np.ndarray, elem: Any, valid: np.ndarray) -> pa.ListArray:
    counts = np.where(valid, buf.read(start, 8, np.dtype("<i8"), valid), 0)
    if np.any(counts < 0) or np.any(counts > buf.size):
        raise CorruptFileError("array with an invalid element count", buf.path)
    header = 8 + ((counts + 63) // 64) * 8
    esize = _element_size(elem)
    offsets = np.zeros(len(counts) + 1, dtype=np.int64)
    np.cumsum(counts, out=offsets[1:])
    total = int(offsets[-1])
    owner = np.repeat(np.arange(len(counts)), counts)
    j = np.arange(total, dtype=np.int64) - offsets[:-1][owner]
    arr_start = start[owner]
    all_valid = np.ones(total, dtype=bool)
    null = _null_bit(buf, arr_start + 8, j, all_valid)
    slots = arr_start + header[owner] + j * esize
    values = _decode_value(buf, slots, arr_start, elem, ~null)
    return pa.ListArray.from_arrays(
        pa.array(offsets.astype(np.int32)),
        values,
        type=pa.list_(pa.field("element", to_arrow_type(elem), True)),
        mask=pa.array(~valid) if not valid.all() else None,
    )


def _decode_struct(
    buf: _Buf, base: np.ndarray, fields: list[dict], valid: np.ndarray
) -> pa.StructArray:
    bitset_width = ((len(fields) + 63) // 64) * 8
    children = []
    for i, f in enumerate(fields):
        is_null = _null_bit(buf, base, i, valid)
        child_valid = valid & ~is_null
        children.append(
            _decode_value(buf, base + bitset_width + 8 * i, base, f["type"], child_valid)
        )
    arrow_fields = [to_arrow_field(f) for f in fields]
    if not fields:
        return (
            pa.StructArray.from_arrays([], fields=[], mask=pa.array(~valid))
            if len(base)
            else pa.array([], pa.struct([]))
        )
    return pa.StructArray.from_arrays(
        children, fields=arrow_fields, mask=pa.array(~valid) if not valid.all() else None
    )


def decode_unsafe_rows(
    rows: pa.Array, schema: str | dict, path: str | None = None
) -> pa.StructArray:
    """One UnsafeRow per element of ``rows`` (a null element gives a null struct)."""
    struct = parse_schema(schema)
    if rows.type != pa.large_binary():
        rows = rows.cast(pa.large_binary())
    n = len(rows)
    validity, off_buf, data_buf = rows.buffers()
    offsets = np.frombuffer(off_buf, dtype=np.int64)[rows.offset : rows.offset + n + 1]
    data = (
        np.frombuffer(data_buf, dtype=np.uint8) if data_buf is not None else np.zeros(0, np.uint8)
    )
    valid = (
        np.asarray(rows.is_valid().to_numpy(zero_copy_only=False), dtype=bool)
        if validity is not None
        else np.ones(n, bool)
    )
    fields = struct["fields"]
    need = ((len(fields) + 63) // 64) * 8 + 8 * len(fields)
    lengths = np.diff(offsets)
    short = valid & (lengths < need)
    if short.any():
        i = int(np.nonzero(short)[0][0])
        raise CorruptFileError(
            f"state row {i} has {int(lengths[i])} bytes, the schema needs at least {need}: "
            "the schema does not match the data (or the file is corrupt)",
            path,
        )
    buf = _Buf(data, path)
    return _decode_struct(buf, offsets[:-1].copy(), fields, valid)


# -- encoding (reference implementation, row at a time) -------------------------------------
def _pad8(n: int) -> int:
    return (n + 7) & ~7


def _fixed_bytes(t: Any, v: Any) -> bytes:
    import struct as _struct

    name = atomic_name(t)
    dec = decimal_of(t)
    if dec:
        return _struct.pack("<q", _unscaled(v, dec[1]))
    if name == "boolean":
        return b"\x01" if v else b"\x00"
    if name == "byte":
        return _struct.pack("<b", v)
    if name == "short":
        return _struct.pack("<h", v)
    if name in ("integer",) or is_interval_ym(name or ""):
        return _struct.pack("<i", v)
    if name == "date":
        return _struct.pack("<i", (v - _EPOCH_DATE).days if not isinstance(v, int) else v)
    if name == "float":
        return _struct.pack("<f", v) if v == v else b"\x00\x00\xc0\x7f"
    if name == "double":
        return _struct.pack("<d", v) if v == v else b"\x00\x00\x00\x00\x00\x00\xf8\x7f"
    if name in ("long",):
        return _struct.pack("<q", v)
    if name in ("timestamp", "timestamp_ntz"):
        return _struct.pack("<q", v if isinstance(v, int) else _micros(v))
    if name is not None and is_interval_dt(name):
        return _struct.pack("<q", v if isinstance(v, int) else v // _dt.timedelta(microseconds=1))
    raise UnsupportedError(f"cannot encode {t!r} as a fixed-width value")


import datetime as _dt  # noqa: E402  (kept beside the reference encoder that needs it)
import decimal as _decimal  # noqa: E402

_EPOCH_DATE = _dt.date(1970, 1, 1)
_EPOCH = _dt.datetime(1970, 1, 1)


def _micros(v: _dt.datetime) -> int:
    if v.tzinfo is not None:
        v = v.astimezone(_dt.timezone.utc).replace(tzinfo=None)
    return (v - _EPOCH) // _dt.timedelta(microseconds=1)


def _unscaled(v: Any, scale: int) -> int:
    ctx = _decimal.Context(prec=100)  # the default 28 digits would round decimal(38, s)
    return int(_decimal.Decimal(v).scaleb(scale, context=ctx).to_integral_value(context=ctx))


def _is_fixed(t: Any) -> bool:
    dec = decimal_of(t)
    if dec:
        return dec[0] <= 18
    name = atomic_name(t)
    return name is not None and (name in _FIXED or is_interval_ym(name) or is_interval_dt(name))


def _var_bytes(t: Any, v: Any) -> bytes:
    """The variable-length payload (unpadded) of a non-fixed value."""
    name = atomic_name(t)
    dec = decimal_of(t)
    if dec:
        u = _unscaled(v, dec[1])
        return u.to_bytes(max(1, (u.bit_length() + 8) // 8), "big", signed=True)
    if name == "string":
        return v.encode("utf-8")
    if name == "binary":
        return bytes(v)
    if name == "calendarinterval":
        import struct as _struct

        return _struct.pack("<iiq", v["months"], v["days"], v["microseconds"])
    kind = t.get("type") if isinstance(t, dict) else None
    if kind == "struct":
        return encode_row(t["fields"], v)
    if kind == "array":
        return encode_array(t["elementType"], v)
    if kind == "map":
        items = list(v.items()) if isinstance(v, dict) else list(v)
        keys = encode_array(t["keyType"], [k for k, _ in items])
        values = encode_array(t["valueType"], [x for _, x in items])
        return len(keys).to_bytes(8, "little", signed=True) + keys + values
    if kind == "udt":
        return _var_bytes(t["sqlType"], v)
    raise UnsupportedError(f"cannot encode Spark type {t!r}")


def encode_array(elem: Any, values: list[Any]) -> bytes:
    n = len(values)
    esize = _element_size(elem)
    header = 8 + ((n + 63) // 64) * 8
    fixed_len = _pad8(n * esize)
    head = bytearray(header + fixed_len)
    head[0:8] = n.to_bytes(8, "little")
    var = bytearray()
    for j, v in enumerate(values):
        slot = header + j * esize
        if v is None:
            head[8 + (j >> 3)] |= 1 << (j & 7)
            continue
        if _is_fixed(elem):
            head[slot : slot + esize] = _fixed_bytes(elem, v)[:esize]
        else:
            payload = _var_bytes(elem, v)
            offset = header + fixed_len + len(var)
            head[slot : slot + 8] = ((offset << 32) | len(payload)).to_bytes(8, "little")
            var += payload + b"\x00" * (_pad8(len(payload)) - len(payload))
    return bytes(head + var)


def encode_row(fields: list[dict], values: Any) -> bytes:
    """One UnsafeRow, byte for byte as UnsafeRowWriter writes it."""
    if isinstance(values, dict):
        values = [values.get(f["name"]) for f in fields]
    n = len(fields)
    bitset = ((n + 63) // 64) * 8
    head = bytearray(bitset + 8 * n)
    var = bytearray()
    for i, (f, v) in enumerate(zip(fields, values, strict=True)):
        t = f["type"]
        slot = bitset + 8 * i
        dec = decimal_of(t)
        if v is None:
            head[i >> 3] |= 1 << (i & 7)
            if dec and dec[0] > 18:
                # Spark still reserves 16 bytes and points the slot at them (size 0).
                head[slot : slot + 8] = ((len(head) + len(var)) << 32).to_bytes(8, "little")
                var += b"\x00" * 16
            continue
        if _is_fixed(t):
            head[slot : slot + 8] = _fixed_bytes(t, v).ljust(8, b"\x00")
            continue
        payload = _var_bytes(t, v)
        offset = len(head) + len(var)
        head[slot : slot + 8] = ((offset << 32) | len(payload)).to_bytes(8, "little")
        room = 16 if dec else _pad8(len(payload))
        var += payload + b"\x00" * (room - len(payload))
    return bytes(head + var)


def encode_unsafe_rows(data: pa.StructArray | pa.Table, schema: str | dict) -> pa.LargeBinaryArray:
    """UnsafeRow bytes for every row (a null struct gives a null element)."""
    fields = parse_schema(schema)["fields"]
    if isinstance(data, pa.Table):
        data = (
            pa.StructArray.from_arrays(data.columns, names=data.column_names)
            if data.num_columns
            else data
        )
    fast = encode_flat_rows(data, fields)
    if fast is not None:
        return fast
    columns = [data.field(i) for i in range(data.type.num_fields)]
    pylists = [_pylist(c) for c in columns]
    valid = data.is_valid().to_pylist()
    out = [
        encode_row(fields, [col[r] for col in pylists]) if valid[r] else None
        for r in range(len(data))
    ]
    return pa.array(out, type=pa.large_binary())


def _pylist(arr: pa.Array) -> list[Any]:
    """Python values by position (structs as lists, so duplicate field names survive)."""
    if pa.types.is_struct(arr.type):
        children = [_pylist(arr.field(i)) for i in range(arr.type.num_fields)]
        valid = arr.is_valid().to_pylist()
        return [[c[r] for c in children] if valid[r] else None for r in range(len(arr))]
    if (
        pa.types.is_timestamp(arr.type)
        or pa.types.is_duration(arr.type)
        or pa.types.is_date(arr.type)
    ):
        storage = arr.cast(pa.int64() if not pa.types.is_date32(arr.type) else pa.int32())
        return storage.to_pylist()
    if pa.types.is_map(arr.type):
        return [None if m is None else list(m) for m in arr.to_pylist()]
    return arr.to_pylist()


# -- vectorized encoding of flat rows ---------------------------------------------------------
def _flat_kind(t: Any) -> str | None:
    """How a top-level field is encoded by the vectorized path, or None if it needs the loop."""
    dec = decimal_of(t)
    if dec:
        return "decimal" if dec[0] <= 18 else None
    name = atomic_name(t)
    if name in _FIXED:
        return name
    if name in ("string", "binary"):
        return "var"
    if name == "void":
        return "void"
    return None


def _scatter(
    dst: np.ndarray,
    dst_starts: np.ndarray,
    src: np.ndarray,
    src_starts: np.ndarray,
    lengths: np.ndarray,
) -> None:
    total = int(lengths.sum())
    if total == 0:
        return
    offs = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offs[1:])
    within = np.arange(total, dtype=np.int64) - np.repeat(offs[:-1], lengths)
    dst[np.repeat(dst_starts, lengths) + within] = src[np.repeat(src_starts, lengths) + within]


def encode_flat_rows(data: pa.StructArray, fields: list[dict]) -> pa.LargeBinaryArray | None:
    """UnsafeRows for rows whose fields are all fixed-width, string or binary, at numpy speed.

    Returns None when a field needs the reference encoder (nested or big-decimal types).
    """
    kinds = [_flat_kind(f["type"]) for f in fields]
    if any(k is None for k in kinds) or data.null_count:
        return None
    n = len(data)
    nf = len(fields)
    head = ((nf + 63) // 64) * 8 + 8 * nf
    var_lens = []
    var_src = []
    for i, k in enumerate(kinds):
        if k == "var":
            col = data.field(i).cast(pa.large_binary())
            _, off_buf, data_buf = col.buffers()
            offs = np.frombuffer(off_buf, dtype=np.int64)[col.offset : col.offset + n + 1]
            src = (
                np.frombuffer(data_buf, dtype=np.uint8)
                if data_buf is not None
                else np.zeros(0, np.uint8)
            )
            valid = np.asarray(col.is_valid().to_numpy(zero_copy_only=False), dtype=bool)
            var_lens.append(np.where(valid, np.diff(offs), 0))
            var_src.append((src, offs[:-1]))
    padded = [(ln + 7) & ~7 for ln in var_lens]
    sizes = head + (np.sum(padded, axis=0) if padded else np.zeros(n, dtype=np.int64))
    starts = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(sizes, out=starts[1:])
    out = np.zeros(int(starts[-1]), dtype=np.uint8)
    words = out.view("<u8")
    row = starts[:-1]
    cursor = np.full(n, head, dtype=np.int64)
    v = 0
    for i, k in enumerate(kinds):
        col = data.field(i)
        valid = np.asarray(col.is_valid().to_numpy(zero_copy_only=False), dtype=bool)
        null_rows = row[~valid]
        if len(null_rows):
            out[null_rows + (i >> 3)] |= np.uint8(1 << (i & 7))
        slot = (row + ((nf + 63) // 64) * 8 + 8 * i) >> 3
        if k == "void":
            continue
        if k == "var":
            lengths = var_lens[v]
            src, src_starts = var_src[v]
            words[slot] = np.where(
                valid, (cursor.astype(np.uint64) << np.uint64(32)) | lengths.astype(np.uint64), 0
            )
            _scatter(out, row + cursor, src, src_starts, lengths)
            cursor = cursor + padded[v]
            v += 1
            continue
        if k == "decimal":
            raw = np.frombuffer(col.buffers()[1], dtype=np.int64)[
                2 * col.offset : 2 * (col.offset + n)
            ][0::2]
            bits = raw.view(np.uint64)
        else:
            width, dtype = _FIXED[k]
            if k in ("date", "timestamp", "timestamp_ntz"):
                vals = np.asarray(
                    col.cast(pa.int32() if k == "date" else pa.int64())
                    .fill_null(0)
                    .to_numpy(zero_copy_only=False)
                )
            elif k == "boolean":
                vals = np.asarray(col.cast(pa.int8()).fill_null(0).to_numpy(zero_copy_only=False))
            else:
                vals = np.asarray(col.fill_null(0).to_numpy(zero_copy_only=False))
            vals = vals.astype(dtype)
            if k == "float":
                vals = np.where(np.isnan(vals), np.float32("nan"), vals).astype(dtype)
                bits = vals.view(np.uint32).astype(np.uint64)
                bits = np.where(np.isnan(vals), np.uint64(0x7FC00000), bits)
            elif k == "double":
                bits = np.where(np.isnan(vals), np.uint64(0x7FF8000000000000), vals.view(np.uint64))
            elif k == "boolean":
                bits = vals.astype(np.uint64)
            else:
                # Only the value's own width is written; the rest of the slot stays zero.
                bits = vals.astype(np.int64).view(np.uint64) & np.uint64(
                    (1 << (8 * width)) - 1 if width < 8 else 0xFFFFFFFFFFFFFFFF
                )
        words[slot] = np.where(valid, bits, 0)
    return pa.LargeBinaryArray.from_buffers(
        pa.large_binary(), n, [None, pa.py_buffer(starts), pa.py_buffer(out)]
    )

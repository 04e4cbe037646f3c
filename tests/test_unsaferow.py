"""UnsafeRow codec: Spark's byte vectors, round trips of every type, corruption, and (marked
``spark``) byte-for-byte agreement with the rows Spark 4.3's UnsafeRowWriter produces."""

from __future__ import annotations

import datetime as dt
import decimal
import struct
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from statectl.codecs.sparktypes import decimal_of, kind, parse_schema, physical, to_arrow_type
from statectl.codecs.unsaferow_decode import decode_unsafe_rows
from statectl.codecs.unsaferow_encode import encode_unsafe_rows
from statectl.errors import CorruptFileError, UnsupportedError
from tests.helpers.unsaferow import encode_row


def field(name: str, t: Any, nullable: bool = True) -> dict:
    return {"name": name, "type": t, "nullable": nullable, "metadata": {}}


def struct_of(*fields: dict) -> dict:
    return {"type": "struct", "fields": list(fields)}


def array_of(t: Any, contains_null: bool = True) -> dict:
    return {"type": "array", "elementType": t, "containsNull": contains_null}


def map_of(k: Any, v: Any, value_null: bool = True) -> dict:
    return {"type": "map", "keyType": k, "valueType": v, "valueContainsNull": value_null}


def rows_of(*hexes: str) -> pa.Array:
    return pa.array([bytes.fromhex(h.replace(" ", "")) for h in hexes], pa.large_binary())


KEY = struct_of(field("key", "string"))
VALUE = struct_of(field("count", "long"), field("sum", "long"))
_EXACT = decimal.Context(prec=100)  # the default 28 digits would round decimal(38, s)


# -- the vectors in spark-state-format.md §7.5.1, §8.1-§8.3 (Spark 4.3.0) ---------------------
def test_doc_vectors_key_and_value():
    key = "0000000000000000 0100000010000000 6100000000000000"  # §8.1: "a"
    value = "0000000000000000 0200000000000000 0b00000000000000"  # §8.2: count 2, sum 11
    assert decode_unsafe_rows(rows_of(key), KEY).to_pylist() == [{"key": "a"}]
    assert decode_unsafe_rows(rows_of(value), VALUE).to_pylist() == [{"count": 2, "sum": 11}]
    assert encode_row(KEY["fields"], ["a"]).hex() == key.replace(" ", "")
    assert encode_unsafe_rows(decode_unsafe_rows(rows_of(value), VALUE), VALUE) == rows_of(value)
    # §7.5.1: RocksDB prefixes each row with the encoding version byte 0x00.
    rocks_value = "00 0000000000000000 0300000000000000 1000000000000000"
    got = decode_unsafe_rows(rows_of(rocks_value), VALUE, skip_prefix=1)
    assert got.to_pylist() == [{"count": 3, "sum": 16}]
    assert got == decode_unsafe_rows(rows_of(rocks_value[3:]), VALUE)  # the prefix, skipped


# §8.3, one field at a time: (type, value, the slot and variable bytes Spark wrote)
DOC_TYPES = [
    ("boolean", True, "0100000000000000", ""),
    ("byte", 7, "0700000000000000", ""),
    ("short", -2, "feff000000000000", ""),
    ("integer", 123456, "40e2010000000000", ""),
    ("long", -5, "fbffffffffffffff", ""),
    ("float", 1.5, "0000c03f00000000", ""),
    ("double", -2.25, "00000000000002c0", ""),
    ("date", dt.date(2024, 3, 1), "474d000000000000", ""),
    ("timestamp", 1709296496789000, "08c6819a98120600", ""),
    ("timestamp_ntz", 1709296496789000, "08c6819a98120600", ""),
    ("decimal(10,2)", decimal.Decimal("12.34"), "d204000000000000", ""),
    ("binary", b"\x01\x02\x03", "0300000010000000", "0102030000000000"),
    (
        "string",
        "héllo wörld, longer than 8",
        "1c00000010000000",
        "68c3a96c6c6f2077c3b6726c642c206c6f6e676572207468616e203800000000",
    ),
    (
        "decimal(38,3)",
        decimal.Decimal("-12345678901234567890.123"),
        "0a00000010000000",
        "fd62bd49b1898ebdbb35000000000000",
    ),
    (
        struct_of(field("a", "integer"), field("b", "string")),
        {"a": 1, "b": "x"},
        "2000000010000000",
        "0000000000000000 0100000000000000 0100000018000000 7800000000000000",
    ),
    (
        array_of("integer"),
        [1, 2, None],
        "2000000010000000",
        "0300000000000000 0400000000000000 0100000002000000 0000000000000000",
    ),
    (
        array_of("string"),
        ["p", "qq"],
        "3000000010000000",
        "0200000000000000 0000000000000000 0100000020000000 0200000028000000 7000000000000000 7171000000000000",
    ),
    (
        map_of("string", "integer"),
        {"k1": 10, "k2": 20},
        "5000000010000000",
        "3000000000000000 0200000000000000 0000000000000000 0200000020000000 0200000028000000 6b31000000000000 6b32000000000000 0200000000000000 0000000000000000 0a00000014000000",
    ),
]


@pytest.mark.parametrize(("t", "value", "slot", "var"), DOC_TYPES, ids=[str(c[0])[:30] for c in DOC_TYPES])  # fmt: skip
def test_doc_type_table(t, value, slot, var):
    schema = struct_of(field("c", t))
    row = "0000000000000000" + slot + var
    expected = to_arrow_type(schema)
    decoded = decode_unsafe_rows(rows_of(row), schema)
    assert decoded.equals(pa.array([{"c": _py(t, value)}], expected))
    assert encode_unsafe_rows(decoded, schema) == rows_of(row)


def _py(t: Any, v: Any) -> Any:
    if kind(t) == "map":
        return list(v.items())
    return v


def test_doc_nulls_and_big_decimal_null():
    # §8.3: null string and null int → bits set, slots 0. A null decimal(38) keeps 16 bytes.
    schema = struct_of(field("s", "string"), field("i", "integer"), field("d", "decimal(38,3)"))
    row = encode_row(schema["fields"], [None, None, None])
    assert row == bytes.fromhex("0700000000000000" + "00" * 16 + "0000000020000000") + bytes(16)
    assert decode_unsafe_rows(pa.array([row]), schema).to_pylist() == [{"s": None, "i": None, "d": None}]  # fmt: skip
    # §9.2: dedup's value {__dummy__: void} is always null.
    dummy = struct_of(field("__dummy__", "void"))
    assert encode_row(dummy["fields"], [None]).hex() == "0100000000000000" + "0000000000000000"


# -- an independent, row-at-a-time reference writer (a transcription of UnsafeRowWriter) -------
def _pad(b: bytes) -> bytes:
    return b + b"\x00" * (-len(b) % 8)


def ref_row(fields: list[dict], values: list[Any]) -> bytes:
    n = len(fields)
    bitset = (n + 63) // 64 * 8
    head = bytearray(bitset + 8 * n)
    var = bytearray()
    for i, (f, v) in enumerate(zip(fields, values, strict=True)):
        t, slot = f["type"], bitset + 8 * i
        big = (decimal_of(t) or (0, 0))[0] > 18
        if v is None or kind(t) == "void":
            head[i >> 3] |= 1 << (i & 7)
            if big:  # write((Decimal) null, p, s): 16 zero bytes, slot = cursor << 32
                head[slot : slot + 8] = ((len(head) + len(var)) << 32).to_bytes(8, "little")
                var += bytes(16)
            continue
        fixed = ref_fixed(t, v)
        if fixed is not None:
            head[slot : slot + 8] = fixed.ljust(8, b"\x00")
            continue
        payload = ref_var(t, v)
        offset = len(head) + len(var)
        head[slot : slot + 8] = ((offset << 32) | len(payload)).to_bytes(8, "little")
        var += payload.ljust(16, b"\x00") if big else _pad(payload)
    return bytes(head + var)


def ref_array(elem: Any, values: list[Any]) -> bytes:
    n = len(values)
    size = ref_element_size(elem)
    header = 8 + (n + 63) // 64 * 8
    head = bytearray(header + len(_pad(bytes(n * size))))
    head[0:8] = n.to_bytes(8, "little")
    var = bytearray()
    for j, v in enumerate(values):
        at = header + j * size
        if v is None:
            head[8 + (j >> 3)] |= 1 << (j & 7)
            continue
        fixed = ref_fixed(elem, v)
        if fixed is not None:
            head[at : at + size] = fixed[:size]
            continue
        payload = ref_var(elem, v)  # no 16-byte reservation inside arrays
        offset = len(head) + len(var)
        head[at : at + 8] = ((offset << 32) | len(payload)).to_bytes(8, "little")
        var += _pad(payload)
    return bytes(head + var)


def ref_element_size(t: Any) -> int:
    return {"boolean": 1, "byte": 1, "short": 2, "integer": 4, "date": 4, "float": 4, "interval_ym": 4}.get(kind(t), 8)  # fmt: skip


def ref_fixed(t: Any, v: Any) -> bytes | None:
    dec = decimal_of(t)
    if dec:
        return None if dec[0] > 18 else struct.pack("<q", ref_unscaled(v, dec[1]))
    fmt = {"boolean": "<?", "byte": "<b", "short": "<h", "integer": "<i", "date": "<i", "interval_ym": "<i", "long": "<q", "timestamp": "<q", "timestamp_ntz": "<q", "interval_dt": "<q", "time": "<q", "float": "<f", "double": "<d"}.get(kind(t))  # fmt: skip
    if fmt is None:
        return None
    if fmt in ("<f", "<d") and v != v:
        return b"\x00\x00\xc0\x7f" if fmt == "<f" else b"\x00" * 6 + b"\xf8\x7f"
    return struct.pack(fmt, v)


def ref_unscaled(v: decimal.Decimal, scale: int) -> int:
    return int(v.scaleb(scale, _EXACT))


def ref_var(t: Any, v: Any) -> bytes:
    k = kind(t)
    t = physical(t)
    if k == "string":
        return v.encode()
    if k == "binary":
        return bytes(v)
    if k == "decimal":
        u = ref_unscaled(v, decimal_of(t)[1])  # type: ignore[index]
        # BigInteger.toByteArray: bitLength() (without the sign bit) // 8 + 1 bytes
        return u.to_bytes((u if u >= 0 else ~u).bit_length() // 8 + 1, "big", signed=True)
    if k == "calendarinterval":
        return struct.pack("<iiq", v["months"], v["days"], v["microseconds"])
    if k == "struct":
        return ref_row(t["fields"], [v[f["name"]] for f in t["fields"]])
    if k == "array":
        return ref_array(t["elementType"], v)
    assert k == "map"
    keys = ref_array(t["keyType"], [a for a, _ in v])
    return len(keys).to_bytes(8, "little") + keys + ref_array(t["valueType"], [b for _, b in v])


def storage_values(schema: dict, arr: pa.Array) -> list[Any]:
    """Python values with dates, times, timestamps and durations as their integer storage."""
    return [_storage(schema, v) for v in arr.to_pylist()]


_EPOCH = dt.datetime(1970, 1, 1)


def _storage(t: Any, v: Any) -> Any:
    if v is None:
        return None
    k = kind(t)
    t = physical(t)
    if k == "date":
        return (v - _EPOCH.date()).days
    if k in ("timestamp", "timestamp_ntz"):
        naive = v.astimezone(dt.timezone.utc).replace(tzinfo=None) if v.tzinfo else v
        return (naive - _EPOCH) // dt.timedelta(microseconds=1)
    if k == "interval_dt":
        return v // dt.timedelta(microseconds=1)
    if k == "time":
        return ((v.hour * 60 + v.minute) * 60 + v.second) * 10**9 + v.microsecond * 1000
    if k == "struct":
        return {f["name"]: _storage(f["type"], v[f["name"]]) for f in t["fields"]}
    if k == "array":
        return [_storage(t["elementType"], x) for x in v]
    if k == "map":
        return [(_storage(t["keyType"], a), _storage(t["valueType"], b)) for a, b in v]
    return v


# -- random schemas and data: every type, nulls at every level -------------------------------
ATOMIC_TYPES = [
    "boolean", "byte", "short", "integer", "long", "float", "double", "string", "binary",
    "date", "timestamp", "timestamp_ntz", "void", "decimal(1,0)", "decimal(10,2)",
    "decimal(18,18)", "decimal(19,0)", "decimal(38,3)", "decimal(38,38)",
    "interval year to month", "interval day to second", "interval", "time(6)",
]  # fmt: skip
MAP_KEY_TYPES = ["string", "integer", "long", "date", "decimal(38,3)", "binary"]


def spark_types(depth: int = 2) -> st.SearchStrategy[Any]:
    atomic = st.sampled_from(ATOMIC_TYPES)
    if depth == 0:
        return atomic
    inner = spark_types(depth - 1)
    return st.one_of(
        atomic,
        atomic,
        st.builds(array_of, inner, st.booleans()),
        st.builds(map_of, st.sampled_from(MAP_KEY_TYPES), inner, st.booleans()),
        st.lists(st.tuples(inner, st.booleans()), min_size=1, max_size=4).map(
            lambda fs: struct_of(*[field(f"f{i}", t, n) for i, (t, n) in enumerate(fs)])
        ),
    )


def _decimals(p: int, s: int) -> st.SearchStrategy[decimal.Decimal]:
    top = 10**p - 1
    return st.one_of(st.integers(-top, top), st.sampled_from([top, -top, 0, -1, 1])).map(
        lambda u: decimal.Decimal(u).scaleb(-s, _EXACT)
    )


def values_of(t: Any, nullable: bool = True) -> st.SearchStrategy[Any]:
    k = kind(t)
    base: st.SearchStrategy[Any]
    if k == "void":
        return st.none()
    if k == "decimal":
        base = _decimals(*decimal_of(t))  # type: ignore[misc]
    elif k == "struct":
        fields = physical(t)["fields"]
        base = st.fixed_dictionaries({f["name"]: values_of(f["type"], f["nullable"]) for f in fields})  # fmt: skip
    elif k == "array":
        t = physical(t)
        base = st.lists(values_of(t["elementType"], t["containsNull"]), max_size=5)
    elif k == "map":
        t = physical(t)
        keys = values_of(t["keyType"], False)
        base = st.dictionaries(keys, values_of(t["valueType"], t["valueContainsNull"]), max_size=4).map(lambda d: list(d.items()))  # fmt: skip
    else:
        base = {
            "boolean": st.booleans(),
            "byte": st.integers(-(2**7), 2**7 - 1),
            "short": st.integers(-(2**15), 2**15 - 1),
            "integer": st.integers(-(2**31), 2**31 - 1),
            "interval_ym": st.integers(-(2**31), 2**31 - 1),
            "long": st.integers(-(2**63), 2**63 - 1),
            "interval_dt": st.integers(-(2**63), 2**63 - 1),
            "time": st.integers(0, 86_400 * 10**6 - 1).map(lambda us: us * 1000),  # time(6)
            "float": st.floats(width=32, allow_nan=False),
            "double": st.floats(allow_nan=False),
            "string": st.text(max_size=20),
            "binary": st.binary(max_size=20),
            "date": st.integers(-719_162, 2_932_896),  # years 1 to 9999
            "timestamp": st.integers(-62_135_596_800 * 10**6, 253_402_300_799 * 10**6),
            "timestamp_ntz": st.integers(-62_135_596_800 * 10**6, 253_402_300_799 * 10**6),
            "calendarinterval": st.fixed_dictionaries(
                {
                    "months": st.integers(-(2**31), 2**31 - 1),
                    "days": st.integers(-(2**31), 2**31 - 1),
                    "microseconds": st.integers(-(2**63), 2**63 - 1),
                }
            ),
        }[k]
    return st.one_of(st.none(), base) if nullable else base


@st.composite
def schema_and_data(draw: st.DrawFn) -> tuple[dict, pa.StructArray]:
    types = draw(st.lists(st.tuples(spark_types(), st.booleans()), min_size=1, max_size=6))
    schema = struct_of(*[field(f"c{i}", t, n) for i, (t, n) in enumerate(types)])
    row = st.fixed_dictionaries({f["name"]: values_of(f["type"], f["nullable"]) for f in schema["fields"]})  # fmt: skip
    rows = draw(st.lists(st.one_of(st.none(), row, row, row), max_size=10))
    return schema, pa.array(rows, type=to_arrow_type(schema))


@given(schema_and_data())
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])  # fmt: skip
def test_round_trip_and_reference_bytes(case):
    schema, data = case
    encoded = encode_unsafe_rows(data, schema)
    assert encoded.null_count == data.null_count
    # The vectorized writer agrees with the row-at-a-time transcription of UnsafeRowWriter.
    fields = schema["fields"]
    reference = [None if r is None else ref_row(fields, [r[f["name"]] for f in fields]) for r in storage_values(schema, data)]  # fmt: skip
    assert encoded.to_pylist() == reference
    assert all(len(b) % 8 == 0 for b in reference if b is not None)
    decoded = decode_unsafe_rows(encoded, schema)
    assert decoded.type == to_arrow_type(schema)
    decoded.validate(full=True)
    assert decoded.to_pylist() == data.to_pylist()
    # Same bytes from a binary (int32 offsets) input behind a 2-byte prefix, sliced.
    prefixed = pa.array([None if b is None else b"\x05\x00" + b for b in reference], pa.binary())
    again = decode_unsafe_rows(pa.concat_arrays([pa.array([b"xx"], pa.binary()), prefixed]).slice(1), schema, skip_prefix=2)  # fmt: skip
    assert again.to_pylist() == data.to_pylist()


def test_input_shapes():
    data = pa.array([{"count": 1, "sum": 2}, None, {"count": None, "sum": 4}], to_arrow_type(VALUE))
    table = pa.table({"count": pa.array([1, 3], pa.int64()), "sum": pa.array([2, 4], pa.int64())})
    assert encode_unsafe_rows(table, VALUE) == encode_unsafe_rows(table.to_batches()[0], VALUE)
    chunked = pa.chunked_array([data.slice(0, 1), data.slice(1)])
    assert encode_unsafe_rows(chunked, VALUE) == encode_unsafe_rows(data, VALUE)
    # Columns of other but castable types (int32 → long) are accepted.
    narrow = pa.table({"count": pa.array([1], pa.int32()), "sum": pa.array([2], pa.int32())})
    assert encode_unsafe_rows(narrow, VALUE).to_pylist() == encode_unsafe_rows(table.slice(0, 1), VALUE).to_pylist()  # fmt: skip
    # Decoding a sliced or chunked binary array, and an empty one.
    rows = encode_unsafe_rows(data, VALUE)
    assert decode_unsafe_rows(rows.slice(1), VALUE).to_pylist() == data.slice(1).to_pylist()
    assert decode_unsafe_rows(pa.chunked_array([rows.slice(0, 2), rows.slice(2)]), VALUE).equals(data)  # fmt: skip
    assert len(decode_unsafe_rows(pa.array([], pa.binary()), VALUE)) == 0
    # Rows sliced out of a larger buffer are read in place.
    stream = pa.array([b"\x00" * 8 + r + b"\xff" * 20 for r in rows.to_pylist()[:1]])
    inner = pa.Array.from_buffers(pa.binary(), 1, [None, pa.py_buffer(np.array([8, 32], np.int32)), stream.buffers()[2]])  # fmt: skip
    assert decode_unsafe_rows(inner, VALUE).to_pylist() == [{"count": 1, "sum": 2}]
    with pytest.raises(UnsupportedError):
        encode_unsafe_rows(pa.table({"count": pa.array(["x"])}), VALUE)


def test_floats_nan_and_negative_zero():
    schema = struct_of(field("f", "float"), field("d", "double"), field("a", array_of("double")))
    odd_nan32 = np.array([0x7FC00001], np.uint32).view(np.float32)
    odd_nan64 = np.array([0xFFF8000000000001], np.uint64).view(np.float64)
    data = pa.StructArray.from_arrays(
        [pa.array(odd_nan32), pa.array(odd_nan64), pa.array([[-0.0, float(odd_nan64[0])]])],
        names=["f", "d", "a"],
    )
    row = encode_unsafe_rows(data, schema)[0].as_py()
    assert row[8:12] == bytes.fromhex("0000c07f") and row[16:24] == bytes.fromhex("000000000000f87f")  # fmt: skip
    # the array: count, null bits, then -0.0 (kept) and the canonical NaN
    assert row[48:64] == bytes.fromhex("0000000000000080 000000000000f87f".replace(" ", ""))
    normalized = encode_unsafe_rows(data, schema, normalize_floats=True)[0].as_py()
    assert normalized[48:56] == bytes(8)  # -0.0 → 0.0, as NormalizeFloatingNumbers does for keys
    decoded = decode_unsafe_rows(pa.array([row]), schema).to_pylist()[0]
    assert np.isnan(decoded["f"]) and np.isnan(decoded["d"]) and str(decoded["a"][0]) == "-0.0"


def test_encode_row_python_values():
    schema = struct_of(
        field("d", "date"),
        field("t", "timestamp"),
        field("n", "timestamp_ntz"),
        field("m", map_of("string", "long")),
        field("s", struct_of(field("x", "integer"), field("x", "string"))),  # duplicate names
        field("i", "interval day to second"),
    )
    values = [
        dt.date(2024, 3, 1),
        dt.datetime(2024, 3, 1, 12, 34, 56, 789000, tzinfo=dt.timezone.utc),
        dt.datetime(2024, 3, 1, 12, 34, 56, 789000),
        {"k": 1},
        [1, "y"],
        dt.timedelta(microseconds=7),
    ]
    row = encode_row(schema["fields"], values)
    assert row == encode_row(schema["fields"], [19783, 1709296496789000, 1709296496789000, [("k", 1)], (1, "y"), 7])  # fmt: skip
    assert row[8:16] == bytes.fromhex("474d000000000000")
    assert row[16:32] == bytes.fromhex("08c6819a98120600") * 2
    decoded = decode_unsafe_rows(pa.array([row]), schema)
    assert decoded.field(4).field(1).to_pylist() == ["y"]


# -- corruption is reported, vectorized, naming the file -------------------------------------
def _corrupt(schema: dict, row: bytes, match: str) -> None:
    with pytest.raises(CorruptFileError, match=match) as e:
        decode_unsafe_rows(pa.array([row], pa.large_binary()), schema, "state/0/0/1.delta")
    assert "state/0/0/1.delta" in str(e.value)


def test_corruption():
    key = bytearray.fromhex("000000000000000001000000100000006100000000000000")
    _corrupt(VALUE, bytes(8), "schema needs at least 24")
    bad = bytearray(key)
    bad[8] = 9  # size 9 from offset 16 runs past the 24-byte row
    _corrupt(KEY, bytes(bad), r"row\.key.*outside its row \(row 0")
    bad = bytearray(key)
    bad[12] = 8  # offset into the fixed region
    _corrupt(KEY, bytes(bad), "outside its row")
    arr = struct_of(field("a", array_of("long")))
    bad = bytearray(encode_row(arr["fields"], [[1, 2, 3]]))
    bad[16] = 200  # element count
    _corrupt(arr, bytes(bad), r"row\.a\[\]: array header does not fit")
    mp = struct_of(field("m", map_of("string", "long")))
    bad = bytearray(encode_row(mp["fields"], [{"a": 1}]))
    bad[16] = 250  # key array length
    _corrupt(mp, bytes(bad), "map key array does not fit")
    nested = struct_of(field("s", struct_of(field("x", "long"), field("y", "long"))))
    bad = bytearray(encode_row(nested["fields"], [[1, 2]]))
    bad[8] = 16  # nested row shorter than its 24-byte header
    _corrupt(nested, bytes(bad), "nested row too short")
    big = struct_of(field("d", "decimal(38,0)"))
    bad = bytearray(encode_row(big["fields"], [decimal.Decimal(5)]))
    bad[8] = 17
    _corrupt(big, bytes(bad), "outside its row|decimal")
    # The second row is the corrupt one, and the message says so.
    second = bytes.fromhex("0000000000000000 0900000010000000 6100000000000000".replace(" ", ""))
    with pytest.raises(CorruptFileError, match=r"row 1,"):
        decode_unsafe_rows(pa.array([bytes(key), second]), KEY)
    # A null row or a null field may hold anything: it is not read.
    null_field = bytearray(key)
    null_field[0] = 1
    null_field[8:16] = b"\xff" * 8
    assert decode_unsafe_rows(pa.array([bytes(null_field), None]), KEY).to_pylist() == [{"key": None}, None]  # fmt: skip
    with pytest.raises(
        CorruptFileError, match="state row 0 has -1 bytes, the schema needs at least 16"
    ):
        decode_unsafe_rows(pa.array([b"\x00"]), KEY, "x", skip_prefix=2)
    with pytest.raises(UnsupportedError, match="UTF-8"):
        decode_unsafe_rows(rows_of("0000000000000000 0100000010000000 ff00000000000000"), KEY)


def test_unsupported_types():
    for t in ["variant", "timestamp_ntz(9)", "geometry(4326)", "whatever"]:
        with pytest.raises(UnsupportedError, match="not supported"):
            decode_unsafe_rows(pa.array([bytes(16)]), struct_of(field("v", t)))


# -- byte-exact agreement with Spark 4.3.0 ----------------------------------------------------
@pytest.fixture(scope="session")
def _spark(spark):  # the one shared session of tests/conftest.py
    return spark


def spark_unsafe_rows(df: Any) -> tuple[str, pa.Array]:
    """(schema JSON, UnsafeRow bytes) of a DataFrame, as Spark's own writer lays them out.

    ``executeCollect`` returns the UnsafeRows the plan's UnsafeProjection wrote (copied as
    bytes); ``getBytes`` hands them over through py4j.
    """
    jdf = df._jdf
    rows = jdf.queryExecution().executedPlan().executeCollect()
    assert all(r.getClass().getSimpleName() == "UnsafeRow" for r in rows[:1])
    return jdf.schema().json(), pa.array([bytes(r.getBytes()) for r in rows], pa.large_binary())


def _spark_input(seed: int, n: int) -> tuple[Any, list[tuple], list[dict]]:
    """A schema of every type Python can hand to Spark, random rows with nulls at every level,
    and the values the SQL expressions below add."""
    from pyspark.sql import types as T

    rng = np.random.default_rng(seed)
    inner = T.StructType([T.StructField("x", T.ShortType()), T.StructField("y", T.BinaryType()), T.StructField("z", T.DecimalType(38, 10))])  # fmt: skip
    schema = T.StructType(
        [
            T.StructField("id", T.LongType(), False),
            T.StructField("b", T.BooleanType()),
            T.StructField("y", T.ByteType()),
            T.StructField("h", T.ShortType()),
            T.StructField("i", T.IntegerType()),
            T.StructField("l", T.LongType()),
            T.StructField("f", T.FloatType()),
            T.StructField("d", T.DoubleType()),
            T.StructField("s", T.StringType()),
            T.StructField("bin", T.BinaryType()),
            T.StructField("dt", T.DateType()),
            T.StructField("ts", T.TimestampType()),
            T.StructField("ntz", T.TimestampNTZType()),
            T.StructField("d7", T.DecimalType(7, 2)),
            T.StructField("d18", T.DecimalType(18, 0)),
            T.StructField("d19", T.DecimalType(19, 4)),
            T.StructField("d38", T.DecimalType(38, 3)),
            T.StructField("dti", T.DayTimeIntervalType()),
            T.StructField("st", inner),
            T.StructField("ai", T.ArrayType(T.IntegerType())),
            T.StructField("ab", T.ArrayType(T.BooleanType())),
            T.StructField("ah", T.ArrayType(T.ShortType())),
            T.StructField("af", T.ArrayType(T.FloatType())),
            T.StructField("as_", T.ArrayType(T.StringType())),
            T.StructField("ad", T.ArrayType(T.DecimalType(38, 2))),
            T.StructField("ad9", T.ArrayType(T.DecimalType(9, 2))),
            T.StructField("ast", T.ArrayType(inner)),
            T.StructField("aa", T.ArrayType(T.ArrayType(T.LongType()))),
            T.StructField("adt", T.ArrayType(T.DateType())),
            T.StructField("m", T.MapType(T.StringType(), T.DoubleType())),
            T.StructField("mi", T.MapType(T.IntegerType(), inner)),
            T.StructField("ms", T.MapType(T.StringType(), T.ArrayType(T.StringType()))),
        ]
    )

    def maybe(v: Any, p: float = 0.2) -> Any:
        return None if rng.random() < p else v

    def text() -> str:
        return "".join(rng.choice(list("ab€😀xyz"), size=int(rng.integers(0, 20))))

    def dec(p: int, s: int) -> decimal.Decimal:
        digits = int(rng.integers(1, p + 1))
        u = int(rng.integers(0, 10 ** min(digits, 18))) * 10 ** max(0, digits - 18)
        return decimal.Decimal(u if rng.random() < 0.5 else -u).scaleb(-s, _EXACT)

    def ts() -> dt.datetime:
        return dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc) + dt.timedelta(microseconds=int(rng.integers(-(2**55), 2**55)))  # fmt: skip

    def st_value() -> Any:
        return maybe((maybe(int(rng.integers(-(2**15), 2**15))), maybe(rng.bytes(int(rng.integers(0, 30)))), maybe(dec(38, 10))))  # fmt: skip

    def arr(f: Any) -> Any:
        return maybe([maybe(f()) for _ in range(int(rng.integers(0, 70)))])

    rows, extra = [], []
    for i in range(n):
        rows.append(
            (
                i,
                maybe(bool(rng.integers(0, 2))),
                maybe(int(rng.integers(-128, 128))),
                maybe(int(rng.integers(-(2**15), 2**15))),
                maybe(int(rng.integers(-(2**31), 2**31))),
                maybe(int(rng.integers(-(2**63), 2**63))),
                maybe(float(np.float32(rng.normal() * 1e3))),
                maybe(float(rng.choice([rng.normal(), -0.0, np.inf, -np.inf, np.nan]))),
                maybe(text()),
                maybe(rng.bytes(int(rng.integers(0, 40)))),
                maybe(dt.date(1, 1, 1) + dt.timedelta(days=int(rng.integers(0, 3_652_058)))),
                maybe(ts()),
                maybe(ts().replace(tzinfo=None)),
                maybe(dec(7, 2)),
                maybe(dec(18, 0)),
                maybe(dec(19, 4)),
                maybe(dec(38, 3)),
                maybe(dt.timedelta(microseconds=int(rng.integers(-(2**50), 2**50)))),
                st_value(),
                arr(lambda: int(rng.integers(-(2**31), 2**31))),
                arr(lambda: bool(rng.integers(0, 2))),
                arr(lambda: int(rng.integers(-(2**15), 2**15))),
                arr(lambda: float(np.float32(rng.normal()))),
                arr(text),
                arr(lambda: dec(38, 2)),
                arr(lambda: dec(9, 2)),
                maybe([st_value() for _ in range(int(rng.integers(0, 4)))]),
                maybe(
                    [
                        maybe([int(x) for x in rng.integers(0, 9, int(rng.integers(0, 4)))])
                        for _ in range(int(rng.integers(0, 4)))
                    ]
                ),
                arr(
                    lambda: dt.date(2000, 1, 1) + dt.timedelta(days=int(rng.integers(-1000, 1000)))
                ),
                maybe({text(): maybe(float(rng.normal())) for _ in range(int(rng.integers(0, 4)))}),
                maybe({int(k): st_value() for k in rng.integers(0, 100, int(rng.integers(0, 4)))}),
                maybe(
                    {
                        text(): maybe([text() for _ in range(int(rng.integers(0, 3)))])
                        for _ in range(int(rng.integers(0, 3)))
                    }
                ),
            )
        )
        extra.append(
            {
                "ym": (i % 50) * 12 + i % 12 - 300,
                "ci": {
                    "months": i % 13 - 6,
                    "days": i % 40 - 20,
                    "microseconds": i * 1_000_001 - 10**8,
                },
                "v": None,
                "tm": (i * 7919 % 86_400) * 10**9 + (i % 1000) * 1000,
            }
        )
    return schema, rows, extra


SQL_EXTRA = [
    "make_ym_interval(cast(id % 50 as int) - 25, cast(id % 12 as int)) as ym",
    "make_interval(0, cast(id % 13 as int) - 6, 0, cast(id % 40 as int) - 20, 0, 0, cast((id * 1000001 - 100000000) / 1000000.0 as decimal(18, 6))) as ci",
    "cast(null as void) as v",
    "make_time(cast((id * 7919 % 86400) div 3600 as int), cast((id * 7919 % 86400) % 3600 div 60 as int), cast((id * 7919 % 60) + (id % 1000) / 1000000.0 as decimal(16, 6))) as tm",
    "named_struct('ym', make_ym_interval(1, 2), 'v', cast(null as void), 'arr', array(make_ym_interval(0, 5), null)) as nested_extra",
]


@pytest.mark.spark
def test_spark_bytes_every_type(_spark):
    """Spark's UnsafeRowWriter output for 400 random rows of every type: our decoder reads the
    values Spark was given, and our encoder writes the very same bytes."""
    from pyspark.sql import functions as F

    schema, rows, extra = _spark_input(seed=7, n=400)
    df = _spark.createDataFrame(rows, schema).selectExpr("*", *SQL_EXTRA).orderBy(F.col("id"))
    schema_json, spark_rows = spark_unsafe_rows(df)
    assert len(spark_rows) == 400
    parsed = parse_schema(schema_json)
    decoded = decode_unsafe_rows(spark_rows, parsed)
    decoded.validate(full=True)
    # Values: what we handed to Spark (the Python side of createDataFrame), plus the SQL columns.
    arrow_t = to_arrow_type(parsed)
    names = [f["name"] for f in parsed["fields"]]
    expected_rows = []
    for r, x in zip(rows, extra, strict=True):
        d = dict(zip(names, r, strict=False))
        d.update(x)
        d["nested_extra"] = {"ym": 14, "v": None, "arr": [5, None]}
        for key in ("m", "mi", "ms"):
            d[key] = None if d[key] is None else list(d[key].items())
        expected_rows.append(d)
    expected = pa.array(expected_rows, type=arrow_t)
    for i, name in enumerate(names):
        got, want = decoded.field(i), expected.field(i)
        if name in ("f", "d", "af"):  # NaN != NaN for Arrow: compare the text
            assert str(got.to_pylist()) == str(want.to_pylist()), name
        elif name in ("m", "mi", "ms"):  # Python dicts reach Spark as Java HashMaps: any order
            assert _sorted_maps(got) == _sorted_maps(want), name
        else:
            assert got.equals(want), (name, _first_diff(got, want))
    # Bytes: our writer reproduces Spark's, row for row.
    ours = encode_unsafe_rows(decoded, parsed)
    mismatched = [i for i, (a, b) in enumerate(zip(ours.to_pylist(), spark_rows.to_pylist(), strict=True)) if a != b]  # fmt: skip
    assert not mismatched, (mismatched[:5], ours[mismatched[0]].as_py().hex(), spark_rows[mismatched[0]].as_py().hex())  # fmt: skip


def _sorted_maps(arr: pa.Array) -> list[Any]:
    return [None if m is None else sorted(m, key=repr) for m in arr.to_pylist()]


def _first_diff(a: pa.Array, b: pa.Array) -> Any:
    for i, (x, y) in enumerate(zip(a.to_pylist(), b.to_pylist(), strict=True)):
        if x != y:
            return i, x, y
    return None


@pytest.mark.spark
def test_spark_bytes_aggregation_shapes(_spark):
    """The common state shapes (string key, long buffers, window struct) and wide rows (> 64
    fields, a two-word null bitset), written by Spark and by us."""
    cols = ", ".join(f"case when id % {k + 2} = 0 then null else id * {k} end as c{k}" for k in range(70))  # fmt: skip
    df = _spark.sql(
        f"select concat('key-', id) as key, id as count, id * id as sum, "
        f"window(timestamp_seconds(id * 7), '10 seconds') as window, {cols} from range(300)"
    )
    schema_json, spark_rows = spark_unsafe_rows(df)
    decoded = decode_unsafe_rows(spark_rows, schema_json)
    assert decoded.field(0).to_pylist() == [f"key-{i}" for i in range(300)]
    assert decoded.field(4 + 69).to_pylist()[:3] == [None, 69, 138]  # null when id % 71 == 0
    assert decoded.field(4).to_pylist()[:3] == [None, 0, None]  # c0: null for even ids
    assert decoded.field(4 + 60).to_pylist()[:3] == [None, 60, 120]  # field 64: second null word
    assert decoded.field(3).to_pylist()[1] == {"start": dt.datetime(1970, 1, 1, 0, 0, tzinfo=dt.timezone.utc), "end": dt.datetime(1970, 1, 1, 0, 0, 10, tzinfo=dt.timezone.utc)}  # fmt: skip
    assert encode_unsafe_rows(decoded, schema_json) == spark_rows

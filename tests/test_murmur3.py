"""Spark's Murmur3 hash and partitioning, bit-exact: literal vectors from Spark 4.3.0, a scalar
reference implementation, Spark's placement of every fixture key, and (``spark`` marker) Spark's
own ``hash()`` and ``HashPartitioning`` on Hypothesis-generated rows of every supported type."""

from __future__ import annotations

import datetime as dt
import decimal
import struct

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from statectl.codecs.murmur3 import hash_bytes, partition_ids, spark_hash
from statectl.errors import UnsupportedError
from statectl.operators import whole_key
from tests.helpers.fixtures import FIXTURES, load_manifest

UTC = dt.timezone.utc
# shared/docs/spark-state-format.md §3.1 and §13.1, plus vectors from Spark 4.3.0's hash()
# (spark.sql.legacy.allowHashOnMapType=true for the map).
VECTORS = [
    ([pa.array(["a"])], 1485273170),
    ([pa.array(["b"])], 1905031361),
    ([pa.array([1], pa.int32())], -559580957),
    ([pa.array([1], pa.int64())], -1712319331),
    ([pa.array([1.5])], 1290763749),
    ([pa.array([-0.0])], -1670924195),
    ([pa.array([0.0])], -1670924195),
    ([pa.array([None], pa.int32())], 42),
    ([pa.array(["a"]), pa.array([1], pa.int32())], 532252686),
    (
        [pa.array([{"a": 1, "b": "x"}], pa.struct([("a", pa.int32()), ("b", pa.string())]))],
        -1305545736,
    ),
    ([pa.array([[1, 2]], pa.list_(pa.int32()))], -222940379),
    ([pa.array([decimal.Decimal("-12345678901234567890.123")], pa.decimal128(38, 3))], -769998348),
    ([pa.array([decimal.Decimal("1.5")], pa.decimal128(20, 1))], -357711666),
    ([pa.array([[("a", 1), ("b", 2)]], pa.map_(pa.string(), pa.int32()))], -793797513),
    ([pa.array([dt.timedelta(seconds=5)], pa.duration("us"))], -111824516),
    ([pa.array([dt.datetime(2020, 1, 1)], pa.timestamp("us"))], -1486022740),
]


@pytest.mark.parametrize(("cols", "expected"), VECTORS)
def test_spark_vectors(cols: list[pa.Array], expected: int) -> None:
    assert spark_hash(cols).tolist() == [expected]


def test_doc_partition_examples() -> None:
    assert partition_ids([pa.array(["a", "b"])], 2).tolist() == [0, 1]
    h = spark_hash([pa.array(["a", "b", "c", "d"])])
    assert partition_ids([pa.array(["a", "b", "c", "d"])], 7).tolist() == [
        ((int(x) % 7) + 7) % 7 for x in h
    ]
    assert partition_ids([pa.array([1], pa.int32())], 5).tolist() == [-559580957 % 5]
    with pytest.raises(ValueError):
        partition_ids([pa.array([1])], 0)


# -- a scalar reference, written from the doc ------------------------------------------------------
M32 = 0xFFFFFFFF


def _rotl(x: int, r: int) -> int:
    return ((x << r) | (x >> (32 - r))) & M32


def _mix_k1(k: int) -> int:
    return (_rotl((k * 0xCC9E2D51) & M32, 15) * 0x1B873593) & M32


def _mix_h1(h: int, k: int) -> int:
    return (_rotl(h ^ k, 13) * 5 + 0xE6546B64) & M32


def _fmix(h: int, n: int) -> int:
    h ^= n
    h ^= h >> 16
    h = (h * 0x85EBCA6B) & M32
    h ^= h >> 13
    h = (h * 0xC2B2AE35) & M32
    return h ^ (h >> 16)


def ref_bytes(b: bytes, seed: int) -> int:
    h = seed & M32
    aligned = len(b) - len(b) % 4
    for i in range(0, aligned, 4):
        h = _mix_h1(h, _mix_k1(struct.unpack_from("<I", b, i)[0]))
    for x in b[aligned:]:
        h = _mix_h1(h, _mix_k1((x - 256 if x > 127 else x) & M32))
    return _fmix(h, len(b))


def ref_int(v: int, seed: int) -> int:
    return _fmix(_mix_h1(seed & M32, _mix_k1(v & M32)), 4)


def ref_long(v: int, seed: int) -> int:
    h = _mix_h1(seed & M32, _mix_k1(v & M32))
    return _fmix(_mix_h1(h, _mix_k1((v >> 32) & M32)), 8)


def signed(h: int) -> int:
    return h - (1 << 32) if h >= 1 << 31 else h


def dec(unscaled: int, scale: int) -> decimal.Decimal:
    """An exact decimal (the default context would round past 28 digits)."""
    return decimal.Decimal(unscaled).scaleb(-scale, context=decimal.Context(prec=100))


def java_to_byte_array(v: int) -> bytes:
    """``BigInteger.toByteArray``: minimal big-endian two's complement."""
    return v.to_bytes((v if v >= 0 else ~v).bit_length() // 8 + 1, "big", signed=True)


@given(st.lists(st.one_of(st.none(), st.binary(max_size=70)), max_size=60), st.integers(0, M32))
@settings(max_examples=200, deadline=None)
def test_bytes_match_the_reference(values: list[bytes | None], seed: int) -> None:
    seeds = np.full(len(values), seed, dtype=np.uint32)
    arr = pa.array(values, pa.binary())
    expected = [signed(seed if v is None else ref_bytes(v, seed)) for v in values]
    assert spark_hash([arr], seed=seed).tolist() == expected
    assert hash_bytes(arr, seeds).view(np.int32).tolist()[: len(values)] == [
        signed(ref_bytes(v or b"", seed)) for v in values
    ]


@given(st.lists(st.one_of(st.none(), st.text(max_size=30)), max_size=60))
@settings(max_examples=200, deadline=None)
def test_strings_match_the_reference(values: list[str | None]) -> None:
    expected = [42 if v is None else signed(ref_bytes(v.encode(), 42)) for v in values]
    for t in (pa.string(), pa.large_string(), pa.string_view()):
        assert spark_hash([pa.array(values, t)]).tolist() == expected
    chunked = pa.chunked_array(
        [values[: len(values) // 2], values[len(values) // 2 :]], pa.string()
    )
    assert spark_hash([chunked]).tolist() == expected
    assert spark_hash([pa.array(values, pa.string()).dictionary_encode()]).tolist() == expected


@given(st.lists(st.integers(-(2**63), 2**63 - 1), max_size=50), st.integers(0, M32))
@settings(max_examples=200, deadline=None)
def test_integers_match_the_reference(values: list[int], seed: int) -> None:
    longs = spark_hash([pa.array(values, pa.int64())], seed=seed).tolist()
    assert longs == [signed(ref_long(v, seed)) for v in values]
    ints = [v & 0xFFFF for v in values]
    ints = [v - 65536 if v >= 32768 else v for v in ints]
    expected = [signed(ref_int(v, seed)) for v in ints]
    for t in (pa.int16(), pa.int32()):
        assert spark_hash([pa.array(ints, t)], seed=seed).tolist() == expected


@given(st.lists(st.integers(-(10**38) + 1, 10**38 - 1), max_size=40), st.integers(19, 38))
@settings(max_examples=200, deadline=None)
def test_big_decimals_hash_java_byte_arrays(unscaled: list[int], precision: int) -> None:
    unscaled = [v for v in unscaled if abs(v) < 10**precision]
    unscaled += [0, -1, 1, 127, 128, -128, -129, 255, -256, 2**63, -(2**63), 10**precision - 1]
    values = [dec(v, 2) for v in unscaled]
    arr = pa.array(values, pa.decimal128(precision, 2))
    assert spark_hash([arr]).tolist() == [
        signed(ref_bytes(java_to_byte_array(v), 42)) for v in unscaled
    ]
    # The declared precision decides: <= 18 digits hash the unscaled long.
    small = [v for v in unscaled if abs(v) < 10**18]
    arr18 = pa.array([dec(v, 2) for v in small], pa.decimal128(18, 2))
    assert spark_hash([arr18]).tolist() == [signed(ref_long(v, 42)) for v in small]


def test_floats_zero_and_nan_are_canonical() -> None:
    f64 = np.array([0.0, -0.0, np.nan, 1.5], dtype=np.float64)
    odd_nan = np.array([0x7FF8000000000001, 0xFFF8000000000000], dtype=np.uint64).view(np.float64)
    h64 = spark_hash([pa.array(np.concatenate([f64, odd_nan]))]).tolist()
    assert h64[0] == h64[1] == signed(ref_long(0, 42))
    assert h64[2] == h64[4] == h64[5] == signed(ref_long(0x7FF8000000000000, 42))
    f32 = np.array([0.0, -0.0, np.nan], dtype=np.float32)
    odd32 = np.array([0x7FC00001, 0xFFC00000, 0x7F800001], dtype=np.uint32).view(np.float32)
    h32 = spark_hash([pa.array(np.concatenate([f32, odd32]))]).tolist()
    assert h32[0] == h32[1] == signed(ref_int(0, 42))
    assert h32[2] == h32[3] == h32[4] == h32[5] == signed(ref_int(0x7FC00000, 42))


def test_nulls_leave_the_running_hash_per_row() -> None:
    a = pa.array([1, None, 3], pa.int32())
    b = pa.array([None, "x", "y"])
    h = spark_hash([a, b]).tolist()
    assert h[0] == spark_hash([pa.array([1], pa.int32())]).tolist()[0]
    assert h[1] == spark_hash([pa.array(["x"])]).tolist()[0]
    assert h[2] == spark_hash([pa.array([3], pa.int32()), pa.array(["y"])]).tolist()[0]
    # a null element of an array, field of a struct, value of a map: skipped the same way
    lists = pa.array([[1, None, 2], [1, 2], None, []], pa.list_(pa.int32()))
    lh = spark_hash([lists]).tolist()
    assert lh[0] == lh[1] and lh[2] == lh[3] == 42
    structs = pa.array(
        [{"a": None, "b": "x"}, None], pa.struct([("a", pa.int32()), ("b", pa.string())])
    )
    assert spark_hash([structs]).tolist() == [spark_hash([pa.array(["x"])]).tolist()[0], 42]
    maps = pa.array([[("k", None)], [("k", 1)]], pa.map_(pa.string(), pa.int32()))
    assert spark_hash([maps]).tolist()[0] == spark_hash([pa.array(["k"])]).tolist()[0]


NESTED = pa.array(
    [
        {"s": {"a": 1, "b": "x"}, "l": [[1], [], None], "m": [("a", [1.5, None])]},
        None,
        {"s": None, "l": None, "m": None},
        {"s": {"a": None, "b": "yy"}, "l": [[2, 3, 4], [5]], "m": [("b", []), ("a", [0.0])]},
        {"s": {"a": 7, "b": ""}, "l": [], "m": []},
    ],
    pa.struct(
        [
            ("s", pa.struct([("a", pa.int32()), ("b", pa.string())])),
            ("l", pa.list_(pa.list_(pa.int64()))),
            ("m", pa.map_(pa.string(), pa.list_(pa.float64()))),
        ]
    ),
)


def test_nested_types_fold_like_their_parts() -> None:
    h = spark_hash([NESTED]).tolist()
    # row 3 by hand: struct fields in order; list of lists; map as k0, v0, k1, v1
    step = int(spark_hash([pa.array([{"a": None, "b": "yy"}], NESTED.type.field("s").type)])[0])
    for inner in ([2, 3, 4], [5]):
        step = int(spark_hash([pa.array([inner], pa.list_(pa.int64()))], step)[0])
    for part in (["b"], pa.array([[]], pa.list_(pa.float64())), ["a"], pa.array([[0.0]])):
        step = int(spark_hash([pa.array(part) if isinstance(part, list) else part], step)[0])
    assert h[3] == step
    assert h[1] == 42 and h[2] == 42


@pytest.mark.parametrize("offset", [0, 1, 2, 3])
def test_sliced_arrays(offset: int) -> None:
    columns = [
        NESTED,
        pa.array([1, None, 3, 4, 5], pa.int8()),
        pa.array(["a", "bb", None, "dddd", "eeeee"]),
        pa.array([True, False, None, True, False]),
        pa.array([decimal.Decimal(v) for v in (1, -2, 3, -(10**30), 5)], pa.decimal128(38, 0)),
        pa.array([1.0, -0.0, None, float("nan"), 2.5], pa.float32()),
        pa.array([dt.date(2020, 1, d) for d in range(1, 6)]),
        pa.array([[1, 2], None, [], [3], [None]], pa.large_list(pa.int16())),
    ]
    whole = spark_hash(columns)
    assert spark_hash([c.slice(offset) for c in columns]).tolist() == whole[offset:].tolist()
    table = pa.table({f"c{i}": c for i, c in enumerate(columns)})
    assert spark_hash(table).tolist() == whole.tolist()
    assert (
        spark_hash(pa.StructArray.from_arrays(columns, names=list(table.column_names))).tolist()
        == whole.tolist()
    )


def test_type_conversions() -> None:
    ts_ns = pa.array([1_577_836_800_123_456_789], pa.timestamp("ns", tz="UTC"))
    ts_us = pa.array([1_577_836_800_123_456], pa.timestamp("us"))
    assert spark_hash([ts_ns]).tolist() == spark_hash([ts_us]).tolist()
    assert (
        spark_hash([pa.array([dt.date(2021, 5, 4)], pa.date64())]).tolist()
        == spark_hash([pa.array([dt.date(2021, 5, 4)], pa.date32())]).tolist()
    )
    fixed = pa.array([[1, 2]], pa.list_(pa.int32(), 2))
    assert spark_hash([fixed]).tolist() == [-222940379]
    with pytest.raises(UnsupportedError, match="cannot compute Spark's hash"):
        spark_hash([pa.array([1], pa.uint32())])
    assert spark_hash([]).tolist() == []
    assert spark_hash([pa.array([], pa.int32())]).tolist() == []
    assert spark_hash([pa.nulls(3)]).tolist() == [42, 42, 42]


def test_long_and_ragged_strings() -> None:
    values = ["x" * 5000, "", "abc", None, "é" * 7, "y" * 4001]
    assert spark_hash([pa.array(values)]).tolist() == [
        42 if v is None else signed(ref_bytes(v.encode(), 42)) for v in values
    ]


# -- where Spark put every fixture key --------------------------------------------------------------
PLACEMENT = [
    (fx["name"], read)
    for fx in load_manifest()
    for read in fx.get("reads", [])
    if not read.get("options", {}).get("readRegisteredTimers")
    and "keyWithIndexToValue" not in str(read.get("options"))
]


@pytest.mark.parametrize(
    ("name", "read"), PLACEMENT, ids=[f"{n}-{r['options']}" for n, r in PLACEMENT]
)
def test_partition_of_every_fixture_key_matches_spark(name: str, read: dict) -> None:
    """Every key sits in the partition Spark put it in: pmod(hash(key), partitions), where the
    key is what the operator kind places by (a session's grouping columns; a streaming limit
    keeps its one row in partition 0)."""
    from statectl.checkpoint.model import Checkpoint
    from statectl.state import Selection, read_state

    opts = read.get("options", {})
    ckpt = Checkpoint.open(str(FIXTURES / name))
    sel = Selection(
        read["operatorId"], opts.get("storeName"), opts.get("joinSide"), opts.get("stateVarName")
    )
    table = read_state(ckpt, sel)
    if table.num_rows == 0:
        pytest.skip("no rows")
    key = table.column("key").combine_chunks()
    store = opts.get("storeName") or "default"
    if opts.get("joinSide") and key.type[key.type.num_fields - 1].name == "__event_time":
        store = f"{opts['joinSide']}-keyWithTsToValues"  # a format 4 join side: (key, event time)
    n = ckpt.num_partitions(ckpt.latest_committed_batch)
    kind = ckpt.operator(read["operatorId"], ckpt.latest_committed_batch).kind
    placed = kind.partitions_of(store, key, n)
    assert placed.tolist() == table.column("partition_id").to_pylist()
    if kind.partition_key is whole_key and not kind.single_partition:
        assert partition_ids(key, n).tolist() == placed.tolist()


# -- against Spark's hash() ----------------------------------------------------------------------------
def _nullable(strategy: st.SearchStrategy) -> st.SearchStrategy:
    return st.one_of(st.none(), strategy)


def _decimals(precision: int, scale: int) -> st.SearchStrategy:
    bound = 10**precision - 1
    return st.integers(-bound, bound).map(lambda v: dec(v, scale))


INNER = pa.struct([("x", pa.int64()), ("y", pa.string())])
COLUMNS: dict[str, tuple[pa.DataType, st.SearchStrategy]] = {
    "b": (pa.bool_(), st.booleans()),
    "i8": (pa.int8(), st.integers(-(2**7), 2**7 - 1)),
    "i16": (pa.int16(), st.integers(-(2**15), 2**15 - 1)),
    "i32": (pa.int32(), st.integers(-(2**31), 2**31 - 1)),
    "i64": (pa.int64(), st.integers(-(2**63), 2**63 - 1)),
    "f32": (pa.float32(), st.floats(width=32)),
    "f64": (pa.float64(), st.floats()),
    "s": (pa.string(), st.text(max_size=24)),
    "bin": (pa.binary(), st.binary(max_size=24)),
    "date": (pa.date32(), st.dates(dt.date(1000, 1, 1), dt.date(9999, 12, 31))),
    "ts": (
        pa.timestamp("us", tz="UTC"),
        st.datetimes(dt.datetime(1900, 1, 1), dt.datetime(2200, 1, 1), timezones=st.just(UTC)),
    ),
    "dur": (pa.duration("us"), st.timedeltas(dt.timedelta(days=-99999), dt.timedelta(days=99999))),
    "d10": (pa.decimal128(10, 2), _decimals(10, 2)),
    "d18": (pa.decimal128(18, 0), _decimals(18, 0)),
    "d19": (pa.decimal128(19, 4), _decimals(19, 4)),
    "d38": (pa.decimal128(38, 3), _decimals(38, 3)),
    "d38z": (pa.decimal128(38, 0), _decimals(38, 0)),
    "ai": (pa.list_(pa.int32()), st.lists(_nullable(st.integers(-(2**31), 2**31 - 1)), max_size=5)),
    "as": (pa.list_(pa.string()), st.lists(_nullable(st.text(max_size=6)), max_size=4)),
    "st": (
        pa.struct([("a", pa.int32()), ("b", pa.string()), ("c", pa.list_(pa.float64()))]),
        st.fixed_dictionaries(
            {
                "a": _nullable(st.integers(-9, 9)),
                "b": _nullable(st.text(max_size=5)),
                "c": _nullable(st.lists(_nullable(st.floats()), max_size=3)),
            }
        ),
    ),
    "ast": (
        pa.list_(INNER),
        st.lists(
            _nullable(
                st.fixed_dictionaries(
                    {"x": _nullable(st.integers(-5, 5)), "y": st.text(max_size=3)}
                )
            ),
            max_size=3,
        ),
    ),
    "m": (
        pa.map_(pa.string(), pa.int32()),
        st.dictionaries(st.text(max_size=4), _nullable(st.integers(-99, 99)), max_size=4).map(
            lambda d: list(d.items())
        ),
    ),
    "mn": (
        pa.map_(pa.int32(), pa.list_(pa.string())),
        st.dictionaries(
            st.integers(-9, 9), _nullable(st.lists(st.text(max_size=3), max_size=2)), max_size=3
        ).map(lambda d: list(d.items())),
    ),
}
COMBOS = [("i32", "s"), ("s", "d38", "st"), ("ts", "bin", "ai", "f64"), tuple(COLUMNS)]


def _spark_hashes(spark, table: pa.Table, exprs: list[str]) -> list[list[int]]:  # type: ignore[no-untyped-def]
    spark.conf.set("spark.sql.legacy.allowHashOnMapType", "true")
    spark.conf.set("spark.sql.session.timeZone", "UTC")
    try:
        rows = spark.createDataFrame(table).selectExpr(*exprs).collect()
    finally:
        spark.conf.unset("spark.sql.legacy.allowHashOnMapType")
    return [[row[i] for row in rows] for i in range(len(exprs))]


def _check_against_spark(spark, table: pa.Table) -> None:  # type: ignore[no-untyped-def]
    names = table.column_names
    combos = [c for c in COMBOS if all(n in names for n in c)]
    exprs = [f"hash(`{n}`)" for n in names] + [
        "hash(" + ", ".join(f"`{n}`" for n in combo) + ")" for combo in combos
    ]
    expected = _spark_hashes(spark, table, exprs)
    got = [spark_hash([table.column(n)]).tolist() for n in names] + [
        spark_hash([table.column(n) for n in combo]).tolist() for combo in combos
    ]
    for expr, g, e in zip(exprs, got, expected, strict=True):
        assert g == e, expr


@pytest.mark.spark
@given(st.lists(st.tuples(*[_nullable(s) for _, s in COLUMNS.values()]), min_size=1, max_size=60))
@settings(
    max_examples=12,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
def test_equals_spark_hash_for_every_type(spark, rows: list[tuple]) -> None:  # type: ignore[no-untyped-def]
    """One DataFrame per example: every type, nulls everywhere, and multi-column keys."""
    table = pa.table(
        {
            name: pa.array([r[i] for r in rows], t)
            for i, (name, (t, _)) in enumerate(COLUMNS.items())
        }
    )
    _check_against_spark(spark, table)


@pytest.mark.spark
def test_equals_spark_hash_on_edge_cases(spark) -> None:  # type: ignore[no-untyped-def]
    strings = [
        "",
        "a",
        "ab",
        "abc",
        "abcd",
        "abcde",
        "abcdefgh",
        "abcdefghi",
        "é",
        "日本語",
        "😀",
        "a\x00b",
        "x" * 1001,
    ]
    binaries = [b"\x80", b"\xff\xfe\xfd", b"abcd\x80", b"\x00", b"\x7f\x80\x81\x82\x83", b""]
    floats = [
        0.0,
        -0.0,
        float("inf"),
        float("-inf"),
        float("nan"),
        5e-324,
        -1.5,
        3.4028234663852886e38,
    ]
    longs = [0, -1, 2**63 - 1, -(2**63), 2**32, -(2**32), 1]
    big = [0, -1, 1, 127, 128, -128, -129, 2**63, -(2**63), 10**38 - 1, -(10**38) + 1, 256, -256]
    lists = [[], None, [None], [1, None, 2], [-(2**31)]]
    n = max(map(len, (strings, binaries, floats, longs, big, lists)))

    def pad(values: list) -> list:
        return values + [None] * (n - len(values))

    payload_nans = np.array([0x7FF8000000000001, 0xFFF0000000000001], dtype=np.uint64).view(
        np.float64
    )
    f64 = np.full(n, np.nan)
    f64[: len(floats)] = floats
    f64[len(floats) : len(floats) + 2] = payload_nans
    table = pa.table(
        {
            "s": pa.array(pad(strings)),
            "bin": pa.array(pad(binaries), pa.binary()),
            "f64": pa.array(f64),
            "f32": pa.array(f64.astype(np.float32)),
            "i64": pa.array(pad(longs), pa.int64()),
            "d38z": pa.array(pad([decimal.Decimal(v) for v in big]), pa.decimal128(38, 0)),
            "d19": pa.array(pad([decimal.Decimal(v) for v in big[:8]]), pa.decimal128(19, 0)),
            "d20": pa.array(pad([dec(v, 20) for v in big[:8]]), pa.decimal128(20, 20)),
            "ai": pa.array(pad(lists), pa.list_(pa.int32())),
            "m": pa.array(
                pad([[], [("a", None)], [("", 0), ("b", 1)]]), pa.map_(pa.string(), pa.int32())
            ),
        }
    )
    _check_against_spark(spark, table)


@pytest.mark.spark
@given(
    st.lists(
        st.tuples(
            _nullable(st.integers(-(2**31), 2**31 - 1)),
            _nullable(st.text(max_size=8)),
            st.integers(0, 2**40),
        ),
        min_size=1,
        max_size=200,
    ),
    st.integers(1, 13),
)
@settings(max_examples=5, deadline=None)
def test_partition_ids_match_spark_hash_partitioning(spark, rows: list[tuple], n: int) -> None:  # type: ignore[no-untyped-def]
    """``repartition(n, cols)`` is HashPartitioning: Pmod(Murmur3Hash(cols), n)."""
    from pyspark.sql.functions import spark_partition_id

    table = pa.table(
        {
            "id": pa.array(range(len(rows)), pa.int64()),
            "k": pa.array([r[0] for r in rows], pa.int32()),
            "s": pa.array([r[1] for r in rows], pa.string()),
            "l": pa.array([r[2] for r in rows], pa.int64()),
        }
    )
    df = spark.createDataFrame(table).repartition(n, "k", "s", "l")
    placed = dict(df.select("id", spark_partition_id().alias("p")).collect())
    ours = partition_ids([table.column("k"), table.column("s"), table.column("l")], n).tolist()
    assert [placed[i] for i in range(len(rows))] == ours


@pytest.mark.parametrize(
    "values",
    [[b"a"], [b"ab", b"c"], [b"", b"xyz"], [b"abcd", b"efghi"], [b"abcdefg"], [b"\xff\x80\x7f"]],
)
def test_tail_bytes_at_the_end_of_the_data(values: list[bytes]) -> None:
    """Tail bytes within the data's last 3 bytes, and data shorter than one word: the tails
    are loaded zero-padded, and only each row's own bytes are mixed (signed, as Spark does)."""
    arr = pa.array(values, pa.binary())
    seeds = np.full(len(values), 42, dtype=np.uint32)
    assert hash_bytes(arr, seeds).view(np.int32).tolist() == [
        signed(ref_bytes(v, 42)) for v in values
    ]

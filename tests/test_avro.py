"""Avro state rows (transformWithState, ``encodingFormat=avro``): Spark's schema rules, the
doc's byte vectors, round trips, and (marked ``spark``) Spark's own serializer's bytes."""

from __future__ import annotations

import datetime as dt
import decimal
import json
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from statectl.codecs.avro import (
    avro_schema,
    decode_avro_rows,
    encode_avro_rows,
    min_bytes_for_precision,
)
from statectl.codecs.sparktypes import to_arrow_type
from statectl.errors import CorruptFileError, UnsupportedError


def field(name: str, t: Any, nullable: bool = True) -> dict:
    return {"name": name, "type": t, "nullable": nullable, "metadata": {}}


def struct_of(*fields: dict) -> dict:
    return {"type": "struct", "fields": list(fields)}


def array_of(t: Any) -> dict:
    return {"type": "array", "elementType": t, "containsNull": True}


def map_of(v: Any) -> dict:
    return {"type": "map", "keyType": "string", "valueType": v, "valueContainsNull": True}


# SchemaConverters.toAvroTypeWithDefaults(schema).toString(), Spark 4.3.0
EVERY_TYPE = struct_of(
    field("b", "boolean", False),
    field("y", "byte"),
    field("s", "string"),
    field("d", "decimal(20,2)"),
    field("d2", "decimal(5,2)"),
    field("dt", "date"),
    field("ts", "timestamp"),
    field("tn", "timestamp_ntz"),
    field("bin", "binary"),
    field("v", "void"),
    field(
        "st",
        struct_of(
            field("x", "long"),
            field("dd", "decimal(38,0)"),
            field("in", struct_of(field("q", "double"))),
        ),
    ),
    field("arr", array_of("long")),
    field("arrs", array_of(struct_of(field("z", "float")))),
    field("arrd", array_of("decimal(30,1)")),
    field("m", map_of(array_of("integer"))),
)
SPARK_AVRO = '{"type":"record","name":"topLevelRecord","fields":[{"name":"b","type":["null","boolean"],"default":null},{"name":"y","type":["null","int"],"default":null},{"name":"s","type":["null","string"],"default":null},{"name":"d","type":["null",{"type":"fixed","name":"fixed","namespace":"d","size":9,"logicalType":"decimal","precision":20,"scale":2}],"default":null},{"name":"d2","type":["null",{"type":"fixed","name":"fixed","namespace":"d2","size":3,"logicalType":"decimal","precision":5,"scale":2}],"default":null},{"name":"dt","type":["null",{"type":"int","logicalType":"date"}],"default":null},{"name":"ts","type":["null",{"type":"long","logicalType":"timestamp-micros"}],"default":null},{"name":"tn","type":["null",{"type":"long","logicalType":"local-timestamp-micros"}],"default":null},{"name":"bin","type":["null","bytes"],"default":null},{"name":"v","type":"null","default":null},{"name":"st","type":["null",{"type":"record","name":"st","fields":[{"name":"x","type":["null","long"],"default":null},{"name":"dd","type":["null",{"type":"fixed","name":"fixed","namespace":"dd","size":16,"logicalType":"decimal","precision":38,"scale":0}],"default":null},{"name":"in","type":["null",{"type":"record","name":"in","fields":[{"name":"q","type":["null","double"],"default":null}]}],"default":null}]}],"default":null},{"name":"arr","type":["null",{"type":"array","items":"long"}],"default":null},{"name":"arrs","type":["null",{"type":"array","items":["null",{"type":"record","name":"arrs","fields":[{"name":"z","type":["null","float"],"default":null}]}]}],"default":null},{"name":"arrd","type":["null",{"type":"array","items":{"type":"fixed","name":"fixed","namespace":"arrd","size":13,"logicalType":"decimal","precision":30,"scale":1}}],"default":null},{"name":"m","type":["null",{"type":"map","values":["null",{"type":"array","items":"int"}]}],"default":null}]}'  # fmt: skip


def _text(avro: dict) -> str:
    return json.dumps(avro, separators=(",", ":"), ensure_ascii=False)


def test_schema_is_sparks():
    assert _text(avro_schema(EVERY_TYPE)) == SPARK_AVRO


def test_min_bytes_for_precision():
    # Decimal.minBytesForPrecision: 1..38 digits
    assert [min_bytes_for_precision(p) for p in (1, 2, 3, 5, 9, 10, 18, 19, 20, 30, 38)] == [1, 1, 2, 3, 4, 5, 8, 9, 9, 13, 16]  # fmt: skip


def test_doc_vectors():
    # spark-state-format.md §7.5.4: key "a" = 02 02 61, long 3 = 02 06 (after the prefix).
    key = struct_of(field("k", "string"))
    value = struct_of(field("c", "long", False))
    assert encode_avro_rows([{"k": "a"}], key).to_pylist() == [bytes.fromhex("020261")]
    assert encode_avro_rows([{"c": 3}], value).to_pylist() == [bytes.fromhex("0206")]
    rows = pa.array([bytes.fromhex("020261"), None, bytes.fromhex("00")], pa.large_binary())
    assert decode_avro_rows(rows, key).to_pylist() == [{"k": "a"}, None, {"k": None}]
    # A NullType-only schema (timers' __dummy__) encodes to nothing.
    dummy = struct_of(field("__dummy__", "void"))
    assert encode_avro_rows([{"__dummy__": None}], dummy).to_pylist() == [b""]
    assert decode_avro_rows(pa.array([b""]), dummy).to_pylist() == [{"__dummy__": None}]
    # Spark's bytes (AvroSerializer + GenericDatumWriter, 4.3.0) for array<long>[1,2] and
    # decimal(20,2) -1.5: no branch byte per element, a sign-extended 9-byte fixed.
    row = struct_of(field("a", array_of("long")), field("d", "decimal(20,2)"))
    expected = bytes.fromhex("020402040002ffffffffffffffff6a")
    assert encode_avro_rows([{"a": [1, 2], "d": decimal.Decimal("-1.50")}], row).to_pylist() == [expected]  # fmt: skip


def test_errors():
    key = struct_of(field("k", "string"))
    with pytest.raises(CorruptFileError, match=r"ck/state: Avro state row 0 does not decode"):
        decode_avro_rows(pa.array([b"\x02\x10ab"]), key, "ck/state")
    with pytest.raises(CorruptFileError, match="1 bytes left"):
        decode_avro_rows(pa.array([b"\x02\x02ab"]), key, "ck/state")
    # Spark's schema has no room for a null element in an array of atomic values (Spark's
    # own writer fails on one too).
    with pytest.raises(UnsupportedError, match="cannot hold nulls"):
        encode_avro_rows([{"a": [1, None]}], struct_of(field("a", array_of("long"))))
    for bad in ("interval day", "interval", "time(6)", "variant"):
        with pytest.raises(UnsupportedError):
            avro_schema(struct_of(field("x", bad)))
    with pytest.raises(UnsupportedError, match="string map keys"):
        avro_schema(struct_of(field("m", {"type": "map", "keyType": "integer", "valueType": "long", "valueContainsNull": True})))  # fmt: skip


# -- round trips ---------------------------------------------------------------------------
ATOMIC = {
    "boolean": st.booleans(),
    "byte": st.integers(-128, 127),
    "short": st.integers(-(2**15), 2**15 - 1),
    "integer": st.integers(-(2**31), 2**31 - 1),
    "long": st.integers(-(2**63), 2**63 - 1),
    "double": st.floats(allow_nan=False),
    "float": st.floats(width=32, allow_nan=False),
    "string": st.text(max_size=10),
    "binary": st.binary(max_size=10),
    "date": st.dates(),
    "timestamp": st.datetimes(timezones=st.just(dt.timezone.utc)),
    "timestamp_ntz": st.datetimes(),
    "decimal(38,3)": st.integers(-(10**38) + 1, 10**38 - 1).map(
        lambda u: decimal.Decimal(u).scaleb(-3, decimal.Context(prec=50))
    ),
    "decimal(4,1)": st.integers(-9999, 9999).map(lambda u: decimal.Decimal(u).scaleb(-1)),
}


def avro_types(depth: int = 2) -> st.SearchStrategy[Any]:
    atomic = st.sampled_from(sorted(ATOMIC))
    if depth == 0:
        return atomic
    inner = avro_types(depth - 1)
    return st.one_of(
        atomic,
        st.builds(array_of, inner),
        st.builds(map_of, inner),
        st.lists(inner, min_size=1, max_size=3).map(
            lambda ts: struct_of(*[field(f"f{depth}_{i}", t) for i, t in enumerate(ts)])
        ),
    )


def avro_values(t: Any, nullable: bool = True) -> st.SearchStrategy[Any]:
    if isinstance(t, str):
        base = ATOMIC[t]
    elif t["type"] == "array":
        # Atomic elements are bare Avro types in Spark's schema: no nulls there.
        base = st.lists(avro_values(t["elementType"], not isinstance(t["elementType"], str)), max_size=3)  # fmt: skip
    elif t["type"] == "map":
        base = st.dictionaries(st.text(max_size=4), avro_values(t["valueType"], not isinstance(t["valueType"], str)), max_size=3).map(lambda d: list(d.items()))  # fmt: skip
    else:
        base = st.fixed_dictionaries({f["name"]: avro_values(f["type"]) for f in t["fields"]})
    return st.one_of(st.none(), base) if nullable else base


@st.composite
def avro_case(draw: st.DrawFn) -> tuple[dict, pa.StructArray]:
    types = draw(st.lists(avro_types(), min_size=1, max_size=4))
    schema = struct_of(*[field(f"c{i}", t) for i, t in enumerate(types)])
    rows = draw(st.lists(st.one_of(st.none(), avro_values(schema, False)), max_size=6))
    return schema, pa.array(rows, to_arrow_type(schema))


@given(avro_case())
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_round_trip(case):
    schema, data = case
    encoded = encode_avro_rows(data, schema)
    assert encoded.null_count == data.null_count
    decoded = decode_avro_rows(encoded, schema)
    assert decoded.to_pylist() == data.to_pylist()
    assert encode_avro_rows(decoded, schema) == encoded


# -- Spark's AvroStateEncoder bytes -------------------------------------------------------------
@pytest.fixture(scope="session")
def _spark(spark):  # the one shared session of tests/conftest.py
    return spark


def _converters(spark: Any) -> Any:
    return getattr(getattr(spark._jvm.org.apache.spark.sql.avro, "SchemaConverters$"), "MODULE$")


def spark_avro_rows(spark: Any, df: Any) -> tuple[str, str, pa.Array]:
    """(schema JSON, Avro schema text, Avro rows) exactly as AvroStateEncoder writes them:
    ``encodeUnsafeRowToAvro`` = AvroSerializer(schema, toAvroTypeWithDefaults(schema), false),
    GenericDatumWriter, a direct binary encoder (javap of the 4.3.0 jar)."""
    jvm = spark._jvm
    schema = df._jdf.schema()
    avro_t = _converters(spark).toAvroTypeWithDefaults(schema)
    serializer = jvm.org.apache.spark.sql.avro.AvroSerializer(schema, avro_t, False)
    writer = jvm.org.apache.avro.generic.GenericDatumWriter(avro_t)
    factory = jvm.org.apache.avro.io.EncoderFactory.get()
    out = []
    for row in df._jdf.queryExecution().executedPlan().executeCollect():
        stream = jvm.java.io.ByteArrayOutputStream()
        encoder = factory.directBinaryEncoder(stream, None)
        writer.write(serializer.serialize(row), encoder)
        encoder.flush()
        out.append(bytes(stream.toByteArray()))
    return schema.json(), avro_t.toString(), pa.array(out, pa.large_binary())


@pytest.mark.spark
def test_spark_avro_bytes(_spark):
    """300 random rows of every Avro-able type, nulls wherever Spark's schema allows them:
    the same Avro schema text, the same bytes, and the values Spark was given."""
    from pyspark.sql import types as T

    rng = np.random.default_rng(3)
    inner = T.StructType([T.StructField("x", T.LongType()), T.StructField("y", T.StringType())])
    schema = T.StructType(
        [
            T.StructField("id", T.LongType(), False),
            T.StructField("b", T.BooleanType()),
            T.StructField("y", T.ByteType()),
            T.StructField("h", T.ShortType()),
            T.StructField("i", T.IntegerType()),
            T.StructField("f", T.FloatType()),
            T.StructField("d", T.DoubleType()),
            T.StructField("s", T.StringType()),
            T.StructField("bin", T.BinaryType()),
            T.StructField("dt", T.DateType()),
            T.StructField("ts", T.TimestampType()),
            T.StructField("ntz", T.TimestampNTZType()),
            T.StructField("d7", T.DecimalType(7, 2)),
            T.StructField("d38", T.DecimalType(38, 3)),
            T.StructField("st", inner),
            T.StructField("al", T.ArrayType(T.LongType())),
            T.StructField("ast", T.ArrayType(inner)),
            T.StructField("ms", T.MapType(T.StringType(), inner)),
            T.StructField("md", T.MapType(T.StringType(), T.DecimalType(20, 4))),
        ]
    )

    def maybe(v: Any) -> Any:
        return None if rng.random() < 0.2 else v

    def text() -> str:
        return "".join(rng.choice(list("ab€😀z"), size=int(rng.integers(0, 12))))

    def dec(p: int, s: int) -> decimal.Decimal:
        u = int(rng.integers(-(10 ** min(p, 18)) + 1, 10 ** min(p, 18))) * 10 ** max(0, p - 18)
        return decimal.Decimal(u).scaleb(-s, decimal.Context(prec=50))

    def inner_value() -> Any:
        return maybe((maybe(int(rng.integers(-(2**63), 2**63))), maybe(text())))

    epoch = dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc)
    rows = []
    for i in range(300):
        ts = epoch + dt.timedelta(microseconds=int(rng.integers(-(2**55), 2**55)))
        rows.append(
            (
                i,
                maybe(bool(rng.integers(0, 2))),
                maybe(int(rng.integers(-128, 128))),
                maybe(int(rng.integers(-(2**15), 2**15))),
                maybe(int(rng.integers(-(2**31), 2**31))),
                maybe(float(np.float32(rng.normal()))),
                maybe(float(rng.normal() * 1e6)),
                maybe(text()),
                maybe(rng.bytes(int(rng.integers(0, 20)))),
                maybe(dt.date(1, 1, 1) + dt.timedelta(days=int(rng.integers(0, 3_652_058)))),
                maybe(ts),
                maybe(ts.replace(tzinfo=None)),
                maybe(dec(7, 2)),
                maybe(dec(38, 3)),
                inner_value(),
                maybe([int(x) for x in rng.integers(-(2**40), 2**40, int(rng.integers(0, 5)))]),
                maybe([inner_value() for _ in range(int(rng.integers(0, 4)))]),
                maybe({text(): inner_value() for _ in range(int(rng.integers(0, 3)))}),
                maybe({text(): dec(20, 4) for _ in range(int(rng.integers(0, 3)))}),
            )
        )
    df = _spark.createDataFrame(rows, schema)
    schema_json, avro_text, spark_rows = spark_avro_rows(_spark, df)
    assert _text(avro_schema(schema_json)) == avro_text
    decoded = decode_avro_rows(spark_rows, schema_json)
    assert encode_avro_rows(decoded, schema_json) == spark_rows

    def as_dict(v: Any) -> Any:
        return None if v is None else {"x": v[0], "y": v[1]}

    def by_key(pairs: Any) -> Any:
        return None if pairs is None else sorted(pairs, key=lambda kv: kv[0])

    names = [f.name for f in schema.fields]
    expected = []
    for r in rows:
        d = dict(zip(names, r, strict=True))
        d["st"] = as_dict(d["st"])
        d["ast"] = None if d["ast"] is None else [as_dict(v) for v in d["ast"]]
        d["ms"] = None if d["ms"] is None else by_key((k, as_dict(v)) for k, v in d["ms"].items())
        d["md"] = None if d["md"] is None else by_key(d["md"].items())
        expected.append(d)
    got = decoded.to_pylist()
    for g in got:  # Python dicts reach Spark as Java HashMaps: any order
        g["ms"], g["md"] = by_key(g["ms"]), by_key(g["md"])
    assert got == expected
    # The schemas of real transformWithState column families (map state key, timers' dummy
    # value, a TTL value) convert the same way too.
    for text in (
        '{"type":"struct","fields":[{"name":"key","type":{"type":"struct","fields":[{"name":"k","type":"string","nullable":true,"metadata":{}}]},"nullable":true,"metadata":{}},{"name":"userKey","type":{"type":"struct","fields":[{"name":"mk","type":"string","nullable":true,"metadata":{}}]},"nullable":true,"metadata":{}}]}',
        '{"type":"struct","fields":[{"name":"__dummy__","type":"void","nullable":true,"metadata":{}}]}',
        '{"type":"struct","fields":[{"name":"value","type":{"type":"struct","fields":[{"name":"c","type":"long","nullable":true,"metadata":{}}]},"nullable":true,"metadata":{}},{"name":"ttlExpirationMs","type":"long","nullable":false,"metadata":{}}]}',
    ):
        jschema = _spark._jvm.org.apache.spark.sql.types.DataType.fromJson(text)
        assert _text(avro_schema(text)) == _converters(_spark).toAvroTypeWithDefaults(jschema).toString()  # fmt: skip

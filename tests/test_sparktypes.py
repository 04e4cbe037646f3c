"""Spark JSON types: Arrow mapping both ways, and Spark's exact JSON text (``StructType.json``)."""

from __future__ import annotations

import json
from typing import Any

import pyarrow as pa
import pytest

from statectl.codecs.sparktypes import (
    METADATA_KEY,
    TYPE_KEY,
    canonical_type,
    from_arrow_schema,
    from_arrow_type,
    parse_schema,
    to_arrow_field,
    to_arrow_schema,
    to_arrow_type,
    to_json,
)
from statectl.errors import CorruptFileError, StatectlError, UnsupportedError

# Written by Spark 4.3.0 (the JVM's DataType.json, as stored in state schema files).
SPARK_JSON = [
    # a windowed aggregation key (fixtures/checkpoints/window-hdfs/state/0/0/_metadata/schema)
    '{"type":"struct","fields":[{"name":"window","type":{"type":"struct","fields":[{"name":"start","type":"timestamp","nullable":true,"metadata":{}},{"name":"end","type":"timestamp","nullable":true,"metadata":{}}]},"nullable":true,"metadata":{"spark.timeWindow":true,"spark.watermarkDelayMs":5000}},{"name":"k","type":"string","nullable":true,"metadata":{}}]}',
    # metadata: Spark's own key order (a HashMap's), doubles the Java way, escapes
    '{"type":"struct","fields":[{"name":"x","type":"long","nullable":true,"metadata":{"s":"é\\u0001","n":null,"f":1.5,"b":true,"l":[1,2],"nested":{"a":2,"z":1},"d":1.0E10}}]}',
    # field names: json4s escapes quotes, backslashes and control characters (upper-case hex)
    '{"type":"struct","fields":[{"name":"we\\"ird\\\\nam\\te","type":"integer","nullable":false,"metadata":{}},{"name":"a\x7fb","type":"long","nullable":true,"metadata":{}},{"name":"c\x85d","type":"long","nullable":true,"metadata":{}},{"name":"e\u2028f","type":"long","nullable":true,"metadata":{}},{"name":"g\\u001Fh","type":"long","nullable":true,"metadata":{}},{"name":"i/j","type":"long","nullable":true,"metadata":{}},{"name":"k\U0001f600l","type":"long","nullable":true,"metadata":{}},{"name":"\\b\\f","type":"long","nullable":true,"metadata":{}}]}',
    # every type a state row can hold, intervals, void and time included
    '{"type":"struct","fields":[{"name":"id","type":"long","nullable":true,"metadata":{}},{"name":"b","type":"boolean","nullable":true,"metadata":{}},{"name":"s","type":"string","nullable":true,"metadata":{}},{"name":"d38","type":"decimal(38,3)","nullable":true,"metadata":{}},{"name":"ts","type":"timestamp","nullable":true,"metadata":{}},{"name":"dti","type":"interval day to second","nullable":true,"metadata":{}},{"name":"arr","type":{"type":"array","elementType":"integer","containsNull":true},"nullable":true,"metadata":{}},{"name":"m","type":{"type":"map","keyType":"string","valueType":"double","valueContainsNull":true},"nullable":true,"metadata":{}},{"name":"st","type":{"type":"struct","fields":[{"name":"x","type":"short","nullable":true,"metadata":{}},{"name":"y","type":"binary","nullable":true,"metadata":{}}]},"nullable":true,"metadata":{}},{"name":"ym","type":"interval year to month","nullable":false,"metadata":{}},{"name":"ci","type":"interval","nullable":false,"metadata":{}},{"name":"v","type":"void","nullable":true,"metadata":{}},{"name":"tm","type":"time(6)","nullable":true,"metadata":{}}]}',
    # a collated string: the collation lives in the field metadata
    '{"type":"struct","fields":[{"name":"c","type":"string","nullable":false,"metadata":{"__COLLATIONS":{"c":"spark.UTF8_LCASE"}}}]}',
]


@pytest.mark.parametrize("text", SPARK_JSON)
def test_spark_json_round_trips_byte_for_byte(text):
    assert to_json(parse_schema(text)) == text
    assert to_json(parse_schema(text.encode())) == text
    # Through Arrow and back: types, nullability and metadata survive.
    assert to_json(from_arrow_schema(to_arrow_schema(text))) == text


def test_pyspark_sorted_json_gives_spark_order():
    # PySpark's StructType.json() sorts keys; Spark's order is restored.
    pyspark = '{"fields":[{"metadata":{},"name":"c","nullable":false,"type":{"containsNull":true,"elementType":"long","type":"array"}}],"type":"struct"}'  # fmt: skip
    assert to_json(parse_schema(pyspark)) == '{"type":"struct","fields":[{"name":"c","type":{"type":"array","elementType":"long","containsNull":true},"nullable":false,"metadata":{}}]}'  # fmt: skip


CALENDAR = pa.struct([pa.field("months", pa.int32(), False), pa.field("days", pa.int32(), False), pa.field("microseconds", pa.int64(), False)])  # fmt: skip
ARROW = {
    "boolean": pa.bool_(),
    "byte": pa.int8(),
    "short": pa.int16(),
    "integer": pa.int32(),
    "long": pa.int64(),
    "float": pa.float32(),
    "double": pa.float64(),
    "string": pa.string(),
    "char(3)": pa.string(),
    "varchar(9)": pa.string(),
    "string collate UTF8_LCASE": pa.string(),
    "binary": pa.binary(),
    "date": pa.date32(),
    "timestamp": pa.timestamp("us", tz="UTC"),
    "timestamp_ltz": pa.timestamp("us", tz="UTC"),
    "timestamp_ntz": pa.timestamp("us"),
    "time(6)": pa.time64("ns"),
    "decimal(10,2)": pa.decimal128(10, 2),
    "decimal(38, 0)": pa.decimal128(38, 0),
    "decimal": pa.decimal128(10, 0),
    "void": pa.null(),
    "interval year": pa.int32(),
    "interval year to month": pa.int32(),
    "interval month": pa.int32(),
    "interval day": pa.duration("us"),
    "interval day to second": pa.duration("us"),
    "interval hour to minute": pa.duration("us"),
    "interval second": pa.duration("us"),
    "interval": CALENDAR,
    "calendarinterval": CALENDAR,
}


@pytest.mark.parametrize(("spark", "arrow"), ARROW.items())
def test_atomic_types(spark, arrow):
    assert to_arrow_type(spark) == arrow


def test_nested_types_and_metadata():
    schema = {
        "type": "struct",
        "fields": [
            {
                "name": "a",
                "type": {"type": "array", "elementType": "long", "containsNull": False},
                "nullable": False,
                "metadata": {},
            },
            {
                "name": "m",
                "type": {
                    "type": "map",
                    "keyType": "string",
                    "valueType": "double",
                    "valueContainsNull": True,
                },
                "nullable": True,
                "metadata": {"spark.timeWindow": True},
            },
            {
                "name": "s",
                "type": {
                    "type": "struct",
                    "fields": [
                        {
                            "name": "x",
                            "type": "interval day",
                            "nullable": True,
                            "metadata": {"k": 1},
                        }
                    ],
                },
                "nullable": True,
                "metadata": {},
            },
            {
                "name": "u",
                "type": {
                    "type": "udt",
                    "class": "org.example.PointUDT",
                    "pyClass": "example.PointUDT",
                    "sqlType": {"type": "array", "elementType": "double", "containsNull": False},
                },
                "nullable": True,
                "metadata": {},
            },
            {
                "name": "e",
                "type": {"type": "array", "elementType": "void", "containsNull": False},
                "nullable": False,
                "metadata": {},
            },
        ],
    }
    arrow = to_arrow_schema(schema)
    assert arrow.field("a").type == pa.list_(pa.field("element", pa.int64(), False))
    assert not arrow.field("a").nullable
    assert arrow.field("m").type == pa.map_(pa.string(), pa.float64())
    assert json.loads(arrow.field("m").metadata[METADATA_KEY]) == {"spark.timeWindow": True}
    assert json.loads(arrow.field("s").type.field(0).metadata[METADATA_KEY]) == {"k": 1}
    assert arrow.field("u").type == pa.list_(pa.field("element", pa.float64(), False))
    # Arrow has no non-nullable null type: array() is array<void> without nulls in Spark.
    assert arrow.field("e").type == pa.list_(pa.field("element", pa.null(), True))
    # Types Arrow cannot tell apart keep their Spark type; plain ones carry no extra key.
    assert TYPE_KEY in arrow.field("s").metadata and TYPE_KEY in arrow.field("u").metadata
    assert TYPE_KEY not in (arrow.field("a").metadata or {})
    assert from_arrow_schema(arrow) == schema
    # Without the hint, Arrow's nullable null type comes back as it is.
    plain = from_arrow_type(arrow.field("e").type)
    assert canonical_type(plain) == {"type": "array", "elementType": "void", "containsNull": True}


def test_from_arrow_types():
    assert from_arrow_type(pa.large_string()) == "string"
    assert from_arrow_type(pa.large_binary()) == "binary"
    assert from_arrow_type(pa.timestamp("ns", tz="Europe/Paris")) == "timestamp"
    assert from_arrow_type(pa.timestamp("ms")) == "timestamp_ntz"
    assert from_arrow_type(pa.duration("us")) == "interval day to second"
    assert from_arrow_type(pa.dictionary(pa.int32(), pa.string())) == "string"
    assert from_arrow_type(pa.large_list(pa.int16())) == {"type": "array", "elementType": "short", "containsNull": True}  # fmt: skip
    assert from_arrow_type(pa.struct([pa.field("x", pa.int8(), False)])) == {
        "type": "struct",
        "fields": [{"name": "x", "type": "byte", "nullable": False, "metadata": {}}],
    }
    for bad in (pa.uint32(), pa.float16(), pa.month_day_nano_interval(), pa.decimal256(40, 2)):
        with pytest.raises(UnsupportedError, match="no Spark equivalent"):
            from_arrow_type(bad)
    # A stale type hint (it no longer describes the Arrow type) is ignored.
    stale = pa.field("x", pa.int64(), metadata={TYPE_KEY: b'"interval year"'})
    assert from_arrow_schema(pa.schema([stale]))["fields"][0]["type"] == "long"


@pytest.mark.parametrize("t", ["variant", "timestamp_ntz(9)", "timestamp_ltz(9)", "geometry(4326)", "geography(4326)", "object", "interval week", {"type": "weird"}, 7])  # fmt: skip
def test_unsupported_types(t):
    with pytest.raises(UnsupportedError, match="not supported"):
        to_arrow_type(t)
    schema = {"type": "struct", "fields": [{"name": "v", "type": t, "nullable": True, "metadata": {}}]}  # fmt: skip
    with pytest.raises(StatectlError):  # a non-type (7) is a malformed file instead
        to_arrow_schema(schema)


def test_malformed_schemas():
    with pytest.raises(CorruptFileError, match="s/0: schema is not valid JSON"):
        parse_schema('{"type":"struct"', "s/0")
    with pytest.raises(UnsupportedError, match="not a Spark struct"):
        parse_schema('"long"')
    with pytest.raises(CorruptFileError, match="malformed"):
        parse_schema({"type": "struct", "fields": [{"name": "x"}]})
    with pytest.raises(CorruptFileError, match="malformed Spark array"):
        parse_schema({"type": "struct", "fields": [{"name": "x", "type": {"type": "array"}}]})
    with pytest.raises(UnsupportedError, match="precision"):
        to_arrow_type("decimal(40,2)")


def test_json_numbers_the_java_way():
    meta = {"a": 1e10, "b": 1.5e-5, "c": 100.0, "d": 0.001, "e": -0.0, "f": 12345678.0, "g": 2**40}
    field = {"name": "x", "type": "long", "nullable": True, "metadata": meta}
    text = to_json({"type": "struct", "fields": [field]})
    assert '"metadata":{"a":1.0E10,"b":1.5E-5,"c":100.0,"d":0.001,"e":-0.0,"f":1.2345678E7,"g":1099511627776}' in text  # fmt: skip


def test_arrow_field_keeps_metadata_text():
    f = to_arrow_field({"name": "w", "type": "long", "nullable": False, "metadata": {"d": 1.0}})
    assert f.metadata == {METADATA_KEY: b'{"d":1.0}'} and not f.nullable


# -- against the JVM ---------------------------------------------------------------------------
@pytest.fixture(scope="session")
def _spark(spark):  # the one shared session of tests/conftest.py
    return spark


def _jvm_json(spark: Any, text: str) -> str:
    return spark._jvm.org.apache.spark.sql.types.DataType.fromJson(text).json()


@pytest.mark.spark
def test_spark_schemas_round_trip(_spark):
    """Schemas Spark builds from queries (every type, collation, char/varchar, a UDT, metadata):
    our JSON is Spark's byte for byte, and Spark reads back what we write from Arrow."""
    from pyspark.ml.linalg import VectorUDT
    from pyspark.sql import types as T

    df = _spark.sql(
        """select true b, 1Y y, 1S h, 1 i, 1L l, 1.5F f, 2.5D d, 'x' s, X'01' bin,
                  date'2024-03-01' dt, timestamp'2024-03-01 00:00:00' ts,
                  timestamp_ntz'2024-03-01 00:00:00' ntz, 1.25BD d3, cast(1 as decimal(38,3)) d38,
                  cast(null as void) v, interval '1-2' year to month ym, interval 3 day dd,
                  interval '1 02:03' day to minute dm, make_interval(1, 2, 3, 4, 5, 6, 7.5) ci,
                  time'12:34:56' tm, cast('a' as string collate UTF8_LCASE) lc,
                  named_struct('a', array(map('k', named_struct('z', 1L))), 'b', array()) nested,
                  window(timestamp'2024-03-01 00:00:00', '10 seconds') w"""
    )
    texts = [df._jdf.schema().json()]
    udt = T.StructType([T.StructField("v", VectorUDT()), T.StructField("c", T.CharType(3)), T.StructField("vc", T.VarcharType(5))])  # fmt: skip
    texts.append(_jvm_json(_spark, udt.json()))
    meta = T.StructType([T.StructField("x", T.LongType(), True, {"d": 1e10, "f": 1.5, "s": "é\x01", "l": [1, 2], "n": None, "b": True, "nested": {"z": 1, "a": 2}})])  # fmt: skip
    texts.append(_jvm_json(_spark, meta.json()))
    for text in texts:
        assert to_json(parse_schema(text)) == text
        through_arrow = to_json(from_arrow_schema(to_arrow_schema(text)))
        assert through_arrow == text
        assert _jvm_json(_spark, through_arrow) == text
    assert '"type":"interval"' in texts[0] and '"type":"void"' in texts[0]
    assert '"__COLLATIONS"' in texts[0] and '"type":"udt"' in texts[1]
    # PySpark's sorted JSON (df.schema.json()) comes out in Spark's order too.
    assert to_json(parse_schema(df.schema.json())) == texts[0]

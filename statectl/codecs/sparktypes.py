"""Spark's JSON data types (``StructType.json``) and their Arrow equivalents.

Schemas stay as Spark's parsed JSON (str for atomic types, dict for struct/array/map/udt): it is
what state schema files hold, and it round-trips to Spark byte for byte.
"""

from __future__ import annotations

import json
import re
from typing import Any

import pyarrow as pa

from statectl.errors import UnsupportedError

SparkType = Any  # str | dict
_DECIMAL = re.compile(r"^decimal\((\d+),\s*(-?\d+)\)$")

ATOMIC_TO_ARROW: dict[str, pa.DataType] = {
    "boolean": pa.bool_(),
    "byte": pa.int8(),
    "short": pa.int16(),
    "integer": pa.int32(),
    "long": pa.int64(),
    "float": pa.float32(),
    "double": pa.float64(),
    "string": pa.string(),
    "binary": pa.binary(),
    "date": pa.date32(),
    "timestamp": pa.timestamp("us", tz="UTC"),
    "timestamp_ntz": pa.timestamp("us"),
    "void": pa.null(),
    "calendarinterval": pa.struct(
        [("months", pa.int32()), ("days", pa.int32()), ("microseconds", pa.int64())]
    ),
}
METADATA_KEY = b"spark.metadata"


def parse_schema(schema: str | dict) -> dict:
    """A Spark struct schema from JSON text or an already parsed object."""
    obj = json.loads(schema) if isinstance(schema, str) else schema
    if not isinstance(obj, dict) or obj.get("type") != "struct":
        raise UnsupportedError("state schema is not a Spark struct type")
    return obj


def atomic_name(t: SparkType) -> str | None:
    if isinstance(t, str):
        # Collated strings ("string collate UTF8_LCASE") are stored as plain UTF-8.
        return "string" if t.startswith("string collate") else t
    return None


def decimal_of(t: SparkType) -> tuple[int, int] | None:
    if isinstance(t, str):
        if t == "decimal":
            return 10, 0
        m = _DECIMAL.match(t)
        if m:
            return int(m.group(1)), int(m.group(2))
    return None


def is_interval_ym(t: SparkType) -> bool:
    return (
        isinstance(t, str)
        and t.startswith("interval")
        and ("year" in t or "month" in t)
        and "day" not in t
    )


def is_interval_dt(t: SparkType) -> bool:
    return (
        isinstance(t, str)
        and t.startswith("interval")
        and not is_interval_ym(t)
        and t != "interval"
    )


def to_arrow_type(t: SparkType) -> pa.DataType:
    dec = decimal_of(t)
    if dec:
        return pa.decimal128(*dec)
    name = atomic_name(t)
    if name is not None:
        if name in ATOMIC_TO_ARROW:
            return ATOMIC_TO_ARROW[name]
        if is_interval_ym(name):
            return pa.int32()  # months
        if is_interval_dt(name):
            return pa.duration("us")
        raise UnsupportedError(f"Spark type {t!r} is not supported in state by statectl")
    kind = t.get("type")
    if kind == "struct":
        return pa.struct([to_arrow_field(f) for f in t["fields"]])
    if kind == "array":
        return pa.list_(
            pa.field("element", to_arrow_type(t["elementType"]), t.get("containsNull", True))
        )
    if kind == "map":
        return pa.map_(
            to_arrow_type(t["keyType"]),
            pa.field("value", to_arrow_type(t["valueType"]), t.get("valueContainsNull", True)),
        )
    if kind == "udt":
        return to_arrow_type(t["sqlType"])
    raise UnsupportedError(f"Spark type {json.dumps(t)[:80]} is not supported in state by statectl")


def to_arrow_field(f: dict) -> pa.Field:
    meta = f.get("metadata") or {}
    return pa.field(
        f["name"],
        to_arrow_type(f["type"]),
        bool(f.get("nullable", True)),
        {METADATA_KEY: json.dumps(meta, separators=(",", ":")).encode()} if meta else None,
    )


def to_arrow_schema(struct: str | dict) -> pa.Schema:
    return pa.schema([to_arrow_field(f) for f in parse_schema(struct)["fields"]])


def from_arrow_type(t: pa.DataType) -> SparkType:
    for name, at in ATOMIC_TO_ARROW.items():
        if name != "calendarinterval" and t == at:
            return name
    if pa.types.is_large_string(t):
        return "string"
    if pa.types.is_large_binary(t):
        return "binary"
    if pa.types.is_timestamp(t):
        return "timestamp" if t.tz else "timestamp_ntz"
    if pa.types.is_decimal(t):
        return f"decimal({t.precision},{t.scale})"
    if pa.types.is_struct(t):
        return {
            "type": "struct",
            "fields": [from_arrow_field(t.field(i)) for i in range(t.num_fields)],
        }
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        return {
            "type": "array",
            "elementType": from_arrow_type(t.value_type),
            "containsNull": t.value_field.nullable,
        }
    if pa.types.is_map(t):
        return {
            "type": "map",
            "keyType": from_arrow_type(t.key_type),
            "valueType": from_arrow_type(t.item_type),
            "valueContainsNull": t.item_field.nullable,
        }
    raise UnsupportedError(f"Arrow type {t} has no Spark equivalent in state")


def from_arrow_field(f: pa.Field) -> dict:
    meta = json.loads((f.metadata or {}).get(METADATA_KEY, b"{}"))
    return {
        "name": f.name,
        "type": from_arrow_type(f.type),
        "nullable": f.nullable,
        "metadata": meta,
    }


def to_json(struct: dict) -> str:
    """Compact JSON with Spark's field order (type, fields / name, type, nullable, metadata)."""
    return json.dumps(struct, separators=(",", ":"), ensure_ascii=False)

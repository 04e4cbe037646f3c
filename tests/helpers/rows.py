"""Comparing our Arrow tables with Spark rows, by position (duplicate field names exist)."""

from __future__ import annotations

import datetime as dt
import decimal
from typing import Any

import pyarrow as pa


def normalize(v: Any) -> Any:
    if isinstance(v, float) and v != v:
        return "NaN"
    if isinstance(v, dt.datetime):
        if v.tzinfo is not None:
            v = v.astimezone(dt.timezone.utc).replace(tzinfo=None)
        return v.isoformat()
    if isinstance(v, (dt.date, decimal.Decimal)):
        return str(v)
    if isinstance(v, (bytes, bytearray, memoryview)):
        return bytes(v).hex()
    if isinstance(v, dict):
        return tuple(sorted((normalize(k), normalize(x)) for k, x in v.items()))
    if isinstance(v, (list, tuple)):
        return tuple(normalize(x) for x in v)
    return v


def arrow_rows(table: pa.Table) -> list[tuple]:
    """Rows as nested tuples by field position, so duplicate struct field names survive."""

    def column_values(arr: pa.Array) -> list[Any]:
        if pa.types.is_struct(arr.type):
            children = [column_values(arr.field(i)) for i in range(arr.type.num_fields)]
            valid = arr.is_valid().to_pylist()
            return [tuple(c[i] for c in children) if valid[i] else None for i in range(len(arr))]
        if pa.types.is_map(arr.type):
            return [None if m is None else dict(m) for m in arr.to_pylist()]
        return arr.to_pylist()

    cols = [column_values(c.combine_chunks()) for c in table.columns]
    return sorted((normalize(tuple(r)) for r in zip(*cols, strict=True)), key=repr)


def spark_rows(df) -> list[tuple]:
    def conv(v: Any) -> Any:
        from pyspark.sql import Row

        if isinstance(v, Row):
            return tuple(conv(x) for x in v)
        if isinstance(v, list):
            return [conv(x) for x in v]
        if isinstance(v, dict):
            return {conv(k): conv(x) for k, x in v.items()}
        return v

    return sorted((normalize(conv(r)) for r in df.collect()), key=repr)


def arrow_names(t) -> object:
    """Field names, nested, of an Arrow type or schema."""
    if isinstance(t, pa.Schema):
        return [(f.name, arrow_names(f.type)) for f in t]
    if pa.types.is_struct(t):
        return [(t.field(i).name, arrow_names(t.field(i).type)) for i in range(t.num_fields)]
    if pa.types.is_list(t):
        return arrow_names(t.value_type)
    if pa.types.is_map(t):
        return (arrow_names(t.key_type), arrow_names(t.item_type))
    return None


def spark_names(t) -> object:
    from pyspark.sql.types import ArrayType, MapType, StructType

    if isinstance(t, StructType):
        return [(f.name, spark_names(f.dataType)) for f in t.fields]
    if isinstance(t, ArrayType):
        return spark_names(t.elementType)
    if isinstance(t, MapType):
        return (spark_names(t.keyType), spark_names(t.valueType))
    return None

"""The Arrow shape of a savepoint's state tables: the schema of a table's rows (Spark's
``statestore`` columns from the Spark JSON schemas in ``_metadata``), and the renaming of
repeated struct field names that Parquet needs, both ways.

Pure Arrow, no I/O: the savepoint writers, the reader and ``export`` all use it.
"""

from __future__ import annotations

import json
from typing import Any

import pyarrow as pa

from statectl.codecs.sparktypes import to_arrow_type
from statectl.errors import CorruptFileError
from statectl.savepoints.format import METADATA_FILE, StateTable

# Parquet and Arrow's writers reject duplicate field names, which aggregation buffers have
# (count, sum, count ...). Renamed fields get a "_<n>" suffix; the original names are kept in the
# field metadata under this key so a reader can restore them.
ORIGINAL_NAME_KEY = b"statectl.original_name"


def dedupe_field_names(t: pa.DataType) -> pa.DataType:
    if pa.types.is_struct(t):
        seen: dict[str, int] = {}
        fields = []
        for i in range(t.num_fields):
            f = t.field(i)
            ftype = dedupe_field_names(f.type)
            name = f.name
            if name in seen:
                seen[name] += 1
                new = f"{name}_{seen[name]}"
                meta = dict(f.metadata or {})
                meta[ORIGINAL_NAME_KEY] = name.encode()
                fields.append(pa.field(new, ftype, f.nullable, meta))
            else:
                seen[name] = 0
                fields.append(pa.field(name, ftype, f.nullable, f.metadata))
        return pa.struct(fields)
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        return pa.list_(dedupe_field_names(t.value_type))
    if pa.types.is_map(t):
        return pa.map_(dedupe_field_names(t.key_type), dedupe_field_names(t.item_type))
    return t


def retype(arr: pa.Array, t: pa.DataType) -> pa.Array:
    """The same data under a type that differs only in struct field names."""
    if arr.type == t:
        return arr
    if pa.types.is_struct(t):
        children = [retype(arr.field(i), t.field(i).type) for i in range(t.num_fields)]
        return pa.StructArray.from_arrays(
            children, fields=list(t), mask=arr.is_null() if arr.null_count else None
        )
    if pa.types.is_list(t):
        return pa.ListArray.from_arrays(
            arr.offsets,
            retype(arr.values, t.value_type),
            type=t,
            mask=arr.is_null() if arr.null_count else None,
        )
    if pa.types.is_map(t):
        return pa.MapArray.from_arrays(
            arr.offsets,
            retype(arr.keys, t.key_type),
            retype(arr.items, t.item_type),
            type=t,
            mask=arr.is_null() if arr.null_count else None,
        )
    return arr.cast(t)


def exportable(table: pa.Table) -> pa.Table:
    """Rename repeated struct field names so Parquet (and Arrow's writers) accept the table."""
    schema = pa.schema(
        [pa.field(f.name, dedupe_field_names(f.type), f.nullable, f.metadata) for f in table.schema]
    )
    if schema.equals(table.schema):
        return table
    cols = [retype(c.combine_chunks(), f.type) for c, f in zip(table.columns, schema, strict=True)]
    return pa.Table.from_arrays(cols, schema=schema)


def table_schema(table: StateTable) -> pa.Schema:
    """The columns of ``table``'s rows, as Spark's ``statestore`` source shows them."""

    def arrow(schema_json: Any) -> pa.DataType:
        try:
            return to_arrow_type(json.loads(schema_json))
        except (ValueError, TypeError, KeyError, AttributeError, RecursionError) as e:
            raise CorruptFileError(
                f"schema of table {table.name!r} in _metadata is invalid ({e})", METADATA_FILE
            ) from None

    key = arrow(table.key_schema)
    value = arrow(table.value_schema)
    if table.kind in ("MapState", "timers") and not (
        pa.types.is_struct(key) and key.get_field_index("key") >= 0
    ):
        raise CorruptFileError(
            f"key schema of {table.kind} table {table.name!r} in _metadata has no field 'key'",
            METADATA_FILE,
        )
    if table.kind == "MapState":
        user_key = arrow(table.user_key_schema or "{}")
        return pa.schema(
            [
                ("key", key.field("key").type),
                ("user_map_key", user_key),
                ("user_map_value", value),
                ("partition_id", pa.int32()),
            ]
        )
    if table.kind == "timers":
        return pa.schema(
            [
                ("key", key.field("key").type),
                ("expiration_timestamp_ms", pa.int64()),
                ("partition_id", pa.int32()),
            ]
        )
    name = "list_element" if table.kind == "ListState" else "value"
    return pa.schema([("key", key), (name, value), ("partition_id", pa.int32())])


def _plain(t: pa.DataType) -> pa.DataType:
    """``t`` with every field nullable and without metadata: what "the same schema" compares
    (names and types, field for field), whoever wrote the file."""
    if pa.types.is_struct(t):
        return pa.struct([pa.field(f.name, _plain(f.type)) for f in t])
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        return pa.list_(_plain(t.value_type))
    if pa.types.is_map(t):
        return pa.map_(_plain(t.key_type), _plain(t.item_type))
    return t


def check_file_schema(actual: pa.Schema, table: StateTable, path: str) -> None:
    """A data file's columns are exactly what ``_metadata`` declares for ``table`` (names and
    types, field for field, as the writer stores them): a file whose key is an int64 where
    ``_metadata`` says string is forged or belongs elsewhere, never something to cast."""
    expected = table_schema(table)
    names = [f.name for f in expected]
    if list(table.columns) != names:
        raise CorruptFileError(
            f"savepoint metadata is invalid: table {table.name} lists columns "
            f"{table.columns}, its kind {table.kind!r} has {names}",
            METADATA_FILE,
        )
    if actual.names != names:
        raise CorruptFileError(
            f"has columns {actual.names}, _metadata declares {names} for table {table.name}; "
            "the savepoint is damaged",
            path,
        )
    for got, want in zip(actual, expected, strict=True):
        if _plain(got.type) != _plain(dedupe_field_names(want.type)):
            raise CorruptFileError(
                f"column {got.name} is {got.type}, _metadata declares "
                f"{dedupe_field_names(want.type)} for table {table.name}; the savepoint is damaged",
                path,
            )

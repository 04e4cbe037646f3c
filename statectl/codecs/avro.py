"""The Avro row encoding transformWithState uses with ``stateStore.encodingFormat=avro``.

Spark (``AvroStateEncoder``) converts every key/value schema with
``SchemaConverters.toAvroTypeWithDefaults`` and writes each row with a ``GenericDatumWriter``
and a direct binary encoder. :func:`avro_schema` rebuilds that schema rule for rule (checked
against javap of the 4.3.0 jar and its ``toString`` output):

* the top level is ``record topLevelRecord`` (no namespace);
* every field is the union ``["null", T]`` with default null, nullable in Spark or not, so a
  value starts with the branch byte ``02``; a NullType field is plain ``"null"`` (no bytes);
* a nested struct is ``["null", record <field name>]``; arrays and maps are
  ``["null", array|map]`` whose items/values are bare atomic types (no union, so no branch
  byte and no room for a null element) or unions for struct/array/map;
* byte/short/integer → int; date → int (date); timestamp → long (timestamp-micros);
  timestamp_ntz → long (local-timestamp-micros); binary → bytes; decimal(p,s) → fixed
  ``<field>.fixed`` of ``minBytesForPrecision(p)`` bytes; map keys must be strings. Intervals,
  time and the other types make Spark fail, so they are UnsupportedError here.

Rows are the Avro binary of one record; the caller strips Spark's prefix (version byte, schema
id). Decoding loops over rows with fastavro: Avro has no fixed layout to vectorize over, and
only transformWithState stores use it.
"""

from __future__ import annotations

import io
from collections.abc import Iterable
from typing import Any

import pyarrow as pa

from statectl.codecs.sparktypes import (
    decimal_of,
    kind,
    nested,
    parse_schema,
    physical,
    to_arrow_type,
)
from statectl.errors import CorruptFileError, UnsupportedError

_ATOMIC: dict[str, Any] = {
    "boolean": "boolean",
    "byte": "int",
    "short": "int",
    "integer": "int",
    "long": "long",
    "float": "float",
    "double": "double",
    "string": "string",
    "binary": "bytes",
    "void": "null",
    "date": {"type": "int", "logicalType": "date"},
    "timestamp": {"type": "long", "logicalType": "timestamp-micros"},
    "timestamp_ntz": {"type": "long", "logicalType": "local-timestamp-micros"},
}


def min_bytes_for_precision(precision: int) -> int:
    """Spark's ``Decimal.minBytesForPrecision``: bytes of a two's complement 10^p - 1."""
    n = 1
    while 2 ** (8 * n - 1) < 10**precision:
        n += 1
    return n


def avro_schema(schema: str | bytes | dict) -> dict:
    """The Avro schema (JSON object) Spark writes a state row of ``schema`` with."""
    return _avro(parse_schema(schema), "topLevelRecord", 0)


def _avro(t: Any, name: str, level: int) -> Any:
    k = kind(t)
    if k == "struct":
        return _avro_record(nested(t), name, level)
    if k == "array":
        items = _avro(nested(t)["elementType"], name, level + 1)
        return ["null", {"type": "array", "items": items}]
    if k == "map":
        return _avro_map(nested(t), name, level)
    if k == "decimal":
        return _avro_decimal(t, name)
    if k in _ATOMIC:
        return _ATOMIC[k]
    raise UnsupportedError(f"Spark type {physical(t)!r} cannot be stored in Avro-encoded state")


def _avro_record(t: dict, name: str, level: int) -> Any:
    """A struct: a record of nullable fields (itself nullable when nested)."""
    fields = []
    for f in t["fields"]:
        inner = _avro(f["type"], f["name"], level + 1)
        if inner != "null" and not isinstance(inner, list):
            inner = ["null", inner]
        fields.append({"name": f["name"], "type": inner, "default": None})
    record = {"type": "record", "name": name, "fields": fields}
    return ["null", record] if level > 0 else record


def _avro_map(t: dict, name: str, level: int) -> Any:
    if kind(t["keyType"]) != "string":
        raise UnsupportedError(f"Avro state encoding needs string map keys, not {t['keyType']!r}")
    return ["null", {"type": "map", "values": _avro(t["valueType"], name, level + 1)}]


def _avro_decimal(t: Any, name: str) -> dict[str, Any]:
    """A decimal: fixed bytes of the unscaled value, as Spark's Avro schema converter makes."""
    dec = decimal_of(t)
    if dec is None:
        raise UnsupportedError(f"Spark type {t!r} is not a decimal")
    precision, scale = dec
    return {
        "type": "fixed",
        "name": "fixed",
        "namespace": name,
        "size": min_bytes_for_precision(precision),
        "logicalType": "decimal",
        "precision": precision,
        "scale": scale,
    }


def _plain(avro: Any, names: list[int]) -> Any:
    """The schema fastavro reads and writes with: the same bytes, but

    * no date/timestamp logical types, so values stay integers (no datetime objects, no
      range limits, and Arrow takes them as they are);
    * a unique name for every record and fixed type. Spark names them after fields, so two
      structs or decimals under the same field name collide; Avro's SchemaBuilder does not
      mind (names never reach the bytes), but a parsed schema must not redefine a name.
    """
    if isinstance(avro, list):
        return [_plain(a, names) for a in avro]
    if isinstance(avro, dict):
        if avro.get("logicalType") in ("date", "timestamp-micros", "local-timestamp-micros"):
            return avro["type"]
        out = {key: _plain(v, names) for key, v in avro.items() if key != "namespace"}
        if avro["type"] in ("record", "fixed"):
            names.append(len(names))
            out["name"] = f"t{len(names)}"
        return out
    return avro


def _parsed(struct: dict) -> Any:
    import fastavro

    return fastavro.parse_schema(_plain(_avro(struct, "topLevelRecord", 0), []))


def decode_avro_rows(
    rows: pa.Array | pa.ChunkedArray, schema: str | bytes | dict, path: str | None = None
) -> pa.StructArray:
    """One Avro record per element of ``rows`` → a struct array of ``to_arrow_type(schema)``.

    A null element gives a null struct; a record that does not decode, or leaves bytes
    unread, raises CorruptFileError naming ``path``.
    """
    import fastavro

    struct = parse_schema(schema, path)
    parsed = _parsed(struct)
    has_maps = _has_maps(struct)
    out: list[Any] = []  # fastavro types a datum as any Avro value; of a record schema, a dict
    for i, blob in enumerate(rows.to_pylist()):
        if blob is None:
            out.append(None)
            continue
        stream = io.BytesIO(blob)
        try:
            record = fastavro.schemaless_reader(stream, parsed, None)
        except Exception as e:  # fastavro raises many types (EOFError, ValueError …)
            raise CorruptFileError(
                f"Avro state row {i} does not decode with its schema ({type(e).__name__}: {e})",
                path,
            ) from None
        if stream.tell() != len(blob):
            raise CorruptFileError(
                f"Avro state row {i} has {len(blob) - stream.tell()} bytes left after the "
                "record: the schema does not match the data (or the file is corrupt)",
                path,
            )
        out.append(_maps_to_pairs(struct, record) if has_maps else record)
    return pa.array(out, type=to_arrow_type(struct))


def encode_avro_rows(
    data: pa.StructArray | pa.Table | pa.RecordBatch | Iterable[dict | None],
    schema: str | bytes | dict,
) -> pa.LargeBinaryArray:
    """The Avro binary Spark's AvroStateEncoder writes for each row (without its prefix)."""
    import fastavro

    struct = parse_schema(schema)
    arrow_t = to_arrow_type(struct)
    if isinstance(data, (pa.Table, pa.RecordBatch)):
        data = pa.StructArray.from_arrays(
            [c.combine_chunks() if isinstance(c, pa.ChunkedArray) else c for c in data.columns],
            fields=list(data.schema),
        )
    elif not isinstance(data, (pa.Array, pa.ChunkedArray)):
        data = pa.array(list(data), type=arrow_t)
    if not data.type.equals(arrow_t):
        data = data.cast(arrow_t)
    # Dates and timestamps as their integer storage, to match the plain schema.
    values = data.cast(_storage_type(arrow_t)).to_pylist()
    parsed = _parsed(struct)
    out: list[bytes | None] = []
    for row in values:
        if row is None:
            out.append(None)
            continue
        stream = io.BytesIO()
        try:
            fastavro.schemaless_writer(stream, parsed, _pairs_to_maps(struct, row))
        except (ValueError, TypeError) as e:
            raise UnsupportedError(
                f"row cannot be written with Spark's Avro state schema ({e}); arrays and map "
                "values of atomic types cannot hold nulls there",
            ) from None
        out.append(stream.getvalue())
    return pa.array(out, type=pa.large_binary())


def _storage_type(t: pa.DataType) -> pa.DataType:
    if pa.types.is_date32(t):
        return pa.int32()
    if pa.types.is_timestamp(t):
        return pa.int64()
    if pa.types.is_struct(t):
        return pa.struct([f.with_type(_storage_type(f.type)) for f in t])
    if pa.types.is_list(t):
        return pa.list_(t.value_field.with_type(_storage_type(t.value_type)))
    if pa.types.is_map(t):
        return pa.map_(
            t.key_field.with_type(_storage_type(t.key_type)),
            t.item_field.with_type(_storage_type(t.item_type)),
        )
    return t


def _has_maps(t: Any) -> bool:
    k = kind(t)
    t = physical(t)
    if k == "map":
        return True
    if k == "struct":
        return any(_has_maps(f["type"]) for f in t["fields"])
    return k == "array" and _has_maps(t["elementType"])


def _maps_to_pairs(t: Any, v: Any) -> Any:
    """fastavro's dicts for Avro maps → the (key, value) pairs pa.array wants for Arrow maps."""
    if v is None:
        return None
    k = kind(t)
    t = physical(t)
    if k == "struct":
        return {f["name"]: _maps_to_pairs(f["type"], v[f["name"]]) for f in t["fields"]}
    if k == "array":
        return [_maps_to_pairs(t["elementType"], x) for x in v]
    if k == "map":
        return [(key, _maps_to_pairs(t["valueType"], x)) for key, x in v.items()]
    return v


def _pairs_to_maps(t: Any, v: Any) -> Any:
    if v is None:
        return None
    k = kind(t)
    t = physical(t)
    if k == "struct":
        return {f["name"]: _pairs_to_maps(f["type"], v[f["name"]]) for f in t["fields"]}
    if k == "array":
        return [_pairs_to_maps(t["elementType"], x) for x in v]
    if k == "map":
        return {key: _pairs_to_maps(t["valueType"], x) for key, x in v}
    return v

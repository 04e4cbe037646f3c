"""The Avro row encoding transformWithState uses with ``stateStore.encodingFormat=avro``.

Spark converts each key/value schema with ``SchemaConverters.toAvroTypeWithDefaults``: a record
per struct whose every field is the union ``["null", T]`` (null first, default null), nullable
in Spark or not; a NullType field is plain ``null`` (zero bytes). Observed on Spark 4.3.0 bytes:
key "k0" = ``02 04 6b 30``, a non-nullable long timer timestamp starts with the union branch 02.
Array elements and map values are assumed to follow the same rule (no Spark-written sample).

Decoding is a loop over rows with fastavro: Avro has no fixed layout to vectorize over, and only
transformWithState stores use it.
"""

from __future__ import annotations

import io
from typing import Any

import pyarrow as pa

from statectl.codecs.sparktypes import atomic_name, decimal_of, parse_schema, to_arrow_type
from statectl.errors import CorruptFileError, UnsupportedError

_ATOMIC = {
    "boolean": "boolean",
    "byte": "int",
    "short": "int",
    "integer": "int",
    "long": "long",
    "float": "float",
    "double": "double",
    "string": "string",
    "binary": "bytes",
    "date": {"type": "int", "logicalType": "date"},
    "timestamp": {"type": "long", "logicalType": "timestamp-micros"},
    "timestamp_ntz": {"type": "long", "logicalType": "local-timestamp-micros"},
}


def _avro_type(t: Any, name: str, namespace: str, counter: list[int]) -> Any:
    dec = decimal_of(t)
    if dec:
        counter[0] += 1
        size = max(1, (dec[0] * 3322 // 1000 + 8) // 8 + 1)  # Spark's minBytesForPrecision
        return {
            "type": "fixed",
            "name": f"{name}_fixed{counter[0]}",
            "namespace": namespace,
            "size": min(size, 16),
            "logicalType": "decimal",
            "precision": dec[0],
            "scale": dec[1],
        }
    a = atomic_name(t)
    if a == "void":
        return "null"
    if a in _ATOMIC:
        return _ATOMIC[a]
    if a is not None:
        raise UnsupportedError(f"Spark type {t!r} is not supported in Avro-encoded state")
    kind = t["type"]
    if kind == "struct":
        child_ns = f"{namespace}.{name}" if namespace else name
        return {
            "type": "record",
            "name": name,
            "namespace": namespace,
            "fields": [
                {
                    "name": f["name"],
                    "type": _nullable(_avro_type(f["type"], f["name"], child_ns, counter)),
                    "default": None,
                }
                for f in t["fields"]
            ],
        }
    if kind == "array":
        return {
            "type": "array",
            "items": _nullable(_avro_type(t["elementType"], name, namespace, counter)),
        }
    if kind == "map":
        return {
            "type": "map",
            "values": _nullable(_avro_type(t["valueType"], name, namespace, counter)),
        }
    raise UnsupportedError(f"Spark type {kind!r} is not supported in Avro-encoded state")


def _nullable(avro: Any) -> Any:
    return avro if avro == "null" else ["null", avro]


def avro_schema(schema: str | dict) -> dict:
    """The Avro schema Spark writes a state row of ``schema`` with."""
    return _avro_type(parse_schema(schema), "topLevelRecord", "", [0])


def decode_avro_rows(rows: pa.Array, schema: str | dict, path: str | None = None) -> pa.StructArray:
    """One Avro record per element of ``rows`` (the caller strips Spark's prefix bytes)."""
    import fastavro

    struct = parse_schema(schema)
    parsed = fastavro.parse_schema(avro_schema(struct))
    out: list[dict | None] = []
    for i, blob in enumerate(rows.to_pylist()):
        if blob is None:
            out.append(None)
            continue
        try:
            out.append(fastavro.schemaless_reader(io.BytesIO(blob), parsed, None))
        except Exception as e:  # fastavro raises several types for malformed input
            raise CorruptFileError(
                f"Avro state row {i} does not decode ({type(e).__name__})", path
            ) from None
    arrow_type = to_arrow_type(struct)
    return pa.array(out, type=arrow_type)


def encode_avro_rows(data: list[dict | None], schema: str | dict) -> pa.LargeBinaryArray:
    import fastavro

    parsed = fastavro.parse_schema(avro_schema(schema))
    out = []
    for row in data:
        if row is None:
            out.append(None)
            continue
        buf = io.BytesIO()
        fastavro.schemaless_writer(buf, parsed, row)
        out.append(buf.getvalue())
    return pa.array(out, type=pa.large_binary())

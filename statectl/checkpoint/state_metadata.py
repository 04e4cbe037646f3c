"""Per-operator metadata: operator metadata (v1, v2) and state schema files (v1, v2, v3)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from statectl.checkpoint.logs import parse_version_line
from statectl.codecs.javaio import DataReader, DataWriter
from statectl.codecs.jsonfields import Fields, loads
from statectl.errors import CorruptFileError

MAX_OPERATOR_METADATA_VERSION = 2
MAX_SCHEMA_VERSION = 3
_MAX_UTF_CHUNK = 65535


@dataclass
class StoreInfo:
    store_name: str
    num_cols_prefix_key: int
    num_partitions: int
    schema_file_paths: list[str] = field(default_factory=list)


@dataclass
class OperatorMetadata:
    version: int
    operator_id: int
    operator_name: str
    stores: list[StoreInfo]
    properties: dict[str, Any] = field(default_factory=dict)


def parse_operator_metadata(text: str, path: str) -> OperatorMetadata:
    head, _, body = text.partition("\n")
    version = parse_version_line(head, MAX_OPERATOR_METADATA_VERSION, path)
    obj = Fields(loads(body, path, "operator metadata"), path)
    info = obj.fields("operatorInfo", None) or Fields({}, path, "operatorInfo")
    stores = []
    for s in obj.obj_list("stateStoreInfo", []):
        paths = s.str_list("stateSchemaFilePaths", None)
        if paths is None and s.has("stateSchemaFilePath"):
            paths = [s.str("stateSchemaFilePath")]  # the 4.0-era single-path field
        stores.append(
            StoreInfo(
                store_name=s.str("storeName", "default"),
                num_cols_prefix_key=s.int("numColsPrefixKey", 0, minimum=0),
                num_partitions=s.int("numPartitions", 0, minimum=0),
                schema_file_paths=list(paths or []),
            )
        )
    props: dict[str, Any] = {}
    if obj.has("operatorPropertiesJson"):
        props = Fields(
            loads(obj.str("operatorPropertiesJson"), path, "operatorPropertiesJson"),
            path,
            "operatorPropertiesJson",
        ).obj
    return OperatorMetadata(
        version=version,
        operator_id=info.int("operatorId", -1),
        operator_name=info.str("operatorName", ""),
        stores=stores,
        properties=props,
    )


@dataclass
class ColumnFamilySchema:
    """One column family (or the single store) of a schema file; schemas as Spark JSON text."""

    name: str
    key_schema: str
    value_schema: str
    key_schema_id: int = 0
    value_schema_id: int = 0
    key_encoder_spec: dict[str, Any] = field(
        default_factory=lambda: {"keyStateEncoderType": "NoPrefixKeyStateEncoderSpec"}
    )
    user_key_schema: str | None = None


def _read_chunked(r: DataReader) -> str:
    n = r.read_int()
    if n < 0 or n > 1_000_000:
        raise CorruptFileError(f"invalid chunk count {n} in schema file", r.path)
    return "".join(r.read_utf() for _ in range(n))


def parse_schema_file(data: bytes, path: str) -> tuple[int, list[ColumnFamilySchema]]:
    """Spark's ``SchemaReader`` v1/v2 (one store, name "default") and v3 (column families)."""
    r = DataReader(data, path)
    version = parse_version_line(r.read_utf(), MAX_SCHEMA_VERSION, path)
    if version == 1:
        return 1, [ColumnFamilySchema("default", r.read_utf(), r.read_utf())]
    if version == 2:
        return 2, [ColumnFamilySchema("default", _read_chunked(r), _read_chunked(r))]
    count = r.read_int()
    if count < 1 or count > 100_000:
        raise CorruptFileError(f"invalid column family count {count} in schema file", path)
    return 3, [_read_family(r, path) for _ in range(count)]


def _read_family(r: DataReader, path: str) -> ColumnFamilySchema:
    """One column family of a v3 schema file: name, key and value schemas with their ids, the
    key encoder spec (its fields typed here, where the file is named) and the user key."""
    name = r.read_utf()
    key_id = r.read_short()
    key = _read_chunked(r)
    value_id = r.read_short()
    value = _read_chunked(r)
    spec_text = _read_chunked(r)
    user_key = _read_chunked(r)
    spec = Fields(
        loads(spec_text, path, f"key encoder spec of {name!r}"), path, "keyStateEncoderSpec"
    )
    spec.int("numColsPrefixKey", 0, minimum=0)  # the fields readers use, typed
    spec.str("keyStateEncoderType", "")
    ordinals = spec.list("orderingOrdinals", [])
    if not all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in ordinals):
        raise CorruptFileError(f"orderingOrdinals of {name!r} are not column numbers", path)
    return ColumnFamilySchema(
        name,
        key,
        value,
        key_id,
        value_id,
        spec.obj,
        None if "".join(user_key.split()) in ("", "{}") else user_key,
    )


def _write_chunked(w: DataWriter, text: str) -> None:
    chunks = [text[i : i + _MAX_UTF_CHUNK] for i in range(0, len(text), _MAX_UTF_CHUNK)] or [""]
    w.write_int(len(chunks))
    for c in chunks:
        w.write_utf(c)


def write_schema_file_v2(key_schema: str, value_schema: str) -> bytes:
    w = DataWriter()
    w.write_utf("v2")
    _write_chunked(w, key_schema)
    _write_chunked(w, value_schema)
    return w.getvalue()


def write_schema_file_v3(families: list[ColumnFamilySchema]) -> bytes:
    w = DataWriter()
    w.write_utf("v3")
    w.write_int(len(families))
    for f in families:
        w.write_utf(f.name)
        w.write_short(f.key_schema_id)
        _write_chunked(w, f.key_schema)
        w.write_short(f.value_schema_id)
        _write_chunked(w, f.value_schema)
        _write_chunked(w, json.dumps(f.key_encoder_spec, separators=(",", ":")))
        _write_chunked(w, f.user_key_schema or "{    }")
    return w.getvalue()

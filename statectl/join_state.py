"""Stream-stream join state at Spark's state formats 2, 3 and 4, and the conversions between them.

``spark.sql.streaming.join.stateFormatVersion`` (pinned in the offset log) picks the layout:

* **2** (HDFS or RocksDB): four stores, per side ``keyToNumValues`` (join key -> ``value``:
  the number of values) and ``keyWithIndexToValue`` (join key + ``index`` -> input row +
  ``matched``).
* **3** (RocksDB only): the same four as virtual column families of one store ``default``, all
  ``NoPrefixKeyStateEncoderSpec``: format 2's RocksDB bytes behind the 2-byte family id.
* **4** (RocksDB only), per side:

  - ``keyWithTsToValues``: key (join key, ``__event_time``) with
    ``TimestampAsPostfixKeyStateEncoderSpec`` = ``0x00`` + UnsafeRow(join key) + the event
    time as 8 big-endian bytes with the sign bit flipped (so bytes sort as numbers); value: the
    list of (input row + ``matched``) of that key and time, merged like list state
    (``int32 LE length`` + ``0x00`` + UnsafeRow each, ``,``-separated with mergeOperatorVersion 1);
  - ``tsWithKey``: the same key fields with ``TimestampAsPrefixKeyStateEncoderSpec`` (the 8
    bytes first, so eviction scans by time); value: one null ``__dummy__`` row per value
    (Spark 4.3 merges one per append, and counts them when it evicts).

  The event time is the input row's watermark column (``spark.watermarkDelayMs`` in its field
  metadata; a window's ``end``) in microseconds. Checked byte for byte against
  fixtures/checkpoints/join4-rocksdb and ``javap`` of Spark 4.3's
  ``SymmetricHashJoinStateManagerV4$TsWithKeyTypeStore`` (``merge(key, EMPTY_ROW)``).

Savepoints hold every format as format 2's four tables (the same meaning, whatever the format:
a savepoint restores at 2, 3 or 4), and record the source format on the operator.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from statectl.checkpoint.model import StoreDescription
from statectl.checkpoint.state_metadata import ColumnFamilySchema
from statectl.codecs.sparktypes import from_arrow_schema
from statectl.codecs.unsaferow import encode_unsafe_rows
from statectl.errors import StatectlError, UnsupportedError
from statectl.operators import JOIN_STORES, JOIN_V2, JOIN_V3, JOIN_V4, JOIN_V4_FAMILIES
from statectl.tws_encode import concat_binary, merge_lists

NAME = "symmetricHashJoin"
FORMAT_CONF = JOIN_V2.format_conf
EVENT_TIME = "__event_time"
WATERMARK_KEY = "spark.watermarkDelayMs"
# Which backends Spark runs each format on; formats 3 and 4 as RocksDB snapshots here (statectl
# writes column families into snapshots only, as for transformWithState).
FORMATS = (1, 2, 3, 4)
COLUMN_FAMILY_FORMATS = (3, 4)
NO_PREFIX = {"keyStateEncoderType": "NoPrefixKeyStateEncoderSpec"}
TS_POSTFIX = {"keyStateEncoderType": "TimestampAsPostfixKeyStateEncoderSpec"}
TS_PREFIX = {"keyStateEncoderType": "TimestampAsPrefixKeyStateEncoderSpec"}
SIGN = np.uint64(1 << 63)
VERSION = b"\x00"


def _field(name: str, type_: str) -> dict[str, Any]:
    return {"name": name, "type": type_, "nullable": True, "metadata": {}}


def _schema(fields: list[dict[str, Any]]) -> str:
    """Spark's compact JSON of a struct (what its schema files hold)."""
    return json.dumps({"type": "struct", "fields": fields}, separators=(",", ":"))


def _fields(schema: str) -> list[dict[str, Any]]:
    return json.loads(schema)["fields"]


NUM_VALUES_SCHEMA = _schema([_field("value", "long")])
DUMMY_SCHEMA = _schema([_field("__dummy__", "void")])


def format_of(kind: Any) -> int | None:
    """3 or 4 for a column-family join kind (statectl/operators.py), else None."""
    return {JOIN_V3.kind: 3, JOIN_V4.kind: 4}.get(getattr(kind, "kind", ""))


def pinned_format(confs: dict[str, str]) -> int:
    """The join state format a checkpoint's pinned confs say (Spark's legacy default: 1)."""
    return JOIN_V2.state_format(confs) or 1


# -- the format-2 view of formats 3 and 4 (inspect, savepoint) --------------------------------
def logical_schemas(schemas: list[StoreDescription], fmt: int) -> list[StoreDescription]:
    """Format 2's four stores, with their schemas, of a format 3 or 4 join's column families."""
    by_name = {s.name: s for s in schemas}
    out = []
    for side in ("left", "right"):
        if fmt == 3:
            for store in (f"{side}-keyToNumValues", f"{side}-keyWithIndexToValue"):
                s = by_name[store]
                out.append(StoreDescription(store, s.key_schema, s.value_schema))
            continue
        kwtv = by_name[f"{side}-keyWithTsToValues"]
        key = [f for f in _fields(kwtv.key_schema) if f["name"] != EVENT_TIME]
        out.append(StoreDescription(f"{side}-keyToNumValues", _schema(key), NUM_VALUES_SCHEMA))
        out.append(
            StoreDescription(
                f"{side}-keyWithIndexToValue",
                _schema([*key, _field("index", "long")]),
                kwtv.value_schema,
            )
        )
    return out


def families_for(fmt: int, stores: dict[str, tuple[str, str]]) -> list[ColumnFamilySchema]:
    """The column families Spark registers at format 3 or 4, in its order, from format 2's
    store schemas ``{name: (key schema, value schema)}``."""
    if fmt == 3:
        return [
            ColumnFamilySchema(n, *stores[n], key_encoder_spec=dict(NO_PREFIX)) for n in JOIN_STORES
        ]
    out = []
    for side in ("left", "right"):
        key_fields = _fields(stores[f"{side}-keyToNumValues"][0])
        key = _schema([*key_fields, _field(EVENT_TIME, "long")])
        value = stores[f"{side}-keyWithIndexToValue"][1]
        out.append(
            ColumnFamilySchema(
                f"{side}-keyWithTsToValues", key, value, key_encoder_spec=dict(TS_POSTFIX)
            )
        )
        out.append(
            ColumnFamilySchema(
                f"{side}-tsWithKey", key, DUMMY_SCHEMA, key_encoder_spec=dict(TS_PREFIX)
            )
        )
    assert tuple(f.name for f in out) == JOIN_V4_FAMILIES
    return out


def _sub(key: pa.StructArray, n: int) -> pa.StructArray:
    return pa.StructArray.from_arrays(
        [key.field(i) for i in range(n)], fields=[key.type.field(i) for i in range(n)]
    )


def _group_codes(key: pa.StructArray, schema: str) -> tuple[np.ndarray, np.ndarray]:
    """(group code per row, first row of each group) of equal keys, compared as UnsafeRow
    bytes (what RocksDB compares; works for every key type statectl encodes)."""
    if len(key) == 0:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    codes = pc.dictionary_encode(encode_unsafe_rows(key, schema))
    idx = codes.indices.to_numpy(zero_copy_only=False).astype(np.int64)
    first = np.full(len(codes.dictionary), len(idx), np.int64)
    np.minimum.at(first, idx, np.arange(len(idx)))
    return idx, first


def join_key_bytes(table: pa.Table) -> pa.Array:
    """A format 2 ``keyWithIndexToValue`` table's join keys (the key without ``index``) as
    UnsafeRow bytes: equal keys, equal bytes."""
    key = _sub(table.column("key").combine_chunks(), table.column("key").type.num_fields - 1)
    return encode_unsafe_rows(key, from_arrow_schema(pa.schema(list(key.type))))


def v4_to_v2(table: pa.Table, store: str, key_schema: str) -> pa.Table:
    """Rows of a format 4 ``keyWithTsToValues`` family (one per value; ``key_schema`` its key
    schema) as format 2's ``keyWithIndexToValue`` (``index``: the value's place among its join
    key's values, by event time) or ``keyToNumValues`` (``store`` says which)."""
    key = table.column("key").combine_chunks()
    value = table.column("value").combine_chunks()
    part = table.column("partition_id").combine_chunks()
    n = key.type.num_fields - 1
    join = _sub(key, n)
    codes, first = _group_codes(join, _schema(_fields(key_schema)[:n]))
    ts = key.field(n).to_numpy(zero_copy_only=False) if len(key) else np.zeros(0, np.int64)
    order = np.lexsort((ts, codes))  # stable: values of one (key, time) keep their list order
    if store.endswith("keyToNumValues"):
        counts = np.bincount(codes, minlength=len(first))
        rows = np.sort(first)
        k = join.take(pa.array(rows))
        v = pa.StructArray.from_arrays([pa.array(counts[codes[rows]], pa.int64())], names=["value"])
        return pa.Table.from_arrays([k, v, part.take(pa.array(rows))], names=table.column_names)
    sorted_codes = codes[order]
    starts = (
        np.flatnonzero(np.r_[True, sorted_codes[1:] != sorted_codes[:-1]])
        if len(order)
        else np.zeros(0, np.int64)  # an empty partition (a float [] would fail np.repeat)
    )
    index = np.arange(len(order)) - np.repeat(starts, np.diff(np.r_[starts, len(order)]))
    take = pa.array(order)
    k = _sub(key, n).take(take)
    k = pa.StructArray.from_arrays(
        [*[k.field(i) for i in range(n)], pa.array(index, pa.int64())],
        fields=[*[k.type.field(i) for i in range(n)], pa.field("index", pa.int64())],
    )
    return pa.Table.from_arrays([k, value.take(take), part.take(take)], names=table.column_names)


# -- writing formats 3 and 4 (restore) --------------------------------------------------------
def event_time_column(value_schema: str) -> tuple[int, bool]:
    """(position, is a window struct) of the input row's event-time column, as Spark finds it
    (``WatermarkSupport.findEventTimeColumnIndex``: the column carrying the watermark delay)."""
    for i, f in enumerate(_fields(value_schema)):
        if WATERMARK_KEY in (f.get("metadata") or {}):
            return i, isinstance(f.get("type"), dict)
    raise UnsupportedError(
        "join state format 4 keys values by event time, and this join's state has no "
        "watermarked column; restore it at --join-state-format 2 or 3"
    )


def _event_times(value: pa.StructArray, value_schema: str) -> np.ndarray:
    i, window = event_time_column(value_schema)
    col = value.field(i)
    if window:
        col = col.field("end")
    if col.null_count:
        raise StatectlError("a join value has a null event time; format 4 cannot key it")
    return col.cast(pa.int64()).to_numpy(zero_copy_only=False).astype(np.int64)


def _be_times(ts: np.ndarray) -> pa.Array:
    raw = (ts.astype(np.int64).view(np.uint64) ^ SIGN).astype(">u8")
    return pa.FixedSizeBinaryArray.from_buffers(
        pa.binary(8), len(ts), [None, pa.py_buffer(raw.tobytes())]
    ).cast(pa.large_binary())


def read_be_times(raw: np.ndarray) -> np.ndarray:
    """Event times from their 8 key bytes (``uint8`` rows of 8)."""
    return (np.ascontiguousarray(raw).view(">u8").reshape(-1).astype(np.uint64) ^ SIGN).view(
        np.int64
    )


def encode_partition(
    fmt: int,
    tables: dict[str, pa.Table],
    families: list[ColumnFamilySchema],
    cf_ids: dict[str, int],
    delimiter: bytes,
) -> tuple[pa.LargeBinaryArray, pa.LargeBinaryArray]:
    """Every RocksDB entry (2-byte family id + key, value) of one partition at format 3 or 4,
    from format 2's tables of that partition (``tables``: store name -> key/value table)."""
    by_name = {f.name: f for f in families}
    keys_out: list[pa.Array] = []
    values_out: list[pa.Array] = []

    def put(name: str, keys: pa.Array, values: pa.Array) -> None:
        cf = int(cf_ids[name]).to_bytes(2, "little", signed=True)
        keys_out.append(concat_binary(cf, keys))
        values_out.append(values)

    def row(data: pa.StructArray, schema: str) -> pa.Array:
        return concat_binary(VERSION, encode_unsafe_rows(data, schema))

    for side in ("left", "right"):
        kwiv = tables[f"{side}-keyWithIndexToValue"]
        key = kwiv.column("key").combine_chunks()
        value = kwiv.column("value").combine_chunks()
        if fmt == 3:
            for name in (f"{side}-keyToNumValues", f"{side}-keyWithIndexToValue"):
                t, fam = tables[name], by_name[name]
                put(
                    name,
                    row(t.column("key").combine_chunks(), fam.key_schema),
                    row(t.column("value").combine_chunks(), fam.value_schema),
                )
            continue
        primary, index = by_name[f"{side}-keyWithTsToValues"], by_name[f"{side}-tsWithKey"]
        n = key.type.num_fields - 1
        join_fields = _fields(primary.key_schema)[:-1]
        # Values of one key in index order: a key's list keeps format 2's order.
        order = pa.array(np.argsort(key.field(n).to_numpy(zero_copy_only=False), kind="stable"))
        key, value = key.take(order), value.take(order)
        join_row = row(_sub(key, n), _schema(join_fields))
        ts = _be_times(_event_times(value, primary.value_schema))
        elements = row(value, primary.value_schema)
        k, merged, _ = merge_lists(concat_binary(join_row, ts), elements, delimiter)
        put(primary.name, k, merged)
        dummy = row(
            pa.StructArray.from_arrays([pa.nulls(len(key))], names=["__dummy__"]), DUMMY_SCHEMA
        )
        k, merged, _ = merge_lists(concat_binary(ts, join_row), dummy, delimiter)
        put(index.name, k, merged)
    if not keys_out:
        empty = pa.array([], pa.large_binary())
        return empty, empty
    return (
        pa.concat_arrays([k.cast(pa.large_binary()) for k in keys_out]),
        pa.concat_arrays([v.cast(pa.large_binary()) for v in values_out]),
    )


def v2_to_v4(table: pa.Table, value_schema: str, family: str) -> pa.Table:
    """Format 2 ``keyWithIndexToValue`` rows shown as format 4's ``keyWithTsToValues`` or
    ``tsWithKey`` family (``family`` says which): what Spark's reader shows for the same
    values at format 4 (savepoints of format 4 joins answer its reads)."""
    key = table.column("key").combine_chunks()
    value = table.column("value").combine_chunks()
    n = key.type.num_fields - 1
    ts = pa.array(_event_times(value, value_schema), pa.int64())
    k = pa.StructArray.from_arrays(
        [*[key.field(i) for i in range(n)], ts],
        fields=[*[key.type.field(i) for i in range(n)], pa.field(EVENT_TIME, pa.int64())],
    )
    if family.endswith("tsWithKey"):
        value = pa.StructArray.from_arrays([pa.nulls(len(key))], names=["__dummy__"])
    return pa.Table.from_arrays(
        [k, value, table.column("partition_id").combine_chunks()], names=table.column_names
    )

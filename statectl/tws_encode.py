"""transformWithState state tables -> the RocksDB entries of Spark's virtual column families.

The inverse of what ``state.read_partition`` decodes, byte for byte (proven against every
transformWithState fixture). Layout, UnsafeRow encoding (Spark 4.3):

* key   = ``cf id`` (int16 LE) + the encoded key, value = ``0x00`` + UnsafeRow
* NoPrefix key: ``0x00`` + UnsafeRow(key)
* PrefixKeyScan(n): ``int32 LE len(p)`` + p + r, p = ``0x00`` + UnsafeRow(first n fields),
  r = ``0x00`` + UnsafeRow(the others)
* RangeKeyScan(ordinals): as PrefixKeyScan with p = ``0x00`` + UnsafeRow(struct<binary>) whose
  binary holds, per ordering column, a sign marker (0x00 negative, 0x01 positive) and the value
  big-endian, so that RocksDB's bytewise order is numeric order
* ListState value: the elements' ``int32 LE len + 0x00 + UnsafeRow``, joined by ``,`` with
  mergeOperatorVersion 1 and by nothing with 2
* ``$rowCounter_<list>``: the list's element count; timers: ``<kind>_keyToTimestamp`` (prefix
  key: grouping key, expiry) and ``<kind>_timestampToKey`` (range key: expiry, grouping key),
  both with a null ``__dummy__`` value.

State TTL (Spark's TTLState.scala): a TTL'd variable's values are ``struct<value,
ttlExpirationMs>`` (the savepoint keeps them so, with their original expiry), and Spark keeps
secondary indexes that are derived from them here:

* ``$ttl_<var>``: range key ``(expirationMs, elementKey)``, a null ``__empty__`` value. Value and
  map state (OneToOneTTLState) have one entry per value at its expiry; the element key is the
  grouping key, or for a map the composite ``(key, userKey)``. A list (OneToManyTTLState) has one
  entry per grouping key, at the smallest expiry of its elements
* lists only: ``$min_<var>`` (grouping key -> ``struct<expirationMs>``, that smallest expiry) and
  ``$count_<var>`` (grouping key -> ``struct<count>``, the element count); a TTL'd list writes
  no ``$rowCounter_<var>`` entries.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from typing import Any, ClassVar

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from statectl.checkpoint.state_metadata import ColumnFamilySchema
from statectl.codecs.avro import encode_avro_rows
from statectl.codecs.unsaferow import encode_unsafe_rows
from statectl.errors import UnsupportedError

VERSION = b"\x00"
POSITIVE, NEGATIVE = 0x01, 0x00
TIMER_SUFFIXES = ("_keyToTimestamp", "_timestampToKey")
ROW_COUNTER = "$rowCounter_"
TTL_INDEX, TTL_MIN, TTL_COUNT = "$ttl_", "$min_", "$count_"
TTL_PREFIXES = (TTL_INDEX, TTL_MIN, TTL_COUNT)


def concat_binary(*parts: pa.Array | bytes) -> pa.LargeBinaryArray:
    """Row-wise concatenation of binary arrays and constant byte strings."""
    arrays = [
        pa.scalar(p, pa.large_binary()) if isinstance(p, bytes) else p.cast(pa.large_binary())
        for p in parts
    ]
    return pc.binary_join_element_wise(*arrays, pa.scalar(b"", pa.large_binary()))


def _le32(values: np.ndarray) -> pa.LargeBinaryArray:
    raw = np.ascontiguousarray(values, dtype="<i4").view(np.uint8)
    return pa.FixedSizeBinaryArray.from_buffers(
        pa.binary(4), len(values), [None, pa.py_buffer(raw)]
    ).cast(pa.large_binary())


def _fields(schema_json: str) -> list[dict]:
    return json.loads(schema_json)["fields"]


def _struct(arrays: list[pa.Array], fields: list[dict]) -> pa.StructArray:
    return pa.StructArray.from_arrays(arrays, names=[f["name"] for f in fields])


def _row(
    data: pa.StructArray, fields: list[dict], avro: bool = False, schema_id: int | None = 0
) -> pa.LargeBinaryArray:
    """``0x00`` + UnsafeRow, or with Avro ``0x00`` + int16 schema id + the Avro record (the
    prefix part of a prefix/range key carries no schema id: ``schema_id=None``)."""
    struct = {"type": "struct", "fields": fields}
    if not avro:
        return concat_binary(VERSION, encode_unsafe_rows(data, struct))
    head = VERSION if schema_id is None else VERSION + schema_id.to_bytes(2, "big", signed=True)
    return concat_binary(head, encode_avro_rows(data, struct))


def _sub(
    data: pa.StructArray, fields: list[dict], idx: Iterable[int]
) -> tuple[pa.StructArray, list[dict]]:
    idx = list(idx)
    sub = [fields[i] for i in idx]
    return _struct([data.field(i) for i in idx], sub), sub


def _range_blob(data: pa.StructArray, fields: list[dict], ordinals: list[int]) -> pa.Array:
    parts = []
    for i in ordinals:
        col = data.field(i)
        if col.null_count:
            raise UnsupportedError(f"null in range-scan key column {fields[i]['name']!r}")
        t = fields[i]["type"]
        width = {"long": 8, "integer": 4, "short": 2, "byte": 1}.get(t)
        if width is None:
            raise UnsupportedError(f"range-scan key column of type {t} is not supported yet")
        v = col.to_numpy(zero_copy_only=False).astype(f">i{width}")
        marker = np.where(v < 0, NEGATIVE, POSITIVE).astype(np.uint8)
        rows = np.empty((len(v), 1 + width), dtype=np.uint8)
        rows[:, 0] = marker
        rows[:, 1:] = v.view(np.uint8).reshape(-1, width)
        parts.append(
            pa.FixedSizeBinaryArray.from_buffers(
                pa.binary(1 + width), len(v), [None, pa.py_buffer(rows.tobytes())]
            )
        )
    return concat_binary(*parts) if len(parts) > 1 else parts[0].cast(pa.large_binary())


def _avro_range_blob(data: pa.StructArray, fields: list[dict], ordinals: list[int]) -> pa.Array:
    """Avro's range-scan prefix: per ordering column a record of two nullable byte fields,
    the sign marker and the big-endian value (``02 02 <marker> 02 <2*width> <value>``)."""
    plain = _range_blob(data, fields, ordinals)  # marker + value per column, concatenated
    parts, at = [], 0
    for i in ordinals:
        width = {"long": 8, "integer": 4, "short": 2, "byte": 1}[fields[i]["type"]]
        marker = pc.binary_slice(plain, at, at + 1)
        value = pc.binary_slice(plain, at + 1, at + 1 + width)
        parts += [b"\x02\x02", marker, b"\x02" + bytes([2 * width]), value]
        at += 1 + width
    return concat_binary(*parts)


def encode_key(
    data: pa.StructArray, family: ColumnFamilySchema, avro: bool = False
) -> pa.LargeBinaryArray:
    """The encoded key (without the column-family id) for the family's key encoder."""
    fields = _fields(family.key_schema)
    spec = family.key_encoder_spec
    kind = spec.get("keyStateEncoderType", "NoPrefixKeyStateEncoderSpec")
    sid = family.key_schema_id
    if kind == "NoPrefixKeyStateEncoderSpec":
        return _row(data, fields, avro, sid)
    if kind == "PrefixKeyScanStateEncoderSpec":
        n = int(spec["numColsPrefixKey"])
        head = _row(*_sub(data, fields, range(n)), avro, None)
        tail = _row(*_sub(data, fields, range(n, len(fields))), avro, sid)
    elif kind == "RangeKeyScanStateEncoderSpec":
        ordinals = [int(i) for i in spec["orderingOrdinals"]]
        if avro:
            head = concat_binary(VERSION, _avro_range_blob(data, fields, ordinals))
        else:
            blob = _range_blob(data, fields, ordinals)
            head = _row(
                pa.StructArray.from_arrays([blob.cast(pa.binary())], names=["range"]),
                [{"name": "range", "type": "binary", "nullable": True, "metadata": {}}],
            )
        rest = [i for i in range(len(fields)) if i not in ordinals]
        tail = _row(*_sub(data, fields, rest), avro, sid)
    else:
        raise UnsupportedError(f"key encoder {kind} is not supported yet")
    lengths = pc.binary_length(head).to_numpy(zero_copy_only=False)
    return concat_binary(_le32(lengths), head, tail)


def _dummy(n: int, family: ColumnFamilySchema, avro: bool) -> pa.LargeBinaryArray:
    fields = _fields(family.value_schema)
    return _row(_struct([pa.nulls(n)], fields), fields, avro, family.value_schema_id)


def merge_lists(
    keys: pa.LargeBinaryArray, elements: pa.LargeBinaryArray, delimiter: bytes
) -> tuple[pa.LargeBinaryArray, pa.LargeBinaryArray, np.ndarray]:
    """Group elements by key, keeping their order: (keys, merged values, element counts)."""
    codes = (
        pc.dictionary_encode(keys).combine_chunks()
        if isinstance(keys, pa.ChunkedArray)
        else pc.dictionary_encode(keys)
    )
    idx = codes.indices.to_numpy(zero_copy_only=False)
    order = np.argsort(idx, kind="stable")
    lengths = pc.binary_length(elements).to_numpy(zero_copy_only=False)
    pieces = concat_binary(delimiter, _le32(lengths), elements).take(pa.array(order))
    counts = np.bincount(idx, minlength=len(codes.dictionary))
    present = np.flatnonzero(counts)
    counts = counts[present]
    buf = np.frombuffer(pieces.buffers()[2], dtype=np.uint8)
    offs = np.frombuffer(pieces.buffers()[1], dtype=np.int64)[: len(pieces) + 1]
    buf = buf[offs[0] : offs[-1]]
    offs = offs - offs[0]
    starts = np.cumsum(counts) - counts  # (empty when there are no elements)
    # Drop the leading delimiter of each group's first element.
    keep = np.ones(len(buf), dtype=bool)
    d = len(delimiter)
    if d:
        for j in range(d):
            keep[offs[starts] + j] = False
    merged = buf[keep]
    group_end = offs[starts + counts] - d * np.arange(1, len(counts) + 1)
    new_offs = np.concatenate([[0], group_end]).astype(np.int64)
    values = pa.LargeBinaryArray.from_buffers(
        pa.large_binary(),
        len(counts),
        [None, pa.py_buffer(new_offs.tobytes()), pa.py_buffer(merged.tobytes())],
    )
    return codes.dictionary.take(pa.array(present)).cast(pa.large_binary()), values, counts


def encode_operator_partition(
    tables: dict[str, pa.Table],
    kinds: dict[str, str],
    families: list[ColumnFamilySchema],
    cf_ids: dict[str, int],
    time_mode: str,
    merge_delimiter: bytes,
    avro: bool = False,
) -> tuple[pa.LargeBinaryArray, pa.LargeBinaryArray]:
    """All RocksDB entries (keys with their 2-byte family id) of one partition.

    ``tables``: the savepoint's tables of the operator for this partition, by name (state
    variables and ``$timers``); ``kinds``: their kinds (ValueState, ListState, MapState, timers).
    """
    encoder = TableEncoder(families, cf_ids, time_mode, merge_delimiter, avro)
    encoder.check(tables)
    entries: list[tuple[pa.Array, pa.Array]] = []
    for name, table in tables.items():
        entries += encoder.encode(name, kinds[name], table)
    entries += encoder.row_counters()
    if not entries:
        empty = pa.array([], pa.large_binary())
        return empty, empty
    return (
        pa.concat_arrays([k.cast(pa.large_binary()) for k, _ in entries]),
        pa.concat_arrays([v.cast(pa.large_binary()) for _, v in entries]),
    )


class TableEncoder:
    """One transformWithState operator's tables as RocksDB entries (keys with their 2-byte
    family id), a table (or a chunk of one) at a time. A list state's chunk must hold every
    element of its keys: its entries merge them, and its row counter counts them."""

    def __init__(
        self,
        families: list[ColumnFamilySchema],
        cf_ids: dict[str, int],
        time_mode: str,
        merge_delimiter: bytes,
        avro: bool = False,
    ) -> None:
        self.families, self.cf_ids = families, cf_ids
        self.by_name = {f.name: f for f in families}
        self.time_mode, self.merge_delimiter, self.avro = time_mode, merge_delimiter, avro
        self.ttl = {n[len(TTL_INDEX) :] for n in self.by_name if n.startswith(TTL_INDEX)}
        # list state (without TTL) -> its keys and element counts so far, for $rowCounter_
        self.list_counts: dict[str, list[tuple[pa.Array, np.ndarray]]] = {}

    def check(self, tables: Iterable[str]) -> None:
        """Refuse internal families the savepoint's tables cannot rebuild."""
        names = set(tables)
        for fam in self.families:
            if fam.name.startswith(ROW_COUNTER):
                continue
            if (var := _ttl_variable(fam.name)) is not None and var not in names:
                raise UnsupportedError(
                    f"column family {fam.name!r} (state TTL) belongs to no state variable of "
                    "the savepoint"
                )
            if unsupported_families([fam.name]):
                raise UnsupportedError(
                    f"internal column family {fam.name!r} (TTL state) cannot be restored yet"
                )

    def _put(self, name: str, keys: pa.Array, values: pa.Array) -> tuple[pa.Array, pa.Array]:
        cf = int(self.cf_ids[name]).to_bytes(2, "little", signed=True)
        return concat_binary(cf, keys), values

    def encode(self, name: str, kind: str, table: pa.Table) -> list[tuple[pa.Array, pa.Array]]:
        """The entries of one table (or chunk) ``name`` of kind ``kind``."""
        if kind == "timers":
            return self._timers(table)
        encode_variable = self._VARIABLES.get(kind)
        if encode_variable is None:
            raise UnsupportedError(f"state variable {name!r} of kind {kind} cannot be restored yet")
        return encode_variable(self, name, table)

    def _timers(self, table: pa.Table) -> list[tuple[pa.Array, pa.Array]]:
        """A timers table: one entry in each of the time mode's two timer families."""
        prefix = "$eventTimers" if self.time_mode == "EventTime" else "$procTimers"
        cols = {
            "key": table.column("key").combine_chunks(),
            "expiryTimestampMs": table.column("expiration_timestamp_ms").combine_chunks(),
        }
        out = []
        for suffix in TIMER_SUFFIXES:
            fam = self.by_name[prefix + suffix]
            fields = _fields(fam.key_schema)
            data = _struct([cols[f["name"]] for f in fields], fields)
            dummy = _dummy(len(table), fam, self.avro)
            out.append(self._put(fam.name, encode_key(data, fam, self.avro), dummy))
        return out

    def _map_state(self, name: str, table: pa.Table) -> list[tuple[pa.Array, pa.Array]]:
        """Map state: keyed by (grouping key, user key); a TTL index entry per entry."""
        fam, avro = self.by_name[name], self.avro
        data = _struct(
            [table.column("key").combine_chunks(), table.column("user_map_key").combine_chunks()],
            _fields(fam.key_schema),
        )
        user_map_value = table.column("user_map_value").combine_chunks()
        row = _row(user_map_value, _fields(fam.value_schema), avro, fam.value_schema_id)
        out = [self._put(name, encode_key(data, fam, avro), row)]
        if name in self.ttl:
            ttl = _ttl_index(self.by_name, name, _expiry(user_map_value, name), data, avro)
            out.append(self._put(*ttl))
        return out

    def _list_state(self, name: str, table: pa.Table) -> list[tuple[pa.Array, pa.Array]]:
        """List state: one merged entry per key; with TTL its indexes, else its row count
        (written by :meth:`row_counters`)."""
        fam, avro = self.by_name[name], self.avro
        key = table.column("key").combine_chunks()
        enc_keys = encode_key(key, fam, avro)
        element = table.column("list_element").combine_chunks()
        elements = _row(element, _fields(fam.value_schema), avro, fam.value_schema_id)
        keys, merged, counts = merge_lists(enc_keys, elements, self.merge_delimiter)
        out = [self._put(name, keys, merged)]
        if name in self.ttl:
            ttl = _list_ttl(self.by_name, name, key, enc_keys, element, avro)
            out += [self._put(*e) for e in ttl]
        else:
            self.list_counts.setdefault(name, []).append((keys, counts))
        return out

    def _value_state(self, name: str, table: pa.Table) -> list[tuple[pa.Array, pa.Array]]:
        """Value state: one entry per key; a TTL index entry per entry."""
        fam, avro = self.by_name[name], self.avro
        key = table.column("key").combine_chunks()
        value = table.column("value").combine_chunks()
        row = _row(value, _fields(fam.value_schema), avro, fam.value_schema_id)
        out = [self._put(name, encode_key(key, fam, avro), row)]
        if name in self.ttl:
            out.append(self._put(*_ttl_index(self.by_name, name, _expiry(value, name), key, avro)))
        return out

    # The state variable kinds restore writes, by the kind a savepoint table records.
    _VARIABLES: ClassVar[dict[str, Callable[..., list[tuple[pa.Array, pa.Array]]]]] = {
        "MapState": _map_state,
        "ListState": _list_state,
        "ValueState": _value_state,
    }

    def list_key(self, name: str, table: pa.Table) -> pa.Array:
        """A list state chunk's encoded keys (what groups its elements)."""
        return encode_key(table.column("key").combine_chunks(), self.by_name[name], self.avro)

    def row_counters(self) -> list[tuple[pa.Array, pa.Array]]:
        """``$rowCounter_`` entries of the list states encoded since the last call (one per
        key: its element count; a TTL'd list counts in ``$count_`` and leaves this empty)."""
        out = []
        for fam in self.families:
            if not fam.name.startswith(ROW_COUNTER):
                continue
            var = fam.name[len(ROW_COUNTER) :]
            if var in self.ttl:
                continue  # a TTL'd list counts in $count_ (Spark never fills this family)
            parts = self.list_counts.pop(var, [])
            keys = (
                pa.concat_arrays([k.cast(pa.large_binary()) for k, _ in parts])
                if parts
                else pa.array([], pa.large_binary())
            )
            counts = np.concatenate([c for _, c in parts]) if parts else np.zeros(0)
            fields = _fields(fam.value_schema)
            count = _struct([pa.array(counts, pa.int64())], fields)
            out.append(
                self._put(fam.name, keys, _row(count, fields, self.avro, fam.value_schema_id))
            )
        return out


def _ttl_variable(family: str) -> str | None:
    """The state variable a TTL index family belongs to (None for other families)."""
    for prefix in TTL_PREFIXES:
        if family.startswith(prefix) and len(family) > len(prefix):
            return family[len(prefix) :]
    return None


def _expiry(values: pa.StructArray, name: str) -> pa.Array:
    """The ``ttlExpirationMs`` of TTL'd values: Spark sets it on every value it writes."""
    if values.type.get_field_index("ttlExpirationMs") < 0:
        raise UnsupportedError(f"state variable {name!r} has a TTL index but no ttlExpirationMs")
    expiry = values.field("ttlExpirationMs")
    if expiry.null_count or values.null_count:
        raise UnsupportedError(f"state variable {name!r} has a value without ttlExpirationMs")
    return expiry


def _ttl_index(
    by_name: dict[str, ColumnFamilySchema],
    name: str,
    expiry: pa.Array,
    element_key: pa.StructArray,
    avro: bool,
) -> tuple[str, pa.Array, pa.Array]:
    """``$ttl_<name>`` entries: ``(expirationMs, elementKey) -> null``, one per element key."""
    fam = by_name[TTL_INDEX + name]
    fields = _fields(fam.key_schema)
    inner = fields[1]["type"]["fields"]  # the element key's own field names
    element = _struct([element_key.field(i) for i in range(len(inner))], inner)
    data = _struct([expiry.cast(pa.int64()), element], fields)
    return fam.name, encode_key(data, fam, avro), _dummy(len(data), fam, avro)


def _list_ttl(
    by_name: dict[str, ColumnFamilySchema],
    name: str,
    key: pa.StructArray,
    enc_keys: pa.Array,
    element: pa.StructArray,
    avro: bool,
) -> list[tuple[str, pa.Array, pa.Array]]:
    """A TTL'd list's indexes, per grouping key: the smallest expiry of its elements in
    ``$min_`` and ``$ttl_`` (Spark keeps it so on every append, overwrite and eviction), the
    element count in ``$count_``."""
    expiry = _expiry(element, name).to_numpy(zero_copy_only=False).astype(np.int64)
    if isinstance(enc_keys, pa.ChunkedArray):
        enc_keys = enc_keys.combine_chunks()
    codes = pc.dictionary_encode(enc_keys)
    idx = codes.indices.to_numpy(zero_copy_only=False)
    groups = len(codes.dictionary)
    mins = np.full(groups, np.iinfo(np.int64).max, dtype=np.int64)
    np.minimum.at(mins, idx, expiry)
    counts = np.bincount(idx, minlength=groups).astype(np.int64)
    first = np.unique(idx, return_index=True)[1]
    group_keys = codes.dictionary.cast(pa.large_binary())
    out = [_ttl_index(by_name, name, pa.array(mins), key.take(pa.array(first)), avro)]
    for prefix, column in ((TTL_MIN, mins), (TTL_COUNT, counts)):
        fam = by_name[prefix + name]
        fields = _fields(fam.value_schema)
        row = _struct([pa.array(column, pa.int64())], fields)
        out.append((fam.name, group_keys, _row(row, fields, avro, fam.value_schema_id)))
    return out


def ttl_problems(
    families: Iterable[str], variables: dict[str, str], value_schemas: dict[str, str | None]
) -> list[str]:
    """Why the TTL indexes of an operator cannot be rebuilt (empty: they can). ``variables``:
    the savepoint's state variables by name with their kinds, ``value_schemas`` theirs."""
    problems = []
    for fam in families:
        var = _ttl_variable(fam)
        if var is None:
            continue
        kind = variables.get(var)
        wanted = (
            ("ListState", "MapState", "ValueState") if fam.startswith(TTL_INDEX) else ("ListState",)
        )
        if kind not in wanted:
            problems.append(
                f"column family {fam} (state TTL) belongs to no {' or '.join(wanted)} of the "
                "savepoint"
            )
            continue
        fields = [f.get("name") for f in _fields(value_schemas.get(var) or '{"fields": []}')]
        if fields != ["value", "ttlExpirationMs"]:
            problems.append(
                f"state variable {var} has the TTL index {fam} but its values are not "
                "struct<value, ttlExpirationMs>"
            )
    return problems


def unsupported_families(names: Iterable[str]) -> list[str]:
    """Internal column families this encoder cannot rebuild."""
    return [
        n
        for n in names
        if n.startswith("$")
        and not n.startswith(ROW_COUNTER)
        and _ttl_variable(n) is None
        and not any(n.endswith(s) for s in TIMER_SUFFIXES)
    ]


def assign_cf_ids(families: list[ColumnFamilySchema]) -> dict[str, Any]:
    """Virtual column family ids, as RocksDB's ``columnFamilyMapping`` records them: "default"
    first, then the families in schema order."""
    ids = {"default": 1}
    for f in families:
        ids.setdefault(f.name, len(ids) + 1)
    return ids

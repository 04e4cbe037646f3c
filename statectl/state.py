"""Read one operator's state as the table Spark's ``statestore`` data source returns.

This is the operator-semantics layer: it picks the physical stores (or column families) for a
selection, asks the backend for the raw entries of every partition, strips the backend's key and
value encodings, decodes the rows and shapes them like Spark does (join sides, list and map
state flattened, timers).
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Iterator
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from statectl.backends import EntryCodec, RawState, empty_raw_state
from statectl.backends.entries import binary_parts as binary_parts
from statectl.backends.entries import prepend as prepend
from statectl.backends.entries import read_le_int
from statectl.backends.entries import slice_bytes as slice_bytes
from statectl.backends.replay import bounded_replay
from statectl.backends.rocksdb import SnapshotMetadata
from statectl.checkpoint.model import (
    Checkpoint,
    Operator,
    StoreDescription,
    partition_absent,
    store_dir,
)
from statectl.codecs.phases import flush as flush_phases
from statectl.codecs.phases import phase, timed
from statectl.errors import CorruptFileError, StatectlError
from statectl.join_state import format_of, v4_to_v2
from statectl.state_rows import StoreEncoding as StoreEncoding
from statectl.state_rows import _split_list_blob as _split_list_blob
from statectl.state_rows import check_schema, decode_key, decode_rows, split_list_values

STRICT_DISTRIBUTION_CONF = "spark.sql.streaming.statefulOperator.useStrictDistribution"
TIMER_CFS = ("$eventTimers_keyToTimestamp", "$procTimers_keyToTimestamp")
# The largest chunk of records a partition is read in. Each chunk is decoded, checked and
# written while the next one is read, and its arrays (several copies of the chunk, in between)
# fault fresh pages in: at 10M keys, 16 MB chunks against a tenth of the default budget (68 MB)
# took a savepoint's tree from 1.8 to 1.1 GB and its system CPU from 2-3 to 1.3 s, at the same
# wall time (bench/scale.py, issue 27).
READ_CHUNK_BYTES = 16 << 20


@dataclass(frozen=True)
class Selection:
    """What to read, with the meaning of the ``statestore`` source's options."""

    operator_id: int = 0
    store: str | None = None  # storeName
    join_side: str | None = None  # "left" | "right"
    state_var: str | None = None  # stateVarName
    registered_timers: bool = False  # readRegisteredTimers
    batch: int | None = None  # batchId (default: latest committed)
    # A join's format-2 store (keyToNumValues, keyWithIndexToValue) whatever its state format:
    # what savepoints hold (statectl/join_state.py). Not a Spark option.
    join_store: str | None = None


def load_raw(
    ckpt: Checkpoint, op: Operator, store: str, partition: int, batch: int, enc: StoreEncoding
) -> RawState:
    """The live entries of one physical store partition after ``batch`` (version batch+1)."""
    directory = store_dir(ckpt, op.operator_id, partition, store)
    if partition_absent(ckpt, op, partition):
        return empty_raw_state()
    opts = enc.read_options(store_unique_id(ckpt, op, store, partition, batch, enc), ckpt.verify)
    return enc.store_backend.load(ckpt.io, directory, batch + 1, opts)


def store_unique_id(
    ckpt: Checkpoint, op: Operator, store: str, partition: int, batch: int, enc: StoreEncoding
) -> str | None:
    """The checkpoint id (format 2) the commit log records for one store partition."""
    if enc.checkpoint_format < 2 or not enc.store_backend.capabilities.checkpoint_format_2:
        return None
    ids = ckpt.commit(batch).state_unique_ids or {}
    try:
        return ids[str(op.operator_id)][partition][op.store_names.index(store)]
    except (KeyError, IndexError, ValueError):
        raise StatectlError(
            f"commit log has no checkpoint id for operator {op.operator_id} "
            f"partition {partition} store {store!r}",
            ckpt.path("commits", str(batch)),
        ) from None


# -- byte-level helpers (vectorized over Arrow binary arrays) ------------------------------
def _table(key: pa.Array, value_name: str, value: pa.Array, partition: int) -> pa.Table:
    return pa.Table.from_arrays(
        [key, value, pa.array(np.full(len(key), partition, dtype=np.int32))],
        names=["key", value_name, "partition_id"],
    )


def _kv_rows(
    raw: RawState, desc: StoreDescription, enc: StoreEncoding, partition: int, path: str
) -> pa.Table:
    check_schema(desc)
    keys, values, _ = enc.entry_codec().decode(raw.keys, raw.values)
    k = decode_key(keys, desc, enc, path)
    v = decode_rows(values, desc.value_schema, enc, path)
    return _table(k, "value", v, partition)


def _cf_entries(raw: RawState, name: str, path: str) -> tuple[pa.Array, pa.Array]:
    """Entries of one virtual column family, with the 2-byte id stripped from the keys."""
    if name not in raw.cf_ids:
        raise StatectlError(
            f"column family {name!r} is not in the snapshot metadata "
            f"(known: {', '.join(sorted(raw.cf_ids)) or 'none'})",
            path,
        )
    if len(raw.keys) == 0:
        return raw.keys, raw.values
    cf_id = raw.cf_ids[name]
    mask = pa.array(read_le_int(raw.keys, 0, 2) == cf_id)
    # The id only: column family values carry no row checksum here (Spark 4.3 writes none).
    codec = EntryCodec(cf_id=cf_id)
    return codec.decode(pc.filter(raw.keys, mask), pc.filter(raw.values, mask))[:2]


def check_placement(
    ckpt: Checkpoint, op: Operator, table: pa.Table, store: str | None, partition: int, batch: int
) -> None:
    """Every key read from partition p must hash to p, as Spark placed it.

    Catches state files swapped or moved between partitions, which no checksum sees when the
    files carry none of their own (snappy, lzf, zstd, a copy without sidecars). Checked only
    where Spark pinned strict distribution (queries started on Spark >= 3.3); older queries may
    have partitioned by a subset of the key.
    """
    if table.num_rows == 0 or not placement_checked(ckpt, op, batch):
        return
    key = table.column("key").combine_chunks()
    check_partition_ids(
        ckpt, op, op.kind.partitions_of(store or "default", key, op.num_partitions), partition
    )


def placement_checked(ckpt: Checkpoint, op: Operator, batch: int) -> bool:
    """Whether :func:`check_placement` checks ``op``'s keys: where Spark pinned strict
    distribution, for a kind whose placement statectl models."""
    if op.num_partitions < 1:
        return False
    strict = ckpt.offsets(batch).pinned_conf(STRICT_DISTRIBUTION_CONF)
    # Without a spec for the kind, where Spark places its keys is not modelled.
    return strict == "true" and op.kind.restorable


def check_partition_ids(ckpt: Checkpoint, op: Operator, pids: np.ndarray, partition: int) -> None:
    """Every key read from ``partition`` (its partition ids ``pids``) belongs there."""
    wrong = pids != partition
    if wrong.any():
        first = int(pids[np.argmax(wrong)])
        raise CorruptFileError(
            f"{int(wrong.sum())} of {len(pids)} keys read from partition {partition} "
            f"belong to another partition (first: {first}); state files were swapped or moved "
            "between partitions",
            ckpt.path("state", str(op.operator_id), str(partition)),
            "restore the partition directories from a backup",
        )


def read_partition(
    ckpt: Checkpoint, op: Operator, sel: Selection, partition: int, batch: int, enc: StoreEncoding
) -> pa.Table:
    """One partition of a selection, its key placement verified (unless ``--no-verify``)."""
    table, store = _read_partition(ckpt, op, sel, partition, batch, enc)
    if ckpt.verify:
        check_placement(ckpt, op, table, store, partition, batch)
    return table


def iter_partition(
    ckpt: Checkpoint,
    op: Operator,
    sel: Selection,
    partition: int,
    batch: int,
    enc: StoreEncoding,
    *,
    budget: int,
    scratch: str,
) -> Iterator[pa.Table]:
    """:func:`read_partition` in chunks, holding about ``budget`` bytes: the same rows in the
    same order. Key-value stores (aggregations, deduplication, joins at format 2, ...) and
    column families (transformWithState, joins at formats 3/4) are replayed in bounded memory
    (statectl/backends/replay.py). Format 4's view as format 2's stores (what savepoints
    hold) numbers each join key's values, so its chunks end between join keys (a snapshot is
    read in key order, where a key's values are adjacent); a replayed partition (not in key
    order) is read whole. ``scratch`` is a private directory for spill files."""
    if partition_absent(ckpt, op, partition):
        yield read_partition(ckpt, op, sel, partition, batch, enc)
        return
    fmt = format_of(op.kind)
    rows: Callable[[RawState, str], tuple[pa.Table, str | None]] | None = None
    store = "default"  # the physical store: column families live in one
    if fmt is not None:
        _check_join_selection(op, sel)
        rows = lambda raw, where: _join_rows(raw, op, sel, partition, enc, fmt, where)  # noqa: E731
        if fmt == 4 and sel.join_store:
            yield from _chunks(
                ckpt, op, sel, partition, batch, enc, budget, scratch, store, rows, whole_keys=True
            )
            return
    elif op.uses_column_families and fmt is None:
        rows = lambda raw, where: (_cf_table(raw, op, sel, partition, enc, where), None)  # noqa: E731
    elif (plain := _plain_store(op, sel)) is not None:
        store, side = plain
        desc = op.schema(store)
        check_schema(desc)

        def rows(raw: RawState, where: str) -> tuple[pa.Table, str | None]:
            table = _kv_rows(raw, desc, enc, partition, where)
            return (join_side_view(table), None) if side else (table, store)

    if rows is None:
        yield read_partition(ckpt, op, sel, partition, batch, enc)
        return
    yield from _chunks(ckpt, op, sel, partition, batch, enc, budget, scratch, store, rows)


def _chunks(
    ckpt: Checkpoint,
    op: Operator,
    sel: Selection,
    partition: int,
    batch: int,
    enc: StoreEncoding,
    budget: int,
    scratch: str,
    store: str,
    rows: Callable[[RawState, str], tuple[pa.Table, str | None]],
    *,
    whole_keys: bool = False,
) -> Iterator[pa.Table]:
    """The selection's rows, ``rows(chunk, where)`` (a table and the store whose key rule
    places it) of a chunk of ``store``'s live entries at a time, placement checked.
    ``whole_keys``: every chunk holds all the entries of each format 4 join key it has (see
    :func:`_whole_join_keys`), else the partition is read whole."""
    where = ckpt.path("state", str(op.operator_id), str(partition))
    metas: list[SnapshotMetadata] = []  # the snapshot's metadata: its column family ids
    in_key_order: list[bool] = []
    entries = live_entries(
        ckpt, op, store, partition, batch, enc, budget, scratch, metas, in_key_order
    )
    if whole_keys:
        entries = _whole_join_keys(entries)
    empty = True
    for keys, values in timed(entries, "read+replay"):
        if whole_keys and not in_key_order[0]:
            entries.close()
            yield read_partition(ckpt, op, sel, partition, batch, enc)
            return
        raw = RawState(keys, values, cf_ids=metas[0].cf_ids if metas else {})
        with phase("decode"):
            table, placed_by = rows(raw, where)
        if ckpt.verify:
            with phase("place"):  # the placement check hashes every key, as placing does
                check_placement(ckpt, op, table, placed_by, partition, batch)
        empty = False
        yield table
        del keys, values, raw, table  # not held while the next chunk is read
    flush_phases()  # a partition read in the CLI's own process (export) has no task to flush
    if empty:  # no live entries: still one (empty) table, with the columns
        yield read_partition(ckpt, op, sel, partition, batch, enc)


def live_entries(
    ckpt: Checkpoint,
    op: Operator,
    store: str,
    partition: int,
    batch: int,
    enc: StoreEncoding,
    budget: int,
    scratch: str,
    metas: list[SnapshotMetadata] | None = None,
    in_key_order: list[bool] | None = None,
) -> Generator[tuple[pa.LargeBinaryArray, pa.LargeBinaryArray], None, None]:
    """A store partition's live entries, as :func:`load_raw` has them, a chunk at a time
    (RocksDB: the base snapshot's metadata is appended to ``metas`` before its first chunk;
    whether the entries come in RocksDB's key order, one snapshot iterated, is appended to
    ``in_key_order``)."""
    directory = store_dir(ckpt, op.operator_id, partition, store)
    # A chunk is decoded (and written) after it is read: about a tenth of the budget each, at
    # most READ_CHUNK_BYTES.
    chunk_bytes = max(1 << 10, min(budget // 10, READ_CHUNK_BYTES))
    backend = enc.store_backend
    opts = enc.read_options(store_unique_id(ckpt, op, store, partition, batch, enc), ckpt.verify)
    records = backend.events(
        ckpt.io, directory, batch + 1, opts, max_bytes=chunk_bytes, metas=metas
    )
    if in_key_order is not None:
        in_key_order.append(records.unique and backend.iterates_in_key_order())
    if records.unique:  # one snapshot: each key once, no replay
        for chunk in records.chunks():
            yield chunk.keys, chunk.values
            del chunk  # not held while the next one is read
        return
    yield from bounded_replay(
        records,
        budget=budget,
        max_bytes=chunk_bytes,
        scratch=scratch,
        merge_delimiter=enc.merge_delimiter,
    )


def _whole_join_keys(
    chunks: Iterator[tuple[pa.LargeBinaryArray, pa.LargeBinaryArray]],
) -> Generator[tuple[pa.LargeBinaryArray, pa.LargeBinaryArray], None, None]:
    """Chunks of entries in RocksDB key order, re-cut so that no format 4 join key's entries
    straddle two: a ``keyWithTsToValues`` key is the join key's UnsafeRow and an 8-byte event
    time, so one join key's entries are adjacent and differ only in their last 8 bytes. Each
    chunk's trailing run of entries equal but for those bytes moves to the next chunk (one join
    key's values at most; for another family's entries the move is harmless)."""
    carry: tuple[pa.Array, pa.Array] | None = None
    for keys, values in chunks:
        if carry is not None:
            keys = pa.concat_arrays([carry[0], keys])
            values = pa.concat_arrays([carry[1], values])
            carry = None
        n = len(keys)
        if n == 0:
            continue
        last = keys[n - 1].as_py()
        same = pc.and_(
            pc.equal(pc.binary_length(keys), len(last)),
            pc.equal(pc.binary_slice(keys, 0, max(0, len(last) - 8)), last[:-8]),
        ).to_numpy(zero_copy_only=False)
        # The trailing run: the last entry that is not of the last join key, plus one.
        differ = np.flatnonzero(~same)
        cut = int(differ[-1]) + 1 if len(differ) else 0
        if cut:
            yield keys.slice(0, cut), values.slice(0, cut)
        carry = (keys.slice(cut), values.slice(cut))
    if carry is not None and len(carry[0]):
        yield carry[0], carry[1]


def _plain_store(op: Operator, sel: Selection) -> tuple[str, bool] | None:
    """(store, shown as a join side) for a selection of one key-value store, else None."""
    if format_of(op.kind) is not None or op.uses_column_families:
        return None
    if sel.join_store:
        sel = Selection(sel.operator_id, store=sel.join_store, batch=sel.batch)
    if sel.join_side:
        store = f"{sel.join_side}-keyWithIndexToValue"
        return (store, True) if store in op.store_names else None
    store = sel.store or "default"
    return (store, False) if store in op.store_names else None


def _cf_table(
    raw: RawState, op: Operator, sel: Selection, partition: int, enc: StoreEncoding, where: str
) -> pa.Table:
    """The rows of one state variable (or the registered timers) among the column-family
    entries ``raw`` (a whole partition or a chunk of its live entries)."""
    if sel.registered_timers:
        time_mode = op.properties.get("timeMode", "")
        name = TIMER_CFS[0] if time_mode == "EventTime" else TIMER_CFS[1]
        desc = op.schema(name)
        keys, _ = _cf_entries(raw, name, where)
        # Key {key: grouping key, expiryTimestampMs}; Spark shows the two as columns.
        k = decode_key(keys, desc, enc, where)
        return pa.Table.from_arrays(
            [
                k.field("key"),
                k.field("expiryTimestampMs"),
                pa.array(np.full(len(k), partition, dtype=np.int32)),
            ],
            names=["key", "expiration_timestamp_ms", "partition_id"],
        )
    name = sel.state_var or sel.store or "default"
    desc = op.schema(name)
    check_schema(desc)
    keys, values = _cf_entries(raw, name, where)
    kind = state_variable_type(op, name)
    k = decode_key(keys, desc, enc, where)
    if kind == "ListState":
        owners, elems = split_list_values(values, where)
        v = decode_rows(elems, desc.value_schema, enc, where)
        return _table(k.take(pa.array(owners)), "list_element", v, partition)
    v = decode_rows(values, desc.value_schema, enc, where)
    if kind == "MapState":
        return pa.Table.from_arrays(
            [
                k.field("key"),
                k.field("userKey"),
                v,
                pa.array(np.full(len(k), partition, dtype=np.int32)),
            ],
            names=["key", "user_map_key", "user_map_value", "partition_id"],
        )
    return _table(k, "value", v, partition)


def _read_partition(
    ckpt: Checkpoint, op: Operator, sel: Selection, partition: int, batch: int, enc: StoreEncoding
) -> tuple[pa.Table, str | None]:
    """(table, the store whose key rule places its rows)."""
    where = ckpt.path("state", str(op.operator_id), str(partition))
    join_format = format_of(op.kind)
    if join_format is not None:
        return _read_join_families(ckpt, op, sel, partition, batch, enc, join_format)
    if sel.join_store:
        sel = Selection(sel.operator_id, store=sel.join_store, batch=sel.batch)
    if sel.join_side and f"{sel.join_side}-keyWithIndexToValue" not in op.store_names:
        raise StatectlError(
            f"operator {op.operator_id} ({op.name}) is not a stream-stream join; "
            "--join-side is for symmetricHashJoin operators"
        )
    if op.uses_column_families:
        raw = load_raw(ckpt, op, "default", partition, batch, enc)
        return _cf_table(raw, op, sel, partition, enc, where), None
    if sel.join_side:
        store = f"{sel.join_side}-keyWithIndexToValue"
        desc = op.schema(store)
        raw = load_raw(ckpt, op, store, partition, batch, enc)
        return join_side_view(_kv_rows(raw, desc, enc, partition, where)), None
    store = sel.store or "default"
    if store not in op.store_names:
        raise StatectlError(
            f"operator {op.operator_id} ({op.name}) has no store {store!r}; "
            f"stores: {', '.join(op.store_names)}"
            + (
                "; use --join-side left|right or --store NAME"
                if op.name == "symmetricHashJoin"
                else ""
            )
        )
    raw = load_raw(ckpt, op, store, partition, batch, enc)
    return _kv_rows(raw, op.schema(store), enc, partition, where), store


def _read_join_families(
    ckpt: Checkpoint,
    op: Operator,
    sel: Selection,
    partition: int,
    batch: int,
    enc: StoreEncoding,
    fmt: int,
) -> tuple[pa.Table, str | None]:
    """A join at state format 3 or 4 (statectl/join_state.py): a column family (``--store``),
    a join side, or format 2's view of a store (savepoints)."""
    where = ckpt.path("state", str(op.operator_id), str(partition))
    _check_join_selection(op, sel)
    raw = load_raw(ckpt, op, "default", partition, batch, enc)
    return _join_rows(raw, op, sel, partition, enc, fmt, where)


def _check_join_selection(op: Operator, sel: Selection) -> None:
    if sel.state_var or sel.registered_timers:
        raise StatectlError(
            f"operator {op.operator_id} is a stream-stream join; use --join-side left|right or "
            f"--store NAME (column families: {', '.join(s.name for s in op.schemas)})"
        )


def _join_rows(
    raw: RawState,
    op: Operator,
    sel: Selection,
    partition: int,
    enc: StoreEncoding,
    fmt: int,
    where: str,
) -> tuple[pa.Table, str | None]:
    """:func:`_read_join_families` on the column-family entries ``raw`` (a whole partition, or
    a chunk of its live entries where each row stands alone: every selection but format 4's
    view as format 2's stores, which numbers each key's values)."""

    def family(name: str) -> pa.Table:
        desc = op.schema(name)
        check_schema(desc)
        keys, values = _cf_entries(raw, name, where)
        k = decode_key(keys, desc, enc, where)
        if fmt == 3:
            return _table(k, "value", decode_rows(values, desc.value_schema, enc, where), partition)
        # Format 4 values are lists (one element per value of that key and event time).
        owners, elems = split_list_values(values, where)
        v = decode_rows(elems, desc.value_schema, enc, where)
        return _table(k.take(pa.array(owners)), "value", v, partition)

    if sel.join_side:
        if fmt == 3:
            return join_side_view(family(f"{sel.join_side}-keyWithIndexToValue")), None
        # Spark 4.3 shows the key with __event_time, the value without matched. (Its own
        # joinSide read of format 4 shows __event_time wrong; the stores' reads are right.)
        store = f"{sel.join_side}-keyWithTsToValues"
        t = family(store)
        return pa.Table.from_arrays(
            [t.column("key"), join_side_view(t).column("value"), t.column("partition_id")],
            names=["key", "value", "partition_id"],
        ), store
    if sel.join_store:
        if fmt == 3:
            return family(sel.join_store), sel.join_store
        side = sel.join_store.split("-", 1)[0]
        kwtv = f"{side}-keyWithTsToValues"
        return v4_to_v2(family(kwtv), sel.join_store, op.schema(kwtv).key_schema), sel.join_store
    name = sel.store or "default"
    if name not in [s.name for s in op.schemas]:
        raise StatectlError(
            f"operator {op.operator_id} ({op.name}, join state format {fmt}) has no store "
            f"{name!r}; column families: {', '.join(s.name for s in op.schemas)}; or use "
            "--join-side left|right"
        )
    return family(name), name


def join_side_view(t: pa.Table) -> pa.Table:
    """A ``keyWithIndexToValue`` store shown as a join side, as Spark's ``joinSide`` option does:
    the key without ``index``, the value without format 2's ``matched`` flag."""
    key = t.column("key").combine_chunks()
    n = key.type.num_fields - 1
    join_key = pa.StructArray.from_arrays(
        [key.field(i) for i in range(n)], fields=[key.type.field(i) for i in range(n)]
    )
    value = t.column("value").combine_chunks()
    m = value.type.num_fields
    last = value.type.field(m - 1) if m else None
    if last is not None and last.name == "matched" and pa.types.is_boolean(last.type):
        value = pa.StructArray.from_arrays(
            [value.field(i) for i in range(m - 1)],
            fields=[value.type.field(i) for i in range(m - 1)],
            mask=value.is_null() if value.null_count else None,
        )
    return pa.Table.from_arrays(
        [join_key, value, t.column("partition_id")], names=["key", "value", "partition_id"]
    )


def state_variable_type(op: Operator, name: str) -> str:
    for var in op.properties.get("stateVariables", []) or []:
        if var.get("stateName") == name:
            return str(var.get("stateVariableType", "ValueState"))
    return "ValueState"


def read_state(ckpt: Checkpoint, sel: Selection) -> pa.Table:
    """The whole state of one selection, all partitions, like ``spark.read.format("statestore")``."""
    batch = ckpt.resolve_batch(sel.batch)
    if sel.operator_id not in ckpt.operator_ids():
        raise StatectlError(
            f"no stateful operator {sel.operator_id}; operators: "
            f"{', '.join(map(str, ckpt.operator_ids())) or 'none'}",
            ckpt.path("state"),
        )
    op = ckpt.operator(sel.operator_id, batch)
    enc = StoreEncoding.of(ckpt, batch)
    # Partitions are read one after the other: a process pool per partition was measured
    # (bench/read.py, 1M keys, 2 cores) at no gain, the results' transfer eating the saving.
    tables = [read_partition(ckpt, op, sel, p, batch, enc) for p in range(op.num_partitions)]
    return pa.concat_tables(tables)

"""Writing column-family operators: transformWithState (its state variables, timers and TTL
indexes) and stream-stream joins at state format 3 or 4. Every family of an operator in one
RocksDB snapshot per partition, each row placed by its (converted) key, then the schema file
(v3) and operator metadata v2 pointing at it, as Spark writes a column-family operator."""

from __future__ import annotations

import dataclasses
import functools
import posixpath
import uuid
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from statectl import join_state
from statectl.backends.writers import write_rocksdb_snapshot
from statectl.cf_stream import EncodedRuns, encode_join_spilled, encode_spilled, fits
from statectl.checkpoint.model import ENCODING_CONF, MERGE_OPERATOR_CONF, Operator
from statectl.checkpoint.state_metadata import ColumnFamilySchema, write_schema_file_v3
from statectl.checkpoint.writers import operator_metadata_v2_bytes, store_info
from statectl.engine import Engine, partition_spills, spill_dir
from statectl.evolution import TableEvolution
from statectl.io import FileIO
from statectl.restoration.evolve import VALUE_COLUMNS
from statectl.restoration.plan import RestorePlan
from statectl.restoration.stores import evolved_rows
from statectl.restoration.targets import under
from statectl.savepoints.format import OperatorState
from statectl.savepoints.store import Savepoint
from statectl.state import read_le_int
from statectl.tws_encode import TableEncoder, assign_cf_ids, encode_operator_partition

# Each target partition's encoded keys and values, or their sorted runs on disk.
Entries = Iterable[tuple[int, tuple[pa.Array, pa.Array] | EncodedRuns]]


def _evolved_cf_rows(
    evolutions: dict[str, TableEvolution], kinds: dict[str, str], table: Any, rows: pa.Table
) -> pa.Table:
    """A transformWithState savepoint chunk as the query keeps it, before placement: the
    grouping key (the ``key`` column of every table, timers included) converted, since a
    widened key hashes differently, and value structs evolved."""
    evo = evolutions.get(table.name)
    if evo is None:
        return rows
    if evo.key is not None:
        i = rows.schema.get_field_index("key")
        rows = rows.set_column(i, "key", evo.key.convert(rows.column("key").combine_chunks()))
    if evo.value is not None:
        column = VALUE_COLUMNS[kinds[table.name]]
        i = rows.schema.get_field_index(column)
        rows = rows.set_column(i, column, evo.value.convert(rows.column(column).combine_chunks()))
    return rows


def _hadoop_url(io: FileIO, path: str, scheme: str) -> str:
    """How Spark writes a qualified path into operator metadata: ``file:/abs/path`` locally,
    else with the scheme the target was given with (``s3a://`` stays ``s3a://``)."""
    if io.protocol == "file":
        return f"file:{path}"
    return f"{scheme}://{path}" if scheme else io.url(path)


def _evolved_families(
    plan: RestorePlan, op: OperatorState, new_id: int, evolutions: dict[str, TableEvolution]
) -> list[ColumnFamilySchema]:
    """The operator's column families with the query's schemas where they evolve. A re-keyed
    operator takes every family's key schema from the query's plan (checked when planning):
    what Spark's own schema check compares the query with."""
    planned = (
        {s.name: s for s in plan.query_operators[new_id].schemas}
        if any(e.key is not None for e in evolutions.values())
        else {}
    )
    families = []
    for cf in op.column_families or []:
        family = ColumnFamilySchema(**cf)
        if cf["name"] in planned:
            family = dataclasses.replace(family, key_schema=planned[cf["name"]].key_schema)
        evo = evolutions.get(cf["name"])
        if evo is not None and evo.value is not None:
            family = dataclasses.replace(family, value_schema=evo.value.new_schema)
        families.append(family)
    return families


def write_cf_operator(
    sp: Savepoint, op: OperatorState, new_id: int, plan: RestorePlan
) -> dict[str, int]:
    """transformWithState from the savepoint: its tables and its column families, evolved to
    the query's schemas where the plan says so."""
    evolutions = plan.evolutions.get(op.uid, {})
    families = _evolved_families(plan, op, new_id, evolutions)
    kinds = {t.name: t.kind for t in op.tables}
    convert = functools.partial(_evolved_cf_rows, evolutions, kinds) if evolutions else None
    _write_cf_state(sp, op, new_id, families, kinds, convert, plan)
    return {t.name: sum(f.rows for f in t.files) for t in op.tables}


@dataclass(frozen=True)
class _TwsPartitionEncoder:
    """How a transformWithState operator's partitions are encoded (the savepoint's merge
    operator and encoding, the operator's time mode): whole, or through a TableEncoder."""

    families: list[ColumnFamilySchema]
    cf_ids: dict[str, int]
    kinds: dict[str, str]
    time_mode: str
    delimiter: bytes
    avro: bool

    def __call__(self, tables: dict[str, pa.Table]) -> tuple[pa.Array, pa.Array]:
        return encode_operator_partition(
            tables,
            self.kinds,
            self.families,
            self.cf_ids,
            self.time_mode,
            self.delimiter,
            avro=self.avro,
        )

    def encoder(self) -> TableEncoder:
        return TableEncoder(self.families, self.cf_ids, self.time_mode, self.delimiter, self.avro)


def merge_operator_version(plan: RestorePlan, pinned: dict[str, str]) -> str | None:
    """The RocksDB merge operator version the restored checkpoint pins, which decides how every
    list value is written (``,``-joined at 1, plain at 2): the savepoint's, or 2 where a join
    is written at state format 4. Spark 4.3 refuses format 4 with version 1
    (``STREAM_STREAM_JOIN_INCOMPATIBLE_STATE_STORE_CONFIGS``), and reads a checkpoint that
    pins no version as 1 (``OffsetSeqMetadata.relevantSQLConfDefaultValues``, javap)."""
    if plan.join_state_format == 4:
        return "2"
    return pinned.get(MERGE_OPERATOR_CONF)


def _merge_delimiter(plan: RestorePlan, sp: Savepoint) -> bytes:
    return b"" if merge_operator_version(plan, sp.metadata.pinned_confs) == "2" else b","


def _tws_partition_encoder(
    plan: RestorePlan,
    sp: Savepoint,
    properties: dict[str, Any],
    families: list[ColumnFamilySchema],
    cf_ids: dict[str, int],
    kinds: dict[str, str],
) -> _TwsPartitionEncoder:
    confs = sp.metadata.pinned_confs
    return _TwsPartitionEncoder(
        families,
        cf_ids,
        kinds,
        properties.get("timeMode", ""),
        _merge_delimiter(plan, sp),
        confs.get(ENCODING_CONF) == "avro",
    )


def _write_cf_state(
    sp: Savepoint,
    op: OperatorState,
    new_id: int,
    families: list[ColumnFamilySchema],
    kinds: dict[str, str],
    convert: Callable[[Any, pa.Table], pa.Table] | None,
    plan: RestorePlan,
) -> None:
    """transformWithState: every column family in one RocksDB snapshot per partition, each row
    placed by its (converted) key. A partition is encoded whole when it fits the budget, else a
    chunk at a time through sorted runs on disk (statectl/cf_stream.py); the Spark engine hands
    each partition over whole."""
    cf_ids = assign_cf_ids(families)
    encode = _tws_partition_encoder(plan, sp, op.properties, families, cf_ids, kinds)
    internal = np.array(sorted(i for n, i in cf_ids.items() if n.startswith("$")))

    def chunked(spilled: Any, scratch: str, budget: int) -> EncodedRuns:
        return encode_spilled(spilled, kinds, encode.encoder(), internal, scratch, budget)

    entries = _partition_entries(sp, op, plan, convert, encode, chunked)
    _write_cf_files(new_id, op.name, op.properties, families, cf_ids, entries, plan)


def _partition_entries(
    sp: Savepoint,
    op: OperatorState,
    plan: RestorePlan,
    convert: Callable[[Any, pa.Table], pa.Table] | None,
    whole: Callable[[dict[str, pa.Table]], tuple[pa.Array, pa.Array]],
    chunked: Callable[[Any, str, int], EncodedRuns],
) -> Iterator[tuple[int, tuple[pa.Array, pa.Array] | EncodedRuns]]:
    """Each target partition's column-family entries: its rows placed by the kind's key
    (statectl/engine.py), encoded ``whole`` when the partition fits the engine's budget, else
    ``chunked`` through sorted runs in a scratch directory (statectl/cf_stream.py)."""
    engine = plan.engine or Engine.of()
    for p, spilled in partition_spills(
        sp, op.tables, op.kind.partitions_of, plan.partitions, engine, convert=convert
    ):
        if fits(spilled, engine.per_task):
            yield p, whole({name: t.read() for name, t in spilled.items()})
            continue
        with spill_dir() as scratch:
            yield p, chunked(spilled, scratch, engine.per_task)


def write_join_families(
    sp: Savepoint, op: OperatorState, new_id: int, plan: RestorePlan
) -> dict[str, int]:
    """A join at state format 3 or 4 from the savepoint's format 2 tables: the column families
    Spark registers for that format, keys placed by the join key (statectl/join_state.py)."""
    fmt = plan.join_state_format
    assert fmt in join_state.COLUMN_FAMILY_FORMATS
    # Schema evolution (a widened join key, widened or renamed columns): the rows are converted
    # before they are placed, so a widened key lands where Spark hashes it, and the families
    # take the query's schemas.
    evolutions = plan.evolutions.get(op.uid, {})
    convert = functools.partial(evolved_rows, evolutions) if evolutions else None
    families = join_state.families_for(
        fmt, {t.name: plan.target_schemas(op.uid, t) for t in op.tables}
    )
    cf_ids = assign_cf_ids(families)
    delimiter = _merge_delimiter(plan, sp)
    encode = functools.partial(
        join_state.encode_partition, fmt, families=families, cf_ids=cf_ids, delimiter=delimiter
    )

    def chunked(spilled: Any, scratch: str, budget: int) -> EncodedRuns:
        return encode_join_spilled(fmt, spilled, encode, scratch, budget)

    entries = _partition_entries(sp, op, plan, convert, encode, chunked)

    properties = {"useVirtualColumnFamilies": True}
    # Spark 3.5's joins carry no operator name; Spark reads column families by this one.
    _write_cf_files(new_id, join_state.NAME, properties, families, cf_ids, entries, plan)
    return {t.name: sum(f.rows for f in t.files) for t in op.tables}


def _write_snapshot(
    io: FileIO,
    store: str,
    version: int,
    encoded: tuple[pa.Array, pa.Array] | EncodedRuns,
    cf_ids: dict[str, int],
    internal: np.ndarray,
    unique_id: str | None,
) -> None:
    """One partition's RocksDB snapshot, from sorted runs on disk or arrays in memory."""
    if isinstance(encoded, EncodedRuns):
        write_rocksdb_snapshot(
            io,
            store,
            version,
            None,
            None,
            column_families=cf_ids,
            num_internal_keys=encoded.num_internal_keys,
            unique_id=unique_id,
            batches=encoded.batches(),
            num_keys=encoded.num_keys,
        )
        return
    keys, values = encoded
    ids = read_le_int(keys, 0, 2) if len(keys) else np.zeros(0)
    write_rocksdb_snapshot(
        io,
        store,
        version,
        keys,
        values,
        column_families=cf_ids,
        num_internal_keys=int(np.isin(ids, internal).sum()),
        unique_id=unique_id,
    )


def _write_cf_files(
    new_id: int,
    name: str,
    properties: dict[str, Any],
    families: list[ColumnFamilySchema],
    cf_ids: dict[str, int],
    entries: Entries,
    plan: RestorePlan,
) -> None:
    """One RocksDB snapshot per partition (``entries``: each target partition's encoded keys
    and values, or their sorted runs on disk, in partition order), the schema file (v3) and
    operator metadata v2 pointing at it, as Spark writes a column-family operator."""
    io, root = plan.run.io, plan.run.root
    assert io is not None
    internal = np.array(sorted(i for n, i in cf_ids.items() if n.startswith("$")))
    written = 0
    for p, encoded in entries:
        # The engine yields every target partition, in order (unique ids are recorded in order).
        if p != written:
            raise AssertionError(f"partition {p} came after {written} partitions")
        written += 1
        unique_id = str(uuid.uuid4()) if plan.checkpoint_format == 2 else None
        plan.run.record_unique_id(new_id, p, plan.partitions, unique_id)
        store = under(root, "state", str(new_id), str(p))
        _write_snapshot(io, store, plan.batch + 1, encoded, cf_ids, internal, unique_id)
    if written != plan.partitions:
        raise AssertionError(f"{written} of {plan.partitions} partitions were encoded")
    schema_path = posixpath.join(
        root, "state", str(new_id), "_stateSchema", "default", f"{plan.batch}_{uuid.uuid4()}"
    )
    io.write_atomic(schema_path, write_schema_file_v3(families))
    stores = [
        store_info("default", 0, plan.partitions, [_hadoop_url(io, schema_path, plan.scheme)])
    ]
    io.write_atomic(
        under(root, "state", str(new_id), "_metadata", "v2", str(plan.batch)),
        operator_metadata_v2_bytes(new_id, name, stores, properties),
    )


def write_empty_cf_operator(sp: Savepoint, op: Operator, plan: RestorePlan) -> None:
    """A new transformWithState operator of the changed query: empty snapshots with the
    column families Spark's planning of the query registered."""
    families = [
        ColumnFamilySchema(
            d.name,
            d.key_schema,
            d.value_schema,
            d.key_schema_id,
            d.value_schema_id,
            d.key_encoder_spec,
            d.user_key_schema,
        )
        for d in op.schemas
    ]
    cf_ids = assign_cf_ids(families)
    encode = _tws_partition_encoder(plan, sp, op.properties, families, cf_ids, {})
    empty = ((p, encode({})) for p in range(plan.partitions))
    _write_cf_files(op.operator_id, op.name, op.properties, families, cf_ids, empty, plan)

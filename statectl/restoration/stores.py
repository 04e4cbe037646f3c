"""Writing a store operator's state (aggregations, deduplication, joins at format 2,
flatMapGroupsWithState, ...): every key placed where Spark looks for it, encoded as the
backend keeps it, with its schema file and operator metadata. From the savepoint through the
engine (statectl/engine.py), or, for migrate's pass-through, from the source checkpoint's
bytes (statectl/passthrough.py)."""

from __future__ import annotations

import dataclasses
import functools
import json
import posixpath
from collections.abc import Callable
from typing import Any

import pyarrow as pa

from statectl.backends import get_backend
from statectl.checkpoint.model import UNKNOWN_OPERATOR, Operator
from statectl.checkpoint.state_metadata import ColumnFamilySchema, write_schema_file_v2
from statectl.checkpoint.writers import operator_metadata_v1_bytes, store_info
from statectl.codecs.unsaferow_encode import encode_unsafe_rows
from statectl.engine import Engine, StoreFormat, restore_stores
from statectl.evolution import TableEvolution
from statectl.io import FileIO
from statectl.operators import OperatorKind
from statectl.passthrough import restore_raw_stores
from statectl.restoration.continuation import with_row_checksums
from statectl.restoration.plan import RestorePlan
from statectl.restoration.targets import under
from statectl.savepoints.format import OperatorState
from statectl.savepoints.store import Savepoint
from statectl.transforms import apply_transform
from statectl.tws_encode import VERSION, concat_binary, encode_key

# Where each store partition of an operator goes: (store name, partition) -> directory.
StoreDir = Callable[[str, int], str]


def store_format(plan: RestorePlan, codec: str) -> StoreFormat:
    """How each store partition is written at version N+1."""
    return StoreFormat(
        plan.backend,
        plan.layout,
        plan.batch + 1,
        codec,
        unique_ids=plan.checkpoint_format == 2,
    )


def _encode_store(
    backend: str, kind: OperatorKind, key: pa.StructArray, value: pa.StructArray, table: Any
) -> tuple[pa.Array, pa.Array]:
    """A store's keys and values as the backend keeps them. HDFS: UnsafeRows (the whole key,
    prefix or not). RocksDB: Spark 4's encoding-version byte in front of key and value, and a
    key with ``numColsPrefixKey > 0`` prefix-encoded as Spark's PrefixKeyScanStateEncoder
    does (``int32 LE len ‖ 0x00 prefix row ‖ 0x00 remaining row``)."""
    k = encode_unsafe_rows(key, json.loads(table.key_schema))
    v = encode_unsafe_rows(value, json.loads(table.value_schema))
    if not get_backend(backend).capabilities.key_encoders:
        return k, v
    prefix = kind.prefix_columns(table.key_schema)
    if prefix:
        spec = {"keyStateEncoderType": "PrefixKeyScanStateEncoderSpec", "numColsPrefixKey": prefix}
        family = ColumnFamilySchema(table.name, table.key_schema, table.value_schema, 0, 0, spec)
        return encode_key(key, family), concat_binary(VERSION, v)
    return concat_binary(VERSION, k), concat_binary(VERSION, v)


def evolved_rows(evolutions: dict[str, TableEvolution], table: Any, rows: pa.Table) -> pa.Table:
    """A savepoint chunk as the query keeps it, before placement: a widened key hashes
    differently, so it is placed by the new key."""
    evo = evolutions.get(table.name)
    if evo is None:
        return rows
    if evo.transform is not None:
        return apply_transform(evo, table.name, rows)
    key, value = rows.column("key").combine_chunks(), rows.column("value").combine_chunks()
    if evo.key is not None:
        key = evo.key.convert(key)
    if evo.value is not None:
        value = evo.value.convert(value, key)
    return pa.table({"key": key, "value": value})


def _evolved_encode(
    backend: str,
    schemas: dict[str, tuple[str, str]],
    kind: OperatorKind,
    key: pa.StructArray,
    value: pa.StructArray,
    table: Any,
) -> tuple[pa.Array, pa.Array]:
    """Encoded with the schemas :meth:`RestorePlan.target_schemas` chose (the rows were
    converted by :func:`evolved_rows`). Plain data, no plan: the Spark engine ships it to
    executors."""
    key_schema, value_schema = schemas[table.name]
    table = dataclasses.replace(table, key_schema=key_schema, value_schema=value_schema)
    return _encode_store(backend, kind, key, value, table)


def _encoder(plan: RestorePlan, op: OperatorState, kind: OperatorKind) -> Any:
    """The encoder of ``op``'s stores; with --row-checksums each value gets Spark's row
    checksum (statectl/restoration/continuation.py)."""
    schemas = {t.name: plan.target_schemas(op.uid, t) for t in op.tables}
    encoder = functools.partial(_evolved_encode, plan.backend, schemas, kind)
    if not plan.row_checksums:
        return encoder
    header = plan.target_backend.entry_codec(row_checksum=True).checksum_bytes
    return functools.partial(with_row_checksums, encoder, header)


def _restore_stores(
    sp: Savepoint, op: OperatorState, plan: RestorePlan, codec: str, store_dir: StoreDir
) -> list[list[tuple[int, str | None]]]:
    """The local engine: bounded memory, every core (statectl/engine.py). Keys go where the
    operator kind places them, encoded as the backend keeps them (:func:`_encode_store`)."""
    kind = op.kind
    evolutions = plan.evolutions.get(op.uid, {})
    assert plan.run.io is not None
    return restore_stores(
        sp,
        op.tables,
        kind.partitions_of,
        plan.partitions,
        store_format(plan, codec),
        plan.run.io,
        store_dir,
        plan.engine or Engine.of(),
        encoder=_encoder(plan, op, kind),
        # Spark runs a single-partition operator in one task and never creates the others.
        only=[0] if kind.single_partition else None,
        convert=functools.partial(evolved_rows, evolutions) if evolutions else None,
    )


def _write_raw_operator(
    raw: tuple[Any, int, Operator], plan: RestorePlan, codec: str, store_dir: StoreDir
) -> tuple[list[list[tuple[int, str | None]]], dict[str, int]]:
    """:func:`_restore_stores` from the source checkpoint's bytes (migrate's pass-through)."""
    ckpt, batch, source_op = raw
    assert plan.run.io is not None
    return restore_raw_stores(
        ckpt,
        source_op,
        batch,
        plan.partitions,
        store_format(plan, codec),
        plan.run.io,
        store_dir,
        plan.engine,
        only=[0] if source_op.kind.single_partition else None,
    )


def write_operator_metadata(
    io: FileIO, root: str, op_id: int, name: str, stores: list[dict[str, Any]]
) -> None:
    io.write_atomic(
        under(root, "state", str(op_id), "_metadata", "metadata"),
        operator_metadata_v1_bytes(op_id, name, stores),
    )


def _store_dirs(root: str, op_id: int) -> StoreDir:
    def store_dir(table: str, p: int) -> str:
        base = under(root, "state", str(op_id), str(p))
        return base if table == "default" else posixpath.join(base, table)

    return store_dir


def write_store_operator(
    sp: Savepoint, op: OperatorState, new_id: int, plan: RestorePlan, codec: str
) -> dict[str, int]:
    """A store operator's partitions, schema files and metadata; its rows by store."""
    io, root = plan.run.io, plan.run.root
    assert io is not None
    store_dir = _store_dirs(root, new_id)
    raw = plan.passthrough.get(op.uid)
    if raw is not None:
        built, rows_written = _write_raw_operator(raw, plan, codec, store_dir)
    else:
        built = _restore_stores(sp, op, plan, codec, store_dir)
        rows_written = {t.name: sum(f.rows for f in t.files) for t in op.tables}
    stores = []
    for table, ids in zip(op.tables, built, strict=True):
        for p, unique_id in ids:
            plan.run.record_unique_id(new_id, p, plan.partitions, unique_id)
        key_schema, value_schema = plan.target_schemas(op.uid, table)
        io.write_atomic(
            posixpath.join(store_dir(table.name, 0), "_metadata", "schema"),
            write_schema_file_v2(key_schema, value_schema),
        )
        # numPartitions is the shuffle partition count even for a one-task operator (Spark's
        # StatefulOperatorStateInfo.numPartitions), as Spark records it.
        stores.append(store_info(table.name, op.kind.prefix_columns(key_schema), plan.partitions))
    name = op.name
    if name == UNKNOWN_OPERATOR and new_id in plan.query_operators:
        name = plan.query_operators[new_id].name
    if name != UNKNOWN_OPERATOR:  # Spark < 4 state has none; Spark 4 writes it on restart
        write_operator_metadata(io, root, new_id, name, stores)
    return rows_written


def write_empty_store_operator(op: Operator, plan: RestorePlan, codec: str) -> None:
    """A new store operator of the changed query: valid empty state at the version Spark
    loads, with the metadata and schemas Spark's planning of the query wrote."""
    io, root = plan.run.io, plan.run.root
    assert io is not None
    writer = store_format(plan, codec).write
    empty = pa.array([], pa.large_binary())
    store_dir = _store_dirs(root, op.operator_id)
    for desc in op.schemas:
        for p in range(plan.partitions):
            unique_id = writer(io, store_dir(desc.name, p), empty, empty)
            plan.run.record_unique_id(op.operator_id, p, plan.partitions, unique_id)
            if p == 0:
                io.write_atomic(
                    posixpath.join(store_dir(desc.name, p), "_metadata", "schema"),
                    write_schema_file_v2(desc.key_schema, desc.value_schema),
                )
    stores = [store_info(d.name, d.num_cols_prefix_key, plan.partitions) for d in op.schemas]
    write_operator_metadata(io, root, op.operator_id, op.name, stores)

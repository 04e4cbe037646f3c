"""Use case ``restore``: write a Spark checkpoint from a savepoint, in either backend, at any
partition count, from which the query resumes at batch N+1 with exactly-once positions.

The savepoint is only read (Flink's NO_CLAIM). Every key is placed where Spark will look for
it, ``pmod(murmur3(key), partitions)``; the pinned confs are rewritten for the chosen backend
and partition count. State files are written first, the logs after them, ``commits/N`` last,
so an interrupted restore never looks like a finished checkpoint.
"""

from __future__ import annotations

import json
import posixpath
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from statectl.backends.writers import (
    write_hdfs_store,
    write_rocksdb_snapshot,
    write_rocksdb_store,
)
from statectl.checkpoint.model import (
    CODEC_CONF,
    ENCODING_CONF,
    HDFS,
    MERGE_OPERATOR_CONF,
    PARTITIONS_CONF,
    PROVIDER_CLASSES,
    PROVIDER_CONF,
    ROCKSDB,
    ROW_CHECKSUM_CONF,
    UNKNOWN_OPERATOR,
    Operator,
)
from statectl.checkpoint.state_metadata import (
    ColumnFamilySchema,
    write_schema_file_v2,
    write_schema_file_v3,
)
from statectl.codecs.compression import normalize_codec
from statectl.codecs.murmur3 import partition_ids
from statectl.codecs.unsaferow import encode_unsafe_rows
from statectl.errors import StatectlError, UnsupportedError
from statectl.io import FileIO
from statectl.query_plan import PlannedQuery, plan_query, planning_confs
from statectl.savepoints.create import default_uid
from statectl.savepoints.format import (
    OperatorState,
    fingerprint_of,
    operator_fingerprint,
)
from statectl.savepoints.store import Savepoint
from statectl.schema_compat import difference
from statectl.state import read_le_int
from statectl.tws_encode import (
    VERSION,
    assign_cf_ids,
    concat_binary,
    encode_operator_partition,
    unsupported_families,
)

FILE_SOURCE_COMPACT_INTERVAL = 10


@dataclass
class RestorePlan:
    savepoint: str
    target: str
    backend: str
    partitions: int
    batch: int
    restored: dict[str, int] = field(default_factory=dict)  # uid -> operator id
    dropped: list[str] = field(default_factory=list)
    started_empty: dict[int, str] = field(default_factory=dict)  # operator id -> name
    problems: list[str] = field(default_factory=list)
    query: str | None = None
    rocksdb_layout: str = "snapshot"  # RocksDB target files: "snapshot" (zip) or "changelog"
    checkpoint_format: int = 1  # 2: file names carry unique ids, listed in commits/N
    scheme: str = ""  # the URL scheme the target was given with (s3a stays s3a for Spark)
    # checkpoint format 2: operator id -> partition -> store index -> unique id
    unique_ids: dict[int, list[list[str]]] = field(default_factory=dict)
    # The changed query's operators (from --query), by id: restored ones take their metadata
    # and schemas from the savepoint, new ones get empty state with these.
    query_operators: dict[int, Operator] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {
            "savepoint": self.savepoint,
            "target": self.target,
            "backend": self.backend,
            "partitions": self.partitions,
            "resumes_at_batch": self.batch + 1,
            "checkpoint_format": self.checkpoint_format,
            "query": self.query,
            "restored": self.restored,
            "dropped": self.dropped,
            "started_empty": {str(k): v for k, v in self.started_empty.items()},
            "problems": self.problems,
            "ok": not self.problems,
        }


def choose_target(sp: Savepoint, backend: str | None, partitions: int | None) -> tuple[str, int]:
    """The backend and partition count to restore to: the arguments, else the savepoint's."""
    m = sp.metadata
    chosen = backend or m.source_checkpoint.get("backend") or HDFS
    if chosen not in (HDFS, ROCKSDB):
        raise StatectlError(f"--backend must be hdfs or rocksdb, not {chosen!r}")
    n = (
        partitions
        or int(m.pinned_confs.get(PARTITIONS_CONF, 0))
        or m.source_checkpoint["partitions"]
    )
    if n < 1:
        raise StatectlError(f"--partitions must be at least 1, got {n}")
    return chosen, n


def _dedupe(names: list[tuple[int, str]]) -> dict[int, str]:
    """Twin fingerprints get -2, -3 in operator id order, as default uids do."""
    out: dict[int, str] = {}
    seen: dict[str, int] = {}
    for op_id, name in sorted(names):
        seen[name] = seen.get(name, 0) + 1
        out[op_id] = name if seen[name] == 1 else f"{name}-{seen[name]}"
    return out


def _schema_problems(uid: str, op: OperatorState, target: Operator) -> list[str]:
    where = f"uid {uid} -> operator {target.operator_id}"
    if op.name not in (target.name, UNKNOWN_OPERATOR):
        return [
            f"{where}: the savepoint holds {op.name} state, the query's operator is {target.name}"
        ]
    problems = []
    for table in op.tables:
        desc = next((s for s in target.schemas if s.name == table.name), None)
        if desc is None:
            problems.append(
                f"{where} ({op.name}): the query has no store {table.name!r} "
                f"(it has {', '.join(s.name for s in target.schemas)})"
            )
            continue
        for part, stored, new in (
            ("key", table.key_schema, desc.key_schema),
            ("value", table.value_schema, desc.value_schema),
        ):
            diff = difference(json.loads(stored), json.loads(new))
            if diff:
                store = "" if table.name == "default" else f" of store {table.name!r}"
                problems.append(
                    f"{where} ({op.name}): {part} schema{store} is incompatible, {diff}"
                )
    return problems


def plan_restore(
    sp: Savepoint,
    target: str,
    backend: str | None,
    partitions: int | None,
    mapping: dict[str, int],
    allow_non_restored: bool,
    drop: list[str] | None = None,
    query: PlannedQuery | None = None,
    rocksdb_layout: str = "snapshot",
    checkpoint_format: int | None = None,
) -> RestorePlan:
    """Which uid goes to which operator id; what is dropped or started empty; what is wrong.

    A uid goes to ``--map``'s operator id, else (with ``--query``) to the query's operator with
    the same fingerprint (what it is, not where it sits: ids shift when operators are added or
    removed), else to the id it had. State with no operator to go to is an error unless ``-n``.
    """
    m = sp.metadata
    chosen, n = choose_target(sp, backend, partitions)
    plan = RestorePlan(
        sp.url(),
        target,
        chosen,
        n,
        m.batch_id,
        query=query.spec if query else None,
        rocksdb_layout=rocksdb_layout,
    )
    # Format 2 (RocksDB snapshots only) when the savepoint came from it, or when asked.
    if checkpoint_format not in (None, 1, 2):
        raise StatectlError(f"--checkpoint-format must be 1 or 2, not {checkpoint_format}")
    wanted = checkpoint_format or int(m.source_checkpoint.get("checkpoint_format_version") or 1)
    if wanted == 2 and (chosen != ROCKSDB or rocksdb_layout != "snapshot"):
        if checkpoint_format == 2:
            plan.problems.append("checkpoint format 2 needs --backend rocksdb without --changelog")
        wanted = 1
    plan.checkpoint_format = wanted
    uids = {op.uid for op in m.operators}
    for flag, names in (("--map", sorted(mapping)), ("--drop", sorted(drop or []))):
        unknown = [u for u in names if u not in uids]
        if unknown:
            plan.problems.append(
                f"{flag} names uids the savepoint does not have: {', '.join(unknown)} "
                f"(it has {', '.join(sorted(uids))})"
            )
    by_fingerprint: dict[str, int] = {}
    if query is not None:
        plan.query_operators = {op.operator_id: op for op in query.operators}
        by_fingerprint = {
            fp: op_id
            for op_id, fp in _dedupe(
                [(o.operator_id, default_uid(o)) for o in query.operators]
            ).items()
        }
        # Spark < 4 wrote no operator metadata, so its operators are named "unknown": they
        # match by stores and key schemas alone.
        by_fingerprint.update(
            {
                fp: op_id
                for op_id, fp in _dedupe(
                    [
                        (
                            o.operator_id,
                            operator_fingerprint(
                                UNKNOWN_OPERATOR,
                                o.store_names,
                                [(d.name, d.key_schema) for d in o.schemas],
                            ),
                        )
                        for o in query.operators
                    ]
                ).items()
            }
        )
    sp_fingerprints = _dedupe([(op.operator_id, fingerprint_of(op)) for op in m.operators])
    unmatched = []
    for op in m.operators:
        if op.uid in (drop or []):
            target_id = None
        elif op.uid in mapping:
            target_id = mapping[op.uid]
        elif query is not None:
            target_id = by_fingerprint.get(sp_fingerprints[op.operator_id])
        elif op.operator_id in mapping.values():
            target_id = None  # its old id now belongs to a --map'ed uid: no operator left
        else:
            target_id = op.operator_id
        if target_id is None:
            unmatched.append(op.uid)
            continue
        plan.restored[op.uid] = target_id
    if unmatched:
        if allow_non_restored:
            plan.dropped = unmatched
        else:
            plan.problems.append(
                f"state of {', '.join(unmatched)} matches no operator of the "
                f"{'query' if query else 'restore'}; pass -n (--allow-non-restored-state) to "
                "drop it, or --map UID=OPERATOR_ID"
            )
    ids = list(plan.restored.values())
    if len(set(ids)) != len(ids):
        plan.problems.append(f"two uids map to the same operator id: {plan.restored}")
    if query is not None:
        by_uid = {op.uid: op for op in m.operators}
        for uid, op_id in plan.restored.items():
            if op_id not in plan.query_operators:
                plan.problems.append(
                    f"uid {uid} maps to operator {op_id}, which the query does not have "
                    f"(its operators: {', '.join(f'{i} {o.name}' for i, o in sorted(plan.query_operators.items()))})"
                )
            elif m.savepoint_type != "native":
                plan.problems += _schema_problems(uid, by_uid[uid], plan.query_operators[op_id])
        for op_id, qop in sorted(plan.query_operators.items()):
            if op_id not in ids:
                plan.started_empty[op_id] = qop.name
                if qop.uses_column_families and (chosen != ROCKSDB or rocksdb_layout != "snapshot"):
                    plan.problems.append(
                        f"operator {op_id} ({qop.name}, transformWithState) starts empty only "
                        "on RocksDB snapshots (--backend rocksdb, no --changelog)"
                    )
    for op in m.operators:
        if op.uid in plan.restored and (refusal := op.kind.refusal(f"uid {op.uid} ({op.name})")):
            plan.problems.append(refusal)
    if m.savepoint_type == "native":
        plan.problems.append(
            "a native savepoint restores by copying its checkpoint/ directory (same backend and "
            "partitions); convert it first: statectl savepoint --type canonical SAVEPOINT"
        )
        return plan
    for op in m.operators:
        if op.uid not in plan.restored or all(t.kind in ("store", "join-store") for t in op.tables):
            continue
        what = f"uid {op.uid} ({op.name}, transformWithState)"
        if not op.column_families:
            plan.problems.append(
                f"{what}: the savepoint predates column-family records; take a new savepoint "
                "with this statectl"
            )
        elif chosen != ROCKSDB or plan.rocksdb_layout != "snapshot":
            plan.problems.append(
                f"{what}: restores only to RocksDB snapshots (--backend rocksdb, no --changelog); "
                "Spark runs transformWithState on RocksDB only"
            )
        elif bad := unsupported_families(cf["name"] for cf in op.column_families):
            plan.problems.append(
                f"{what}: column families {', '.join(bad)} (state TTL) cannot be restored yet"
            )
    return plan


def _check_target(io: FileIO, root: str) -> None:
    if io.exists(root) and (not io.is_dir(root) or io.list_dir(root)):
        raise StatectlError(
            "target checkpoint exists and is not empty; choose a new directory", root
        )


def _store_writer(
    plan: RestorePlan, codec: str
) -> Callable[[FileIO, str, pa.Array, pa.Array], str | None]:
    """Writes one store partition's UnsafeRow keys and values at version N+1; returns the
    unique id the files carry (checkpoint format 2) or None."""
    version = plan.batch + 1

    def hdfs(io: FileIO, d: str, k: pa.Array, v: pa.Array) -> None:
        write_hdfs_store(io, d, version, codec, k, v)

    def changelog(io: FileIO, d: str, k: pa.Array, v: pa.Array) -> None:
        write_rocksdb_store(io, d, version, codec, k, v)

    def snapshot(io: FileIO, d: str, k: pa.Array, v: pa.Array) -> str | None:
        # RocksDB rows carry Spark 4's encoding-version byte in front of key and value.
        uid = str(uuid.uuid4()) if plan.checkpoint_format == 2 else None
        write_rocksdb_snapshot(
            io, d, version, concat_binary(VERSION, k), concat_binary(VERSION, v), unique_id=uid
        )
        return uid

    if plan.backend == HDFS:
        return hdfs
    return changelog if plan.rocksdb_layout == "changelog" else snapshot


def _record_unique_id(plan: RestorePlan, op_id: int, partition: int, uid: str | None) -> None:
    if uid is not None:
        parts = plan.unique_ids.setdefault(op_id, [[] for _ in range(plan.partitions)])
        parts[partition].append(uid)


def _write_operator(
    sp: Savepoint,
    op: OperatorState,
    new_id: int,
    plan: RestorePlan,
    io: FileIO,
    root: str,
    codec: str,
) -> dict[str, int]:
    if op.column_families:
        return _write_cf_operator(sp, op, new_id, plan, io, root)
    writer = _store_writer(plan, codec)
    rows_written = {}
    store_infos = []
    for table in op.tables:
        data = sp.read_table(table)
        key = data.column("key").combine_chunks()
        value = data.column("value").combine_chunks()
        pids = partition_ids(op.kind.partition_key(table.name, key), plan.partitions)
        key_schema = json.loads(table.key_schema)
        value_schema = json.loads(table.value_schema)
        for p in range(plan.partitions):
            mask = pa.array(pids == p)
            k = encode_unsafe_rows(pc.filter(key, mask), key_schema)
            v = encode_unsafe_rows(pc.filter(value, mask), value_schema)
            base = posixpath.join(root, "state", str(new_id), str(p))
            store_dir = base if table.name == "default" else posixpath.join(base, table.name)
            _record_unique_id(plan, new_id, p, writer(io, store_dir, k, v))
            if p == 0:
                io.write_atomic(
                    posixpath.join(store_dir, "_metadata", "schema"),
                    write_schema_file_v2(table.key_schema, table.value_schema),
                )
        rows_written[table.name] = data.num_rows
        store_infos.append(
            {"storeName": table.name, "numColsPrefixKey": 0, "numPartitions": plan.partitions}
        )
    name = op.name
    if name == UNKNOWN_OPERATOR and new_id in plan.query_operators:
        name = plan.query_operators[new_id].name
    if name != UNKNOWN_OPERATOR:  # Spark < 4 state has none; Spark 4 writes it on restart
        _write_operator_metadata(io, root, new_id, name, store_infos)
    return rows_written


def _hadoop_url(io: FileIO, path: str, scheme: str) -> str:
    """How Spark writes a qualified path into operator metadata: ``file:/abs/path`` locally,
    else with the scheme the target was given with (``s3a://`` stays ``s3a://``)."""
    if io.protocol == "file":
        return f"file:{path}"
    return f"{scheme}://{path}" if scheme else io.url(path)


def _write_cf_operator(
    sp: Savepoint, op: OperatorState, new_id: int, plan: RestorePlan, io: FileIO, root: str
) -> dict[str, int]:
    """transformWithState from the savepoint: its tables and its column families verbatim."""
    families = [ColumnFamilySchema(**cf) for cf in op.column_families or []]
    data = {t.name: sp.read_table(t) for t in op.tables}
    kinds = {t.name: t.kind for t in op.tables}
    _write_cf_state(sp, new_id, op.name, op.properties, families, data, kinds, plan, io, root)
    return {name: t.num_rows for name, t in data.items()}


def _write_cf_state(
    sp: Savepoint,
    new_id: int,
    name: str,
    properties: dict[str, Any],
    families: list[ColumnFamilySchema],
    data: dict[str, pa.Table],
    kinds: dict[str, str],
    plan: RestorePlan,
    io: FileIO,
    root: str,
) -> None:
    """Every column family in one RocksDB snapshot per partition, the schema file (v3) and
    operator metadata v2 pointing at it."""
    cf_ids = assign_cf_ids(families)
    internal = np.array(sorted(i for n, i in cf_ids.items() if n.startswith("$")))
    confs = sp.metadata.pinned_confs
    delimiter = b"" if confs.get(MERGE_OPERATOR_CONF) == "2" else b","
    pids = {
        name: partition_ids(t.column("key").combine_chunks(), plan.partitions)
        for name, t in data.items()
    }
    version = plan.batch + 1
    for p in range(plan.partitions):
        tables = {name: t.filter(pa.array(pids[name] == p)) for name, t in data.items()}
        keys, values = encode_operator_partition(
            tables,
            kinds,
            families,
            cf_ids,
            properties.get("timeMode", ""),
            delimiter,
            avro=confs.get(ENCODING_CONF) == "avro",
        )
        ids = read_le_int(keys, 0, 2) if len(keys) else np.zeros(0)
        unique_id = str(uuid.uuid4()) if plan.checkpoint_format == 2 else None
        _record_unique_id(plan, new_id, p, unique_id)
        write_rocksdb_snapshot(
            io,
            posixpath.join(root, "state", str(new_id), str(p)),
            version,
            keys,
            values,
            column_families=cf_ids,
            num_internal_keys=int(np.isin(ids, internal).sum()),
            unique_id=unique_id,
        )
    schema_path = posixpath.join(
        root, "state", str(new_id), "_stateSchema", "default", f"{plan.batch}_{uuid.uuid4()}"
    )
    io.write_atomic(schema_path, write_schema_file_v3(families))
    meta = {
        "operatorInfo": {"operatorId": new_id, "operatorName": name},
        "stateStoreInfo": [
            {
                "storeName": "default",
                "numColsPrefixKey": 0,
                "numPartitions": plan.partitions,
                "stateSchemaFilePaths": [_hadoop_url(io, schema_path, plan.scheme)],
            }
        ],
        "operatorPropertiesJson": json.dumps(properties, separators=(",", ":")),
    }
    io.write_atomic(
        posixpath.join(root, "state", str(new_id), "_metadata", "v2", str(plan.batch)),
        ("v2\n" + json.dumps(meta, separators=(",", ":"))).encode(),
    )


def _write_operator_metadata(
    io: FileIO, root: str, op_id: int, name: str, store_infos: list[dict[str, Any]]
) -> None:
    meta = {
        "operatorInfo": {"operatorId": op_id, "operatorName": name},
        "stateStoreInfo": store_infos,
    }
    io.write_atomic(
        posixpath.join(root, "state", str(op_id), "_metadata", "metadata"),
        ("v1\n" + json.dumps(meta, separators=(",", ":"))).encode(),
    )


def _write_empty_operator(
    sp: Savepoint, op: Operator, plan: RestorePlan, io: FileIO, root: str, codec: str
) -> None:
    """A new operator of the changed query: valid empty state at the version Spark loads,
    with the metadata and schemas Spark's planning of the query wrote."""
    if op.uses_column_families:
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
        _write_cf_state(
            sp, op.operator_id, op.name, op.properties, families, {}, {}, plan, io, root
        )
        return
    writer = _store_writer(plan, codec)
    empty = pa.array([], pa.large_binary())
    for desc in op.schemas:
        for p in range(plan.partitions):
            base = posixpath.join(root, "state", str(op.operator_id), str(p))
            store_dir = base if desc.name == "default" else posixpath.join(base, desc.name)
            _record_unique_id(plan, op.operator_id, p, writer(io, store_dir, empty, empty))
            if p == 0:
                io.write_atomic(
                    posixpath.join(store_dir, "_metadata", "schema"),
                    write_schema_file_v2(desc.key_schema, desc.value_schema),
                )
    _write_operator_metadata(
        io,
        root,
        op.operator_id,
        op.name,
        [
            {
                "storeName": d.name,
                "numColsPrefixKey": d.num_cols_prefix_key,
                "numPartitions": plan.partitions,
            }
            for d in op.schemas
        ],
    )


def _offset_text(offsets: dict[str, str | None], meta: dict[str, Any], version: int) -> str:
    """``offsets/N``: v1 lists offsets in source order; v2 (named sources, Spark 4.3's
    ``queryEvolution.enableSourceEvolution``) as ``name:offset`` lines."""
    lines = [f"v{version}", json.dumps(meta, separators=(",", ":"))]
    if version == 1:
        keys = sorted(offsets, key=int)
        lines += ["-" if offsets[k] is None else str(offsets[k]) for k in keys]
    else:
        lines += [f"{k}:{'-' if v is None else v}" for k, v in offsets.items()]
    return "\n".join(lines)


def _write_source_logs(io: FileIO, root: str, source_logs: dict[str, list[dict]]) -> None:
    """Re-create each file source log as Spark lays it out (compaction every 10 batches)."""
    for source, entries in source_logs.items():
        by_batch: dict[int, list[dict]] = {}
        for e in entries:
            by_batch.setdefault(int(e["batchId"]), []).append(e)
        if not by_batch:
            continue
        seen: list[dict] = []
        for b in range(max(by_batch) + 1):
            seen.extend(by_batch.get(b, []))
            compact = (b + 1) % FILE_SOURCE_COMPACT_INTERVAL == 0
            body = seen if compact else by_batch.get(b, [])
            name = f"{b}.compact" if compact else str(b)
            text = "\n".join(["v1", *(json.dumps(e, separators=(",", ":")) for e in body)])
            io.write_atomic(posixpath.join(root, "sources", source, name), text.encode())


def restore(
    savepoint: str,
    target: str,
    *,
    backend: str | None = None,
    partitions: int | None = None,
    mapping: dict[str, int] | None = None,
    allow_non_restored: bool = False,
    drop: list[str] | None = None,
    query: str | PlannedQuery | None = None,
    output_mode: str = "append",
    spark: Any = None,
    changelog: bool = False,
    checkpoint_format: int | None = None,
    dry_run: bool = False,
) -> RestorePlan:
    """Write a checkpoint at ``target`` from the savepoint (unless ``dry_run`` or a problem).

    ``query`` (``MODULE:FUNCTION`` or a :class:`PlannedQuery`) is the changed query: it is
    planned with Spark (``spark``, or a local session) to match state to its operators.
    """
    sp = Savepoint.open(savepoint)
    io, root = FileIO.for_url(target)
    if isinstance(query, str):
        chosen, n = choose_target(sp, backend, partitions)
        query = plan_query(
            query,
            output_mode=output_mode,
            confs=planning_confs(sp.metadata.pinned_confs, chosen, n),
            spark=spark,
        )
    plan = plan_restore(
        sp,
        io.url(root),
        backend,
        partitions,
        mapping or {},
        allow_non_restored,
        drop,
        query,
        "changelog" if changelog else "snapshot",
        checkpoint_format,
    )
    if plan.problems or dry_run:
        return plan
    _check_target(io, root)
    scheme, sep, _ = target.partition("://")
    plan.scheme = scheme if sep else ""
    m = sp.metadata
    if m.offset_log_version not in (1, 2):
        raise UnsupportedError(
            f"restoring offset log v{m.offset_log_version} is not supported", sp.url()
        )
    codec = normalize_codec(m.pinned_confs.get(CODEC_CONF, "lz4"))
    by_uid = {op.uid: op for op in m.operators}
    for uid, new_id in plan.restored.items():
        _write_operator(sp, by_uid[uid], new_id, plan, io, root, codec)
    for op_id in plan.started_empty:
        _write_empty_operator(sp, plan.query_operators[op_id], plan, io, root, codec)
    _write_source_logs(io, root, m.source_logs)
    confs = dict(m.pinned_confs)
    confs[PROVIDER_CONF] = PROVIDER_CLASSES[plan.backend]
    confs[PARTITIONS_CONF] = str(plan.partitions)
    # statectl writes plain rows; the restarted query keeps writing them.
    if confs.get(ROW_CHECKSUM_CONF) == "true":
        confs[ROW_CHECKSUM_CONF] = "false"
    meta = {
        "batchWatermarkMs": m.batch_watermark_ms,
        "batchTimestampMs": m.batch_timestamp_ms,
        "conf": confs,
        **m.offset_metadata_extra,  # e.g. v2's sourceMetadataInfo
    }
    io.write_atomic(
        posixpath.join(root, "metadata"),
        json.dumps({"id": m.query_id}, separators=(",", ":")).encode(),
    )
    b = m.batch_id
    if b > 0:
        io.write_atomic(
            posixpath.join(root, "offsets", str(b - 1)),
            _offset_text(m.previous_offsets or m.offsets, meta, m.offset_log_version).encode(),
        )
    io.write_atomic(
        posixpath.join(root, "offsets", str(b)),
        _offset_text(m.offsets, meta, m.offset_log_version).encode(),
    )
    commit: dict[str, Any] = {"nextBatchWatermarkMs": m.next_batch_watermark_ms}
    if plan.checkpoint_format == 2:
        commit["stateUniqueIds"] = {str(k): v for k, v in sorted(plan.unique_ids.items())}
    io.write_atomic(
        posixpath.join(root, "commits", str(b)),
        f"v{plan.checkpoint_format}\n{json.dumps(commit, separators=(',', ':'))}".encode(),
    )
    return plan

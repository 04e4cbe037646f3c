"""Use case ``restore``: write a Spark checkpoint from a savepoint, in either backend, at any
partition count, from which the query resumes at batch N+1 with exactly-once positions.

The savepoint is only read (Flink's NO_CLAIM). Every key is placed where Spark will look for
it, ``pmod(murmur3(key), partitions)``; the pinned confs are rewritten for the chosen backend
and partition count. State files are written first, the logs after them, ``commits/N`` last,
so an interrupted restore never looks like a finished checkpoint.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import functools
import json
import os
import posixpath
import re
import socket
import uuid
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa

from statectl import join_state
from statectl.backends.writers import (
    write_rocksdb_snapshot,
)
from statectl.cf_stream import EncodedRuns, encode_join_spilled, encode_spilled, fits
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
from statectl.codecs.unsaferow import encode_unsafe_rows
from statectl.engine import (
    Engine,
    StoreFormat,
    partition_spills,
    restore_stores,
    spill_dir,
)
from statectl.errors import MissingFileError, StatectlError
from statectl.evolution import (
    PartEvolution,
    Refused,
    TableEvolution,
    aggregation_format_conversion,
    apply_transform,
    evolve_table,
    group_state_format_conversion,
    grouping_key,
    load_transform,
    state_variable_value,
)
from statectl.in_progress import IN_PROGRESS_TOKEN, describe_in_progress, read_in_progress
from statectl.io import FileIO
from statectl.operators import (
    AGG_FORMAT_CONF,
    AGGREGATION,
    GROUP_STATE_FORMAT_CONF,
    JOIN_KINDS,
    SESSION_WINDOW,
    OperatorKind,
    classify,
)
from statectl.query_plan import PlannedQuery, plan_query, planning_confs
from statectl.savepoints.create import default_uid, logical_stores
from statectl.savepoints.format import (
    OperatorState,
    fingerprint_of,
    operator_fingerprint,
)
from statectl.savepoints.store import Savepoint, is_savepoint_dir
from statectl.schema_compat import difference, simple_string
from statectl.sources import SourcePositions, plan_positions, write_carried_sources
from statectl.state import read_le_int
from statectl.tws_encode import (
    TTL_INDEX,
    VERSION,
    TableEncoder,
    assign_cf_ids,
    concat_binary,
    encode_key,
    encode_operator_partition,
    ttl_problems,
    unsupported_families,
)

FILE_SOURCE_COMPACT_INTERVAL = 10
# A restore re-creates each file source log from its latest compaction on (as Spark's own log
# cleanup leaves it); more files than this means the savepoint's batch ids are not credible.
MAX_SOURCE_LOG_FILES = 1000
MAX_OPERATOR_ID = 2**31 - 1
MAX_BATCH_ID = 2**62
# Store, state variable and source names that become path components of the target.
SAFE_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.$=-]{0,254}")
# Where migrate keeps its temporary savepoint: inside the target, removed before it completes.
TMP_DIR = ".statectl-tmp"


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
    overwrite: bool = False  # the target is an interrupted statectl restore to replace
    # Stream-stream joins: the state format written (pinned as
    # spark.sql.streaming.join.stateFormatVersion), None without joins; what is converted.
    join_state_format: int | None = None
    # --aggregation-state-format / --group-state-format: the kind's format conf -> the state
    # format written (and pinned) for every operator of that kind; unasked: kept.
    state_formats: dict[str, int] = field(default_factory=dict)
    conversions: list[str] = field(default_factory=list)
    interrupted: dict[str, Any] | None = None  # what the interrupted restore's marker says
    # Every source of the restored query: kept / new / given / dropped
    # (statectl/sources/positions.py),
    # and the offset log and source logs written for them (None: the savepoint's as they are).
    sources: list[dict[str, Any]] = field(default_factory=list)
    positions: SourcePositions | None = field(default=None, repr=False, compare=False)
    # Schema evolution (statectl/evolution.py): uid -> store name -> how its rows change, and
    # one line per evolved field for the plan.
    evolutions: dict[str, dict[str, TableEvolution]] = field(default_factory=dict)
    evolved: list[str] = field(default_factory=list)
    # uid -> store name -> the query's (key, value) schemas where they differ from the
    # savepoint's in names or nullability only (the same bytes): written to the schema file,
    # since Spark refuses a stored non-nullable field the query plans nullable.
    query_schemas: dict[str, dict[str, tuple[str, str]]] = field(default_factory=dict)
    transforms: dict[str, str] = field(default_factory=dict)  # uid -> FILE.py:FUNCTION
    # What write_restore needs: the open savepoint and the target's filesystem and root.
    sp: Savepoint | None = field(default=None, repr=False, compare=False)
    io: FileIO | None = field(default=None, repr=False, compare=False)
    root: str = field(default="", repr=False, compare=False)
    started: bool = field(default=False, repr=False, compare=False)  # marker already written
    # The engine that writes the stores: local (memory, workers) or Spark's.
    engine: Any = field(default=None, repr=False, compare=False)
    # migrate: uid -> (checkpoint, batch, operator) of the operators whose stores are written
    # from the source's bytes (statectl/passthrough.py), not from the savepoint.
    passthrough: dict[str, tuple[Any, int, Operator]] = field(
        default_factory=dict, repr=False, compare=False
    )

    def rewrites(self, uid: str) -> bool:
        """The restore writes ``uid``'s rows otherwise than the savepoint has them: evolved,
        under the query's schemas, or transformed (join format conversion: ``conversions``)."""
        return bool(self.evolutions.get(uid)) or uid in self.query_schemas or uid in self.transforms

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
            "join_state_format": self.join_state_format,
            "aggregation_state_format": self.state_formats.get(AGG_FORMAT_CONF),
            "group_state_format": self.state_formats.get(GROUP_STATE_FORMAT_CONF),
            "conversions": self.conversions,
            "sources": self.sources,
            "engine": getattr(self.engine, "name", "local"),
            "evolved": self.evolved,
            "problems": self.problems,
            "ok": not self.problems,
        }


def choose_target(sp: Savepoint, backend: str | None, partitions: int | None) -> tuple[str, int]:
    """The backend and partition count to restore to: the arguments, else the savepoint's."""
    m = sp.metadata
    chosen = backend or m.source_checkpoint.get("backend") or HDFS
    if chosen not in (HDFS, ROCKSDB):
        raise StatectlError(f"--backend must be hdfs or rocksdb, not {chosen!r}")
    if partitions is not None:
        if partitions < 1:
            raise StatectlError(f"--partitions must be at least 1, got {partitions}")
        return chosen, partitions
    try:
        n = int(m.pinned_confs.get(PARTITIONS_CONF, 0)) or int(
            m.source_checkpoint.get("partitions") or 0
        )
    except (TypeError, ValueError):
        n = 0
    if n < 1:
        raise StatectlError(
            f"the savepoint records no valid partition count ({PARTITIONS_CONF}); pass --partitions",
            sp.url(),
        )
    return chosen, n


def _dedupe(names: list[tuple[int, str]]) -> dict[int, str]:
    """Twin fingerprints get -2, -3 in operator id order, as default uids do."""
    out: dict[int, str] = {}
    seen: dict[str, int] = {}
    for op_id, name in sorted(names):
        seen[name] = seen.get(name, 0) + 1
        out[op_id] = name if seen[name] == 1 else f"{name}-{seen[name]}"
    return out


def _evolve(
    plan: RestorePlan,
    uid: str,
    op: OperatorState,
    target: Operator,
    query: PlannedQuery,
    native: bool,
) -> list[str]:
    """The savepoint operator ``op`` restored into the query's ``target``: Spark's own schema
    rule first; where it refuses, schema evolution (recorded in the plan) or its field-level
    reason."""
    problems = _schema_problems(uid, op, target)
    if op.name not in (target.name, UNKNOWN_OPERATOR):
        return problems
    where = f"uid {uid} -> operator {target.operator_id} ({target.name})"
    if uid in plan.transforms:
        return _plan_transform(plan, uid, op, target, where, native)
    if native:
        return problems and [
            f"{where}: the query changed the state schema; a native savepoint is restored as "
            "it is: convert it first with statectl savepoint --type canonical SAVEPOINT"
        ]
    if op.column_families or any(t.kind not in ("store", "join-store") for t in op.tables):
        return _evolve_state_variables(plan, uid, op, target, problems, where)
    # Even where Spark's rule (names ignored) accepts the schema, aggregation buffers may have
    # changed owners ((count, sum) -> (max, count)), and renames belong in the plan.
    schemas = {s.name: s for s in logical_stores(target)[1]}
    evolutions: dict[str, TableEvolution] = {}
    notes = []
    format_ = op.kind.state_format(plan.sp.metadata.pinned_confs if plan.sp else {})
    for table in op.tables:
        desc = schemas.get(table.name)
        if desc is None:
            return problems
        store = "" if table.name == "default" else f" store {table.name!r}"
        try:
            evo = evolve_table(
                table.key_schema,
                table.value_schema,
                desc.key_schema,
                desc.value_schema,
                query.aggregates.get(target.operator_id),
                aggregation=op.kind is AGGREGATION,
                # The value repeats the grouping columns before the buffers.
                grouped=op.kind is SESSION_WINDOW or (op.kind is AGGREGATION and format_ == 1),
            )
        except Refused as e:
            # Spark's reason first (what the query changed), then why restore cannot bridge it.
            if not problems:
                return [f"{where}{store}: {e}"]
            return [f"{problems[0]}; restore cannot evolve it:{store} {e}", *problems[1:]]
        if evo.key is not None or evo.value is not None:
            evolutions[table.name] = evo
        if (table.key_schema, table.value_schema) != (desc.key_schema, desc.value_schema):
            plan.query_schemas.setdefault(uid, {})[table.name] = (
                desc.key_schema,
                desc.value_schema,
            )
        notes += [f"uid {uid}{store}: {n}" for n in evo.notes]
    if evolutions:
        plan.evolutions[uid] = evolutions
    plan.evolved += notes
    return []


# The column of a savepoint table that holds a state variable's value struct, by kind.
VALUE_COLUMNS = {"ValueState": "value", "ListState": "list_element", "MapState": "user_map_value"}


def _evolve_state_variables(
    plan: RestorePlan,
    uid: str,
    op: OperatorState,
    target: Operator,
    problems: list[str],
    where: str,
) -> list[str]:
    """transformWithState: the grouping key may be widened or renamed (every state variable,
    row counter, timer and TTL index re-keyed alike: :func:`statectl.evolution.grouping_key`),
    UnsafeRow or Avro; a state variable's value struct may gain fields (null), with or without
    TTL (the expiry kept), UnsafeRow or Avro. Everything else stays as Spark's rule wants it."""
    if not op.column_families:
        return problems
    stored_families = {cf["name"] for cf in op.column_families}
    schemas = {s.name: s for s in logical_stores(target)[1]}
    kinds = {t.name: t.kind for t in op.tables}

    def refused(what: str, reason: object, store: str | None = None) -> list[str]:
        # Spark's reason first (what the query changed), then why restore cannot bridge it.
        # A refused variable: only Spark's complaints about it (the others would evolve).
        own = [p for p in problems if store is None or f"store {store!r}" in p] or problems
        if not own:
            return [f"{where} {what}: {reason}"]
        return [f"{own[0]}; restore cannot evolve it: {what}: {reason}", *own[1:]]

    try:
        key, notes = grouping_key(
            {cf["name"]: cf["key_schema"] for cf in op.column_families},
            {name: s.key_schema for name, s in schemas.items()},
            kinds,
        )
    except Refused as e:
        return refused("grouping key", e)
    notes = [f"uid {uid}: {n}" for n in notes]
    evolutions = {}
    for table in op.tables:
        desc = schemas.get(table.name)
        if desc is None or table.kind not in VALUE_COLUMNS:
            if table.kind == "timers":
                if key is not None:
                    evolutions[table.name] = TableEvolution(key=key)
                continue
            return problems
        what = f"state variable {table.name!r}"
        try:
            # A TTL'd value evolves inside Spark's TTL wrapper, its expiry kept. UnsafeRow or
            # Avro, the rows are re-encoded in the query's schema (the schema file says so),
            # so Spark 4.3 finds its own schema and evolves nothing itself.
            value, changes = state_variable_value(
                table.value_schema,
                desc.value_schema,
                stored_ttl=TTL_INDEX + table.name in stored_families,
                query_ttl=TTL_INDEX + table.name in schemas,
            )
        except Refused as e:
            return refused(what, e, table.name)
        if value is not None or key is not None:
            evolutions[table.name] = TableEvolution(key=key, value=value)
        notes += [f"uid {uid} state variable {table.name!r}: {n}" for n in changes]
    if evolutions:
        plan.evolutions[uid] = evolutions
    plan.evolved += notes
    return []


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


def _plan_transform(
    plan: RestorePlan, uid: str, op: OperatorState, target: Operator, where: str, native: bool
) -> list[str]:
    """``--transform UID=FILE.py:FUNCTION``: the user's function makes the query's rows."""
    spec = plan.transforms[uid]
    if (
        native
        or op.column_families
        or any(t.kind not in ("store", "join-store") for t in op.tables)
    ):
        return [f"{where}: --transform works on canonical savepoints of store operators only"]
    try:
        load_transform(spec)
    except StatectlError as e:
        return [f"{where}: {e}"]
    schemas = {s.name: s for s in logical_stores(target)[1]}
    evolutions = {}
    for table in op.tables:
        desc = schemas.get(table.name)
        if desc is None:
            return [f"{where}: the query has no store {table.name!r}"]
        evolutions[table.name] = TableEvolution(
            PartEvolution(desc.key_schema, []),
            PartEvolution(desc.value_schema, []),
            transform=spec,
        )
        store = "" if table.name == "default" else f" store {table.name!r}"
        plan.evolved.append(
            f"uid {uid}{store}: rows transformed by {spec}, checked against the query's "
            f"{simple_string(json.loads(desc.key_schema))} / "
            f"{simple_string(json.loads(desc.value_schema))}"
        )
    plan.evolutions[uid] = evolutions
    return []


def _schema_problems(uid: str, op: OperatorState, target: Operator) -> list[str]:
    where = f"uid {uid} -> operator {target.operator_id}"
    if op.name not in (target.name, UNKNOWN_OPERATOR):
        return [
            f"{where}: the savepoint holds {op.name} state, the query's operator is {target.name}"
        ]
    problems = []
    for table in op.tables:
        # A join at state format 3/4 is compared as format 2's stores (what savepoints hold).
        schemas = logical_stores(target)[1]
        # transformWithState's timers table is its key-to-timestamp column family.
        names = (
            {f"${mode}Timers_keyToTimestamp" for mode in ("event", "proc")}
            if table.kind == "timers"
            else {table.name}
        )
        desc = next((s for s in schemas if s.name in names), None)
        if desc is None:
            problems.append(
                f"{where} ({op.name}): the query has no store {table.name!r} "
                f"(it has {', '.join(s.name for s in schemas)})"
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


def _local_real(io: FileIO, path: str) -> str:
    """A path to compare containment with: symlinks resolved on the local filesystem."""
    if io.protocol == "file":
        return os.path.realpath(path)
    return posixpath.normpath(path)


def _inside(io: FileIO, path: str, parent: str) -> bool:
    a, b = _local_real(io, path), _local_real(io, parent)
    return a == b or a.startswith(b.rstrip("/") + "/")


def _enclosing_state_dir(io: FileIO, root: str, levels: int = 8) -> tuple[str, str] | None:
    """The Spark checkpoint or statectl savepoint a target would be written into, if any
    (whatever the savepoint records: writing inside either would corrupt or be deleted with
    it)."""
    path = posixpath.dirname(root.rstrip("/"))
    for _ in range(levels):
        if not path or path == "/":
            return None
        if is_savepoint_dir(io, path):
            return "savepoint", path
        if io.exists(posixpath.join(path, "offsets")) and io.exists(
            posixpath.join(path, "metadata")
        ):
            return "Spark checkpoint", path
        parent = posixpath.dirname(path)
        if parent == path:
            return None
        path = parent
    return None


def target_problems(
    io: FileIO, root: str, overwrite: bool, sources: list[tuple[str, FileIO, str]]
) -> tuple[list[str], dict[str, Any] | None]:
    """Why ``root`` cannot be written (empty list: it can), and the interrupted restore's
    marker if it is one. ``sources`` are (what, io, path) the target must not be inside."""
    url = io.url(root)
    for what, src_io, src in sources:
        if src_io.protocol == io.protocol and _inside(io, root, src):
            return [
                f"{url}: the target is inside the {what} {src_io.url(src)}; choose a "
                "directory outside it"
            ], None
    enclosing = _enclosing_state_dir(io, root)
    if enclosing is not None:
        return [
            f"{url}: the target is inside the {enclosing[0]} {io.url(enclosing[1])}; choose a "
            "directory outside it"
        ], None
    if not io.exists(root):
        return [], None
    if not io.is_dir(root):
        return [f"{url}: the target exists and is a file; choose a new directory"], None
    if not io.list_dir(root):
        return [], None
    marker = read_in_progress(io, root)
    if marker is not None:
        if overwrite:
            return [], marker
        return [
            f"{url}: the target is an unfinished restore ({describe_in_progress(marker)}); "
            "pass --overwrite to replace it, once no statectl is writing it"
        ], marker
    kind = (
        "a Spark checkpoint"
        if io.exists(_under(root, "offsets")) or io.exists(_under(root, "commits"))
        else "a statectl savepoint"
        if is_savepoint_dir(io, root)
        else "not empty"
    )
    return [
        f"{url}: the target exists and is {kind}; refusing to overwrite it (--overwrite "
        "replaces only an interrupted statectl restore); choose a new directory"
    ], None


def _valid_id(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool) and 0 <= x <= MAX_OPERATOR_ID


def _safe_name(x: Any) -> bool:
    return isinstance(x, str) and SAFE_NAME.fullmatch(x) is not None


def source_log_layout(entries: list[dict], previous_offset: int | None) -> list[tuple[str, list]]:
    """The files of one file source log, as Spark leaves them: from the latest compaction at or
    before the first batch a restart may re-read, then every later batch (compactions as
    ``N.compact`` with all entries so far). Spark reads older batches from a compaction."""
    by_batch: dict[int, list[dict]] = {}
    for e in entries:
        by_batch.setdefault(int(e["batchId"]), []).append(e)
    if not by_batch:
        return []
    last = max(by_batch)
    # A restart re-plans the last batch: its range starts after the previous batch's offset.
    need = last if previous_offset is None else max(0, min(last, previous_offset + 1))
    first = (need + 1) // FILE_SOURCE_COMPACT_INTERVAL * FILE_SOURCE_COMPACT_INTERVAL - 1
    first = max(first, 0)
    files = []
    for b in range(first, last + 1):
        compact = (b + 1) % FILE_SOURCE_COMPACT_INTERVAL == 0
        if compact:
            body = [e for k in sorted(by_batch) if k <= b for e in by_batch[k]]
        else:
            body = by_batch.get(b, [])
        files.append((f"{b}.compact" if compact else str(b), body))
    return files


def _log_offset(text: str | None) -> int | None:
    try:
        v = json.loads(text or "null")["logOffset"]
    except (TypeError, KeyError, ValueError):
        return None
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def _safety_problems(m: Any, mapping: dict[str, int]) -> list[str]:
    """Everything from the savepoint that becomes a path or a file count in the target: ids are
    non-negative ints, names are plain path components, batch ids are credible."""
    problems = []
    if not _valid_id(m.batch_id) or m.batch_id > MAX_BATCH_ID:
        problems.append(f"_metadata: batch_id {m.batch_id!r} is not a non-negative integer")
        return problems
    if m.offset_log_version not in (1, 2):
        problems.append(
            f"restoring offset log v{m.offset_log_version} is not supported (v1 and v2 are)"
        )
    for op in m.operators:
        if not _valid_id(op.operator_id):
            problems.append(
                f"_metadata: operator {op.uid!r} has operator_id {op.operator_id!r}, not a "
                "non-negative integer"
            )
        for t in op.tables:
            # Store names become directories; transformWithState variables live in one store.
            if not op.column_families and not _safe_name(t.name):
                problems.append(
                    f"_metadata: operator {op.uid!r} has a table named {t.name!r}, which is not "
                    "a plain file name"
                )
    for uid, op_id in mapping.items():
        if not _valid_id(op_id):
            problems.append(f"--map {uid}={op_id}: operator ids are integers from 0")
    for source, entries in (m.source_logs or {}).items():
        if not _safe_name(source):
            problems.append(f"_metadata: source log name {source!r} is not a plain file name")
            continue
        if not isinstance(entries, list) or not all(isinstance(e, dict) for e in entries):
            problems.append(f"_metadata: source log {source!r} is not a list of entries")
            continue
        ids = [e.get("batchId") for e in entries]
        bad = [b for b in ids if not _valid_id(b) or b > m.batch_id]
        if bad:
            problems.append(
                f"_metadata: source log {source!r} has batchId {bad[0]!r}; a file source's "
                f"batch ids are integers from 0 to the savepoint's batch {m.batch_id}"
            )
            continue
        prev = _log_offset((m.previous_offsets or {}).get(source))
        if entries:
            n = len(source_log_layout(entries, prev))
            if n > MAX_SOURCE_LOG_FILES:
                problems.append(
                    f"_metadata: source log {source!r} would need {n} log files (batchId "
                    f"{max(ids)}, previous offset {prev}); refusing more than "
                    f"{MAX_SOURCE_LOG_FILES}"
                )
    return problems


def _schema_changed(
    op: OperatorState, candidates: dict[int, Operator], taken: set[int]
) -> Operator | None:
    """The query operator that is this savepoint operator with a changed schema: the same kind
    with the same store names (or the same operator id), not already restored into."""
    for qop in sorted(candidates.values(), key=lambda o: o.operator_id != op.operator_id):
        if qop.operator_id in taken:
            continue
        same_kind = op.name in (qop.name, UNKNOWN_OPERATOR)
        same_stores = sorted(
            t.name for t in op.tables if t.kind in ("store", "join-store")
        ) == sorted(logical_stores(qop)[0]) or (
            op.column_families is not None and qop.uses_column_families
        )
        if same_kind and (same_stores or qop.operator_id == op.operator_id):
            return qop
    return None


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
    *,
    overwrite: bool = False,
    source: str | None = None,
    own_target: bool = False,
    join_state_format: int | None = None,
    source_offsets: dict[str, str] | None = None,
    transforms: dict[str, str] | None = None,
    aggregation_state_format: int | None = None,
    group_state_format: int | None = None,
) -> RestorePlan:
    """Every check the restore makes, nothing written: which uid goes to which operator id,
    what is dropped or started empty, and what is wrong (``problems``; empty means
    :func:`write_restore` will write it).

    A uid goes to ``--map``'s operator id, else (with ``--query``) to the query's operator with
    the same fingerprint (what it is, not where it sits: ids shift when operators are added or
    removed), else to the id it had. State with no operator to go to is an error unless ``-n``;
    state whose operator is still there with another schema is an error either way.

    ``source`` is the checkpoint the savepoint was taken from (migrate), ``own_target`` says
    the caller already marked the target in progress (migrate). ``source_offsets`` (source
    index or description -> offset JSON, ``-`` for the configured start) positions sources;
    with ``query`` the sources are matched to the query's (statectl/sources/positions.py).
    """
    m = sp.metadata
    chosen, n = choose_target(sp, backend, partitions)
    io, root = FileIO.for_url(target)
    scheme, sep, _ = target.partition("://")
    plan = RestorePlan(
        sp.url(),
        io.url(root),
        chosen,
        n,
        m.batch_id,
        query=query.spec if query else None,
        rocksdb_layout=rocksdb_layout,
        scheme=scheme if sep else "",
        overwrite=overwrite,
        sp=sp,
        io=io,
        root=root,
        started=own_target,
        transforms=dict(transforms or {}),
    )
    if plan.transforms and query is None:
        plan.problems.append("--transform needs --query: it is checked against the query's schemas")
    if not own_target:
        inside = [("savepoint", sp.io, sp.root)]
        recorded = (
            m.source_checkpoint.get("path") if isinstance(m.source_checkpoint, dict) else None
        )
        for what, url in (("source checkpoint", source), ("source checkpoint", recorded)):
            if isinstance(url, str) and url:
                src_io, src_root = FileIO.for_url(url)
                inside.append((what, src_io, src_root))
        problems, plan.interrupted = target_problems(io, root, overwrite, inside)
        plan.problems += problems
    plan.problems += _safety_problems(m, mapping)
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
    for flag, names in (
        ("--map", sorted(mapping)),
        ("--drop", sorted(drop or [])),
        ("--transform", sorted(plan.transforms)),
    ):
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
    by_uid = {op.uid: op for op in m.operators}
    changed: set[int] = set()
    if query is not None:
        # Not gone, changed: an operator of the same kind and stores (or id) is still in the
        # query, with another schema. Dropping its state (-n) is not the fix, so not offered.
        taken = set(plan.restored.values())
        for uid in [u for u in unmatched if u not in (drop or [])]:
            qop = _schema_changed(by_uid[uid], plan.query_operators, taken)
            if qop is None:
                continue
            native = m.savepoint_type == "native"
            reasons = _evolve(plan, uid, by_uid[uid], qop, query, native)
            if not reasons:
                plan.restored[uid] = qop.operator_id  # renamed or evolved: restored
                taken.add(qop.operator_id)
                unmatched.remove(uid)
                continue
            reasons = reasons or [
                f"uid {uid} -> operator {qop.operator_id} ({qop.name}): the state's stores or "
                "schemas differ from the query's"
            ]
            for r in reasons:
                plan.problems.append(
                    f"{r}; the query changed this operator's state schema, which Spark cannot "
                    f"read the savepoint's state with: keep the schema, or discard the state "
                    f"deliberately with --drop {uid} -n"
                )
            taken.add(qop.operator_id)
            changed.add(qop.operator_id)
            unmatched.remove(uid)
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
        for uid, op_id in plan.restored.items():
            if op_id not in plan.query_operators:
                plan.problems.append(
                    f"uid {uid} maps to operator {op_id}, which the query does not have "
                    f"(its operators: {', '.join(f'{i} {o.name}' for i, o in sorted(plan.query_operators.items()))})"
                )
            elif uid not in plan.evolutions and m.savepoint_type != "native":
                target_op = plan.query_operators[op_id]
                _name_from_query(by_uid[uid], target_op)
                plan.problems += _evolve(plan, uid, by_uid[uid], target_op, query, False)
        for op_id, qop in sorted(plan.query_operators.items()):
            if op_id not in ids and op_id not in changed:
                plan.started_empty[op_id] = qop.name
                if qop.uses_column_families and (chosen != ROCKSDB or rocksdb_layout != "snapshot"):
                    plan.problems.append(
                        f"operator {op_id} ({qop.name}, transformWithState) starts empty only "
                        "on RocksDB snapshots (--backend rocksdb, no --changelog)"
                    )
    for op in m.operators:
        if op.uid in plan.restored and (refusal := op.kind.refusal(f"uid {op.uid} ({op.name})")):
            plan.problems.append(refusal)
    if m.savepoint_type != "native":
        plan.positions = plan_positions(
            m,
            query.sources if query is not None else None,
            source_offsets or {},
            allow_non_restored,
        )
        plan.sources = plan.positions.report
        plan.problems += plan.positions.problems
    elif source_offsets:
        plan.problems.append(
            "a native savepoint keeps its source offsets; convert it first: statectl "
            "savepoint --type canonical SAVEPOINT"
        )
    formats = {
        AGG_FORMAT_CONF: aggregation_state_format,
        GROUP_STATE_FORMAT_CONF: group_state_format,
    }
    for conf, asked in formats.items():
        if asked not in (None, 1, 2):
            raise StatectlError(f"{FORMAT_FLAGS[conf][0]} must be 1 or 2, not {asked}")
    if m.savepoint_type == "native":
        for flag, asked in (
            ("join", join_state_format),
            ("aggregation", aggregation_state_format),
            ("flatMapGroupsWithState", group_state_format),
        ):
            if asked is not None:
                plan.problems.append(
                    f"a native savepoint keeps its {flag} state format; convert it first: "
                    "statectl savepoint --type canonical SAVEPOINT"
                )
        plan.problems += _native_problems(plan, m)
        return plan
    _plan_join_format(plan, m, join_state_format)
    for conf, asked in formats.items():
        _plan_state_format(plan, m, conf, asked, query is not None)
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
                f"{what}: internal column families {', '.join(bad)} cannot be restored yet"
            )
        else:
            plan.problems += [
                f"{what}: {p}"
                for p in ttl_problems(
                    (cf["name"] for cf in op.column_families),
                    {t.name: t.kind for t in op.tables},
                    {cf["name"]: cf.get("value_schema") for cf in op.column_families},
                )
            ]
    return plan


def _join_formats_supported(plan: RestorePlan) -> tuple[int, ...]:
    """Join state formats this restore can write: Spark runs 3 and 4 on RocksDB only, and
    statectl writes column families as RocksDB snapshots only."""
    if plan.backend == ROCKSDB and plan.rocksdb_layout == "snapshot":
        return join_state.FORMATS
    return (1, 2)


# Kinds with two state formats Spark pins per query and statectl converts between (joins have
# their own planner): format conf -> (the flag, what the operators are).
FORMAT_FLAGS: dict[str, tuple[str, str]] = {
    AGG_FORMAT_CONF: ("--aggregation-state-format", "streaming aggregation"),
    GROUP_STATE_FORMAT_CONF: (
        "--group-state-format",
        "flatMapGroupsWithState / applyInPandasWithState",
    ),
}
_FORMAT_NOTES = {
    (AGG_FORMAT_CONF, 2): "the grouping columns leave the value",
    (AGG_FORMAT_CONF, 1): "the value repeats the grouping columns",
    (GROUP_STATE_FORMAT_CONF, 2): "the state's fields nest in groupState",
    (GROUP_STATE_FORMAT_CONF, 1): "the state's fields leave groupState",
}


def _format_conversion(conf: str, table: Any, source: int, target: int) -> PartEvolution:
    if conf == AGG_FORMAT_CONF:
        return aggregation_format_conversion(table.key_schema, table.value_schema, source, target)
    return group_state_format_conversion(table.value_schema, source, target)


def _plan_state_format(
    plan: RestorePlan, m: Any, conf: str, requested: int | None, with_query: bool
) -> None:
    """``--aggregation-state-format`` / ``--group-state-format``: every restored operator
    whose kind reads ``conf`` (one pin for the whole query) is written at ``requested``; one
    at another format is converted and the plan says so."""
    if requested is None:
        return
    flag, what_kind = FORMAT_FLAGS[conf]
    ops = [
        op
        for op in m.operators
        if op.uid in plan.restored and not op.column_families and op.kind.format_conf == conf
    ]
    if not ops:
        plan.problems.append(f"{flag}: the restore has no {what_kind} operator to convert")
        return
    plan.state_formats[conf] = requested
    for op in ops:
        source = op.kind.state_format(m.pinned_confs) or 2
        if source == requested:
            continue
        what = f"uid {op.uid} ({op.name})"
        if with_query or op.uid in plan.evolutions or op.uid in plan.transforms:
            plan.problems.append(
                f"{flag}: {what} would be converted and changed in one restore; convert it in "
                "a restore without --query / --transform, then restore that checkpoint's "
                "savepoint with them"
            )
            continue
        evolutions = {}
        for table in op.tables:
            try:
                evolutions[table.name] = TableEvolution(
                    value=_format_conversion(conf, table, source, requested)
                )
            except Refused as e:
                plan.problems.append(f"{flag}: {what} store {table.name}: {e}")
        plan.evolutions[op.uid] = evolutions
        plan.conversions.append(
            f"{what}: {what_kind} state format {source} -> {requested} "
            f"({_FORMAT_NOTES[conf, requested]})"
        )


def _plan_join_format(plan: RestorePlan, m: Any, requested: int | None) -> None:
    """Choose the join state format (``--join-state-format``, else the savepoint's when the
    target supports it, else 2) and say in the plan what is converted."""
    joins = [
        op
        for op in m.operators
        if op.uid in plan.restored and not op.column_families and op.kind in JOIN_KINDS
    ]
    if requested is not None and requested not in (2, 3, 4):
        raise StatectlError(f"--join-state-format must be 2, 3 or 4, not {requested}")
    if not joins:
        if requested is not None:
            plan.problems.append(
                "--join-state-format: the restore has no stream-stream join to convert"
            )
        return
    pinned = join_state.pinned_format(m.pinned_confs)
    sources = {op.uid: op.state_format or pinned for op in joins}
    supported = _join_formats_supported(plan)
    where = (
        "HDFS"
        if plan.backend == HDFS
        else "RocksDB changelog checkpoints (--changelog)"
        if plan.backend == ROCKSDB and plan.rocksdb_layout != "snapshot"
        else plan.backend
    )
    if requested is not None:
        target = requested
        if target not in supported:
            plan.problems.append(
                f"--join-state-format {target}: join state formats 3 and 4 keep the join in "
                f"RocksDB column families, which {where} cannot hold (Spark runs them on RocksDB "
                "only; statectl writes them as RocksDB snapshots); use --backend rocksdb "
                "without --changelog, or --join-state-format 2"
            )
    else:
        kept = set(sources.values())
        target = kept.pop() if len(kept) == 1 else 2
        if target not in supported:
            plan.conversions.append(
                f"join state format {target} cannot be written to {where}: restoring at "
                "format 2 (pass --join-state-format to choose)"
            )
            target = 2
    plan.join_state_format = target
    if target == 4 and m.pinned_confs.get(MERGE_OPERATOR_CONF) != "2":
        plan.conversions.append(
            "RocksDB merge operator version 1 -> 2: Spark runs join state format 4 only with "
            "version 2, and reads a checkpoint that pins none as version 1"
        )
    for op in joins:
        src = sources[op.uid]
        if src == target:
            plan.conversions.append(f"uid {op.uid}: join state format {src}, kept")
            continue
        if 1 in (src, target):
            plan.problems.append(
                f"uid {op.uid}: join state format 1 has no matched flags; it converts to no "
                "other format (and none to it)"
            )
            continue
        plan.conversions.append(f"uid {op.uid}: join state format {src} -> {target}")
        if target == 4:
            for t in op.tables:
                if t.name.endswith("keyWithIndexToValue"):
                    try:
                        join_state.event_time_column(t.value_schema)
                    except StatectlError as e:
                        plan.problems.append(f"uid {op.uid} ({t.name}): {e}")
    if m.pinned_confs.get(ENCODING_CONF) == "avro":
        # Spark 4.3 refuses the query itself ("State store encoding format as avro is not
        # supported for operator=join"), whatever the join state format: no Spark wrote this.
        plan.problems.append(
            f"the savepoint pins {ENCODING_CONF}=avro beside a stream-stream join, which Spark "
            "refuses to run (Avro state encoding is not supported for joins); the savepoint was "
            "not written by Spark as it is: take it again from the original checkpoint"
        )


def _native_problems(plan: RestorePlan, m: Any) -> list[str]:
    """A native savepoint is a copy of Spark's own files: it restores as it is (same backend,
    partition count and layout, every operator at its id) or is converted first."""
    src = m.source_checkpoint
    convert = "convert it first: statectl savepoint --type canonical SAVEPOINT"
    problems = []
    if plan.backend != src.get("backend") or plan.partitions != src.get("partitions"):
        problems.append(
            f"a native savepoint restores only to its own backend and partition count "
            f"({src.get('backend')}, {src.get('partitions')} partitions); {convert}"
        )
    moved = {u: i for u, i in plan.restored.items() if m.operator(u).operator_id != i}
    if moved or plan.dropped or plan.started_empty:
        problems.append(
            "a native savepoint restores every operator at its own id; to move, drop or add "
            f"operators, {convert}"
        )
    if plan.checkpoint_format != int(src.get("checkpoint_format_version") or 1):
        problems.append(f"a native savepoint keeps its checkpoint format; {convert}")
    for op in m.operators:
        for t in op.tables:
            for f in t.files:
                if not _safe_rel(f.path):
                    problems.append(
                        f"_metadata: data file path {f.path!r} is not inside the savepoint"
                    )
    for f in m.native_logs or []:
        if not _safe_rel(f.path):
            problems.append(f"_metadata: log file path {f.path!r} is not inside the savepoint")
    return problems


def _safe_rel(path: Any) -> bool:
    """A path relative to the savepoint under its embedded ``checkpoint/``, without ``..``."""
    if not isinstance(path, str) or path.startswith("/") or "\\" in path:
        return False
    parts = path.split("/")
    return (
        len(parts) > 1 and parts[0] == "checkpoint" and all(p not in ("", ".", "..") for p in parts)
    )


def _under(root: str, *parts: str) -> str:
    """A path of the target: every path a restore writes goes through here and must stay
    inside the target (names were validated when planning; this is the last guard)."""
    path = posixpath.join(root, *parts)
    norm, base = posixpath.normpath(path), posixpath.normpath(root)
    if not (norm == base or norm.startswith(base.rstrip("/") + "/")) or "/../" in f"/{path}/":
        raise StatectlError("refusing to write outside the target", path)
    return path


def _store_format(plan: RestorePlan, codec: str) -> StoreFormat:
    """How each store partition is written at version N+1."""
    return StoreFormat(
        plan.backend,
        plan.rocksdb_layout if plan.backend == ROCKSDB else "snapshot",
        plan.batch + 1,
        codec,
        unique_ids=plan.checkpoint_format == 2,
    )


def _store_writer(
    plan: RestorePlan, codec: str
) -> Callable[[FileIO, str, pa.Array, pa.Array], str | None]:
    """Writes one store partition's UnsafeRow keys and values at version N+1; returns the
    unique id the files carry (checkpoint format 2) or None."""
    return _store_format(plan, codec).write


def _encode_store(
    backend: str, kind: OperatorKind, key: pa.StructArray, value: pa.StructArray, table: Any
) -> tuple[pa.Array, pa.Array]:
    """A store's keys and values as the backend keeps them. HDFS: UnsafeRows (the whole key,
    prefix or not). RocksDB: Spark 4's encoding-version byte in front of key and value, and a
    key with ``numColsPrefixKey > 0`` prefix-encoded as Spark's PrefixKeyScanStateEncoder
    does (``int32 LE len ‖ 0x00 prefix row ‖ 0x00 remaining row``)."""
    k = encode_unsafe_rows(key, json.loads(table.key_schema))
    v = encode_unsafe_rows(value, json.loads(table.value_schema))
    if backend == HDFS:
        return k, v
    prefix = kind.prefix_columns(table.key_schema)
    if prefix:
        spec = {"keyStateEncoderType": "PrefixKeyScanStateEncoderSpec", "numColsPrefixKey": prefix}
        family = ColumnFamilySchema(table.name, table.key_schema, table.value_schema, 0, 0, spec)
        return encode_key(key, family), concat_binary(VERSION, v)
    return concat_binary(VERSION, k), concat_binary(VERSION, v)


def _evolved_rows(evolutions: dict[str, TableEvolution], table: Any, rows: pa.Table) -> pa.Table:
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
    """Encoded with the schemas :func:`target_schemas` chose (the rows were converted by
    :func:`_evolved_rows`). Plain data, no plan: the Spark engine ships it to executors."""
    key_schema, value_schema = schemas[table.name]
    table = dataclasses.replace(table, key_schema=key_schema, value_schema=value_schema)
    return _encode_store(backend, kind, key, value, table)


def target_schemas(plan: RestorePlan, uid: str, table: Any) -> tuple[str, str]:
    """The key and value schemas a restored store (a join's at any state format) is written
    with: the query's wherever the plan has them, evolved or the same bytes under other names
    or nullability (which Spark's schema check may refuse as stored), else the savepoint's.
    The one owner: the schema files, the column families and the encoders all ask here."""
    planned = plan.query_schemas.get(uid, {}).get(table.name)
    if planned is not None:
        return planned
    evo = plan.evolutions.get(uid, {}).get(table.name)
    key = evo.key.new_schema if evo and evo.key else table.key_schema
    value = evo.value.new_schema if evo and evo.value else table.value_schema
    return key, value


def _record_unique_id(plan: RestorePlan, op_id: int, partition: int, uid: str | None) -> None:
    if uid is not None:
        parts = plan.unique_ids.setdefault(op_id, [[] for _ in range(plan.partitions)])
        parts[partition].append(uid)


def _restore_stores(
    sp: Savepoint,
    op: OperatorState,
    plan: RestorePlan,
    io: FileIO,
    codec: str,
    store_dir: Callable[[str, int], str],
    evolutions: dict[str, TableEvolution],
) -> list[list[tuple[int, str | None]]]:
    """The local engine: bounded memory, every core (statectl/engine.py). Keys go where the
    operator kind places them, encoded as the backend keeps them (:func:`_encode_store`)."""
    kind = op.kind
    return restore_stores(
        sp,
        op.tables,
        kind.partitions_of,
        plan.partitions,
        _store_format(plan, codec),
        io,
        store_dir,
        plan.engine or Engine.of(),
        encoder=functools.partial(
            _evolved_encode,
            plan.backend,
            {t.name: target_schemas(plan, op.uid, t) for t in op.tables},
            kind,
        ),
        # Spark runs a single-partition operator in one task and never creates the others.
        only=[0] if kind.single_partition else None,
        convert=functools.partial(_evolved_rows, evolutions) if evolutions else None,
    )


def _write_raw_operator(
    raw: tuple[Any, int, Operator],
    plan: RestorePlan,
    io: FileIO,
    codec: str,
    store_dir: Callable[[str, int], str],
) -> tuple[list[list[tuple[int, str | None]]], dict[str, int]]:
    """:func:`_restore_stores` from the source checkpoint's bytes (migrate's pass-through)."""
    from statectl.passthrough import restore_raw_stores

    ckpt, batch, source_op = raw
    return restore_raw_stores(
        ckpt,
        source_op,
        batch,
        plan.partitions,
        _store_format(plan, codec),
        io,
        store_dir,
        plan.engine,
        only=[0] if source_op.kind.single_partition else None,
    )


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
    if op.kind in JOIN_KINDS and plan.join_state_format in join_state.COLUMN_FAMILY_FORMATS:
        return _write_join_families(sp, op, new_id, plan, io, root)
    kind = op.kind
    store_infos = []

    def store_dir(table: str, p: int) -> str:
        base = _under(root, "state", str(new_id), str(p))
        return base if table == "default" else posixpath.join(base, table)

    evolutions = plan.evolutions.get(op.uid, {})
    raw = plan.passthrough.get(op.uid)
    if raw is not None:
        built, rows_written = _write_raw_operator(raw, plan, io, codec, store_dir)
    else:
        built = _restore_stores(sp, op, plan, io, codec, store_dir, evolutions)
        rows_written = {t.name: sum(f.rows for f in t.files) for t in op.tables}
    for table, ids in zip(op.tables, built, strict=True):
        for p, unique_id in ids:
            _record_unique_id(plan, new_id, p, unique_id)
        key_schema, value_schema = target_schemas(plan, op.uid, table)
        io.write_atomic(
            posixpath.join(store_dir(table.name, 0), "_metadata", "schema"),
            write_schema_file_v2(key_schema, value_schema),
        )
        prefix = kind.prefix_columns(key_schema)
        # numPartitions is the shuffle partition count even for a one-task operator (Spark's
        # StatefulOperatorStateInfo.numPartitions), as Spark records it.
        store_infos.append(
            {"storeName": table.name, "numColsPrefixKey": prefix, "numPartitions": plan.partitions}
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
    """transformWithState from the savepoint: its tables and its column families, evolved to
    the query's schemas where the plan says so."""
    evolutions = plan.evolutions.get(op.uid, {})
    # A re-keyed operator takes every family's key schema from the query's plan (checked when
    # planning): what Spark's own schema check compares the query with.
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
    kinds = {t.name: t.kind for t in op.tables}
    convert = functools.partial(_evolved_cf_rows, evolutions, kinds) if evolutions else None
    _write_cf_state(sp, op, new_id, families, kinds, convert, plan, io, root)
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
    io: FileIO,
    root: str,
) -> None:
    """transformWithState: every column family in one RocksDB snapshot per partition, each row
    placed by its (converted) key. A partition is encoded whole when it fits the budget, else a
    chunk at a time through sorted runs on disk (statectl/cf_stream.py); the Spark engine hands
    each partition over whole."""
    cf_ids = assign_cf_ids(families)
    encode = _tws_partition_encoder(plan, sp, op.properties, families, cf_ids, kinds)
    engine = plan.engine or Engine.of()
    place = op.kind.partitions_of
    internal = np.array(sorted(i for n, i in cf_ids.items() if n.startswith("$")))

    def entries() -> Iterator[tuple[int, tuple[pa.Array, pa.Array] | EncodedRuns]]:
        for p, spilled in partition_spills(
            sp, op.tables, place, plan.partitions, engine, convert=convert
        ):
            if fits(spilled, engine.per_task):
                yield p, encode({name: t.read() for name, t in spilled.items()})
                continue
            with spill_dir() as scratch:
                encoder = encode.encoder()
                yield p, encode_spilled(spilled, kinds, encoder, internal, scratch, engine.per_task)

    _write_cf_files(new_id, op.name, op.properties, families, cf_ids, entries(), plan, io, root)


def _write_join_families(
    sp: Savepoint, op: OperatorState, new_id: int, plan: RestorePlan, io: FileIO, root: str
) -> dict[str, int]:
    """A join at state format 3 or 4 from the savepoint's format 2 tables: the column families
    Spark registers for that format, keys placed by the join key (statectl/join_state.py)."""
    fmt = plan.join_state_format
    assert fmt in join_state.COLUMN_FAMILY_FORMATS
    # Schema evolution (a widened join key, widened or renamed columns): the rows are converted
    # before they are placed, so a widened key lands where Spark hashes it, and the families
    # take the query's schemas.
    evolutions = plan.evolutions.get(op.uid, {})
    convert = functools.partial(_evolved_rows, evolutions) if evolutions else None
    families = join_state.families_for(
        fmt, {t.name: target_schemas(plan, op.uid, t) for t in op.tables}
    )
    cf_ids = assign_cf_ids(families)
    delimiter = _merge_delimiter(plan, sp)
    engine = plan.engine or Engine.of()
    place = op.kind.partitions_of
    encode = functools.partial(
        join_state.encode_partition, fmt, families=families, cf_ids=cf_ids, delimiter=delimiter
    )

    def entries() -> Iterator[tuple[int, tuple[pa.Array, pa.Array] | EncodedRuns]]:
        # Keys placed by the join key (statectl/engine.py); a partition encoded whole when it
        # fits the budget, else a chunk at a time (cf_stream.py).
        for p, spilled in partition_spills(
            sp, op.tables, place, plan.partitions, engine, convert=convert
        ):
            if fits(spilled, engine.per_task):
                yield p, encode({name: t.read() for name, t in spilled.items()})
                continue
            with spill_dir() as scratch:
                yield p, encode_join_spilled(fmt, spilled, encode, scratch, engine.per_task)

    properties = {"useVirtualColumnFamilies": True}
    # Spark 3.5's joins carry no operator name; Spark reads column families by this one.
    _write_cf_files(
        new_id, join_state.NAME, properties, families, cf_ids, entries(), plan, io, root
    )
    return {t.name: sum(f.rows for f in t.files) for t in op.tables}


def _write_cf_files(
    new_id: int,
    name: str,
    properties: dict[str, Any],
    families: list[ColumnFamilySchema],
    cf_ids: dict[str, int],
    entries: Iterable[tuple[int, tuple[pa.Array, pa.Array] | EncodedRuns]],
    plan: RestorePlan,
    io: FileIO,
    root: str,
) -> None:
    """One RocksDB snapshot per partition (``entries``: each target partition's encoded keys
    and values, or their sorted runs on disk, in partition order), the schema file (v3) and
    operator metadata v2 pointing at it, as Spark writes a column-family operator."""
    internal = np.array(sorted(i for n, i in cf_ids.items() if n.startswith("$")))
    version = plan.batch + 1
    written = 0
    for p, encoded in entries:
        # The engine yields every target partition, in order (unique ids are recorded in order).
        if p != written:
            raise AssertionError(f"partition {p} came after {written} partitions")
        written += 1
        unique_id = str(uuid.uuid4()) if plan.checkpoint_format == 2 else None
        _record_unique_id(plan, new_id, p, unique_id)
        store = _under(root, "state", str(new_id), str(p))
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
            continue
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
    if written != plan.partitions:
        raise AssertionError(f"{written} of {plan.partitions} partitions were encoded")
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
        _under(root, "state", str(new_id), "_metadata", "v2", str(plan.batch)),
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
        _under(root, "state", str(op_id), "_metadata", "metadata"),
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
        cf_ids = assign_cf_ids(families)
        encode = _tws_partition_encoder(plan, sp, op.properties, families, cf_ids, {})
        empty = ((p, encode({})) for p in range(plan.partitions))
        _write_cf_files(
            op.operator_id, op.name, op.properties, families, cf_ids, empty, plan, io, root
        )
        return
    writer = _store_writer(plan, codec)
    empty = pa.array([], pa.large_binary())
    for desc in op.schemas:
        for p in range(plan.partitions):
            base = _under(root, "state", str(op.operator_id), str(p))
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


def _offset_metadata_extra(extra: dict[str, Any], offsets: dict[str, Any]) -> dict[str, Any]:
    """The savepoint's extra offset metadata (v2's ``sourceMetadataInfo``), without the named
    sources a restore dropped."""
    info = extra.get("sourceMetadataInfo")
    if not isinstance(info, dict):
        return dict(extra)
    return {**extra, "sourceMetadataInfo": {k: v for k, v in info.items() if k in offsets}}


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


def _write_source_logs(
    io: FileIO, root: str, source_logs: dict[str, list[dict]], previous: dict[str, str | None]
) -> None:
    """Re-create each file source log as Spark lays it out (compaction every 10 batches),
    from the compaction a restart may read on (older files are what Spark's own log cleanup
    deletes), so the file count stays bounded however long the query ran."""
    for source, entries in source_logs.items():
        for name, body in source_log_layout(entries, _log_offset(previous.get(source))):
            text = "\n".join(["v1", *(json.dumps(e, separators=(",", ":")) for e in body)])
            io.write_atomic(_under(root, "sources", source, name), text.encode())


def _marker(plan: RestorePlan, command: str, source: str | None) -> bytes:
    info = {
        "command": command,
        "source": source or plan.savepoint,
        "target": plan.target,
        "started_at": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "pid": os.getpid(),
        "host": socket.gethostname(),
    }
    return f"{IN_PROGRESS_TOKEN}\n{json.dumps(info)}".encode()


def begin_target(
    io: FileIO, root: str, plan: RestorePlan, command: str = "restore", source: str | None = None
) -> None:
    """Mark the target in progress before anything else is written there. With --overwrite,
    first clear an interrupted restore (planning made sure that is all the target is)."""
    if plan.overwrite and io.exists(root) and io.list_dir(root):
        marker = read_in_progress(io, root)
        if marker is None:  # re-checked here: never delete anything but an unfinished restore
            raise StatectlError("--overwrite replaces only an interrupted statectl restore", root)
        # The marker goes last: killed mid-way, what is left is still an overwritable restore.
        for entry in io.list_dir(root):
            if entry.name != "metadata":
                io.remove(entry.path, recursive=entry.is_dir and not entry.is_link)
        io.remove(root, recursive=True)
    io.makedirs(root)
    io.write_atomic(_under(root, "metadata"), _marker(plan, command, source), overwrite=True)
    plan.started = True


def _copy_native(plan: RestorePlan) -> None:
    """A native savepoint at its own backend and partition count: its files as they are,
    ``metadata`` last (the marker stays until everything else is in place)."""
    sp, io, root = plan.sp, plan.io, plan.root
    assert sp is not None and io is not None
    m = sp.metadata
    files = [f.path for op in m.operators for t in op.tables for f in t.files]
    files += [f.path for f in m.native_logs or []]
    prefix = "checkpoint/"
    for rel in sorted(set(files), key=lambda r: (r.startswith(prefix + "commits/"), r)):
        inner = rel[len(prefix) :]
        if inner == "metadata":
            continue
        io.write_atomic(
            _under(root, *inner.split("/")), sp.io.read_bytes(posixpath.join(sp.root, rel))
        )


def write_restore(plan: RestorePlan, *, before_finish: Callable[[], None] | None = None) -> None:
    """Write the checkpoint ``plan`` describes. The target is marked in progress first (a
    ``metadata`` Spark refuses to start from) and gets its real ``metadata`` last, so an
    interrupted restore is never mistaken for a checkpoint, by Spark or by statectl."""
    if plan.problems:
        raise StatectlError(f"the restore plan has problems: {plan.problems[0]}", plan.target)
    sp, io, root = plan.sp, plan.io, plan.root
    assert sp is not None and io is not None
    m = sp.metadata
    if not plan.started:
        begin_target(io, root, plan)
    if m.savepoint_type == "native":
        _copy_native(plan)
    else:
        _write_canonical(plan)
    if before_finish is not None:
        before_finish()
    io.write_atomic(
        _under(root, "metadata"),
        json.dumps({"id": m.query_id}, separators=(",", ":")).encode(),
        overwrite=True,
    )


def _write_canonical(plan: RestorePlan) -> None:
    sp, io, root = plan.sp, plan.io, plan.root
    assert sp is not None and io is not None
    m = sp.metadata
    codec = normalize_codec(m.pinned_confs.get(CODEC_CONF, "lz4"))
    by_uid = {op.uid: op for op in m.operators}
    for uid, new_id in plan.restored.items():
        _write_operator(sp, by_uid[uid], new_id, plan, io, root, codec)
    for op_id in plan.started_empty:
        _write_empty_operator(sp, plan.query_operators[op_id], plan, io, root, codec)
    pos = plan.positions
    offsets = pos.offsets if pos is not None else m.offsets
    previous = pos.previous_offsets if pos is not None else (m.previous_offsets or m.offsets)
    _write_source_logs(io, root, pos.source_logs if pos else m.source_logs, previous or {})
    # Every other kind's sources/ files, byte for byte, under the key the query gives them.
    write_carried_sources(m.sources, sp.io, sp.root, io, root, pos.carried if pos else None)
    confs = dict(m.pinned_confs)
    confs[PROVIDER_CONF] = PROVIDER_CLASSES[plan.backend]
    confs[PARTITIONS_CONF] = str(plan.partitions)
    if plan.join_state_format is not None:  # Spark reads the joins at the pinned format
        confs[join_state.FORMAT_CONF] = str(plan.join_state_format)
    for conf, written in plan.state_formats.items():  # and the converted kinds likewise
        confs[conf] = str(written)
    if (merge := merge_operator_version(plan, m.pinned_confs)) is not None:
        confs[MERGE_OPERATOR_CONF] = merge
    # statectl writes plain rows; the restarted query keeps writing them.
    if confs.get(ROW_CHECKSUM_CONF) == "true":
        confs[ROW_CHECKSUM_CONF] = "false"
    meta = {
        "batchWatermarkMs": m.batch_watermark_ms,
        "batchTimestampMs": m.batch_timestamp_ms,
        "conf": confs,
        **_offset_metadata_extra(m.offset_metadata_extra, offsets),
    }
    b = m.batch_id
    if b > 0:
        io.write_atomic(
            _under(root, "offsets", str(b - 1)),
            _offset_text(previous or offsets, meta, m.offset_log_version).encode(),
        )
    io.write_atomic(
        _under(root, "offsets", str(b)),
        _offset_text(offsets, meta, m.offset_log_version).encode(),
    )
    commit: dict[str, Any] = {"nextBatchWatermarkMs": m.next_batch_watermark_ms}
    if plan.checkpoint_format == 2:
        commit["stateUniqueIds"] = {str(k): v for k, v in sorted(plan.unique_ids.items())}
    version = plan.checkpoint_format
    if m.source_checkpoint.get("commit_log_version") == 3:
        # Commit log v3 (sink evolution) stays v3 with its sinkMetadataMap: Spark keeps the
        # version of the latest commit, and takes the checkpoint format from stateUniqueIds.
        version = 3
        extra = m.source_checkpoint.get("commit_metadata_extra")
        for key, value in (extra if isinstance(extra, dict) else {}).items():
            if key not in ("nextBatchWatermarkMs", "stateUniqueIds"):  # ours decide those
                commit[key] = value
    io.write_atomic(
        _under(root, "commits", str(b)),
        f"v{version}\n{json.dumps(commit, separators=(',', ':'))}".encode(),
    )


def open_savepoint(url: str) -> Savepoint:
    """The savepoint to restore; a Spark checkpoint given instead is named as such."""
    io, root = FileIO.for_url(url)
    if not is_savepoint_dir(io, root) and (
        io.exists(posixpath.join(root, "offsets")) or io.exists(posixpath.join(root, "commits"))
    ):
        raise StatectlError(
            "is a Spark checkpoint, not a savepoint; use `statectl migrate CHECKPOINT TARGET` "
            "(it takes the savepoint and restores it in one step)",
            io.url(root),
        )
    return Savepoint(io, root)


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
    output_mode: str | None = None,
    spark: Any = None,
    changelog: bool = False,
    checkpoint_format: int | None = None,
    dry_run: bool = False,
    overwrite: bool = False,
    progress: Callable[[str], None] | None = None,
    join_state_format: int | None = None,
    memory: str | int | None = None,
    workers: int | None = None,
    source_offsets: dict[str, str] | None = None,
    engine: Any = None,
    transforms: dict[str, str] | None = None,
    aggregation_state_format: int | None = None,
    group_state_format: int | None = None,
) -> RestorePlan:
    """Plan (:func:`plan_restore`), then write (:func:`write_restore`) unless ``dry_run`` or
    the plan has problems: a dry run and a real run refuse exactly the same things.

    ``query`` (``MODULE:FUNCTION`` or a :class:`PlannedQuery`) is the changed query: it is
    planned with Spark (``spark``, or a local session) to match state to its operators.
    ``memory`` (bytes or ``"512M"``) and ``workers`` size the local engine
    (:mod:`statectl.engine`; default a quarter of the machine's memory up to 2 GiB, a worker per core);
    ``engine`` (an engine of :func:`statectl.spark_engine.engine_for`) replaces it.
    """
    engine = engine or Engine.of(memory, workers)
    sp = open_savepoint(savepoint)
    if isinstance(query, str):
        chosen, n = choose_target(sp, backend, partitions)
        confs = planning_confs(sp.metadata.pinned_confs, chosen, n)
        if join_state_format is not None:  # new joins of the query start at that format
            confs[join_state.FORMAT_CONF] = str(join_state_format)
        query = plan_query(
            query, output_mode=output_mode, confs=confs, spark=spark, progress=progress
        )
    plan = plan_restore(
        sp,
        target,
        backend,
        partitions,
        mapping or {},
        allow_non_restored,
        drop,
        query,
        "changelog" if changelog else "snapshot",
        checkpoint_format,
        overwrite=overwrite,
        join_state_format=join_state_format,
        source_offsets=source_offsets,
        transforms=transforms,
        aggregation_state_format=aggregation_state_format,
        group_state_format=group_state_format,
    )
    plan.engine = engine
    if not plan.problems and not dry_run:
        write_restore(plan)
    return plan


def migrate(
    source: str,
    target: str,
    *,
    backend: str | None = None,
    partitions: int | None = None,
    batch: int | None = None,
    keep_savepoint: str | None = None,
    changelog: bool = False,
    overwrite: bool = False,
    verify: bool = True,
    memory: str | int | None = None,
    workers: int | None = None,
    engine: Any = None,
    join_state_format: int | None = None,
    passthrough: bool = True,
    aggregation_state_format: int | None = None,
    group_state_format: int | None = None,
) -> tuple[RestorePlan, str | None]:
    """Savepoint then restore. The target is marked in progress first and the temporary
    savepoint is written inside it (``.statectl-tmp/``) and removed before the target is
    finished, so an interrupted migrate leaves one directory that says what it is (and that
    ``--overwrite`` replaces), never a full savepoint elsewhere. ``join_state_format``,
    ``aggregation_state_format`` and ``group_state_format`` convert as :func:`restore`'s do.

    Operators whose bytes stay the same (statectl/passthrough.py) skip the typed savepoint:
    their stores go from the source's files to the target's, only the keys decoded for
    placement (``plan.passthrough`` names them). ``passthrough=False`` takes the savepoint
    path for every operator (tests compare the two)."""
    engine = engine or Engine.of(memory, workers)
    src_io, src_root = FileIO.for_url(source)
    io, root = FileIO.for_url(target)
    problems, _ = target_problems(io, root, overwrite, [("source checkpoint", src_io, src_root)])
    if problems:
        raise StatectlError(problems[0])
    if partitions is not None and partitions < 1:
        raise StatectlError(f"--partitions must be at least 1, got {partitions}")
    # The local engine only (Spark's runs the savepoint path), a checkpoint (not a native
    # savepoint), and no savepoint to keep (a kept one must hold the state).
    fast = (
        passthrough
        and isinstance(engine, Engine)
        and keep_savepoint is None
        and src_io.exists(posixpath.join(src_root, "offsets"))
    )
    stub = RestorePlan(source, io.url(root), "", 0, -1, overwrite=overwrite)
    existed = io.exists(root)
    try:
        begin_target(io, root, stub, "migrate", src_io.url(src_root))
        args = (source, keep_savepoint, batch, verify, engine, backend, partitions, changelog)
        asked = {
            AGG_FORMAT_CONF: aggregation_state_format,
            GROUP_STATE_FORMAT_CONF: group_state_format,
        }
        formats = (join_state_format, {c: n for c, n in asked.items() if n is not None})
        try:
            plan, kept = _migrate_plan(io, root, target, *args, *formats, fast)
        except StatectlError:
            # Refused before any state was written: leave the target as it was found.
            _discard_target(io, root, existed)
            raise
        try:
            _migrate_write(io, root, plan)
        except StatectlError as e:
            if not plan.passthrough:
                raise
            # The pass-through reads the source while it writes. A source the savepoint path
            # refuses before writing anything leaves the target as it was found, as there.
            _discard_target(io, root, existed)
            if not isinstance(e, MissingFileError) or batch is not None:
                raise
            # Spark's maintenance removed a file of the batch meanwhile (a running query):
            # the savepoint path tries the newest batch again.
            begin_target(io, root, stub, "migrate", src_io.url(src_root))
            plan, kept = _migrate_plan(io, root, target, *args, *formats, False)
            _migrate_write(io, root, plan)
    finally:
        # On every exit path (errors, Ctrl-C, SIGTERM): no temporary savepoint survives.
        tmp = _under(root, TMP_DIR)
        if io.exists(tmp):
            io.remove(tmp, recursive=True)
    return plan, kept if keep_savepoint else None


def _discard_target(io: FileIO, root: str, existed: bool) -> None:
    """The target as migrate found it: absent, or an empty directory."""
    io.remove(root, recursive=True)
    if existed:
        io.makedirs(root)


def _name_from_query(op: OperatorState, qop: Operator | None) -> None:
    """Spark < 4 recorded no operator names. A kind the state alone cannot confirm (a session
    window: its key ends with the session start, but what says so?) is confirmed by the
    query's operator the state matched: Spark 4's plan names it and records its prefix key.
    The in-memory savepoint operator takes that name, so every later step sees the kind
    (the savepoint's files are not touched)."""
    if qop is None or op.name != UNKNOWN_OPERATOR or op.kind.restorable:
        return
    named = classify(
        qop.name,
        op.store_names,
        column_families=False,
        key_schemas=[t.key_schema for t in op.tables],
        prefix_columns=[d.num_cols_prefix_key for d in qop.schemas],
    )
    if named.restorable and not qop.uses_column_families and not op.column_families:
        op.name = qop.name


def _migrate_write(io: FileIO, root: str, plan: RestorePlan) -> None:
    tmp = _under(root, TMP_DIR)

    def drop_tmp() -> None:
        if io.exists(tmp):
            io.remove(tmp, recursive=True)

    write_restore(plan, before_finish=drop_tmp)


def _migrate_plan(
    io: FileIO,
    root: str,
    target: str,
    source: str,
    keep_savepoint: str | None,
    batch: int | None,
    verify: bool,
    engine: Any,
    backend: str | None,
    partitions: int | None,
    changelog: bool,
    join_state_format: int | None,
    state_formats: dict[str, int],
    fast: bool,
) -> tuple[RestorePlan, str]:
    """The temporary savepoint (``fast``: operators that pass through unread) and the plan
    of the restore from it."""
    from statectl.passthrough import fallback_reason
    from statectl.savepoints.create import take_savepoint

    tmp = _under(root, TMP_DIR)
    chosen: dict[int, tuple[Any, int, Operator]] = {}

    def unread(ckpt: Any, b: int, op: Operator) -> bool:
        if fallback_reason(ckpt, b, op, join_state_format, state_formats) is not None:
            return False
        chosen[op.operator_id] = (ckpt, b, op)
        return True

    if io.exists(tmp):
        io.remove(tmp, recursive=True)
    kept, meta = take_savepoint(
        source,
        keep_savepoint or io.url(tmp),
        batch=batch,
        verify=verify,
        engine=engine,
        unread=unread if fast else None,
    )
    plan = plan_restore(
        Savepoint.open(kept),
        target,
        backend,
        partitions,
        {},
        False,
        rocksdb_layout="changelog" if changelog else "snapshot",
        own_target=True,
        join_state_format=join_state_format,
        aggregation_state_format=state_formats.get(AGG_FORMAT_CONF),
        group_state_format=state_formats.get(GROUP_STATE_FORMAT_CONF),
    )
    plan.engine = engine
    if plan.problems:
        raise StatectlError(f"cannot migrate: {plan.problems[0]}", io.url(root))
    for op in meta.operators:
        raw = chosen.get(op.operator_id)
        if raw is None or raw[1] != meta.batch_id:
            continue
        # ``fallback_reason`` is the one decider: migrate plans no query or transform, and a
        # join whose state format is converted never passes through, so the plan restores
        # these stores as they are. A plan that says otherwise is a bug, not a second path.
        if op.uid not in plan.restored or plan.rewrites(op.uid):
            raise StatectlError(
                f"internal error: operator {op.uid} was read as passing through unchanged but "
                "the plan changes it; rerun with --keep-savepoint to take the savepoint path",
                io.url(root),
            )
        plan.passthrough[op.uid] = raw
    return plan, kept

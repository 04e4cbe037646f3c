"""Use case ``savepoint``: a consistent, relocatable snapshot of a committed batch's state.

It reads only committed, immutable files and never writes into the checkpoint, so the query
may keep running. Data files are written first; ``_metadata`` last, atomically: a savepoint
without ``_metadata`` is incomplete by definition.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import itertools
import os
import posixpath
import re
import secrets
import shutil
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.parquet as pq

import statectl
from statectl.checkpoint.model import Checkpoint, Operator, StoreDescription
from statectl.config import load_config
from statectl.engine import Engine, TaskRunner, spill_dir
from statectl.errors import MissingFileError, StatectlError
from statectl.export import exportable
from statectl.io import FileIO
from statectl.join_state import NAME as JOIN
from statectl.join_state import format_of, logical_schemas, pinned_format
from statectl.operators import JOIN_STORES
from statectl.savepoints.format import (
    METADATA_FILE,
    DataFile,
    OperatorState,
    SavepointMetadata,
    StateTable,
    operator_fingerprint,
)
from statectl.sources import file_source_logs, savepoint_sources
from statectl.state import (
    Selection,
    StoreEncoding,
    iter_partition,
    read_partition,
    state_variable_type,
)

TIMERS = "$timers"
ENV_TARGET = "STATECTL_SAVEPOINT_DIR"
RETRIES = 3
ROW_GROUP_BYTES = 8 << 20


def default_uid(op: Operator) -> str:
    """Stable across runs of the same query: what the operator is, not where it sits (and for a
    join, not its state format: formats 3 and 4 are fingerprinted as format 2's stores)."""
    store_names, schemas = logical_stores(op)
    return operator_fingerprint(op.name, store_names, [(s.name, s.key_schema) for s in schemas])


def logical_stores(op: Operator) -> tuple[list[str], list[StoreDescription]]:
    """The stores a savepoint holds for ``op``: its own, or format 2's for a format 3/4 join."""
    fmt = format_of(op.kind)
    if fmt is None:
        return op.store_names, op.schemas
    return list(JOIN_STORES), logical_schemas(op.schemas, fmt)


def assign_uids(ops: list[Operator], explicit: dict[int, str]) -> dict[int, str]:
    """Explicit uids win; equal default uids (twin operators) get -2, -3 in operator id order."""
    uids: dict[int, str] = {}
    seen: dict[str, int] = {}
    for op in sorted(ops, key=lambda o: o.operator_id):
        uid = explicit.get(op.operator_id) or default_uid(op)
        if uid in seen and op.operator_id not in explicit:
            seen[uid] += 1
            uid = f"{uid}-{seen[uid]}"
        seen.setdefault(uid, 1)
        uids[op.operator_id] = uid
    if len(set(uids.values())) != len(uids):
        raise StatectlError(f"operator uids must be unique, got {sorted(uids.values())}")
    return uids


def resolve_target(target: str | None) -> str:
    """The argument, else $STATECTL_SAVEPOINT_DIR, else [savepoint] dir in ./statectl.toml."""
    if target:
        return target
    if os.environ.get(ENV_TARGET):
        return os.environ[ENV_TARGET]
    value = load_config().get("savepoint", {}).get("dir")
    if value:
        return str(value)
    raise StatectlError(
        "no savepoint target directory: pass TARGET_DIR, set STATECTL_SAVEPOINT_DIR, "
        "or set [savepoint] dir in statectl.toml"
    )


@dataclass
class PartitionTask:
    """Convert one partition of one table: read it from the checkpoint, write one Parquet file."""

    ckpt: Checkpoint
    op: Operator
    selection: Selection
    partition: int
    batch: int
    enc: StoreEncoding
    out_io: FileIO
    out_root: str
    rel: str
    # Bytes this task may hold (the engine's share per task); None: read the partition whole.
    budget: int | None = None
    # The parent's private spill directory (removed by the parent on every exit, so a worker
    # killed mid-way leaves nothing behind); the task works in its own subdirectory.
    scratch: str | None = None

    def __call__(self) -> tuple[DataFile, list[str]]:
        if self.budget is None:
            table = read_partition(
                self.ckpt, self.op, self.selection, self.partition, self.batch, self.enc
            )
            return _write_table(self.out_io, self.out_root, self.rel, table), table.column_names
        scratch = tempfile.mkdtemp(prefix="savepoint-", dir=self.scratch)
        try:
            chunks = iter_partition(
                self.ckpt,
                self.op,
                self.selection,
                self.partition,
                self.batch,
                self.enc,
                budget=self.budget,
                scratch=scratch,
            )
            first = next(chunks)
            columns = first.column_names
            data_file = _write_table(
                self.out_io, self.out_root, self.rel, itertools.chain([first], chunks), scratch
            )
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
        return data_file, columns


def run_tasks(
    jobs: list[PartitionTask], engine: TaskRunner, progress: Callable[[str], None] | None
) -> list:
    """Run conversion tasks on ``engine`` (locally: a fork pool, or threads (concurrent
    transfers) when either side is an object store; or as Spark tasks); results in order."""
    out = []
    threads = any(not (j.ckpt.io.is_local and j.out_io.is_local) for j in jobs)
    for job, result in zip(jobs, engine.run(jobs, threads=threads), strict=True):
        out.append(result)
        if progress:
            progress(job.rel.removeprefix("operators/"))
    return out


def default_workers(ckpt: Checkpoint) -> int:
    """$STATECTL_WORKERS, else a task per core (processes locally, threads on object stores)."""
    del ckpt
    from statectl.engine import default_workers as engine_workers

    return engine_workers()


@dataclass
class TableTask:
    """One unit of conversion: one operator's store or state variable (all partitions)."""

    operator_id: int
    name: str
    kind: str
    selection: Selection


def table_tasks(op: Operator) -> list[TableTask]:
    if format_of(op.kind) is not None:  # join format 3/4: saved as format 2's four stores
        return [
            TableTask(op.operator_id, s, "join-store", Selection(op.operator_id, join_store=s))
            for s in JOIN_STORES
        ]
    if op.uses_column_families:
        tasks = []
        for var in op.properties.get("stateVariables", []) or []:
            name = var.get("stateName", "")
            if name.startswith("$"):
                continue  # internal column families are derived (row counters, TTL indexes)
            kind = state_variable_type(op, name)
            tasks.append(
                TableTask(op.operator_id, name, kind, Selection(op.operator_id, state_var=name))
            )
        if op.properties.get("timeMode", "NoTime") not in ("NoTime", "None"):
            tasks.append(
                TableTask(
                    op.operator_id,
                    TIMERS,
                    "timers",
                    Selection(op.operator_id, registered_timers=True),
                )
            )
        return tasks
    kind = "join-store" if op.name == JOIN else "store"
    return [
        TableTask(op.operator_id, s, kind, Selection(op.operator_id, store=s))
        for s in op.store_names
    ]


def _safe_name(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.=-]", "_", name) or "_"


def _write_table(
    io: FileIO, root: str, rel: str, table: pa.Table | Iterator[pa.Table], scratch: str = ""
) -> DataFile:
    """One Parquet data file of ``table``, or of its chunks (written row group by row group
    through a local file in ``scratch`` when there is more than one)."""
    import io as _io

    if not isinstance(table, pa.Table):
        chunks = table
        table = next(chunks)
        second = next(chunks, None)
        if second is not None:
            return _write_chunks(io, root, rel, itertools.chain([table, second], chunks), scratch)
    buf = _io.BytesIO()
    # Row groups of ~8 MiB of Arrow data: a restore reads a row group at a time, so this
    # bounds its memory whatever the partition size.
    per_row = max(1, table.nbytes // max(1, table.num_rows))
    rows = max(1024, ROW_GROUP_BYTES // per_row)
    pq.write_table(exportable(table), buf, compression="zstd", row_group_size=rows)
    data = buf.getvalue()
    io.write_atomic(posixpath.join(root, rel), data)
    return DataFile(rel, table.num_rows, len(data), hashlib.sha256(data).hexdigest())


def _write_chunks(
    io: FileIO, root: str, rel: str, chunks: Iterator[pa.Table], scratch: str
) -> DataFile:
    """A data file too large for memory: row groups of about ``ROW_GROUP_BYTES`` (sized by the
    first chunk) streamed to a local file, then uploaded atomically."""
    local = os.path.join(scratch, f"out-{secrets.token_hex(8)}.parquet")
    rows = 0
    writer: pq.ParquetWriter | None = None
    try:
        for chunk in chunks:
            chunk = exportable(chunk)
            if writer is None:
                per_row = max(1, chunk.nbytes // max(1, chunk.num_rows))
                group = max(1024, ROW_GROUP_BYTES // per_row)
                writer = pq.ParquetWriter(local, chunk.schema, compression="zstd")
            writer.write_table(chunk, row_group_size=group)
            rows += chunk.num_rows
        assert writer is not None
        writer.close()
        digest = hashlib.sha256()
        with open(local, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                digest.update(block)
        size = os.path.getsize(local)
        io.put_atomic(local, posixpath.join(root, rel))
    finally:
        if os.path.exists(local):
            os.remove(local)
    return DataFile(rel, rows, size, digest.hexdigest())


def _spark_version() -> str | None:
    try:
        from importlib.metadata import version

        return version("pyspark")
    except Exception:
        return None


def _new_dir_name(query_id: str | None, batch: int) -> str:
    return f"savepoint-{(query_id or 'noquery')[:6]}-{batch}-{secrets.token_hex(4)}"


def build_savepoint(
    ckpt: Checkpoint,
    out_io: FileIO,
    out_root: str,
    batch: int,
    uids: dict[int, str],
    progress: Callable[[str], None] | None = None,
    engine: TaskRunner | None = None,
    unread: Callable[[Checkpoint, int, Operator], bool] | None = None,
) -> SavepointMetadata:
    """Write the data files of ``batch`` under ``out_root`` and return the metadata (unwritten).

    ``unread`` (migrate's pass-through, statectl/passthrough.py): operators whose state is
    not read here; their tables list placeholder files, never written, of no rows."""
    ops = ckpt.operators(batch)
    skipped = {op.operator_id for op in ops if unread is not None and unread(ckpt, batch, op)}
    enc = StoreEncoding.of(ckpt, batch)
    pinned_join_format = pinned_format(ckpt.offsets(batch).conf)
    # One task per operator, table and partition, each writing its own Parquet file: the same
    # task function runs here, in a process pool, or as a Spark task (statectl/engine.py, statectl/spark_engine.py).
    jobs = []
    for op in ops:
        if op.operator_id in skipped:
            continue
        for task in table_tasks(op):
            for p in range(op.num_partitions):
                rel = f"operators/{_safe_name(uids[op.operator_id])}/{_safe_name(task.name)}/part-{p:05d}.parquet"
                jobs.append(
                    PartitionTask(ckpt, op, task.selection, p, batch, enc, out_io, out_root, rel)
                )
    runner = engine or Engine.of(workers=1)
    # The engine's share per task bounds each partition's read (statectl/state.py): the local
    # engine's part of --memory, or what one Spark task may hold. Spark tasks spill under the
    # executor's own temporary directory (the driver's is not theirs).
    local = isinstance(runner, Engine)
    with spill_dir() as scratch:
        for job in jobs:
            job.budget, job.scratch = runner.per_task, scratch if local else None
        results = iter(run_tasks(jobs, runner, progress))
    operators = []
    for op in ops:
        if op.operator_id in skipped:
            parts = _placeholder_parts(op, uids[op.operator_id])
        else:
            parts = [[next(results) for _ in range(op.num_partitions)] for _ in table_tasks(op)]
        operators.append(operator_state(op, uids[op.operator_id], parts, pinned_join_format))
    return savepoint_metadata(ckpt, batch, operators, (out_io, out_root))


def _placeholder_parts(op: Operator, uid: str) -> list[list[tuple[DataFile, list[str]]]]:
    """An unread operator's tables: one empty entry per partition, as the metadata's checks
    want them (the file is never written; reading it fails as a missing data file)."""
    empty = hashlib.sha256(b"").hexdigest()
    return [
        [
            (
                DataFile(
                    f"operators/{_safe_name(uid)}/{_safe_name(t.name)}/part-{p:05d}.parquet",
                    0,
                    0,
                    empty,
                ),
                ["key", "value", "partition_id"],
            )
            for p in range(op.num_partitions)
        ]
        for t in table_tasks(op)
    ]


def operator_state(
    op: Operator,
    uid: str,
    parts: list[list[tuple[DataFile, list[str]]]],
    pinned_join_format: int | None,
) -> OperatorState:
    """The savepoint's record of ``op``: ``parts`` holds, per table of :func:`table_tasks`,
    each partition's written file and columns."""
    tables = []
    join_format = format_of(op.kind)
    store_names, logical = logical_stores(op)
    for task, task_parts in zip(table_tasks(op), parts, strict=True):
        files = [f for f, _ in task_parts]
        columns = task_parts[0][1] if task_parts else []
        desc = next((s for s in logical if s.name == task.name), None) or op.schema(
            "$eventTimers_keyToTimestamp"
            if task.kind == "timers" and op.properties.get("timeMode") == "EventTime"
            else "$procTimers_keyToTimestamp"
            if task.kind == "timers"
            else task.name
        )
        tables.append(
            StateTable(
                name=task.name,
                kind=task.kind,
                key_schema=desc.key_schema,
                value_schema=desc.value_schema,
                columns=columns,
                rows=sum(f.rows for f in files),
                files=files,
                user_key_schema=desc.user_key_schema,
                encoder={
                    **desc.key_encoder_spec,
                    "keySchemaId": desc.key_schema_id,
                    "valueSchemaId": desc.value_schema_id,
                }
                if op.uses_column_families and join_format is None
                else {},
            )
        )
    return OperatorState(
        uid,
        op.operator_id,
        op.name,
        op.num_partitions,
        {} if join_format else op.properties,
        store_names,
        op.metadata_version,
        tables,
        default_uid(op),
        [
            {
                "name": s.name,
                "key_schema": s.key_schema,
                "value_schema": s.value_schema,
                "key_schema_id": s.key_schema_id,
                "value_schema_id": s.value_schema_id,
                "key_encoder_spec": s.key_encoder_spec,
                "user_key_schema": s.user_key_schema,
            }
            for s in op.schemas
        ]
        if op.uses_column_families and join_format is None
        else None,
        state_format=(join_format or pinned_join_format) if op.name == JOIN else None,
    )


def savepoint_metadata(
    ckpt: Checkpoint,
    batch: int,
    operators: list[OperatorState],
    out: tuple[FileIO, str] | None = None,
) -> SavepointMetadata:
    """Everything but the state tables: position, confs, source logs, provenance. ``out``: the
    canonical savepoint the sources' files are copied into (statectl/sources/carry.py)."""
    off = ckpt.offsets(batch)
    commit = ckpt.commit(batch)
    return SavepointMetadata(
        query_id=ckpt.query_id,
        batch_id=batch,
        batch_timestamp_ms=off.batch_timestamp_ms,
        batch_watermark_ms=off.batch_watermark_ms,
        next_batch_watermark_ms=commit.next_batch_watermark_ms,
        offsets=off.offsets,
        offset_log_version=off.version,
        offset_metadata_extra=off.metadata_extra,
        pinned_confs=off.conf,
        source_logs=file_source_logs(ckpt, batch),
        sources=savepoint_sources(ckpt, batch, out),
        source_checkpoint={
            "backend": ckpt.backend(batch),
            "partitions": ckpt.num_partitions(batch),
            "checkpoint_format_version": ckpt.checkpoint_format_version(batch),
            "commit_log_version": commit.version,
            # commit log v3 (sink evolution, Spark 4.2+): sinkMetadataMap, kept for the restore
            **({"commit_metadata_extra": commit.extra} if commit.extra else {}),
        },
        operators=operators,
        previous_offsets=ckpt.offsets(batch - 1).offsets
        if batch - 1 in ckpt.offset_batches
        else None,
        created_at=dt.datetime.now(dt.timezone.utc).isoformat(timespec="milliseconds"),
        statectl_version=statectl.__version__,
        spark_version=_spark_version(),
    )


def take_savepoint(
    checkpoint: str,
    target: str | None = None,
    *,
    batch: int | None = None,
    uids: dict[int, str] | None = None,
    progress: Callable[[str], None] | None = None,
    kind: str = "canonical",
    workers: int | None = None,
    verify: bool = True,
    engine: TaskRunner | None = None,
    memory: str | int | None = None,
    unread: Callable[[Checkpoint, int, Operator], bool] | None = None,
) -> tuple[str, SavepointMetadata]:
    """Take a canonical (or native) savepoint; returns (savepoint URL, metadata).

    ``checkpoint`` may also be a native savepoint: it is converted, keeping its uids.

    If the query is running and maintenance deletes a file while we read, the latest committed
    batch is tried again (up to 3 times); with an explicit ``batch`` that is an error.

    ``engine`` runs the partition tasks (default: a local process pool of ``workers`` sharing
    ``memory``, bytes or ``"512M"``, see :mod:`statectl.engine`); the
    Spark engine runs them on a cluster, and ``_metadata`` is still written here, last.
    ``unread`` is :func:`build_savepoint`'s (migrate's pass-through only: such a savepoint
    is a plan, not a savepoint to keep).
    """
    if kind not in ("canonical", "native"):
        raise StatectlError(f"--type must be canonical or native, not {kind!r}")
    src_io, src_root = FileIO.for_url(checkpoint)
    if src_io.exists(posixpath.join(src_root, METADATA_FILE)) and not src_io.exists(
        posixpath.join(src_root, "offsets")
    ):
        from statectl.savepoints.native import EMBEDDED
        from statectl.savepoints.store import Savepoint

        sp = Savepoint(src_io, src_root)
        if sp.metadata.savepoint_type != "native":
            raise StatectlError("is already a canonical savepoint", src_root)
        sp.verify_native()
        uids = {op.operator_id: op.uid for op in sp.metadata.operators} | dict(uids or {})
        batch = sp.metadata.batch_id
        src_root = posixpath.join(src_root, EMBEDDED)
    ckpt = Checkpoint(src_io, src_root, verify=verify)
    out_io, parent = FileIO.for_url(resolve_target(target))
    if out_io.is_within(parent, src_io, src_root):
        raise StatectlError(
            f"the savepoint target {out_io.url(parent)} is inside the checkpoint it saves; "
            "choose a directory outside it",
            src_root,
        )
    last_error: StatectlError | None = None
    for _ in range(RETRIES):
        # re-list the logs: the query may have moved on
        fresh = Checkpoint(ckpt.io, ckpt.root, verify=verify)
        b = fresh.resolve_batch(batch)
        ops = fresh.operators(b)
        explicit = {int(k): v for k, v in (uids or {}).items()}
        unknown = sorted(set(explicit) - {op.operator_id for op in ops})
        if unknown:
            raise StatectlError(
                f"--uid names operator(s) {unknown}, which the checkpoint does not have"
            )
        root = posixpath.join(parent, _new_dir_name(fresh.query_id, b))
        try:
            if kind == "native":
                from functools import partial

                from statectl.savepoints.native import build_native

                meta = build_native(
                    fresh,
                    out_io,
                    root,
                    b,
                    assign_uids(ops, explicit),
                    partial(savepoint_metadata, fresh, b),
                    progress,
                )
            else:
                meta = build_savepoint(
                    fresh,
                    out_io,
                    root,
                    b,
                    assign_uids(ops, explicit),
                    progress,
                    engine or Engine.of(memory, workers or default_workers(fresh)),
                    unread,
                )
        except MissingFileError as e:
            out_io.remove(root, recursive=True) if out_io.exists(root) else None
            if batch is not None:
                raise StatectlError(
                    f"state of batch {batch} changed while reading ({e}); "
                    "Spark's maintenance removed it: choose a newer --batch"
                ) from None
            last_error = e
            continue
        except BaseException:
            if out_io.exists(root):
                out_io.remove(root, recursive=True)
            raise
        out_io.write_atomic(posixpath.join(root, METADATA_FILE), meta.to_json().encode())
        return out_io.url(root), meta
    raise StatectlError(f"state kept changing while reading ({last_error}); try again")

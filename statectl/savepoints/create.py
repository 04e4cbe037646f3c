"""Use case ``savepoint``: a consistent, relocatable snapshot of a committed batch's state.

It reads only committed, immutable files and never writes into the checkpoint, so the query
may keep running. Data files are written first; ``_metadata`` last, atomically: a savepoint
without ``_metadata`` is incomplete by definition.
"""

from __future__ import annotations

import hashlib
import itertools
import os
import posixpath
import shutil
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import partial
from importlib.metadata import version
from typing import Any

from statectl.checkpoint.model import Checkpoint, Operator
from statectl.config import load_config
from statectl.engine import Engine, StateEngine, TaskRunner, spill_dir
from statectl.engine import default_workers as engine_workers
from statectl.errors import MissingFileError, StatectlError
from statectl.io import FileIO
from statectl.join_state import pinned_format
from statectl.savepoints.contents import (
    TIMERS,
    TableTask,
    assign_uids,
    default_uid,
    logical_stores,
    operator_state,
    table_tasks,
)
from statectl.savepoints.format import (
    METADATA_FILE,
    DataFile,
    OperatorState,
    SavepointMetadata,
)
from statectl.savepoints.layout import (
    EMBEDDED,
    new_dir_name,
    now,
    part_path,
    write_metadata,
    write_table,
)
from statectl.savepoints.native import build_native
from statectl.savepoints.store import Savepoint, is_savepoint_dir
from statectl.sources import file_source_logs, savepoint_sources
from statectl.state import (
    Selection,
    StoreEncoding,
    iter_partition,
    read_partition,
)
from statectl.verification import unverifiable_files
from statectl.version import __version__

# Re-exported: restore and the tests name the savepoint's contents from here.
__all__ = [
    "TIMERS",
    "TableTask",
    "assign_uids",
    "build_savepoint",
    "default_uid",
    "logical_stores",
    "operator_state",
    "savepoint_metadata",
    "table_tasks",
    "take_savepoint",
]

ENV_TARGET = "STATECTL_SAVEPOINT_DIR"
RETRIES = 3


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
            return write_table(self.out_io, self.out_root, self.rel, table), table.column_names
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
            data_file = write_table(
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
    tasks: list[Callable[[], Any]] = list(jobs)
    for job, result in zip(jobs, engine.run(tasks, threads=threads), strict=True):
        out.append(result)
        if progress:
            progress(job.rel.removeprefix("operators/"))
    return out


def default_workers(ckpt: Checkpoint) -> int:
    """$STATECTL_WORKERS, else a task per core (processes locally, threads on object stores)."""
    del ckpt
    return engine_workers()


def _spark_version() -> str | None:
    try:
        return version("pyspark")
    except Exception:
        return None


def build_savepoint(
    ckpt: Checkpoint,
    out_io: FileIO,
    out_root: str,
    batch: int,
    uids: dict[int, str],
    progress: Callable[[str], None] | None = None,
    engine: StateEngine | None = None,
    unread: Callable[[Checkpoint, int, Operator], bool] | None = None,
) -> SavepointMetadata:
    """Write the data files of ``batch`` under ``out_root`` and return the metadata (unwritten).

    ``unread`` (migrate's pass-through, statectl/passthrough.py): operators whose state is
    not read here; their tables list placeholder files, never written, of no rows."""
    ops = ckpt.operators(batch)
    skipped = {op.operator_id for op in ops if unread and unread(ckpt, batch, op)}
    pinned_join_format = pinned_format(ckpt.offsets(batch).conf)
    read = [op for op in ops if op.operator_id not in skipped]
    jobs = _partition_tasks(ckpt, read, batch, uids, out_io, out_root)
    runner = engine or Engine.of(workers=1)
    # The engine's share per task bounds each partition's read (statectl/state.py): the local
    # engine's part of --memory, or what one Spark task may hold. Spark tasks spill under the
    # executor's own temporary directory (the driver's is not theirs).
    with spill_dir() as scratch:
        for job in jobs:
            job.budget = runner.per_task
            job.scratch = scratch if runner.runs_locally else None
        results = iter(run_tasks(jobs, runner, progress))
    operators = [
        operator_state(
            op, uids[op.operator_id], _parts(op, uids, results, skipped), pinned_join_format
        )
        for op in ops
    ]
    return savepoint_metadata(ckpt, batch, operators, (out_io, out_root))


def _parts(
    op: Operator, uids: dict[int, str], results: Iterator[Any], skipped: set[int]
) -> list[list[tuple[DataFile, list[str]]]]:
    """``op``'s written files (and columns) per table and partition, taken from ``results``
    in task order; placeholders for an operator that was not read."""
    if op.operator_id in skipped:
        return _placeholder_parts(op, uids[op.operator_id])
    return [[next(results) for _ in range(op.num_partitions)] for _ in table_tasks(op)]


def _partition_tasks(
    ckpt: Checkpoint,
    ops: list[Operator],
    batch: int,
    uids: dict[int, str],
    out_io: FileIO,
    out_root: str,
) -> list[PartitionTask]:
    """One task per operator, table and partition, each writing its own Parquet file: the same
    task function runs here, in a process pool, or as a Spark task (statectl/engine.py,
    statectl/spark_engine.py)."""
    enc = StoreEncoding.of(ckpt, batch)
    return [
        PartitionTask(
            ckpt,
            op,
            task.selection,
            p,
            batch,
            enc,
            out_io,
            out_root,
            part_path(uids[op.operator_id], task.name, p),
        )
        for op in ops
        for task in table_tasks(op)
        for p in range(op.num_partitions)
    ]


def _placeholder_parts(op: Operator, uid: str) -> list[list[tuple[DataFile, list[str]]]]:
    """An unread operator's tables: one empty entry per partition, as the metadata's checks
    want them (the file is never written; reading it fails as a missing data file)."""
    empty = hashlib.sha256(b"").hexdigest()
    return [
        [
            (
                DataFile(part_path(uid, t.name, p), 0, 0, empty),
                ["key", "value", "partition_id"],
            )
            for p in range(op.num_partitions)
        ]
        for t in table_tasks(op)
    ]


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
            # Files of the batch nothing could verify (no checksum sidecar): docs/guide.md
            "unverifiable_files": _source_unverifiable(ckpt, batch),
            # commit log v3 (sink evolution, Spark 4.2+): sinkMetadataMap, kept for the restore
            **({"commit_metadata_extra": commit.extra} if commit.extra else {}),
        },
        operators=operators,
        previous_offsets=ckpt.offsets(batch - 1).offsets
        if batch - 1 in ckpt.offset_batches
        else None,
        created_at=now(),
        statectl_version=__version__,
        spark_version=_spark_version(),
    )


def _source_unverifiable(ckpt: Checkpoint, batch: int) -> list[str] | None:
    """:func:`unverifiable_files` of the source; a native savepoint converted to a canonical
    one had its files verified against its ``_metadata``: what it recorded stands."""
    root = ckpt.root.rstrip("/")
    parent = posixpath.dirname(root)
    if posixpath.basename(root) == EMBEDDED and is_savepoint_dir(ckpt.io, parent):
        recorded = Savepoint(ckpt.io, parent).metadata.source_checkpoint.get("unverifiable_files")
        return recorded if isinstance(recorded, list) else None
    return unverifiable_files(ckpt, batch)


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
    engine: StateEngine | None = None,
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
        src_root, uids, batch = _native_source(src_io, src_root, uids)
    ckpt = Checkpoint(src_io, src_root, verify=verify)
    out_io, parent = _target_outside(src_io, src_root, target)
    last_error: StatectlError | None = None
    for _ in range(RETRIES):
        # re-list the logs: the query may have moved on
        fresh = Checkpoint(ckpt.io, ckpt.root, verify=verify)
        b = fresh.resolve_batch(batch)
        names = _uids(fresh.operators(b), uids)
        root = posixpath.join(parent, new_dir_name(fresh.query_id, b))
        build = (
            partial(
                build_native,
                fresh,
                out_io,
                root,
                b,
                names,
                partial(savepoint_metadata, fresh, b),
                progress,
            )
            if kind == "native"
            else partial(
                build_savepoint,
                fresh,
                out_io,
                root,
                b,
                names,
                progress,
                _runner(fresh, engine, memory, workers),
                unread,
            )
        )
        try:
            meta = _written_or_removed(build, out_io, root)
        except MissingFileError as e:
            if batch is not None:
                raise StatectlError(
                    f"state of batch {batch} changed while reading ({e}); "
                    "Spark's maintenance removed it: choose a newer --batch"
                ) from None
            last_error = e
            continue
        write_metadata(out_io, root, meta)
        return out_io.url(root), meta
    raise StatectlError(f"state kept changing while reading ({last_error}); try again")


def _written_or_removed(
    build: Callable[[], SavepointMetadata], out_io: FileIO, root: str
) -> SavepointMetadata:
    """``build()``'s metadata; on any failure the partial savepoint at ``root`` is removed."""
    try:
        return build()
    except BaseException:
        if out_io.exists(root):
            out_io.remove(root, recursive=True)
        raise


def _target_outside(src_io: FileIO, src_root: str, target: str | None) -> tuple[FileIO, str]:
    """The directory new savepoints go in, which must not be inside the checkpoint."""
    out_io, parent = FileIO.for_url(resolve_target(target))
    if out_io.is_within(parent, src_io, src_root):
        raise StatectlError(
            f"the savepoint target {out_io.url(parent)} is inside the checkpoint it saves; "
            "choose a directory outside it",
            src_root,
        )
    return out_io, parent


def _runner(
    ckpt: Checkpoint, engine: StateEngine | None, memory: str | int | None, workers: int | None
) -> StateEngine:
    """The given engine, else the local one: ``workers`` tasks sharing ``memory``."""
    return engine or Engine.of(memory, workers or default_workers(ckpt))


def _native_source(
    io: FileIO, root: str, uids: dict[int, str] | None
) -> tuple[str, dict[int, str], int]:
    """A native savepoint as the source of a canonical one: (its embedded checkpoint, its uids
    under the explicit ones, its batch), every listed file verified first."""
    sp = Savepoint(io, root)
    if sp.metadata.savepoint_type != "native":
        raise StatectlError("is already a canonical savepoint", root)
    sp.verify_native()
    kept = {op.operator_id: op.uid for op in sp.metadata.operators} | dict(uids or {})
    return posixpath.join(root, EMBEDDED), kept, sp.metadata.batch_id


def _uids(ops: list[Operator], uids: dict[int, str] | None) -> dict[int, str]:
    """Every operator's uid: the explicit ones (``--uid``), which must name operators of the
    batch, else the defaults."""
    explicit = {int(k): v for k, v in (uids or {}).items()}
    unknown = sorted(set(explicit) - {op.operator_id for op in ops})
    if unknown:
        raise StatectlError(
            f"--uid names operator(s) {unknown}, which the checkpoint does not have"
        )
    return assign_uids(ops, explicit)

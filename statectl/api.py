"""The Python API: one function per CLI command, each returning a typed result whose
``to_dict()`` is exactly what the command prints with ``--json`` (the CLI calls these).

``import statectl`` stays fast all the same: the package imports this module on first use of
one of its functions (statectl/__init__.py).
"""

from __future__ import annotations

import dataclasses
import time
from typing import TYPE_CHECKING, Any

from statectl.diagnosis import Diagnosis, diagnose
from statectl.diffing import diff as do_diff
from statectl.editing import edit as do_edit
from statectl.errors import StatectlError
from statectl.export import export_state
from statectl.inspection import inspect_path
from statectl.io import FileIO
from statectl.processor.reading import StateHandle, open_handle
from statectl.reader import as_url, selection_table
from statectl.restoration import migrate as do_migrate
from statectl.restoration import restore as do_restore
from statectl.restoration.options import MigrateOptions, RestoreOptions
from statectl.results import (
    DiffResult,
    EditResult,
    InspectResult,
    MigrateResult,
    RestoreError,
    RestoreResult,
    SavepointResult,
)
from statectl.retention import DEFAULT_INCOMPLETE_AFTER, GcResult, gc_plan, run_gc
from statectl.savepoints.create import take_savepoint
from statectl.sources import normalize_offset
from statectl.spark_engine import engine_for

if TYPE_CHECKING:
    from collections.abc import Callable

    import pyarrow as pa


def _state_size(url: str, under: str = "") -> Callable[[], int]:
    """The bytes of state files under ``url`` (``--engine auto``'s measure), asked lazily."""

    def size() -> int:

        io, root = FileIO.for_url(url)
        path = io.join(root, under) if under else root
        return io.du(path) if io.exists(path) else 0

    return size


def _engine(
    engine: Any,
    spark: Any,
    spark_confs: dict[str, str] | None,
    state_bytes: Callable[[], int],
    memory: str | int | None = None,
    workers: int | None = None,
) -> Any:
    """The engine a use case runs on (``engine=``: "local", "spark", "auto", a SparkSession
    or an engine; statectl.spark_engine.engine_for), shared by every command that has one."""

    return engine_for(
        engine,
        memory=memory,
        workers=workers,
        spark=spark,
        spark_confs=spark_confs,
        state_bytes=state_bytes,
    )


def inspect(
    path: Any, batch: int | None = None, *, rows: bool = True, verify: bool = True
) -> InspectResult:
    """Describe a checkpoint or a savepoint: query, batch, watermark, offsets, confs, operators
    (with stores, schemas and, unless ``rows=False``, live row counts). ``verify=False`` is
    ``--no-verify``: no checksums over state files, no key placement check."""

    return InspectResult.from_document(inspect_path(as_url(path), batch, rows=rows, verify=verify))


def read_state(
    path: Any,
    operator: str | int = 0,
    *,
    store: str | None = None,
    join_side: str | None = None,
    state_var: str | None = None,
    timers: bool = False,
    batch: int | None = None,
    verify: bool = True,
) -> pa.Table:
    """One operator's state, as the ``pyarrow.Table`` Spark's ``statestore`` reader returns for
    the same options (``statectl export`` writes this table). ``operator`` is the operator id,
    or for a savepoint also its uid; ``batch`` defaults to the latest committed one."""

    table = selection_table(store, join_side, state_var, timers)
    return open_state(path, batch=batch, verify=verify).read(operator, table, join_side=join_side)


def export(
    path: Any,
    output: Any,
    operator: str | int = 0,
    *,
    store: str | None = None,
    join_side: str | None = None,
    state_var: str | None = None,
    timers: bool = False,
    batch: int | None = None,
    overwrite: bool = False,
    verify: bool = True,
    engine: Any = "local",
    spark: Any = None,
    spark_confs: dict[str, str] | None = None,
    memory: str | int | None = None,
    workers: int | None = None,
) -> dict[str, Any]:
    """``statectl export``: :func:`read_state`'s table written to ``output`` (.parquet, .jsonl
    or .csv), read and written in chunks within ``memory`` (bytes or ``"512M"``) by
    ``workers`` parallel partition tasks.
    ``engine="spark"`` (or ``spark=`` a SparkSession) reads one partition per Spark task;
    ``"auto"`` as for :func:`savepoint`. Returns what ``--json`` prints (``engine``: which
    ran)."""

    chosen = (
        None
        if engine == "local" and spark is None
        else _engine(engine, spark, spark_confs, _state_size(as_url(path)))
    )
    return export_state(
        as_url(path),
        operator,
        store,
        join_side,
        state_var,
        timers,
        batch,
        as_url(output),
        overwrite,
        verify=verify,
        memory=memory,
        engine=None if chosen is None or chosen.runs_locally else chosen,
        workers=workers,
    )


def open_state(
    path: Any,
    *,
    batch: int | None = None,
    storage_options: dict[str, Any] | None = None,
    verify: bool = True,
) -> StateHandle:
    """``statectl.open``: a savepoint or a checkpoint (at ``batch``, default the latest
    committed one) as a handle with ``operators``, ``read``, ``batches``, ``to_pandas`` and
    ``to_spark`` (docs/api.md). ``storage_options`` are fsspec options for its URL."""

    return open_handle(as_url(path), batch=batch, verify=verify, storage_options=storage_options)


def savepoint(
    checkpoint: Any,
    target: Any = None,
    *,
    batch: int | None = None,
    uids: dict[int, str] | None = None,
    kind: str = "canonical",
    progress: Callable[[str], None] | None = None,
    verify: bool = True,
    engine: Any = "local",
    spark: Any = None,
    spark_confs: dict[str, str] | None = None,
    workers: int | None = None,
    memory: str | int | None = None,
) -> SavepointResult:
    """Take a savepoint of a (possibly running) query's checkpoint. ``target`` defaults to
    ``$STATECTL_SAVEPOINT_DIR`` or ``[savepoint] dir`` in ``./statectl.toml``. The result's
    ``str()`` (and ``.path``) is the savepoint's URL.

    ``engine="spark"`` (or ``spark=`` a SparkSession) converts the partitions as Spark tasks on
    the cluster (a session is built from ``spark_confs`` when none is given); the result is the
    same savepoint as the local engine's. ``engine="auto"``: Spark for large state when a
    session is at hand (docs/guide.md); the result's ``engine`` says which ran. ``memory``
    (bytes or ``"512M"``) bounds the local engine: partitions larger than a worker's share are
    read and written in chunks; on the Spark engine it is each task's budget."""

    chosen = (
        None
        if engine == "local" and spark is None
        else _engine(engine, spark, spark_confs, _state_size(as_url(checkpoint), "state"), memory)
    )
    # local: sized by ``workers``
    runner = None if chosen is None or chosen.runs_locally else chosen

    url, meta = take_savepoint(
        as_url(checkpoint),
        None if target is None else as_url(target),
        batch=batch,
        uids=uids,
        kind=kind,
        progress=progress,
        verify=verify,
        engine=runner,
        workers=workers,
        memory=memory,
    )
    return SavepointResult.from_document(
        {
            "path": url,
            "type": meta.savepoint_type,
            "batch": meta.batch_id,
            "query_id": meta.query_id,
            "operators": {op.uid: op.rows for op in meta.operators},
            "engine": "local" if runner is None else runner.name,
        }
    )


def stop_with_savepoint(
    query: Any,
    target: Any = None,
    *,
    checkpoint: str | None = None,
    uids: dict[int, str] | None = None,
    timeout_s: float = 600.0,
) -> SavepointResult:
    """Let a running PySpark ``StreamingQuery`` finish its current batch, stop it, and take a
    savepoint of the last committed batch. ``checkpoint`` defaults to the query's own location."""
    if checkpoint is None:
        checkpoint = _checkpoint_of(query)
    deadline = time.monotonic() + timeout_s
    # A trigger in flight would be interrupted by stop(): wait for it to commit first.
    while query.isActive and query.status.get("isTriggerActive") and time.monotonic() < deadline:
        time.sleep(0.05)
    query.stop()
    return savepoint(checkpoint, target, uids=uids)


def _checkpoint_of(query: Any) -> str:
    """The checkpoint root of a classic PySpark StreamingQuery (through its JVM object)."""
    jsq = query._jsq
    for path in (("streamingQuery",), ("query",), ()):
        obj = jsq
        try:
            for attr in path:
                obj = getattr(obj, attr)()
            return str(obj.resolvedCheckpointRoot())
        except Exception:
            continue
    raise StatectlError("cannot find the query's checkpoint location; pass checkpoint=...")


_SESSION_ARGUMENTS = ("savepoint", "target", "spark", "progress")


def restore(
    savepoint: Any,
    target: Any,
    *,
    backend: str | None = None,
    partitions: int | None = None,
    mapping: dict[str, int] | None = None,
    drop: list[str] | None = None,
    allow_non_restored: bool = False,
    query: Any = None,
    output_mode: str | None = None,
    changelog: bool = False,
    checkpoint_format: int | None = None,
    dry_run: bool = False,
    overwrite: bool = False,
    spark: Any = None,
    progress: Callable[[str], None] | None = None,
    join_state_format: int | None = None,
    memory: str | int | None = None,
    workers: int | None = None,
    source_offsets: dict[Any, Any] | None = None,
    engine: Any = "local",
    spark_confs: dict[str, str] | None = None,
    transforms: dict[str, str] | None = None,
    aggregation_state_format: int | None = None,
    group_state_format: int | None = None,
    new_query_id: bool = False,
    watermark: str | int | None = None,
    offset_log: int | None = None,
    row_checksums: bool | None = None,
    from_query: Any = None,
) -> RestoreResult:
    """Write a Spark checkpoint at ``target`` from a savepoint: either backend (default: the
    savepoint's), any partition count. With ``dry_run`` nothing is written and the returned
    plan says whether the restore would succeed (``.ok``, ``.problems``); without it, a restore
    that would fail raises :class:`RestoreError` (``.result`` is the plan) and writes nothing.
    ``query`` is ``"MODULE:FUNCTION"`` / ``"FILE.py:FUNCTION"`` for a changed query (planned
    with ``spark`` or a local session, needs PySpark). ``join_state_format`` (2, 3 or 4)
    converts stream-stream join state to that format (default: the savepoint's where the
    target backend runs it, else 2); ``aggregation_state_format`` and ``group_state_format``
    (1 or 2) convert streaming aggregation and flatMapGroupsWithState / applyInPandasWithState
    state likewise (default: kept). ``memory`` (bytes or ``"512M"``) bounds the local
    engine's memory, ``workers`` its parallel tasks (default: a quarter of the machine's
    memory up to 2 GiB, a worker per core). ``source_offsets`` sets sources' starting positions: source
    index or description (as the plan's ``sources`` show it) -> offset (JSON text or a dict;
    ``None`` or ``"-"``: the source's configured start; ``"KIND:JSON"`` swaps the source for
    one of another kind, ``"drop"`` removes it: statectl/sources/edits.py). ``engine`` is ``"local"``, ``"spark"``
    (the stores are built by Spark tasks on ``spark``, the active session, or one from
    ``spark_confs``; ``memory`` is then each task's budget), ``"auto"`` or a SparkSession; the
    result's ``engine`` says which ran. ``transforms`` maps a uid to ``"FILE.py:FUNCTION"``, a
    function ``(batch: pyarrow.RecordBatch, store: str)`` returning the query's key and value
    columns (checked against the planned schemas). ``new_query_id``: a new query id (a fork;
    default: the savepoint's); ``watermark`` (epoch ms or ISO time): the event-time watermark
    to resume at; ``offset_log`` (1, 2) and ``row_checksums``: log and row formats;
    ``from_query`` (with ``query``): the savepoint's query, to match aggregates by identity."""
    # Every keyword but the session handles is a RestoreOptions field of the same name.
    choices = {k: v for k, v in locals().items() if k not in _SESSION_ARGUMENTS}
    options = RestoreOptions(
        **choices
        | {
            "mapping": dict(mapping or {}),
            "drop": tuple(drop or ()),
            "source_offsets": dict(source_offsets or {}),
            "transforms": dict(transforms or {}),
        }
    )
    return restore_with(savepoint, target, options, spark=spark, progress=progress)


def restore_with(
    savepoint: Any,
    target: Any,
    options: RestoreOptions,
    *,
    spark: Any = None,
    progress: Callable[[str], None] | None = None,
) -> RestoreResult:
    """:func:`restore` with every choice in one :class:`RestoreOptions` (the CLI builds it
    once); ``spark`` and ``progress`` as there."""

    given = {
        str(k): normalize_offset(v, f"source_offsets[{k!r}]", edits=True)
        for k, v in options.source_offsets.items()
    }
    options = dataclasses.replace(options, source_offsets=given)
    engine = options.engine
    runner = _engine(
        engine,
        None if engine == "local" else spark,
        dict(options.spark_confs) if options.spark_confs is not None else None,
        _state_size(as_url(savepoint)),
        options.memory,
        options.workers,
    )
    plan = do_restore(
        as_url(savepoint), as_url(target), options, spark=spark, progress=progress, runner=runner
    )
    result = RestoreResult.from_document({**plan.as_dict(), "dry_run": options.dry_run})
    if not result.ok and not options.dry_run:
        raise RestoreError(result)
    return result


def migrate(
    source: Any,
    target: Any,
    *,
    backend: str | None = None,
    partitions: int | None = None,
    batch: int | None = None,
    keep_savepoint: Any = None,
    changelog: bool = False,
    overwrite: bool = False,
    verify: bool = True,
    memory: str | int | None = None,
    workers: int | None = None,
    engine: Any = "local",
    spark: Any = None,
    spark_confs: dict[str, str] | None = None,
    join_state_format: int | None = None,
    aggregation_state_format: int | None = None,
    group_state_format: int | None = None,
    checkpoint_format: int | None = None,
    new_query_id: bool = False,
    watermark: str | int | None = None,
    offset_log: int | None = None,
    row_checksums: bool | None = None,
) -> MigrateResult:
    """A savepoint of ``source`` restored at ``target`` in one step (change backend and/or
    partition count). The intermediate savepoint is deleted unless ``keep_savepoint`` names a
    directory to keep it under. Raises :class:`RestoreError` when the restore would fail.
    ``memory``, ``workers``, ``engine``, ``spark_confs``, ``join_state_format`` and
    ``aggregation_state_format``, ``group_state_format`` as for
    :func:`restore` (the savepoint runs on the same engine); ``spark`` a SparkSession means the
    Spark engine. ``checkpoint_format``, ``new_query_id``, ``watermark``, ``offset_log`` and
    ``row_checksums`` as for :func:`restore`; ``batch`` reprocesses from an earlier committed
    batch (docs/guide.md)."""

    options = MigrateOptions(
        backend=backend,
        partitions=partitions,
        batch=batch,
        keep_savepoint=keep_savepoint,
        changelog=changelog,
        overwrite=overwrite,
        verify=verify,
        join_state_format=join_state_format,
        aggregation_state_format=aggregation_state_format,
        group_state_format=group_state_format,
        memory=memory,
        workers=workers,
        engine=engine,
        spark_confs=spark_confs,
        checkpoint_format=checkpoint_format,
        new_query_id=new_query_id,
        watermark=watermark,
        offset_log=offset_log,
        row_checksums=row_checksums,
    )
    return migrate_with(source, target, options, spark=spark)


def migrate_with(
    source: Any, target: Any, options: MigrateOptions, *, spark: Any = None
) -> MigrateResult:
    """:func:`migrate` with every choice in one :class:`MigrateOptions` (the CLI builds it
    once); ``spark`` as there."""

    if options.keep_savepoint is not None:
        options = dataclasses.replace(options, keep_savepoint=as_url(options.keep_savepoint))
    runner = _engine(
        options.engine,
        spark,
        dict(options.spark_confs) if options.spark_confs is not None else None,
        _state_size(as_url(source), "state"),
        options.memory,
        options.workers,
    )
    plan, kept = do_migrate(as_url(source), as_url(target), options, runner=runner)
    result = MigrateResult.from_document(
        {**plan.as_dict(), "source": as_url(source), "savepoint": kept}
    )
    if not result.ok:
        raise RestoreError(result)
    return result


def edit(
    source: Any,
    target: Any,
    operator: str | int,
    *,
    delete_where: str | None = None,
    keep_where: str | None = None,
    drop: bool = False,
    table: str | None = None,
    dry_run: bool = False,
    batch: int | None = None,
) -> EditResult:
    """``statectl edit``: a new savepoint at ``target`` from a savepoint or checkpoint, with
    one operator's rows deleted (``delete_where``), kept (``keep_where``) or the operator
    dropped. Expressions are the SQL ``WHERE`` subset of docs/guide.md. ``dry_run`` writes
    nothing and reports the rows each table would keep."""

    doc = do_edit(
        as_url(source),
        None if target is None else as_url(target),
        str(operator),
        delete_where=delete_where,
        keep_where=keep_where,
        drop=drop,
        table=table,
        dry_run=dry_run,
        batch=batch,
    )
    return EditResult.from_document(doc)


def diff(
    a: Any,
    b: Any,
    *,
    operator: str | int | None = None,
    samples: int = 5,
    batch_a: int | None = None,
    batch_b: int | None = None,
) -> DiffResult:
    """``statectl diff``: per operator and table of two savepoints or checkpoints (either at a
    ``batch``), the keys added in ``b``, removed, changed (value differs) and unchanged, with
    up to ``samples`` examples of each."""

    if samples < 0:
        raise StatectlError("--samples must be 0 or more")
    doc = do_diff(
        open_handle(as_url(a), batch=batch_a),
        open_handle(as_url(b), batch=batch_b),
        operator=None if operator is None else str(operator),
        samples=samples,
    )
    return DiffResult.from_document(doc)


def doctor(checkpoint: Any) -> Diagnosis:
    """``statectl doctor``: every problem Spark would hit restarting ``checkpoint``, found
    from its files (nothing is written), the batches each store can be rebuilt at, the last
    recoverable batch and the command that recovers it. ``exit_code`` is the command's (0
    healthy, 1 problems found); a path that is no checkpoint raises a ``StatectlError``."""

    return diagnose(as_url(checkpoint))


def gc(
    path: Any,
    *,
    keep_last: int | None = None,
    max_age: str | None = None,
    keep_batches: int | None = None,
    incomplete_after: str = DEFAULT_INCOMPLETE_AFTER,
    dry_run: bool = False,
) -> GcResult:
    """``statectl gc --yes``: under a directory of savepoints, delete those beyond
    ``keep_last`` per query or older than ``max_age`` (``"30d"``; never a query's newest
    complete one) and unfinished ones idle for ``incomplete_after``; in a checkpoint, the
    files no restart at the latest batch or the ``keep_batches`` before it needs.
    ``dry_run`` deletes nothing and returns what would go."""

    plan = gc_plan(
        as_url(path),
        keep_last=keep_last,
        max_age=max_age,
        keep_batches=keep_batches,
        incomplete_after=incomplete_after,
    )
    if dry_run or not plan.delete:
        return GcResult(plan, deleted=False)
    run_gc(plan)
    return GcResult(plan, deleted=True)

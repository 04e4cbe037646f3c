"""Use case ``restore``: plan (:func:`statectl.restoration.planning.plan_restore`), then
write (:func:`statectl.restoration.write.write_restore`) unless a dry run or the plan has
problems, so a dry run and a real run refuse exactly the same things.

A dry run also reads and verifies every data file the restore would read (size, sha256, row
count, schema: what the writers check as they read), so it fails exactly when the restore
would. A real run that fails takes back the target it created (nothing is left where nothing
was); an interrupted one leaves the marked target, which ``--overwrite`` replaces."""

from __future__ import annotations

import dataclasses
import tempfile
from collections.abc import Callable
from typing import Any

from statectl import join_state
from statectl.errors import MissingFileError
from statectl.in_progress import discard_unfinished, target_was_empty
from statectl.io import FileIO
from statectl.query_plan import PlannedQuery, plan_query, planning_confs
from statectl.restoration.options import RestoreOptions
from statectl.restoration.plan import RestorePlan, choose_target
from statectl.restoration.planning import plan_restore
from statectl.restoration.targets import open_savepoint
from statectl.restoration.write import write_restore
from statectl.savepoints.store import Savepoint
from statectl.spark_engine import engine_for


def _planned_query(
    sp: Savepoint,
    options: RestoreOptions,
    spark: Any,
    progress: Callable[[str], None] | None,
) -> PlannedQuery | None:
    """``options.query`` planned with Spark (``spark``, or a local session) under the confs
    the restored query will run with."""
    query = options.query
    if isinstance(query, str):
        chosen, n = choose_target(sp, options.backend, options.partitions)
        confs = planning_confs(sp.metadata.pinned_confs, chosen, n)
        if options.join_state_format is not None:  # new joins of the query start at that format
            confs[join_state.FORMAT_CONF] = str(options.join_state_format)
        query = plan_query(
            query, output_mode=options.output_mode, confs=confs, spark=spark, progress=progress
        )
    if query is not None and options.from_query is not None:
        query = dataclasses.replace(
            query, savepoint_aggregates=_savepoint_aggregates(sp, options.from_query, spark)
        )
    return query


def _savepoint_aggregates(sp: Savepoint, from_query: Any, spark: Any) -> dict[int, Any]:
    """The aggregates of ``--from-query`` (the query the savepoint was taken with), planned
    under the savepoint's own confs, backend and partition count."""
    if not isinstance(from_query, str):
        return dict(from_query.aggregates)
    chosen, n = choose_target(sp, None, None)
    confs = planning_confs(sp.metadata.pinned_confs, chosen, n)
    return dict(plan_query(from_query, confs=confs, spark=spark).aggregates)


def restore(
    savepoint: str,
    target: str,
    options: RestoreOptions | None = None,
    *,
    spark: Any = None,
    progress: Callable[[str], None] | None = None,
    runner: Any = None,
    **choices: Any,
) -> RestorePlan:
    """Restore ``savepoint`` at ``target`` as ``options`` say (or, without them, as the
    keyword ``choices`` say: :class:`RestoreOptions`' fields). ``options.query``
    (``MODULE:FUNCTION`` or a :class:`PlannedQuery`) is the changed query: it is planned with
    Spark (``spark``, or a local session) to match state to its operators. ``runner`` is the
    engine that writes the stores; without it, ``options.engine`` (an engine, or
    :func:`statectl.spark_engine.engine_for`'s names), "local" being the local engine sized by
    ``options.memory`` and ``options.workers`` (:mod:`statectl.engine`; default a quarter of
    the machine's memory up to 2 GiB, a worker per core)."""
    if options is None:
        options = RestoreOptions(**choices)
    elif choices:
        raise TypeError("pass either options or keyword choices, not both")
    engine = runner or engine_for(options.engine, memory=options.memory, workers=options.workers)
    _exists(savepoint)
    sp = open_savepoint(savepoint)
    query = _planned_query(sp, options, spark, progress)
    plan = plan_restore(sp, target, options, query)
    plan.engine = engine
    if plan.problems:
        return plan
    if options.dry_run or sp.metadata.savepoint_type == "native":
        # A native savepoint's files are copied as they are: verified first, whatever the run.
        verify_data(sp, plan, progress)
    if not options.dry_run:
        _write(plan)
    return plan


def _exists(url: str) -> None:
    """A savepoint path that names nothing is said so ("not a complete savepoint" suggested
    a damaged one)."""
    io, root = FileIO.for_url(url)
    if not io.exists(root):
        raise MissingFileError("no such directory", root)


def _write(plan: RestorePlan) -> None:
    """write_restore; on a failure (not an interruption) the target is left as it was found
    when it was absent or empty."""
    io, root = plan.run.io, plan.run.root
    assert io is not None
    was_empty, existed = target_was_empty(io, root), io.exists(root)
    try:
        write_restore(plan)
    except Exception:
        if was_empty:
            discard_unfinished(io, root, existed)
        raise


# A dry run says it is verifying data only when that takes noticeable time.
_SAY_VERIFYING = 256 << 20


def _chunk_rows(bytes_per_row: int) -> int:
    return max(1, (64 << 20) // max(1, bytes_per_row))  # ~64 MiB of rows at a time


def verify_data(
    sp: Savepoint, plan: RestorePlan, progress: Callable[[str], None] | None = None
) -> None:
    """Read every data file ``plan`` restores from, as the writers do (inside the savepoint,
    size, sha256, row count, schema), streamed: the first damaged file raises its error."""
    m = sp.metadata
    if m.savepoint_type == "native":
        files = [f for op in m.operators for t in op.tables for f in t.files]
        files += list(m.native_logs or [])
        if progress and sum(f.bytes for f in files) >= _SAY_VERIFYING:
            progress(f"verifying {len(files)} files of the native savepoint")
        for f in files:
            sp.read_file(f)
        return
    tables = [t for op in m.operators if op.uid in plan.restored for t in op.tables]
    size = sum(f.bytes for t in tables for f in t.files)
    if progress and size >= _SAY_VERIFYING:
        n = sum(len(t.files) for t in tables)
        progress(f"verifying {n} data files ({size / 2**20:.1f} MiB) the restore reads")
    with tempfile.TemporaryDirectory(prefix="statectl-verify-") as scratch:
        for table in tables:
            for f in table.files:
                for _ in sp.iter_file(table, f, _chunk_rows, scratch):
                    pass

"""Use case ``restore``: plan (:func:`statectl.restoration.planning.plan_restore`), then
write (:func:`statectl.restoration.write.write_restore`) unless a dry run or the plan has
problems, so a dry run and a real run refuse exactly the same things."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from statectl import join_state
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
    sp = open_savepoint(savepoint)
    query = _planned_query(sp, options, spark, progress)
    plan = plan_restore(sp, target, options, query)
    plan.engine = engine
    if not plan.problems and not options.dry_run:
        write_restore(plan)
    return plan

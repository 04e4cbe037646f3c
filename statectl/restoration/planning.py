"""``plan_restore``: every check a restore makes, nothing written. A short pipeline of
planners, each deciding one thing and saying what is wrong with it: the target and the
savepoint's safety (targets.py, safety.py), the checkpoint format, which uid goes to which
operator (matching.py, evolve.py), source positions (statectl/sources/positions.py), and the
state formats (formats.py). A native savepoint restores only as it is (safety.py)."""

from __future__ import annotations

from typing import Any

from statectl.errors import StatectlError
from statectl.io import FileIO
from statectl.query_plan import PlannedQuery
from statectl.restoration import continuation, formats, matching
from statectl.restoration.options import RestoreOptions
from statectl.restoration.plan import Execution, RestorePlan, choose_target
from statectl.restoration.safety import native_problems, safety_problems
from statectl.restoration.targets import target_problems
from statectl.savepoints.store import Savepoint
from statectl.sources import plan_positions


def _new_plan(
    sp: Savepoint, target: str, options: RestoreOptions, query: PlannedQuery | None
) -> RestorePlan:
    m = sp.metadata
    chosen, n = choose_target(sp, options.backend, options.partitions)
    io, root = FileIO.for_url(target)
    scheme, sep, _ = target.partition("://")
    return RestorePlan(
        sp.url(),
        io.url(root),
        chosen,
        n,
        m.batch_id,
        query=query.spec if query else None,
        rocksdb_layout=options.rocksdb_layout,
        scheme=scheme if sep else "",
        overwrite=options.overwrite,
        transforms=dict(options.transforms),
        run=Execution(sp=sp, io=io, root=root),
    )


def _check_target(plan: RestorePlan, sp: Savepoint, source: str | None) -> None:
    """The target must be writable and inside neither the savepoint nor its checkpoint."""
    m = sp.metadata
    io, root = plan.run.io, plan.run.root
    assert io is not None
    inside = [("savepoint", sp.io, sp.root)]
    recorded = m.source_checkpoint.get("path") if isinstance(m.source_checkpoint, dict) else None
    for what, url in (("source checkpoint", source), ("source checkpoint", recorded)):
        if isinstance(url, str) and url:
            src_io, src_root = FileIO.for_url(url)
            inside.append((what, src_io, src_root))
    problems, plan.report.interrupted = target_problems(io, root, plan.overwrite, inside)
    plan.problems.extend(problems)


# What a checkpoint format change means to the Spark that runs the target.
_FORMAT_CHANGES = {
    2: "checkpoint format {} -> {}: state files named by unique id, listed in commits/N "
    "(Spark 4.0+; what Real-Time Mode needs)",
    1: "checkpoint format {} -> {}: plain state file names (any Spark; Real-Time Mode refuses "
    "it with CHECKPOINT_FORMAT_V1_NOT_SUPPORTED)",
}


def _checkpoint_format(plan: RestorePlan, m: Any, asked: int | None) -> None:
    """Format 2 (RocksDB snapshots only) when the savepoint came from it, or when asked."""
    if asked not in (None, 1, 2):
        raise StatectlError(f"--checkpoint-format must be 1 or 2, not {asked}")
    source = int(m.source_checkpoint.get("checkpoint_format_version") or 1)
    wanted = asked or source
    if wanted == 2 and not plan.target_backend.capabilities.checkpoint_format_2_in(plan.layout):
        if asked == 2:
            plan.problems.append("checkpoint format 2 needs --backend rocksdb without --changelog")
        wanted = 1
    plan.checkpoint_format = wanted
    if wanted != source:
        plan.conversions.append(_FORMAT_CHANGES[wanted].format(source, wanted))


def _match(plan: RestorePlan, m: Any, options: RestoreOptions, query: PlannedQuery | None) -> None:
    """Which uid goes where, what is dropped, changed or started empty."""
    mapping, drop = dict(options.mapping), list(options.drop)
    plan.problems.extend(matching.unknown_uid_problems(m, mapping, drop, plan.transforms))
    if query is not None:
        plan.query_operators = {op.operator_id: op for op in query.operators}
    unmatched = matching.match_operators(plan, m, mapping, drop, query)
    changed: set[int] = set()
    if query is not None:
        changed = matching.match_changed_operators(plan, m, query, unmatched, drop)
    matching.settle_unmatched(plan, unmatched, options.allow_non_restored, query is not None)
    if query is not None:
        restored_ids = list(plan.restored.values())
        matching.check_query_operators(plan, m, query)
        matching.start_empty(plan, restored_ids, changed)
    plan.problems.extend(matching.refusal_problems(plan, m))


def _sources(
    plan: RestorePlan, m: Any, options: RestoreOptions, query: PlannedQuery | None
) -> None:
    """Every source's starting position (a native savepoint keeps its own)."""
    if m.savepoint_type != "native":
        plan.positions = plan_positions(
            m,
            query.sources if query is not None else None,
            dict(options.source_offsets),
            options.allow_non_restored,
        )
        plan.report.sources = plan.positions.report
        plan.problems.extend(plan.positions.problems)
    elif options.source_offsets:
        plan.problems.append(
            "a native savepoint keeps its source offsets; convert it first: statectl "
            "savepoint --type canonical SAVEPOINT"
        )


def _state_formats(
    plan: RestorePlan, m: Any, options: RestoreOptions, query: PlannedQuery | None
) -> None:
    """The join and kind state formats written; what transformWithState needs."""
    formats.plan_join_format(plan, m, options.join_state_format)
    for conf, asked in options.state_formats.items():
        formats.plan_state_format(plan, m, conf, asked, query is not None)
    plan.problems.extend(formats.column_family_problems(plan, m))


def plan_restore(
    sp: Savepoint,
    target: str,
    options: RestoreOptions,
    query: PlannedQuery | None = None,
    *,
    source: str | None = None,
    own_target: bool = False,
) -> RestorePlan:
    """Every check the restore makes, nothing written: which uid goes to which operator id,
    what is dropped or started empty, and what is wrong (``problems``; empty means
    :func:`statectl.restoration.write.write_restore` will write it). ``query`` is the changed
    query, planned (``options.query`` is only its name).

    ``source`` is the checkpoint the savepoint was taken from (migrate), ``own_target`` says
    the caller already marked the target in progress (migrate). With ``query`` the sources
    are matched to the query's (statectl/sources/positions.py)."""
    m = sp.metadata
    plan = _new_plan(sp, target, options, query)
    plan.run.started = own_target
    if plan.transforms and query is None:
        plan.problems.append("--transform needs --query: it is checked against the query's schemas")
    if options.from_query is not None and query is None:
        plan.problems.append(
            "--from-query needs --query: it names the savepoint's query for a changed one"
        )
    if not own_target:
        _check_target(plan, sp, source)
    plan.problems.extend(safety_problems(m, dict(options.mapping)))
    _checkpoint_format(plan, m, options.checkpoint_format)
    continuation.plan_query_id(plan, m, options.new_query_id)
    _match(plan, m, options, query)
    _sources(plan, m, options, query)
    continuation.plan_watermark(plan, m, options.watermark)
    continuation.plan_logs(plan, m, options.offset_log)
    formats.check_requested(options.state_formats)
    if m.savepoint_type == "native":
        plan.problems.extend(
            formats.native_format_problems(options.join_state_format, options.state_formats)
        )
        plan.problems.extend(native_problems(plan, m))
        continuation.plan_row_checksums(plan, m, options.row_checksums)
        return plan
    _state_formats(plan, m, options, query)
    continuation.plan_row_checksums(plan, m, options.row_checksums)
    return plan

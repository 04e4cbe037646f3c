"""State formats the restore writes: stream-stream joins (``--join-state-format``: 2 to 4,
converting between them), streaming aggregation and flatMapGroupsWithState /
applyInPandasWithState (``--aggregation-state-format`` / ``--group-state-format``: 1 or 2),
and what transformWithState state needs of the target. Each planner records its decision
in the plan and what it converts or refuses in the plan's report."""

from __future__ import annotations

from typing import Any

from statectl import join_state
from statectl.checkpoint.model import ENCODING_CONF, MERGE_OPERATOR_CONF
from statectl.errors import StatectlError
from statectl.evolution import (
    PartEvolution,
    Refused,
    TableEvolution,
    aggregation_format_conversion,
    group_state_format_conversion,
)
from statectl.operators import AGG_FORMAT_CONF, GROUP_STATE_FORMAT_CONF, JOIN_KINDS
from statectl.restoration.plan import RestorePlan
from statectl.savepoints.format import OperatorState
from statectl.tws_encode import ttl_problems, unsupported_families

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
NATIVE_KEEPS = (
    "a native savepoint keeps its {} state format; convert it first: "
    "statectl savepoint --type canonical SAVEPOINT"
)


def check_requested(state_formats: dict[str, int | None]) -> None:
    """State formats no restore can write are usage errors (the join's: plan_join_format)."""
    for conf, asked in state_formats.items():
        if asked not in (None, 1, 2):
            raise StatectlError(f"{FORMAT_FLAGS[conf][0]} must be 1 or 2, not {asked}")


def native_format_problems(join: int | None, state_formats: dict[str, int | None]) -> list[str]:
    """A native savepoint is restored as it is: no format is converted."""
    asked = (
        ("join", join),
        ("aggregation", state_formats.get(AGG_FORMAT_CONF)),
        ("flatMapGroupsWithState", state_formats.get(GROUP_STATE_FORMAT_CONF)),
    )
    return [NATIVE_KEEPS.format(flag) for flag, n in asked if n is not None]


def join_formats_supported(plan: RestorePlan) -> tuple[int, ...]:
    """Join state formats this restore can write: Spark runs 3 and 4 on RocksDB only, and
    statectl writes column families as RocksDB snapshots only."""
    if plan.snapshot_rocksdb:
        return join_state.FORMATS
    return (1, 2)


def _format_conversion(conf: str, table: Any, source: int, target: int) -> PartEvolution:
    if conf == AGG_FORMAT_CONF:
        return aggregation_format_conversion(table.key_schema, table.value_schema, source, target)
    return group_state_format_conversion(table.value_schema, source, target)


def plan_state_format(
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
        if source != requested:
            _convert_state_format(plan, op, conf, source, requested, with_query)


def _convert_state_format(
    plan: RestorePlan, op: OperatorState, conf: str, source: int, target: int, with_query: bool
) -> None:
    flag, what_kind = FORMAT_FLAGS[conf]
    what = f"uid {op.uid} ({op.name})"
    if with_query or op.uid in plan.evolutions or op.uid in plan.transforms:
        plan.problems.append(
            f"{flag}: {what} would be converted and changed in one restore; convert it in "
            "a restore without --query / --transform, then restore that checkpoint's "
            "savepoint with them"
        )
        return
    evolutions = {}
    for table in op.tables:
        try:
            evolutions[table.name] = TableEvolution(
                value=_format_conversion(conf, table, source, target)
            )
        except Refused as e:
            plan.problems.append(f"{flag}: {what} store {table.name}: {e}")
    plan.evolutions[op.uid] = evolutions
    plan.conversions.append(
        f"{what}: {what_kind} state format {source} -> {target} ({_FORMAT_NOTES[conf, target]})"
    )


def _join_target_where(plan: RestorePlan) -> str:
    """The target, as the join format problems name it."""
    if not plan.target_backend.capabilities.column_families:
        return plan.target_backend.title
    if not plan.snapshot_rocksdb:
        return "RocksDB changelog checkpoints (--changelog)"
    return plan.backend


def _choose_join_format(plan: RestorePlan, sources: dict[str, int], requested: int | None) -> int:
    """``--join-state-format``, else the savepoint's when the target supports it, else 2."""
    supported = join_formats_supported(plan)
    if requested is not None:
        if requested not in supported:
            plan.problems.append(
                f"--join-state-format {requested}: join state formats 3 and 4 keep the join in "
                f"RocksDB column families, which {_join_target_where(plan)} cannot hold (Spark "
                "runs them on RocksDB only; statectl writes them as RocksDB snapshots); use "
                "--backend rocksdb without --changelog, or --join-state-format 2"
            )
        return requested
    kept = set(sources.values())
    target = kept.pop() if len(kept) == 1 else 2
    if target not in supported:
        plan.conversions.append(
            f"join state format {target} cannot be written to {_join_target_where(plan)}: "
            "restoring at format 2 (pass --join-state-format to choose)"
        )
        target = 2
    return target


def _convert_join(plan: RestorePlan, op: OperatorState, src: int, target: int) -> None:
    """What one join's conversion from format ``src`` to ``target`` says or refuses."""
    if src == target:
        plan.conversions.append(f"uid {op.uid}: join state format {src}, kept")
        return
    if 1 in (src, target):
        plan.problems.append(
            f"uid {op.uid}: join state format 1 has no matched flags; it converts to no "
            "other format (and none to it)"
        )
        return
    plan.conversions.append(f"uid {op.uid}: join state format {src} -> {target}")
    if target != 4:
        return
    for t in op.tables:
        if t.name.endswith("keyWithIndexToValue"):
            try:
                join_state.event_time_column(t.value_schema)
            except StatectlError as e:
                plan.problems.append(f"uid {op.uid} ({t.name}): {e}")


def _restored_joins(plan: RestorePlan, m: Any) -> list[OperatorState]:
    return [
        op
        for op in m.operators
        if op.uid in plan.restored and not op.column_families and op.kind in JOIN_KINDS
    ]


def _merge_operator_note(plan: RestorePlan, m: Any, target: int) -> None:
    if target == 4 and m.pinned_confs.get(MERGE_OPERATOR_CONF) != "2":
        plan.conversions.append(
            "RocksDB merge operator version 1 -> 2: Spark runs join state format 4 only with "
            "version 2, and reads a checkpoint that pins none as version 1"
        )


def plan_join_format(plan: RestorePlan, m: Any, requested: int | None) -> None:
    """Choose the join state format (``--join-state-format``, else the savepoint's when the
    target supports it, else 2) and say in the plan what is converted."""
    if requested is not None and requested not in (2, 3, 4):
        raise StatectlError(f"--join-state-format must be 2, 3 or 4, not {requested}")
    joins = _restored_joins(plan, m)
    if not joins:
        if requested is not None:
            plan.problems.append(
                "--join-state-format: the restore has no stream-stream join to convert"
            )
        return
    pinned = join_state.pinned_format(m.pinned_confs)
    sources = {op.uid: op.state_format or pinned for op in joins}
    target = _choose_join_format(plan, sources, requested)
    plan.join_state_format = target
    _merge_operator_note(plan, m, target)
    for op in joins:
        _convert_join(plan, op, sources[op.uid], target)
    if m.pinned_confs.get(ENCODING_CONF) == "avro":
        # Spark 4.3 refuses the query itself ("State store encoding format as avro is not
        # supported for operator=join"), whatever the join state format: no Spark wrote this.
        plan.problems.append(
            f"the savepoint pins {ENCODING_CONF}=avro beside a stream-stream join, which Spark "
            "refuses to run (Avro state encoding is not supported for joins); the savepoint was "
            "not written by Spark as it is: take it again from the original checkpoint"
        )


def _column_family_problems(plan: RestorePlan, op: OperatorState) -> list[str]:
    what = f"uid {op.uid} ({op.name}, transformWithState)"
    if not op.column_families:
        return [
            f"{what}: the savepoint predates column-family records; take a new savepoint "
            "with this statectl"
        ]
    if not plan.snapshot_rocksdb:
        return [
            f"{what}: restores only to RocksDB snapshots (--backend rocksdb, no --changelog); "
            "Spark runs transformWithState on RocksDB only"
        ]
    names = [cf["name"] for cf in op.column_families]
    if bad := unsupported_families(names):
        return [f"{what}: internal column families {', '.join(bad)} cannot be restored yet"]
    return [
        f"{what}: {p}"
        for p in ttl_problems(
            names,
            {t.name: t.kind for t in op.tables},
            {cf["name"]: cf.get("value_schema") for cf in op.column_families},
        )
    ]


def column_family_problems(plan: RestorePlan, m: Any) -> list[str]:
    """transformWithState state restores only where Spark runs it, as statectl writes it."""
    problems = []
    for op in m.operators:
        if op.uid in plan.restored and not all(
            t.kind in ("store", "join-store") for t in op.tables
        ):
            problems += _column_family_problems(plan, op)
    return problems

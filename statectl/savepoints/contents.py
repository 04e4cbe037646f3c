"""What a savepoint holds for each stateful operator: its uid, its tables (one per store,
state variable or ``$timers``; a join at state format 3/4 as format 2's four stores) and the
``_metadata`` record of them. Shared by savepoint creation (create.py, native.py), the
processor (which presents a checkpoint the way a savepoint holds it) and restore.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from statectl.checkpoint.model import Operator, StoreDescription
from statectl.errors import StatectlError
from statectl.join_state import NAME as JOIN
from statectl.join_state import format_of, logical_schemas
from statectl.operators import JOIN_STORES
from statectl.savepoints.format import DataFile, OperatorState, StateTable, operator_fingerprint
from statectl.state import Selection, state_variable_type

TIMERS = "$timers"


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


def timers_family(op: Operator) -> str:
    """The column family whose schema a transformWithState operator's timers are read with."""
    if op.properties.get("timeMode") == "EventTime":
        return "$eventTimers_keyToTimestamp"
    return "$procTimers_keyToTimestamp"


def table_description(
    op: Operator, task: TableTask, logical: dict[str, StoreDescription]
) -> StoreDescription:
    """The recorded schemas of one table of :func:`table_tasks` (``logical``: the stores of
    :func:`logical_stores` by name)."""
    if task.kind == "timers":
        return op.schema(timers_family(op))
    return logical.get(task.name) or op.schema(task.name)


def _state_table(
    task: TableTask,
    desc: StoreDescription,
    task_parts: list[tuple[DataFile, list[str]]],
    with_encoder: bool,
) -> StateTable:
    files = [f for f, _ in task_parts]
    encoder = {
        **desc.key_encoder_spec,
        "keySchemaId": desc.key_schema_id,
        "valueSchemaId": desc.value_schema_id,
    }
    return StateTable(
        name=task.name,
        kind=task.kind,
        key_schema=desc.key_schema,
        value_schema=desc.value_schema,
        columns=task_parts[0][1] if task_parts else [],
        rows=sum(f.rows for f in files),
        files=files,
        user_key_schema=desc.user_key_schema,
        encoder=encoder if with_encoder else {},
    )


def _schemas_record(op: Operator) -> list[dict[str, Any]]:
    """Every column family's schemas as recorded (a transformWithState operator's)."""
    return [
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


def operator_state(
    op: Operator,
    uid: str,
    parts: list[list[tuple[DataFile, list[str]]]],
    pinned_join_format: int | None,
) -> OperatorState:
    """The savepoint's record of ``op``: ``parts`` holds, per table of :func:`table_tasks`,
    each partition's written file and columns."""
    join_format = format_of(op.kind)
    store_names, logical = logical_stores(op)
    by_name = {s.name: s for s in logical}
    families = op.uses_column_families and join_format is None
    tables = [
        _state_table(task, table_description(op, task, by_name), task_parts, families)
        for task, task_parts in zip(table_tasks(op), parts, strict=True)
    ]
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
        _schemas_record(op) if families else None,
        state_format=(join_format or pinned_join_format) if op.name == JOIN else None,
    )

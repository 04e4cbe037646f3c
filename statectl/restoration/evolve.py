"""Restoring into a changed query's operator: Spark's own schema rule first
(:func:`schema_problems`); where it refuses, schema evolution (statectl/evolution.py) or a
user's ``--transform``, recorded in the plan (``evolutions``, ``query_schemas``, ``evolved``),
or the field-level reason restore cannot bridge it."""

from __future__ import annotations

import json
import re
from typing import Any

from statectl.checkpoint.model import UNKNOWN_OPERATOR, Operator
from statectl.errors import StatectlError
from statectl.evolution import PartEvolution, Refused, TableEvolution
from statectl.evolution_kinds import evolve_table, grouping_key, state_variable_value
from statectl.operators import AGGREGATION, SESSION_WINDOW
from statectl.query_plan import PlannedQuery
from statectl.restoration.plan import RestorePlan
from statectl.savepoints.create import logical_stores
from statectl.savepoints.format import OperatorState
from statectl.schema_compat import difference, simple_string
from statectl.transforms import load_transform
from statectl.tws_encode import TTL_INDEX

# The column of a savepoint table that holds a state variable's value struct, by kind.
VALUE_COLUMNS = {"ValueState": "value", "ListState": "list_element", "MapState": "user_map_value"}
STORE_KINDS = ("store", "join-store")


def _store_label(name: str, of: bool = False) -> str:
    if name == "default":
        return ""
    return f" of store {name!r}" if of else f" store {name!r}"


def _query_store(op: OperatorState, table: Any, target: Operator) -> Any:
    # A join at state format 3/4 is compared as format 2's stores (what savepoints hold);
    # transformWithState's timers table is its key-to-timestamp column family.
    names = (
        {f"${mode}Timers_keyToTimestamp" for mode in ("event", "proc")}
        if table.kind == "timers"
        else {table.name}
    )
    return next((s for s in logical_stores(target)[1] if s.name in names), None)


def schema_problems(uid: str, op: OperatorState, target: Operator) -> list[str]:
    """Spark's schema rule: the query's stores have the savepoint's (names ignored)."""
    where = f"uid {uid} -> operator {target.operator_id}"
    if op.name not in (target.name, UNKNOWN_OPERATOR):
        return [
            f"{where}: the savepoint holds {op.name} state, the query's operator is {target.name}"
        ]
    problems = []
    for table in op.tables:
        desc = _query_store(op, table, target)
        if desc is None:
            schemas = logical_stores(target)[1]
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
                problems.append(
                    f"{where} ({op.name}): {part} schema{_store_label(table.name, True)} "
                    f"is incompatible, {diff}"
                )
    return problems


def evolve(
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
    before = list(plan.report.evolved)
    problems = _evolve(plan, uid, op, target, query, native)
    names = query.key_expressions.get(target.operator_id, [])
    # Planned twice (a changed operator, then every restored one), a note is listed once.
    notes = [user_terms(n, names) for n in plan.report.evolved[len(before) :]]
    plan.report.evolved[len(before) :] = [n for n in dict.fromkeys(notes) if n not in before]
    return [user_terms(p, names) for p in problems]


_INTERNAL_KEY = "_groupingexpression"
_NAMED_FIELD = re.compile(
    r"field (\d+) \(_groupingexpression\)(: renamed \S+ -> _groupingexpression)?"
)


def user_terms(text: str, names: list[str | None]) -> str:
    """``text`` with Spark's internal name for a grouping expression (``_groupingexpression``,
    the same for every one) replaced by the expression (``upper(k)``): the key field it names
    (``field 0 (upper(k))``), else the grouping expressions in key order in each struct."""
    exprs = [n for n in names if n]
    if _INTERNAL_KEY not in text or not exprs:
        return text

    def named(m: re.Match[str]) -> str:
        i = int(m.group(1))
        name = names[i] if i < len(names) else None
        return m.group(0).replace(_INTERNAL_KEY, name or _INTERNAL_KEY)

    text = _NAMED_FIELD.sub(named, text)
    return "struct<".join(_in_key_order(part, exprs) for part in text.split("struct<"))


def _in_key_order(text: str, exprs: list[str]) -> str:
    order = iter(exprs)
    return re.sub(_INTERNAL_KEY, lambda _m: next(order, "a grouping expression"), text)


def _evolve(
    plan: RestorePlan,
    uid: str,
    op: OperatorState,
    target: Operator,
    query: PlannedQuery,
    native: bool,
) -> list[str]:
    problems = schema_problems(uid, op, target)
    if op.name not in (target.name, UNKNOWN_OPERATOR):
        return problems
    where = f"uid {uid} -> operator {target.operator_id}"
    if not uid.startswith(target.name):  # the uid names the kind unless relabelled
        where += f" ({target.name})"
    if uid in plan.transforms:
        return plan_transform(plan, uid, op, target, where, native)
    if native:
        return problems and [
            f"{where}: the query changed the state schema; a native savepoint is restored as "
            "it is: convert it first with statectl savepoint --type canonical SAVEPOINT"
        ]
    if op.column_families or any(t.kind not in STORE_KINDS for t in op.tables):
        return _evolve_state_variables(plan, uid, op, target, problems, where)
    return _evolve_stores(plan, uid, op, target, query, problems, where)


def _evolve_stores(
    plan: RestorePlan,
    uid: str,
    op: OperatorState,
    target: Operator,
    query: PlannedQuery,
    problems: list[str],
    where: str,
) -> list[str]:
    """Store operators. Even where Spark's rule (names ignored) accepts the schema,
    aggregation buffers may have changed owners ((count, sum) -> (max, count)), and renames
    belong in the plan."""
    schemas = {s.name: s for s in logical_stores(target)[1]}
    evolutions: dict[str, TableEvolution] = {}
    notes = []
    grouped = _grouped(plan, op)
    for table in op.tables:
        desc = schemas.get(table.name)
        if desc is None:
            return problems
        store = _store_label(table.name)
        try:
            evo = evolve_table(
                table.key_schema,
                table.value_schema,
                desc.key_schema,
                desc.value_schema,
                query.aggregates.get(target.operator_id),
                aggregation=op.kind is AGGREGATION,
                grouped=grouped,
                savepoint_buffers=_savepoint_buffers(query, op),
            )
        except Refused as e:
            return _refused_store(problems, where, store, e)
        if evo.key is not None or evo.value is not None:
            evolutions[table.name] = evo
        _record_query_schemas(plan, uid, table, desc)
        notes += [f"uid {uid}{store}: {n}" for n in evo.notes]
    if evolutions:
        plan.evolutions[uid] = evolutions
    plan.report.evolved += notes
    return []


def _savepoint_buffers(query: PlannedQuery, op: OperatorState) -> Any:
    """``--from-query``'s aggregates of the savepoint's operator (None without it)."""
    if query.savepoint_aggregates is None:
        return None
    buffers = query.savepoint_aggregates.get(op.operator_id)
    if buffers is None and (op.kind is AGGREGATION or op.kind is SESSION_WINDOW):
        raise Refused(
            f"--from-query has no aggregation at operator {op.operator_id}, where the "
            "savepoint's is: name the query the savepoint was taken with"
        )
    return buffers


def _grouped(plan: RestorePlan, op: OperatorState) -> bool:
    """The value repeats the grouping columns before the buffers."""
    sp = plan.run.sp
    format_ = op.kind.state_format(sp.metadata.pinned_confs if sp else {})
    return op.kind is SESSION_WINDOW or (op.kind is AGGREGATION and format_ == 1)


def _refused_store(problems: list[str], where: str, store: str, e: Refused) -> list[str]:
    # Restore's reason names the field it cannot bridge, and so says what Spark's would (the
    # same field, read by position): one of them, so the line stays readable. Otherwise
    # Spark's reason first (what the query changed), then why restore cannot bridge it.
    if not problems or re.search(r"\bfields?\b", str(e)):
        return [f"{where}{store}: {e}", *problems[1:]]
    return [f"{problems[0]}; restore cannot evolve it:{store} {e}", *problems[1:]]


def _record_query_schemas(plan: RestorePlan, uid: str, table: Any, desc: Any) -> None:
    """The query's schemas where they are the savepoint's under other names or nullability."""
    if (table.key_schema, table.value_schema) != (desc.key_schema, desc.value_schema):
        plan.query_schemas.setdefault(uid, {})[table.name] = (desc.key_schema, desc.value_schema)


def _refused(
    problems: list[str], where: str, what: str, reason: object, store: str | None = None
) -> list[str]:
    """Spark's reason first (what the query changed), then why restore cannot bridge it.
    A refused variable: only Spark's complaints about it (the others would evolve)."""
    own = [p for p in problems if store is None or f"store {store!r}" in p] or problems
    if not own:
        return [f"{where} {what}: {reason}"]
    return [f"{own[0]}; restore cannot evolve it: {what}: {reason}", *own[1:]]


def _evolve_state_variables(
    plan: RestorePlan,
    uid: str,
    op: OperatorState,
    target: Operator,
    problems: list[str],
    where: str,
) -> list[str]:
    """transformWithState: the grouping key may be widened or renamed (every state variable,
    row counter, timer and TTL index re-keyed alike: :func:`statectl.evolution_kinds.grouping_key`),
    UnsafeRow or Avro; a state variable's value struct may gain fields (null), with or without
    TTL (the expiry kept), UnsafeRow or Avro. Everything else stays as Spark's rule wants it."""
    if not op.column_families:
        return problems
    schemas = {s.name: s for s in logical_stores(target)[1]}
    try:
        key, key_notes = grouping_key(
            {cf["name"]: cf["key_schema"] for cf in op.column_families},
            {name: s.key_schema for name, s in schemas.items()},
            {t.name: t.kind for t in op.tables},
        )
    except Refused as e:
        return _refused(problems, where, "grouping key", e)
    evolutions, notes, refusal = _variable_evolutions(uid, op, schemas, key, problems, where)
    if refusal is not None:
        return refusal
    if evolutions:
        plan.evolutions[uid] = evolutions
    plan.report.evolved += [f"uid {uid}: {n}" for n in key_notes] + notes
    return []


def _variable_evolutions(
    uid: str,
    op: OperatorState,
    schemas: dict[str, Any],
    key: PartEvolution | None,
    problems: list[str],
    where: str,
) -> tuple[dict[str, TableEvolution], list[str], list[str] | None]:
    """Every table's evolution under the grouping key ``key`` and the plan's notes, or why
    restore refuses (the third item, None when it does not)."""
    stored_families = {cf["name"] for cf in op.column_families or []}
    evolutions = {}
    notes: list[str] = []
    for table in op.tables:
        desc = schemas.get(table.name)
        if table.kind == "timers":
            if key is not None:
                evolutions[table.name] = TableEvolution(key=key)
            continue
        if desc is None or table.kind not in VALUE_COLUMNS:
            return {}, [], problems
        what = f"state variable {table.name!r}"
        try:
            evo, changes = _variable_evolution(table, desc, key, stored_families, schemas)
        except Refused as e:
            return {}, [], _refused(problems, where, what, e, table.name)
        if evo is not None:
            evolutions[table.name] = evo
        notes += _prefixed(f"uid {uid} {what}", changes)
    return evolutions, notes, None


def _prefixed(prefix: str, notes: list[str]) -> list[str]:
    return [f"{prefix}: {n}" for n in notes]


def _variable_evolution(
    table: Any,
    desc: Any,
    key: PartEvolution | None,
    stored_families: set[str],
    query_families: dict[str, Any],
) -> tuple[TableEvolution | None, list[str]]:
    """One state variable's value struct, with or without TTL: how it evolves (None: as it
    is, and its key too) and the plan's notes. Raises Refused."""
    # A TTL'd value evolves inside Spark's TTL wrapper, its expiry kept. UnsafeRow or Avro,
    # the rows are re-encoded in the query's schema (the schema file says so), so Spark 4.3
    # finds its own schema and evolves nothing itself.
    value, changes = state_variable_value(
        table.value_schema,
        desc.value_schema,
        stored_ttl=TTL_INDEX + table.name in stored_families,
        query_ttl=TTL_INDEX + table.name in query_families,
    )
    if value is None and key is None:
        return None, changes
    return TableEvolution(key=key, value=value), changes


def plan_transform(
    plan: RestorePlan, uid: str, op: OperatorState, target: Operator, where: str, native: bool
) -> list[str]:
    """``--transform UID=FILE.py:FUNCTION``: the user's function makes the query's rows."""
    spec = plan.transforms[uid]
    if native or op.column_families or any(t.kind not in STORE_KINDS for t in op.tables):
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
        plan.report.evolved.append(
            f"uid {uid}{_store_label(table.name)}: rows transformed by {spec}, checked against "
            f"the query's {simple_string(json.loads(desc.key_schema))} / "
            f"{simple_string(json.loads(desc.value_schema))}"
        )
    plan.evolutions[uid] = evolutions
    return []

"""Which savepoint operator (uid) goes to which operator id of the restored query.

A uid goes to ``--map``'s operator id, else (with ``--query``) to the query's operator with
the same fingerprint (what it is, not where it sits: ids shift when operators are added or
removed), else to the id it had. State with no operator to go to is an error unless ``-n``;
state whose operator is still there with another schema is evolved (statectl/restoration/
evolve.py) or refused either way. The query's operators no state goes to start empty.
"""

from __future__ import annotations

from typing import Any

from statectl.checkpoint.model import UNKNOWN_OPERATOR, Operator
from statectl.operators import classify
from statectl.query_plan import PlannedQuery
from statectl.restoration.evolve import STORE_KINDS, evolve
from statectl.restoration.plan import RestorePlan
from statectl.savepoints.create import default_uid, logical_stores
from statectl.savepoints.format import OperatorState, fingerprint_of, operator_fingerprint


def dedupe(names: list[tuple[int, str]]) -> dict[int, str]:
    """Twin fingerprints get -2, -3 in operator id order, as default uids do."""
    out: dict[int, str] = {}
    seen: dict[str, int] = {}
    for op_id, name in sorted(names):
        seen[name] = seen.get(name, 0) + 1
        out[op_id] = name if seen[name] == 1 else f"{name}-{seen[name]}"
    return out


def unknown_uid_problems(
    m: Any, mapping: dict[str, int], drop: list[str], transforms: dict[str, str]
) -> list[str]:
    """``--map``, ``--drop`` and ``--transform`` name only uids the savepoint has."""
    uids = {op.uid for op in m.operators}
    problems = []
    for flag, names in (
        ("--map", sorted(mapping)),
        ("--drop", sorted(drop)),
        ("--transform", sorted(transforms)),
    ):
        unknown = [u for u in names if u not in uids]
        if unknown:
            problems.append(
                f"{flag} names uids the savepoint does not have: {', '.join(unknown)} "
                f"(it has {', '.join(sorted(uids))})"
            )
    return problems


def _query_fingerprints(query: PlannedQuery) -> dict[str, int]:
    """The query's operators by fingerprint. Spark < 4 wrote no operator metadata, so its
    operators are named "unknown": they match by stores and key schemas alone."""
    ops = query.operators
    by_fingerprint = {
        fp: op_id for op_id, fp in dedupe([(o.operator_id, default_uid(o)) for o in ops]).items()
    }
    unnamed = [
        (
            o.operator_id,
            operator_fingerprint(
                UNKNOWN_OPERATOR, o.store_names, [(d.name, d.key_schema) for d in o.schemas]
            ),
        )
        for o in ops
    ]
    by_fingerprint.update({fp: op_id for op_id, fp in dedupe(unnamed).items()})
    return by_fingerprint


def match_operators(
    plan: RestorePlan,
    m: Any,
    mapping: dict[str, int],
    drop: list[str],
    query: PlannedQuery | None,
) -> list[str]:
    """Fill ``plan.restored`` (uid -> operator id); returns the uids with no operator."""
    by_fingerprint = _query_fingerprints(query) if query is not None else {}
    sp_fingerprints = dedupe([(op.operator_id, fingerprint_of(op)) for op in m.operators])
    unmatched = []
    for op in m.operators:
        if op.uid in drop:
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
        else:
            plan.restored[op.uid] = target_id
    return unmatched


def _schema_changed(
    op: OperatorState, candidates: dict[int, Operator], taken: set[int]
) -> Operator | None:
    """The query operator that is this savepoint operator with a changed schema: the same kind
    with the same store names (or the same operator id), not already restored into."""
    for qop in sorted(candidates.values(), key=lambda o: o.operator_id != op.operator_id):
        if qop.operator_id in taken:
            continue
        same_kind = op.name in (qop.name, UNKNOWN_OPERATOR)
        same_stores = sorted(t.name for t in op.tables if t.kind in STORE_KINDS) == sorted(
            logical_stores(qop)[0]
        ) or (op.column_families is not None and qop.uses_column_families)
        if same_kind and (same_stores or qop.operator_id == op.operator_id):
            return qop
    return None


def match_changed_operators(
    plan: RestorePlan, m: Any, query: PlannedQuery, unmatched: list[str], drop: list[str]
) -> set[int]:
    """Not gone, changed: an operator of the same kind and stores (or id) is still in the
    query, with another schema. Evolved or renamed, it is restored; else refused (dropping its
    state with -n is not the fix, so not offered). Removes them from ``unmatched``; returns
    the query operators refused so."""
    by_uid = {op.uid: op for op in m.operators}
    taken = set(plan.restored.values())
    changed: set[int] = set()
    native = m.savepoint_type == "native"
    for uid in [u for u in unmatched if u not in drop]:
        qop = _schema_changed(by_uid[uid], plan.query_operators, taken)
        if qop is None:
            continue
        reasons = evolve(plan, uid, by_uid[uid], qop, query, native)
        taken.add(qop.operator_id)
        unmatched.remove(uid)
        if not reasons:
            plan.restored[uid] = qop.operator_id  # renamed or evolved: restored
            continue
        for r in reasons:
            plan.problems.append(
                f"{r} (keep the stored schema, or drop this state with --drop {uid} -n)"
            )
        changed.add(qop.operator_id)
    return changed


def settle_unmatched(
    plan: RestorePlan, unmatched: list[str], allow_non_restored: bool, with_query: bool
) -> None:
    """State with no operator: dropped with -n, else a problem; and one id per uid."""
    if unmatched:
        if allow_non_restored:
            plan.dropped = unmatched
        else:
            plan.problems.append(
                f"state of {', '.join(unmatched)} matches no operator of the "
                f"{'query' if with_query else 'restore'}; pass -n (--allow-non-restored-state) "
                "to drop it, or --map UID=OPERATOR_ID"
            )
    ids = list(plan.restored.values())
    if len(set(ids)) != len(ids):
        plan.problems.append(f"two uids map to the same operator id: {plan.restored}")


def name_from_query(op: OperatorState, qop: Operator | None) -> None:
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


def check_query_operators(plan: RestorePlan, m: Any, query: PlannedQuery) -> None:
    """Every restored uid's operator is in the query, its state readable by it (schema
    evolution where Spark's rule refuses)."""
    by_uid = {op.uid: op for op in m.operators}
    ops = plan.query_operators
    for uid, op_id in plan.restored.items():
        if op_id not in ops:
            plan.problems.append(
                f"uid {uid} maps to operator {op_id}, which the query does not have "
                f"(its operators: {', '.join(f'{i} {o.name}' for i, o in sorted(ops.items()))})"
            )
        elif uid not in plan.evolutions and m.savepoint_type != "native":
            name_from_query(by_uid[uid], ops[op_id])
            plan.problems.extend(evolve(plan, uid, by_uid[uid], ops[op_id], query, False))


def start_empty(plan: RestorePlan, restored_ids: list[int], changed: set[int]) -> None:
    """The query's operators no state goes to start with empty state."""
    for op_id, qop in sorted(plan.query_operators.items()):
        if op_id in restored_ids or op_id in changed:
            continue
        plan.started_empty[op_id] = qop.name
        if qop.uses_column_families and not plan.snapshot_rocksdb:
            plan.problems.append(
                f"operator {op_id} ({qop.name}, transformWithState) starts empty only "
                "on RocksDB snapshots (--backend rocksdb, no --changelog)"
            )


def refusal_problems(plan: RestorePlan, m: Any) -> list[str]:
    """Restored operators of kinds restore refuses (operators.py says why)."""
    problems = []
    for op in m.operators:
        if op.uid in plan.restored and (refusal := op.kind.refusal(f"uid {op.uid} ({op.name})")):
            problems.append(refusal)
    return problems

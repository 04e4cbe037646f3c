"""Everything from the savepoint that becomes a path, an id or a file count in the target is
checked before anything is written: ids are non-negative ints, names are plain path
components, batch ids are credible; a native savepoint restores only as it is."""

from __future__ import annotations

import re
from typing import Any

from statectl.restoration.plan import RestorePlan
from statectl.restoration.source_logs import MAX_SOURCE_LOG_FILES, log_offset, source_log_layout

MAX_OPERATOR_ID = 2**31 - 1
MAX_BATCH_ID = 2**62
# Store, state variable and source names that become path components of the target.
SAFE_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.$=-]{0,254}")


def valid_id(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool) and 0 <= x <= MAX_OPERATOR_ID


def safe_name(x: Any) -> bool:
    return isinstance(x, str) and SAFE_NAME.fullmatch(x) is not None


def safe_rel(path: Any) -> bool:
    """A path relative to the savepoint under its embedded ``checkpoint/``, without ``..``."""
    if not isinstance(path, str) or path.startswith("/") or "\\" in path:
        return False
    parts = path.split("/")
    return (
        len(parts) > 1 and parts[0] == "checkpoint" and all(p not in ("", ".", "..") for p in parts)
    )


def _operator_problems(m: Any) -> list[str]:
    problems = []
    for op in m.operators:
        if not valid_id(op.operator_id):
            problems.append(
                f"_metadata: operator {op.uid!r} has operator_id {op.operator_id!r}, not a "
                "non-negative integer"
            )
        for t in op.tables:
            # Store names become directories; transformWithState variables live in one store.
            if not op.column_families and not safe_name(t.name):
                problems.append(
                    f"_metadata: operator {op.uid!r} has a table named {t.name!r}, which is not "
                    "a plain file name"
                )
    return problems


def _source_log_problem(m: Any, source: Any, entries: Any) -> str | None:
    if not safe_name(source):
        return f"_metadata: source log name {source!r} is not a plain file name"
    if not isinstance(entries, list) or not all(isinstance(e, dict) for e in entries):
        return f"_metadata: source log {source!r} is not a list of entries"
    bad = _bad_batch_id(m, source, entries)
    if bad is not None:
        return bad
    return _source_log_size_problem(m, source, entries) if entries else None


def _bad_batch_id(m: Any, source: str, entries: list[dict]) -> str | None:
    bad = [b for b in (e.get("batchId") for e in entries) if not valid_id(b) or b > m.batch_id]
    if not bad:
        return None
    return (
        f"_metadata: source log {source!r} has batchId {bad[0]!r}; a file source's "
        f"batch ids are integers from 0 to the savepoint's batch {m.batch_id}"
    )


def _source_log_size_problem(m: Any, source: str, entries: list[dict]) -> str | None:
    prev = log_offset((m.previous_offsets or {}).get(source))
    n = len(source_log_layout(entries, prev))
    if n <= MAX_SOURCE_LOG_FILES:
        return None
    return (
        f"_metadata: source log {source!r} would need {n} log files (batchId "
        f"{max(int(e['batchId']) for e in entries)}, previous offset {prev}); refusing more "
        f"than {MAX_SOURCE_LOG_FILES}"
    )


def safety_problems(m: Any, mapping: dict[str, int]) -> list[str]:
    """The savepoint's ids, names and batch ids, and ``--map``'s operator ids."""
    if not valid_id(m.batch_id) or m.batch_id > MAX_BATCH_ID:
        return [f"_metadata: batch_id {m.batch_id!r} is not a non-negative integer"]
    problems = []
    if m.offset_log_version not in (1, 2):
        problems.append(
            f"restoring offset log v{m.offset_log_version} is not supported (v1 and v2 are)"
        )
    problems += _operator_problems(m)
    for uid, op_id in mapping.items():
        if not valid_id(op_id):
            problems.append(f"--map {uid}={op_id}: operator ids are integers from 0")
    for source, entries in (m.source_logs or {}).items():
        problem = _source_log_problem(m, source, entries)
        if problem is not None:
            problems.append(problem)
    return problems


def _unsafe_paths(m: Any) -> list[str]:
    problems = []
    for op in m.operators:
        for t in op.tables:
            for f in t.files:
                if not safe_rel(f.path):
                    problems.append(
                        f"_metadata: data file path {f.path!r} is not inside the savepoint"
                    )
    for f in m.native_logs or []:
        if not safe_rel(f.path):
            problems.append(f"_metadata: log file path {f.path!r} is not inside the savepoint")
    return problems


def native_problems(plan: RestorePlan, m: Any) -> list[str]:
    """A native savepoint is a copy of Spark's own files: it restores as it is (same backend,
    partition count and layout, every operator at its id) or is converted first."""
    src = m.source_checkpoint
    convert = "convert it first: statectl savepoint --type canonical SAVEPOINT"
    problems = []
    if plan.backend != src.get("backend") or plan.partitions != src.get("partitions"):
        problems.append(
            f"a native savepoint restores only to its own backend and partition count "
            f"({src.get('backend')}, {src.get('partitions')} partitions); {convert}"
        )
    moved = {u: i for u, i in plan.restored.items() if m.operator(u).operator_id != i}
    if moved or plan.dropped or plan.started_empty:
        problems.append(
            "a native savepoint restores every operator at its own id; to move, drop or add "
            f"operators, {convert}"
        )
    if plan.checkpoint_format != int(src.get("checkpoint_format_version") or 1):
        problems.append(f"a native savepoint keeps its checkpoint format; {convert}")
    return problems + _unsafe_paths(m)

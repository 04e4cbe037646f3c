"""Use case ``edit``: a new savepoint with one operator's rows deleted, kept, or dropped.

A thin layer over the processor's writer: the ``WHERE``-subset expression (expressions.py)
becomes a pyarrow filter applied to every table of the operator (a transformWithState key is
deleted from its value, list and map state and its timers together), or to ``--table`` only.
"""

from __future__ import annotations

from typing import Any

import pyarrow.compute as pc

from statectl import expressions
from statectl.errors import StatectlError
from statectl.processor.reading import OperatorInfo, StateHandle, TableInfo, open_handle
from statectl.processor.writing import SavepointWriter


def edit(
    source: str,
    target: str | None,
    operator: str,
    *,
    delete_where: str | None = None,
    keep_where: str | None = None,
    drop: bool = False,
    table: str | None = None,
    dry_run: bool = False,
    batch: int | None = None,
) -> dict[str, Any]:
    _check_arguments(delete_where, keep_where, drop, table, target, dry_run)
    base = open_handle(source, batch=batch)
    op = base.operator(operator)
    writer = SavepointWriter(base)
    doc: dict[str, Any] = {
        "source": base.path,
        "target": None,
        "operator": op.uid,
        "dropped": drop,
        "tables": {},
        "dry_run": dry_run,
    }
    if drop:
        writer.remove_operator(op.uid)
        doc["tables"] = {
            t.name: {"before": t.rows, "after": 0, "removed": t.rows} for t in op.tables
        }
        if not dry_run:
            doc["target"] = writer.write(target).path
        return doc
    tables = [op.table(table)] if table is not None else list(op.tables)
    for t in tables:
        predicate = _predicate(delete_where, keep_where, t, op, several=table is None)
        writer.filter(op.uid, predicate, table=t.name)
    if dry_run:
        doc["tables"] = writer.preview().get(op.uid, {}).get("tables", {})
        return doc
    out = writer.write(target)
    doc["tables"] = {t.name: _counts(base, op, t, out) for t in tables}
    doc["target"] = out.path
    return doc


def _check_arguments(
    delete_where: str | None,
    keep_where: str | None,
    drop: bool,
    table: str | None,
    target: str | None,
    dry_run: bool,
) -> None:
    if sum(x is not None for x in (delete_where, keep_where)) + bool(drop) != 1:
        raise StatectlError("give exactly one of --delete-where, --keep-where, --drop")
    if drop and table is not None:
        raise StatectlError("--drop removes the whole operator; it takes no --table")
    if target is None and not dry_run:
        raise StatectlError("name the TARGET directory of the new savepoint")


def _predicate(
    delete_where: str | None,
    keep_where: str | None,
    t: TableInfo,
    op: OperatorInfo,
    several: bool,
) -> pc.Expression:
    """The filter of one table; ``several``: the expression applies to every table of the
    operator, so a column missing from one of them asks for ``--table``."""
    try:
        if delete_where is not None:
            return expressions.delete_where(delete_where, t.schema)
        assert keep_where is not None
        return expressions.keep_where(keep_where, t.schema)
    except expressions.ExpressionError as e:
        if several and len(op.tables) > 1 and str(e).startswith("no column"):
            raise StatectlError(
                f"{e} (in table {t.name} of {op.uid}; choose one with --table)"
            ) from None
        raise


def _counts(base: StateHandle, op: OperatorInfo, t: TableInfo, out: StateHandle) -> dict[str, int]:
    before = t.rows
    if before is None:  # a checkpoint: counting is reading
        before = sum(part.num_rows for _, part in base.partitions(op, t.name))
    after = out.operator(op.uid).table(t.name).rows or 0
    return {"before": before, "after": after, "removed": before - after}

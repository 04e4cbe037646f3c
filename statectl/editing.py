"""Use case ``edit``: a new savepoint with one operator's rows deleted, kept, or dropped.

A thin layer over the processor's writer: the ``WHERE``-subset expression (expressions.py)
becomes a pyarrow filter applied to every table of the operator (a transformWithState key is
deleted from its value, list and map state and its timers together), or to ``--table`` only.
"""

from __future__ import annotations

from typing import Any

from statectl import expressions
from statectl.errors import StatectlError
from statectl.processor.reading import open_handle
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
    if sum(x is not None for x in (delete_where, keep_where)) + bool(drop) != 1:
        raise StatectlError("give exactly one of --delete-where, --keep-where, --drop")
    if drop and table is not None:
        raise StatectlError("--drop removes the whole operator; it takes no --table")
    if target is None and not dry_run:
        raise StatectlError("name the TARGET directory of the new savepoint")
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
    else:
        tables = [op.table(table)] if table is not None else list(op.tables)
        text = delete_where if delete_where is not None else keep_where
        for t in tables:
            try:
                predicate = (
                    expressions.delete_where(text, t.schema)  # type: ignore[arg-type]
                    if delete_where is not None
                    else expressions.keep_where(text, t.schema)  # type: ignore[arg-type]
                )
            except expressions.ExpressionError as e:
                if table is None and len(tables) > 1 and str(e).startswith("no column"):
                    raise StatectlError(
                        f"{e} (in table {t.name} of {op.uid}; choose one with --table)"
                    ) from None
                raise
            writer.filter(op.uid, predicate, table=t.name)
        if dry_run:
            doc["tables"] = writer.preview().get(op.uid, {}).get("tables", {})
            return doc
        out = writer.write(target)
        for t in tables:
            before = t.rows
            if before is None:  # a checkpoint: counting is reading
                before = sum(part.num_rows for _, part in base.partitions(op, t.name))
            after = out.operator(op.uid).table(t.name).rows or 0
            doc["tables"][t.name] = {"before": before, "after": after, "removed": before - after}
        doc["target"] = out.path
        return doc
    if dry_run:
        return doc
    doc["target"] = writer.write(target).path
    return doc

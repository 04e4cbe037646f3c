"""What the processor says about a savepoint's or checkpoint's state: its operators and
their tables (name, kind, the columns ``read`` returns, the recorded schemas, rows)."""

from __future__ import annotations

from dataclasses import dataclass

import pyarrow as pa

from statectl.errors import StatectlError, wording
from statectl.savepoints.format import StateTable
from statectl.savepoints.tables import table_schema


@dataclass(frozen=True)
class TableInfo:
    """One store, join store, transformWithState variable or ``$timers`` of an operator."""

    name: str
    kind: str  # store | join-store | ValueState | ListState | MapState | timers
    schema: pa.Schema  # the columns ``read`` returns (Spark's ``statestore`` columns)
    key_schema: pa.DataType  # the ``key`` column (the grouping key for transformWithState)
    value_schema: pa.DataType  # ``value`` / ``list_element`` / ``user_map_value`` / timestamp
    spark_key_schema: str  # as recorded (Spark JSON)
    spark_value_schema: str
    rows: int | None  # known for canonical savepoints; None where counting means reading

    @property
    def value_column(self) -> str:
        return {"ListState": "list_element", "MapState": "user_map_value"}.get(
            self.kind, "expiration_timestamp_ms" if self.kind == "timers" else "value"
        )

    @property
    def key_columns(self) -> list[str]:
        """Columns that identify a row (``diff`` joins on them)."""
        if self.kind == "MapState":
            return ["key", "user_map_key"]
        if self.kind == "timers":
            return ["key", "expiration_timestamp_ms"]
        return ["key"]


@dataclass(frozen=True)
class OperatorInfo:
    """A stateful operator of a savepoint or checkpoint."""

    uid: str
    id: int
    name: str  # Spark's operator name (stateStoreSave, dedupe, symmetricHashJoin, ...)
    kind: str  # statectl's operator kind (statectl/operators.py)
    restorable: bool
    partitions: int
    tables: tuple[TableInfo, ...]

    @property
    def rows(self) -> int | None:
        counts = [t.rows for t in self.tables]
        return None if any(c is None for c in counts) else sum(c or 0 for c in counts)

    def table(self, name: str | None = None) -> TableInfo:
        """``name``, or the operator's only table, or its ``default`` store."""
        by_name = {t.name: t for t in self.tables}
        if name is None:
            if "default" in by_name:
                return by_name["default"]
            if len(self.tables) == 1:
                return self.tables[0]
        elif name in by_name:
            return by_name[name]
        raise StatectlError(
            f"operator {self.uid} (id {self.id}) has no store or state variable "
            f"{name or 'default'!r}; it has: {', '.join(by_name) or 'none'} "
            f"(pass {wording('--store or --state-var; --table for edit', 'table=...')})"
        )


def table_info(
    name: str, kind: str, key: str, value: str, user_key: str | None, rows: int | None
) -> TableInfo:
    """A table described from its recorded (Spark JSON) key and value schemas."""
    st = StateTable(name, kind, key, value, [], 0, [], user_key)
    schema = table_schema(st)
    value_at = 2 if kind == "MapState" else 1
    return TableInfo(
        name, kind, schema, schema.field(0).type, schema.field(value_at).type, key, value, rows
    )

"""The edits ``SavepointWriter`` applies to a table's rows: filters and transforms, new state
conformed to the declared schemas field by field, and the placement of rows in the partition
Spark hash-partitions their key to (``OperatorKind.partition_key``, statectl/operators.py).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, TypeAlias

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from statectl.codecs.murmur3 import partition_ids
from statectl.errors import StatectlError
from statectl.processor.model import OperatorInfo, TableInfo
from statectl.processor.spill import Spill

Predicate: TypeAlias = "pc.Expression | Callable[[pa.RecordBatch], Any]"
Transform: TypeAlias = "Callable[[pa.RecordBatch], pa.RecordBatch | pa.Table]"


@dataclass
class Edit:
    kind: str  # "filter" | "transform"
    fn: Any


@dataclass
class TableEdits:
    replacement: pa.Table | Spill | None = None  # with_state (a Spill: streamed, placed)
    edits: list[Edit] = field(default_factory=list)

    @property
    def moves_keys(self) -> bool:
        return isinstance(self.replacement, pa.Table) or any(
            e.kind == "transform" for e in self.edits
        )


def conform(data: pa.Table, info: TableInfo, what: str) -> pa.Table:
    """``data`` with exactly the table's declared columns and types (``partition_id`` is
    dropped: placement is computed). A field that is missing, extra or of another type that
    does not convert losslessly is an error naming the field."""
    arrays = []
    for f in info.schema:
        if f.name == "partition_id":
            continue
        if f.name not in data.column_names:
            raise StatectlError(
                f"{what}: column {f.name!r} is missing (the table has {_names(info.schema)})"
            )
        arrays.append(_conform(data.column(f.name).combine_chunks(), f.type, f"{what}: {f.name}"))
    extra = set(data.column_names) - {f.name for f in info.schema}
    if extra:
        raise StatectlError(
            f"{what}: column(s) {', '.join(sorted(extra))} are not in the table "
            f"({_names(info.schema)})"
        )
    names = [f.name for f in info.schema if f.name != "partition_id"]
    return pa.Table.from_arrays(arrays, names=names)


def _names(schema: pa.Schema) -> str:
    return ", ".join(f.name for f in schema if f.name != "partition_id")


def _conform(arr: pa.Array, t: pa.DataType, where: str) -> pa.Array:
    if arr.type == t:
        return arr
    if pa.types.is_struct(t):
        return _conform_struct(arr, t, where)
    if (_family(arr.type), _family(t)) not in _CONVERTIBLE and _family(arr.type) != _family(t):
        raise StatectlError(f"{where} is {arr.type}, the declared type is {t}")
    try:
        return arr.cast(t, safe=True)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError) as e:
        raise StatectlError(
            f"{where} is {arr.type}, the declared type is {t} ({str(e).splitlines()[0]})"
        ) from None


def _same_fields(have: list[str], want: list[str], t: pa.DataType, where: str) -> None:
    missing = [n for n in want if n not in have]
    if missing:
        raise StatectlError(f"{where}.{missing[0]} is missing (declared: {t})")
    extra = [n for n in have if n not in want]
    if extra:
        raise StatectlError(f"{where}.{extra[0]} is not in the declared schema ({t})")


def _conform_struct(arr: pa.Array, t: pa.DataType, where: str) -> pa.Array:
    """A struct with exactly ``t``'s fields, by name, each conformed."""
    if not pa.types.is_struct(arr.type):
        raise StatectlError(f"{where} must be a struct {t}, got {arr.type}")
    have = [arr.type.field(i).name for i in range(arr.type.num_fields)]
    want = [t.field(i).name for i in range(t.num_fields)]
    _same_fields(have, want, t, where)
    children = [
        _conform(arr.field(have.index(n)), t.field(i).type, f"{where}.{n}")
        for i, n in enumerate(want)
    ]
    return pa.StructArray.from_arrays(
        children, fields=list(t), mask=arr.is_null() if arr.null_count else None
    )


# Conversions with_state and transform accept beyond a family (e.g. int8 -> int64): numbers
# that stay numbers; the cast itself is ``safe`` (overflow and truncation are errors).
_CONVERTIBLE = {("int", "float"), ("int", "decimal"), ("null", "int"), ("null", "string")}


def _family(t: pa.DataType) -> str:
    for name, test in (
        ("int", pa.types.is_integer),
        ("float", pa.types.is_floating),
        ("decimal", pa.types.is_decimal),
        ("string", lambda x: pa.types.is_string(x) or pa.types.is_large_string(x)),
        ("binary", lambda x: pa.types.is_binary(x) or pa.types.is_large_binary(x)),
        ("timestamp", pa.types.is_timestamp),
        ("date", pa.types.is_date),
        ("list", lambda x: pa.types.is_list(x) or pa.types.is_large_list(x)),
        ("null", pa.types.is_null),
    ):
        if test(t):
            return name
    return str(t)


def as_arrow(data: Any) -> pa.Table:
    """Arrow, pandas (struct columns as dicts, or flattened ``key.k`` columns) or a Spark
    DataFrame (through ``toArrow``) as one Arrow table with ``key``/``value``... columns."""
    if isinstance(data, pa.RecordBatch):
        return pa.Table.from_batches([data])
    if isinstance(data, pa.Table):
        table = data
    elif hasattr(data, "toArrow"):  # a Spark DataFrame (PySpark >= 4)
        table = data.toArrow()
    elif hasattr(data, "to_dict") and hasattr(data, "columns"):  # pandas
        table = pa.Table.from_pandas(data, preserve_index=False)
    else:
        raise StatectlError(
            f"with_state takes a pyarrow Table, a pandas or a Spark DataFrame, "
            f"not {type(data).__name__}"
        )
    return _unflatten(table)


def _unflatten(table: pa.Table) -> pa.Table:
    """``key.k``, ``value.count`` columns (``Table.flatten()``'s names) nested back."""
    if not any("." in n for n in table.column_names):
        return table
    tree: dict[str, Any] = {}
    for name, col in zip(table.column_names, table.columns, strict=True):
        node = tree
        parts = name.split(".")
        for p in parts[:-1]:
            node = node.setdefault(p, {})
        node[parts[-1]] = col.combine_chunks()

    def build(node: Any) -> pa.Array:
        if isinstance(node, dict):
            children = {k: build(v) for k, v in node.items()}
            return pa.StructArray.from_arrays(list(children.values()), names=list(children))
        return node

    return pa.table({k: build(v) for k, v in tree.items()})


def _mask(fn: Predicate, batch: pa.RecordBatch) -> pa.Array:
    out = fn(batch)
    if isinstance(out, pc.Expression):
        raise StatectlError("a filter function returns a boolean array, not an expression")
    mask = pa.array(out, type=pa.bool_()) if not isinstance(out, pa.Array) else out
    if len(mask) != batch.num_rows:
        raise StatectlError(f"the filter function returned {len(mask)} values for {batch.num_rows}")
    return pc.fill_null(mask, False)


def apply_edit(edit: Edit, table: pa.Table, info: TableInfo, what: str) -> pa.Table:
    if edit.kind == "filter":
        if isinstance(edit.fn, pc.Expression):
            try:
                return table.filter(edit.fn)
            except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError) as e:
                raise StatectlError(f"{what}: {str(e).splitlines()[0]}") from None
        kept = [b.filter(_mask(edit.fn, b)) for b in table.to_batches()]
        return pa.Table.from_batches(kept, schema=table.schema)
    if table.num_rows == 0:
        return table
    out = []
    for b in table.to_batches():
        result = edit.fn(b)
        if isinstance(result, pa.RecordBatch):
            result = pa.Table.from_batches([result])
        if not isinstance(result, pa.Table):
            raise StatectlError(
                f"{what}: the transform returned {type(result).__name__}, not a RecordBatch"
            )
        out.append(conform(result, info, f"{what} (transform output)"))
    return with_partition(pa.concat_tables(out), None)


def with_partition(table: pa.Table, partition: int | None) -> pa.Table:
    """``table`` without (``partition=None``) or with a ``partition_id`` column of one value."""
    if "partition_id" in table.column_names:
        table = table.drop_columns(["partition_id"])
    if partition is None:
        return table
    return table.append_column(
        "partition_id", pa.array(np.full(table.num_rows, partition, dtype=np.int32))
    )


def placement(table: pa.Table, info: TableInfo, partitions: int, kind: Any) -> np.ndarray:
    """The partition Spark puts each row of ``table`` in (the operator kind's rule)."""
    if table.num_rows == 0:
        return np.zeros(0, dtype=np.int32)
    key = table.column("key").combine_chunks()
    return partition_ids(kind.partition_key(info.name, key), partitions)


def split_placed(
    table: pa.Table, op: OperatorInfo, info: TableInfo, kind: Any
) -> Iterator[tuple[int, pa.Table]]:
    """``(partition, rows)`` of ``table`` placed as Spark would place them."""
    pids = placement(table, info, op.partitions, kind)
    for p in range(op.partitions):
        yield p, with_partition(table.filter(pa.array(pids == p)), p)

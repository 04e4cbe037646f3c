"""``inspect --stats``: how state is spread over partitions, and which keys are largest.

Read one partition at a time through the processor's handle. Bytes per partition are the
savepoint's data file sizes, or for a checkpoint the bytes under the partition's store
directories (every retained version, i.e. what it costs on disk). A key's size is its Arrow
width (string and binary lengths, fixed widths, 8 bytes per list or map entry), summed over
its rows for list and map state: the same measure on both kinds, comparable across keys.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterator
from typing import Any, Protocol

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from statectl.processor.model import OperatorInfo, TableInfo

# A table is flagged skewed when its hottest partition holds at least SKEW_RATIO times the
# median partition's rows and at least SKEW_MIN_ROWS rows: a few rows spread unevenly over
# many partitions are noise, not a hot key range. One rule for inspect --stats and history.
SKEW_RATIO = 2.0
SKEW_MIN_ROWS = 100


class StateHandle(Protocol):
    """What stats reads of a handle (statectl/processor/handle.py, which calls in here)."""

    path: str
    batch: int
    operators: tuple[OperatorInfo, ...]

    def operator(self, ref: str | int | OperatorInfo) -> OperatorInfo: ...

    def partitions(
        self,
        op: str | int | OperatorInfo,
        table: str | None = None,
        *,
        join_side: str | None = None,
    ) -> Iterator[tuple[int, pa.Table]]: ...

    def partition_bytes(self, op: OperatorInfo, table: TableInfo) -> list[int]: ...


def _is_bytes(t: pa.DataType) -> bool:
    return any(
        test(t)
        for test in (
            pa.types.is_string,
            pa.types.is_binary,
            pa.types.is_large_string,
            pa.types.is_large_binary,
        )
    )


def _is_nested(t: pa.DataType) -> bool:
    return any(test(t) for test in (pa.types.is_list, pa.types.is_large_list, pa.types.is_map))


def _width(arr: pa.Array) -> np.ndarray:
    """Approximate bytes of each value of ``arr``."""
    n = len(arr)
    t = arr.type
    if pa.types.is_struct(t):
        out = np.zeros(n, np.int64)
        for i in range(t.num_fields):
            out += _width(arr.field(i))
        return out
    if _is_bytes(t):
        return (
            pc.fill_null(pc.binary_length(arr), 0).to_numpy(zero_copy_only=False).astype(np.int64)
        )
    if _is_nested(t):
        lengths = pc.fill_null(pc.list_value_length(arr), 0)
        return lengths.to_numpy(zero_copy_only=False).astype(np.int64) * 8
    if pa.types.is_null(t):
        return np.zeros(n, np.int64)
    try:
        return np.full(n, max(t.bit_width // 8, 1), np.int64)
    except ValueError:  # no fixed width (e.g. decimal256 in some versions): count 16
        return np.full(n, 16, np.int64)


def _candidates(part: pa.Table, table: TableInfo, top: int) -> list[tuple[Any, int, int]]:
    """(key, bytes, rows) of the largest keys of one partition (at most ``top`` for tables of
    a row per key; every key for list, map and timer tables, whose keys span rows)."""
    size = np.zeros(part.num_rows, np.int64)
    for name in part.column_names:
        if name != "partition_id":
            size += _width(part.column(name).combine_chunks())
    key = part.column("key").combine_chunks()
    if table.kind not in ("ListState", "MapState", "timers"):
        order = np.argsort(-size)[:top]
        picked = key.take(pa.array(order)).to_pylist()
        return [(k, int(size[i]), 1) for k, i in zip(picked, order, strict=True)]
    # Several rows per key: a key's size is the sum of its rows.
    flat = pa.table({"k": key}).flatten()
    names = flat.column_names
    grouped = (
        flat.append_column("_s", pa.array(size))
        .group_by(names, use_threads=False)
        .aggregate([("_s", "sum"), ("_s", "count")])
    )
    sizes = grouped.column("_s_sum").to_numpy()
    keys = grouped.select(names).to_pylist()
    counts = grouped.column("_s_count").to_pylist()
    return [
        ({k.split(".", 1)[1]: v for k, v in kd.items()}, int(s), c)
        for kd, s, c in zip(keys, sizes, counts, strict=True)
    ]


def table_stats(
    handle: StateHandle, op: OperatorInfo, table: TableInfo, top: int
) -> dict[str, Any]:
    rows: list[int] = []
    heap: list[tuple[int, int, Any]] = []  # (size, tiebreak, key) of the largest keys so far
    seen = 0
    for _, part in handle.partitions(op, table.name):
        rows.append(part.num_rows)
        if part.num_rows == 0 or top <= 0:
            continue
        for k, s, c in _candidates(part, table, top):
            seen += 1
            item = (s, -seen, {"key": k, "bytes": s, "rows": c})
            if len(heap) < top:
                heapq.heappush(heap, item)
            else:
                heapq.heappushpop(heap, item)
    return _summary(rows, handle.partition_bytes(op, table), heap)


def _summary(rows: list[int], sizes: list[int], heap: list[tuple[int, int, Any]]) -> dict[str, Any]:
    """A table's stats from its rows and bytes per partition and its largest keys."""
    per_partition: list[int | None] = list(sizes) or [None] * len(rows)
    total = sum(rows)
    mean = total / len(rows) if rows else 0
    return {
        "rows": total,
        "partitions": [
            {"partition": p, "rows": r, "bytes": b}
            for p, (r, b) in enumerate(zip(rows, per_partition, strict=True))
        ],
        # max / mean rows per partition: 1.0 is perfectly even; N partitions with one hot
        # partition approach N.
        "skew": round(max(rows) / mean, 3) if mean else None,
        "largest_keys": [item[2] for item in sorted(heap, reverse=True)],
        "skewed": is_skewed(rows),
    }


def spread(values: list[int]) -> dict[str, Any]:
    """How uneven per-partition figures are: max, median, max/median (None when the median
    is 0) and the hottest partition."""
    if not values:
        return {"max": None, "median": None, "ratio": None, "hot_partition": None}
    top = max(values)
    median = float(np.median(values))
    return {
        "max": top,
        "median": median,
        "ratio": round(top / median, 3) if median else None,
        "hot_partition": values.index(top),
    }


def is_skewed(rows: list[int]) -> bool:
    """The skew rule (see SKEW_RATIO): a median of 0 with a hot partition counts as skewed."""
    if len(rows) < 2 or max(rows) < SKEW_MIN_ROWS:
        return False
    median = float(np.median(rows))
    return median == 0 or max(rows) / median >= SKEW_RATIO


def state_stats(
    handle: StateHandle, *, operator: str | None = None, top: int = 10
) -> dict[str, Any]:
    ops = [handle.operator(operator)] if operator is not None else list(handle.operators)
    return {
        "path": handle.path,
        "batch": handle.batch,
        "operators": {
            op.uid: {t.name: table_stats(handle, op, t, top) for t in op.tables} for op in ops
        },
    }

"""Use case ``diff``: what differs between the state of two savepoints or checkpoints.

Per operator (matched by uid, else by operator id) and table (matched by name): keys only in
B (added), only in A (removed), in both with another value (changed), and unchanged. A row's
identity is its key (a MapState's key and user key, a timer's key and timestamp); a ListState
key's value is its whole list. Rows are compared vectorized: a hash join (pyarrow/Acero) on
the flattened key columns, values compared column by column. When both sides have the same
partition count their keys are placed alike, so the join runs one partition at a time
(bounded memory); otherwise over the whole table. Keys with nulls or nested lists, which
Arrow's join cannot match, are compared in Python.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from statectl.processor.reading import OperatorInfo, StateHandle, TableInfo

CATEGORIES = ("added", "removed", "changed", "unchanged")


def _flatten(table: pa.Table) -> pa.Table:
    while any(pa.types.is_struct(f.type) for f in table.schema):
        table = table.flatten()
    return table


def _prepare(part: pa.Table, info: TableInfo) -> tuple[pa.Table, pa.Table]:
    """(flat key columns, flat value columns) of one partition, ListState grouped per key."""
    part = part.drop_columns([c for c in ("partition_id",) if c in part.column_names])
    keys = info.key_columns
    if info.kind == "ListState":
        # The state of a key is its list: one row per key, in the stored element order.
        flat_keys = _flatten(part.select(keys))
        names = flat_keys.column_names
        idx = pa.array(np.arange(part.num_rows, dtype=np.int64))
        grouped = (
            flat_keys.append_column("_i", idx)
            .group_by(names, use_threads=False)
            .aggregate([("_i", "list")])
        )
        firsts = pc.list_element(grouped.column("_i_list"), 0)
        elements = part.column("list_element").combine_chunks()
        lists = [
            elements.take(pa.array(ix)).to_pylist() for ix in grouped.column("_i_list").to_pylist()
        ]
        key_rows = part.select(keys).take(firsts)
        return _flatten(key_rows), pa.table({"list_element": pa.array(lists)})
    values = [c for c in part.column_names if c not in keys]
    return _flatten(part.select(keys)), _flatten(part.select(values))


def _joinable(keys: pa.Table) -> bool:
    return all(
        not (pa.types.is_nested(f.type) or pa.types.is_null(f.type)) for f in keys.schema
    ) and not any(c.null_count for c in keys.columns)


def _match(ka: pa.Table, kb: pa.Table) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(a rows only in A, b rows only in B, a rows in both, their b rows)."""
    if _joinable(ka) and _joinable(kb) and ka.schema.equals(kb.schema):
        names = ka.column_names
        left = ka.append_column("_ia", pa.array(np.arange(ka.num_rows, dtype=np.int64)))
        right = kb.append_column("_ib", pa.array(np.arange(kb.num_rows, dtype=np.int64)))
        joined = left.join(right, keys=names, join_type="full outer", use_threads=False)
        ia = joined.column("_ia").to_numpy(zero_copy_only=False)
        ib = joined.column("_ib").to_numpy(zero_copy_only=False)
        a_null = np.isnan(ia) if ia.dtype.kind == "f" else np.zeros(len(ia), bool)
        b_null = np.isnan(ib) if ib.dtype.kind == "f" else np.zeros(len(ib), bool)
        both = ~a_null & ~b_null
        return (
            ia[b_null].astype(np.int64),
            ib[a_null].astype(np.int64),
            ia[both].astype(np.int64),
            ib[both].astype(np.int64),
        )
    # Python: keys with nulls, nested key types, or differing key schemas.
    rows_a = _row_keys(ka)
    rows_b = _row_keys(kb)
    index_b = {k: i for i, k in enumerate(rows_b)}
    only_a, both_a, both_b = [], [], []
    seen_b = np.zeros(len(rows_b), bool)
    for i, k in enumerate(rows_a):
        j = index_b.get(k)
        if j is None:
            only_a.append(i)
        else:
            both_a.append(i)
            both_b.append(j)
            seen_b[j] = True
    return (
        np.array(only_a, np.int64),
        np.flatnonzero(~seen_b).astype(np.int64),
        np.array(both_a, np.int64),
        np.array(both_b, np.int64),
    )


def _hashable(v: Any) -> Any:
    if isinstance(v, dict):
        return tuple((k, _hashable(x)) for k, x in v.items())
    if isinstance(v, list):
        return tuple(_hashable(x) for x in v)
    return v


def _row_keys(t: pa.Table) -> list[Any]:
    return [_hashable(r) for r in t.to_pylist()]


def _equal_rows(va: pa.Table, vb: pa.Table) -> np.ndarray:
    """Row-wise equality of two value tables of equal length (nulls equal nulls)."""
    n = va.num_rows
    eq = np.ones(n, bool)
    if va.column_names != vb.column_names:
        return np.zeros(n, bool)
    for i in range(va.num_columns):  # by position: aggregation buffers repeat names (sum, count)
        a, b = va.column(i).combine_chunks(), vb.column(i).combine_chunks()
        if pa.types.is_null(a.type) and pa.types.is_null(b.type):
            continue  # e.g. dedupe's placeholder value
        if a.type == b.type and not pa.types.is_nested(a.type):
            same = pc.fill_null(pc.equal(a, b), False).to_numpy(zero_copy_only=False)
            both_null = pc.and_(a.is_null(), b.is_null()).to_numpy(zero_copy_only=False)
            eq &= same | both_null
        else:
            pa_, pb_ = a.to_pylist(), b.to_pylist()
            eq &= np.array([x == y for x, y in zip(pa_, pb_, strict=True)], bool)
    return eq


def _sample(keys: pa.Table, values: pa.Table | None, idx: np.ndarray, n: int) -> list[Any]:
    ks = _rows(keys, idx[:n])
    if values is None or values.num_columns == 0:
        return [{"key": k} for k in ks]
    vs = _rows(values, idx[:n])
    return [{"key": k, "value": v} for k, v in zip(ks, vs, strict=True)]


def _rows(t: pa.Table, idx: np.ndarray) -> list[Any]:
    """Rows as dicts; a repeated column name (aggregation buffers) gets ``#2``, ``#3``."""
    t = t.take(pa.array(idx, type=pa.int64()))
    names: list[str] = []
    for n in t.column_names:
        names.append(n if n not in names else f"{n}#{names.count(n) + 1}")
    columns = [c.to_pylist() for c in t.columns]
    return [dict(zip(names, row, strict=True)) for row in zip(*columns, strict=True)] or [
        {} for _ in idx
    ]


class _Tally:
    def __init__(self, samples: int) -> None:
        self.n = samples
        self.counts = dict.fromkeys(CATEGORIES, 0)
        self.samples: dict[str, list[Any]] = {c: [] for c in CATEGORIES[:3]}

    def add(self, a: pa.Table, b: pa.Table, info: TableInfo) -> None:
        ka, va = _prepare(a, info)
        kb, vb = _prepare(b, info)
        only_a, only_b, both_a, both_b = _match(ka, kb)
        same = _equal_rows(va.take(pa.array(both_a)), vb.take(pa.array(both_b)))
        self.counts["removed"] += len(only_a)
        self.counts["added"] += len(only_b)
        self.counts["changed"] += int((~same).sum())
        self.counts["unchanged"] += int(same.sum())
        room = self.n - len(self.samples["removed"])
        if room > 0:
            self.samples["removed"] += _sample(ka, va, only_a, room)
        room = self.n - len(self.samples["added"])
        if room > 0:
            self.samples["added"] += _sample(kb, vb, only_b, room)
        room = self.n - len(self.samples["changed"])
        if room > 0:
            changed = np.flatnonzero(~same)[:room]
            keys = _rows(ka, both_a[changed])
            a_values = _rows(va, both_a[changed])
            b_values = _rows(vb, both_b[changed])
            self.samples["changed"] += [
                {"key": k, "a": x, "b": y} for k, x, y in zip(keys, a_values, b_values, strict=True)
            ]

    def document(self) -> dict[str, Any]:
        return {**self.counts, "samples": self.samples}


def _pair(a: StateHandle, b: StateHandle, op_a: OperatorInfo) -> OperatorInfo | None:
    for op in b.operators:
        if op.uid == op_a.uid:
            return op
    for op in b.operators:
        if op.id == op_a.id and op.name == op_a.name:
            return op
    return None


def diff_table(
    a: StateHandle, b: StateHandle, op_a: OperatorInfo, op_b: OperatorInfo, name: str, samples: int
) -> dict[str, Any]:
    info = op_a.table(name)
    tally = _Tally(samples)
    if op_a.partitions == op_b.partitions:
        # The same partition count places every key in the same partition on both sides.
        for (_, pa_), (_, pb_) in zip(
            a.partitions(op_a, name), b.partitions(op_b, name), strict=True
        ):
            tally.add(pa_, pb_, info)
    else:
        tally.add(a.read(op_a, name), b.read(op_b, name), info)
    return tally.document()


def _diff_operator(
    a: StateHandle, b: StateHandle, op_a: OperatorInfo, op_b: OperatorInfo, samples: int
) -> dict[str, Any]:
    """One operator found on both sides: every table of either, diffed where both have it."""
    tables: dict[str, Any] = {}
    names_b = {t.name for t in op_b.tables}
    for t in op_a.tables:
        if t.name not in names_b:
            tables[t.name] = {"status": "only in A"}
            continue
        tables[t.name] = diff_table(a, b, op_a, op_b, t.name, samples)
    for t in op_b.tables:
        if t.name not in {x.name for x in op_a.tables}:
            tables[t.name] = {"status": "only in B"}
    entry: dict[str, Any] = {"status": "both", "id": op_a.id, "tables": tables}
    if op_b.uid != op_a.uid:
        entry["uid_in_b"] = op_b.uid
    return entry


def _differs(operators: dict[str, Any]) -> bool:
    return any(
        op["status"] != "both"
        or any(
            t.get("status") or t["added"] or t["removed"] or t["changed"]
            for t in op["tables"].values()
        )
        for op in operators.values()
    )


def diff(
    a: StateHandle, b: StateHandle, *, operator: str | None = None, samples: int = 5
) -> dict[str, Any]:
    """The ``statectl diff`` document: per operator of A (and those only in B), per table."""
    ops_a = [a.operator(operator)] if operator is not None else list(a.operators)
    out: dict[str, Any] = {}
    matched_b: set[int] = set()
    for op_a in ops_a:
        op_b = _pair(a, b, op_a)
        if op_b is None:
            if operator is not None:
                b.operator(operator)  # the error names what B has
            out[op_a.uid] = {"status": "only in A", "id": op_a.id, "tables": {}}
            continue
        matched_b.add(op_b.id)
        out[op_a.uid] = _diff_operator(a, b, op_a, op_b, samples)
    if operator is None:
        for op_b in b.operators:
            if op_b.id not in matched_b and _pair(b, a, op_b) is None:
                out[op_b.uid] = {"status": "only in B", "id": op_b.id, "tables": {}}
    return {"a": a.path, "b": b.path, "batch_a": a.batch, "batch_b": b.batch,
            "differs": _differs(out), "operators": out}  # fmt: skip

"""``SavepointWriter``: a new savepoint from an existing one (or a checkpoint), edited.

The base is never modified. Edits are recorded per operator table and applied while writing,
one partition at a time: a filter keeps rows where they are; a transform or ``with_state`` may
produce keys that belong elsewhere, and those rows are re-placed with the operator kind's
placement rule (``OperatorKind.partition_key``, statectl/operators.py), exactly as Spark
hash-partitions them. Data files are written with the savepoint writer's own function
(``savepoints.create._write_table``); ``_metadata`` is written last, atomically, and sealed.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import posixpath
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from statectl.errors import StatectlError
from statectl.processor.reading import (
    OperatorInfo,
    SavepointHandle,
    StateHandle,
    TableInfo,
    open_handle,
)
from statectl.processor.spill import Spill, chunks, is_stream
from statectl.sources import copy_carried_sources

Predicate = pc.Expression | Callable[[pa.RecordBatch], Any]
Transform = Callable[[pa.RecordBatch], pa.RecordBatch | pa.Table]


@dataclass
class _Edit:
    kind: str  # "filter" | "transform"
    fn: Any


@dataclass
class _TableEdits:
    replacement: pa.Table | Spill | None = None  # with_state (a Spill: streamed, placed)
    edits: list[_Edit] = field(default_factory=list)

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
        if not pa.types.is_struct(arr.type):
            raise StatectlError(f"{where} must be a struct {t}, got {arr.type}")
        have = [arr.type.field(i).name for i in range(arr.type.num_fields)]
        want = [t.field(i).name for i in range(t.num_fields)]
        missing = [n for n in want if n not in have]
        extra = [n for n in have if n not in want]
        if missing:
            raise StatectlError(f"{where}.{missing[0]} is missing (declared: {t})")
        if extra:
            raise StatectlError(f"{where}.{extra[0]} is not in the declared schema ({t})")
        children = [
            _conform(arr.field(have.index(n)), t.field(i).type, f"{where}.{n}")
            for i, n in enumerate(want)
        ]
        return pa.StructArray.from_arrays(
            children, fields=list(t), mask=arr.is_null() if arr.null_count else None
        )
    if (_family(arr.type), _family(t)) not in _CONVERTIBLE and _family(arr.type) != _family(t):
        raise StatectlError(f"{where} is {arr.type}, the declared type is {t}")
    try:
        return arr.cast(t, safe=True)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError) as e:
        raise StatectlError(
            f"{where} is {arr.type}, the declared type is {t} ({str(e).splitlines()[0]})"
        ) from None


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


def _apply(edit: _Edit, table: pa.Table, info: TableInfo, what: str) -> pa.Table:
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
    return _with_partition(pa.concat_tables(out), None)


def _with_partition(table: pa.Table, partition: int | None) -> pa.Table:
    """``table`` without (``partition=None``) or with a ``partition_id`` column of one value."""
    if "partition_id" in table.column_names:
        table = table.drop_columns(["partition_id"])
    if partition is None:
        return table
    return table.append_column(
        "partition_id", pa.array(np.full(table.num_rows, partition, dtype=np.int32))
    )


class SavepointWriter:
    """Edits of a base savepoint (or checkpoint), written as a new savepoint by :meth:`write`.

    Every method returns the writer, so edits chain. ``uid`` is an operator uid or id;
    ``table`` a store or state variable (default: ``default`` or the only one).
    """

    def __init__(self, base: StateHandle) -> None:
        self.base = base
        self._removed: set[str] = set()
        self._tables: dict[tuple[str, str], _TableEdits] = {}
        self._offsets: dict[str, str | None] = {}  # with_offsets: source key -> offset
        self._sources: list[Any] | None = None  # for_query: the planned sources
        self._scratch: str | None = None  # for_query: the empty base, removed by write
        self._spent = False  # write consumed streamed with_state input (or the bootstrap base)

    @classmethod
    def for_query(
        cls,
        query: str,
        *,
        batch: int = 0,
        offsets: dict[Any, Any] | None = None,
        partitions: int | None = None,
        backend: str = "hdfs",
        output_mode: str | None = None,
        watermark_ms: int = 0,
        spark: Any = None,
    ) -> SavepointWriter:
        """Bootstrap a savepoint for a query that never ran (``"mod.py:fn"`` or
        ``"module:fn"``, as ``--query``): Spark plans it (nothing runs) and every operator
        starts with empty tables of the planned key/value schemas; fill them with
        :meth:`with_state`. ``batch`` is the savepoint's batch (the restored query resumes
        at ``batch + 1``), ``offsets`` where its sources start (see :meth:`with_offsets`;
        default: every source from its configured start), ``partitions`` the state partition
        count (default: the session's ``spark.sql.shuffle.partitions``), ``watermark_ms`` the
        event-time watermark the query resumes with."""
        from statectl.processor.bootstrap import build_base

        url, planned = build_base(
            query,
            batch=batch,
            partitions=partitions,
            backend=backend,
            output_mode=output_mode,
            watermark_ms=watermark_ms,
            spark=spark,
        )
        writer = cls(open_handle(url))
        writer._scratch = url
        writer._sources = planned.sources
        if offsets:
            try:
                writer.with_offsets(offsets)
            except BaseException:
                writer._drop_scratch()
                raise
        return writer

    def with_offsets(self, offsets: dict[Any, Any]) -> SavepointWriter:
        """Set where sources start when the savepoint is restored: source index (or, for a
        ``for_query`` bootstrap, the description ``statectl restore --dry-run`` shows, e.g.
        ``kafka``; for offset log v2 the source name) -> offset, as JSON text or a dict
        (``{"topic":{"0":42}}``), ``None`` for the source's configured start. An offset the
        planned source cannot parse is refused. A file source's position is its seen-files
        log: it can only be reset (``None``)."""
        from statectl.processor.bootstrap import describe_sources
        from statectl.sources import START, normalize_offset

        current = self._current_offsets()
        logs = self._base_source_logs()
        for name, value in offsets.items():
            text = normalize_offset(value, f"with_offsets[{name!r}]")
            key = self._source_key(str(name), current)
            planned = next((s for s in self._sources or [] if str(s.index) == key), None)
            is_file = (planned is not None and planned.is_file) or bool(logs.get(key))
            if text != START and is_file:
                raise StatectlError(
                    f"with_offsets[{name!r}]: a file source's position is its seen-files log, "
                    "not an offset; pass None to start it from its configured start"
                )
            if text != START and planned is not None and planned.parse_offset is not None:
                err = planned.parse_offset(text)
                if err:
                    raise StatectlError(
                        f"with_offsets[{name!r}]: {planned.description} cannot parse {text}: "
                        f"{err} (sources: {describe_sources(self._sources or [])})"
                    )
            self._offsets[key] = None if text == START else text
        return self

    def _current_offsets(self) -> dict[str, str | None]:
        if isinstance(self.base, SavepointHandle):
            return dict(self.base.sp.metadata.offsets)
        return dict(self.base.ckpt.offsets(self.base.batch).offsets)  # type: ignore[attr-defined]

    def _base_source_logs(self) -> dict[str, Any]:
        if isinstance(self.base, SavepointHandle):
            return dict(self.base.sp.metadata.source_logs or {})
        return {k: [1] for k in self.base.ckpt.source_log_dirs()}  # type: ignore[attr-defined]

    def _source_key(self, name: str, current: dict[str, str | None]) -> str:
        if name in current:
            return name
        hits = [str(s.index) for s in self._sources or [] if name in (s.description, s.file_path)]
        if len(hits) == 1:
            return hits[0]
        names = (
            ", ".join(f"{s.index} {s.description}" for s in self._sources)
            if self._sources
            else ", ".join(current) or "none"
        )
        why = "names several sources (use the index)" if hits else "is not a source"
        raise StatectlError(f"with_offsets: {name!r} {why} (sources: {names})")

    @classmethod
    def from_savepoint(cls, source: Any, *, batch: int | None = None) -> SavepointWriter:
        """A writer over a savepoint or checkpoint (a path, a ``SavepointResult`` or a handle
        from ``statectl.open``); the base is only read."""
        if isinstance(source, StateHandle):
            if batch is not None and batch != source.batch:
                raise StatectlError(f"the handle is at batch {source.batch}, not {batch}")
            return cls(source)
        return cls(open_handle(source, batch=batch))

    # -- edits -----------------------------------------------------------------------------
    def _target(
        self, uid: str | int, table: str | None, edit: str
    ) -> tuple[OperatorInfo, TableInfo]:
        op = self.base.operator(uid)
        if op.uid in self._removed:
            raise StatectlError(f"operator {op.uid} was removed from this writer")
        info = op.table(table)
        if info.kind == "join-store":
            raise StatectlError(
                f"{edit} on {op.uid}/{info.name}: a stream-stream join's four stores must stay "
                "consistent with each other, so statectl edits a join only as a whole "
                "(remove_operator)"
            )
        return op, info

    def _edits(self, op: OperatorInfo, info: TableInfo) -> _TableEdits:
        return self._tables.setdefault((op.uid, info.name), _TableEdits())

    def remove_operator(self, uid: str | int) -> SavepointWriter:
        """Leave the operator's state out of the new savepoint (restore it with ``--drop``/``-n``
        or into a query without it)."""
        self._removed.add(self.base.operator(uid).uid)
        return self

    def filter(
        self, uid: str | int, predicate: Predicate, table: str | None = None
    ) -> SavepointWriter:
        """Keep the rows matching ``predicate``: a ``pyarrow.compute`` expression over the
        table's columns (``pc.field("key", "k") == "k1"``) or a function from a record batch
        to a boolean mask (null counts as false)."""
        if not isinstance(predicate, pc.Expression) and not callable(predicate):
            raise StatectlError("filter takes a pyarrow.compute expression or a function")
        op, info = self._target(uid, table, "filter")
        self._edits(op, info).edits.append(_Edit("filter", predicate))
        return self

    def transform(self, uid: str | int, fn: Transform, table: str | None = None) -> SavepointWriter:
        """Replace each record batch by ``fn(batch)``: the same columns and types (values
        converting losslessly); rows whose key changed are re-placed."""
        op, info = self._target(uid, table, "transform")
        self._require_placement(op, "transform")
        self._edits(op, info).edits.append(_Edit("transform", fn))
        return self

    def with_state(self, uid: str | int, data: Any, table: str | None = None) -> SavepointWriter:
        """Replace the table with ``data`` (Arrow, pandas or a Spark DataFrame; columns as
        ``read`` returns them, ``partition_id`` optional and ignored), validated against the
        declared key and value schemas, placed by the operator kind's rule.

        Big inputs stream: a Spark DataFrame (one Spark partition on the driver at a time), a
        ``pyarrow.RecordBatchReader``, a ``pyarrow.dataset`` or an iterator of record
        batches, tables or pandas DataFrames is read a chunk at a time,
        each chunk checked and placed, and kept on local disk by partition until
        :meth:`write`."""
        op, info = self._target(uid, table, "with_state")
        self._require_placement(op, "with_state")
        edits = self._edits(op, info)
        what = f"with_state({op.uid}, {info.name})"
        if is_stream(data):
            replacement: pa.Table | Spill = self._spill(op, info, data, what)
        else:
            replacement = conform(as_arrow(data), info, what)
        if isinstance(edits.replacement, Spill):
            edits.replacement.remove()
        edits.replacement = replacement
        edits.edits.clear()
        return self

    def _spill(self, op: OperatorInfo, info: TableInfo, data: Any, what: str) -> Spill:
        kind = _kind_of(self, op)
        schema = pa.schema([f for f in info.schema if f.name != "partition_id"])
        spill = Spill(schema)
        try:
            for chunk in chunks(data):
                part = conform(as_arrow(chunk), info, what)
                pids = _placement(part, info, op.partitions, kind)
                for p in np.unique(pids):
                    spill.add(int(p), part.filter(pa.array(pids == p)))
            spill.close()
        except BaseException:
            spill.remove()
            raise
        return spill

    def _remove_spills(self) -> None:
        for edits in self._tables.values():
            if isinstance(edits.replacement, Spill):
                edits.replacement.remove()
                edits.replacement = None
                self._spent = True

    def _require_placement(self, op: OperatorInfo, edit: str) -> None:
        if not op.restorable:
            raise StatectlError(
                f"{edit} on {op.uid}: statectl does not know how Spark places keys of a "
                f"{op.kind} operator, so it cannot place changed keys (filter works)"
            )

    # -- what it would do --------------------------------------------------------------------
    def binary_parts(
        self, op: OperatorInfo, info: TableInfo, edits: _TableEdits, kind: Any
    ) -> Iterator[tuple[int, pa.Table]]:
        """``(partition, rows)`` after the edits, before re-placement (read from the base)."""
        what = f"{op.uid}/{info.name}"
        if isinstance(edits.replacement, Spill):
            spill = edits.replacement
            parts = ((p, _with_partition(spill.partition(p), p)) for p in range(op.partitions))
        elif edits.replacement is not None:
            parts = _split(edits.replacement, op, info, kind)
        else:
            parts = self.base.partitions(op.uid, info.name)
        for p, part in parts:
            for e in edits.edits:
                part = _apply(e, part, info, what)
            yield p, part

    def preview(self) -> dict[str, Any]:
        """Rows per operator table before and after the edits, nothing written (``--dry-run``)."""
        out: dict[str, Any] = {}
        for op in self.base.operators:
            if op.uid in self._removed:
                out[op.uid] = {"removed": True}
                continue
            tables = {}
            for info in op.tables:
                edits = self._tables.get((op.uid, info.name))
                if edits is None:
                    continue
                before = (
                    info.rows
                    if info.rows is not None
                    else sum(t.num_rows for _, t in self.base.partitions(op, info.name))
                )
                after = sum(
                    t.num_rows for _, t in self.binary_parts(op, info, edits, _kind_of(self, op))
                )
                tables[info.name] = {"before": before, "after": after, "removed": before - after}
            if tables:
                out[op.uid] = {"tables": tables}
        return out

    # -- writing -----------------------------------------------------------------------------
    def write(self, target: Any) -> SavepointHandle:
        """Write the new savepoint at ``target`` (a directory that does not exist yet, or is
        empty) and return it opened. A checkpoint base is first saved (like ``statectl
        savepoint``) into a scratch directory beside the target, removed afterwards."""
        from statectl.io import FileIO
        from statectl.reader import as_url

        if self._spent:
            raise StatectlError(
                "this writer was written once and its streamed input (with_state of an "
                "iterator, or a for_query bootstrap) is consumed; build a new writer"
            )
        out_io, root = FileIO.for_url(as_url(target))
        root = root.rstrip("/")
        if out_io.exists(root) and (not out_io.is_dir(root) or out_io.list_dir(root)):
            raise StatectlError("already exists and is not empty; name a new directory", root)
        base = self.base
        scratch = None
        if not isinstance(base, SavepointHandle):
            from statectl.savepoints.create import take_savepoint

            scratch = posixpath.join(posixpath.dirname(root), f".{posixpath.basename(root)}.base")
            uids = {op.id: op.uid for op in base.operators}
            url, _ = take_savepoint(
                base.ckpt.url(), out_io.url(scratch), batch=base.batch, uids=uids
            )
            base = open_handle(url)
        else:
            if out_io.is_within(root, base.sp.io, base.sp.root):
                raise StatectlError("the target is inside the base savepoint", root)
        try:
            meta = _write(self, base, out_io, root)
            out_io.write_atomic(posixpath.join(root, "_metadata"), meta.to_json().encode())
        except BaseException:
            if out_io.exists(root):
                out_io.remove(root, recursive=True)
            raise
        finally:
            if scratch is not None and out_io.exists(scratch):
                out_io.remove(scratch, recursive=True)
            if self._scratch is not None:
                self._drop_scratch()
            self._remove_spills()
        return open_handle(out_io.url(root))

    def _drop_scratch(self) -> None:
        """The empty base of a bootstrap: a local temporary directory, written only here."""
        import shutil

        from statectl.io import FileIO

        io, path = FileIO.for_url(self._scratch or "")
        if io.protocol == "file":
            shutil.rmtree(path, ignore_errors=True)
        self._scratch = None
        self._spent = True


def _kind_of(writer: SavepointWriter, op: OperatorInfo) -> Any:
    """The operator kind spec: from the savepoint's metadata, or the checkpoint's operator."""
    base = writer.base
    if isinstance(base, SavepointHandle):
        return base.sp.metadata.operator(op.uid).kind
    return base._ops[op.id].kind  # type: ignore[attr-defined]


def _placement(table: pa.Table, info: TableInfo, partitions: int, kind: Any) -> np.ndarray:
    from statectl.codecs.murmur3 import partition_ids

    if table.num_rows == 0:
        return np.zeros(0, dtype=np.int32)
    key = table.column("key").combine_chunks()
    return partition_ids(kind.partition_key(info.name, key), partitions)


def _split(
    table: pa.Table, op: OperatorInfo, info: TableInfo, kind: Any
) -> Iterator[tuple[int, pa.Table]]:
    pids = _placement(table, info, op.partitions, kind)
    for p in range(op.partitions):
        yield p, _with_partition(table.filter(pa.array(pids == p)), p)


def _write(writer: SavepointWriter, base: SavepointHandle, out_io: Any, root: str) -> Any:
    import statectl
    from statectl.savepoints.create import _safe_name, _write_table
    from statectl.savepoints.format import DataFile

    sp = base.sp
    operators = []
    for op_state in sp.metadata.operators:
        if op_state.uid in writer._removed:
            continue
        op = base.operator(op_state.uid)
        tables = []
        for t in op_state.tables:
            edits = writer._tables.get((op.uid, t.name))
            if edits is None:  # unchanged: the same bytes, verified as they are copied
                for f in t.files:
                    out_io.write_atomic(posixpath.join(root, f.path), sp.read_file(f))
                tables.append(t)
                continue
            info = op.table(t.name)
            kind = op_state.kind
            prefix = f"operators/{_safe_name(op.uid)}/{_safe_name(t.name)}"
            files: list[DataFile] = []
            incoming: dict[int, list[pa.Table]] = {}
            for p, part in writer.binary_parts(op, info, edits, kind):
                part = _with_partition(part, None)
                if edits.moves_keys and part.num_rows:
                    pids = _placement(part, info, op.partitions, kind)
                    for q in np.unique(pids[pids != p]):
                        incoming.setdefault(int(q), []).append(part.filter(pa.array(pids == q)))
                    part = part.filter(pa.array(pids == p))
                rel = f"{prefix}/part-{p:05d}.parquet"
                files.append(_write_table(out_io, root, rel, _with_partition(part, p)))
            for q, moved in sorted(incoming.items()):
                # Rows whose new key belongs to another partition: that file is rewritten.
                written = _read_back(out_io, root, files[q], info)
                merged = pa.concat_tables([written, *(_with_partition(m, q) for m in moved)])
                out_io.remove(posixpath.join(root, files[q].path))
                files[q] = _write_table(out_io, root, files[q].path, merged)
            tables.append(dataclasses.replace(t, files=files, rows=sum(f.rows for f in files)))
        operators.append(dataclasses.replace(op_state, tables=tables))
    # Sources' carried files (Kafka's initial offsets, ...), as _metadata "sources" lists them.
    copy_carried_sources(sp.metadata.sources, sp.io, sp.root, out_io, root)
    offsets, previous, logs = (
        sp.metadata.offsets,
        sp.metadata.previous_offsets,
        sp.metadata.source_logs,
    )
    if writer._offsets:
        offsets = {**offsets, **writer._offsets}
        if previous is not None:
            previous = {**previous, **writer._offsets}
        # a reset file source forgets the files it saw: it reads its directory again
        logs = {k: v for k, v in (logs or {}).items() if k not in writer._offsets}
    return dataclasses.replace(
        sp.metadata,
        offsets=offsets,
        previous_offsets=previous,
        source_logs=logs,
        operators=operators,
        created_at=dt.datetime.now(dt.timezone.utc).isoformat(timespec="milliseconds"),
        statectl_version=statectl.__version__,
    )


def _read_back(out_io: Any, root: str, f: Any, info: TableInfo) -> pa.Table:
    import pyarrow.parquet as pq

    from statectl.export import retype

    data = pq.read_table(pa.BufferReader(out_io.read_bytes(posixpath.join(root, f.path))))
    return pa.Table.from_arrays(
        [
            retype(c.combine_chunks(), fld.type)
            for c, fld in zip(data.columns, info.schema, strict=True)
        ],
        schema=info.schema,
    )

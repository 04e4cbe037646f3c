"""``SavepointWriter``: a new savepoint from an existing one (or a checkpoint), edited.

The base is never modified. Edits are recorded per operator table and applied while writing,
one partition at a time: a filter keeps rows where they are; a transform or ``with_state`` may
produce keys that belong elsewhere, and those rows are re-placed with the operator kind's
placement rule (``OperatorKind.partition_key``, statectl/operators.py), exactly as Spark
hash-partitions them. Files are written by the savepoint package's one writer
(statectl/savepoints/layout.py): data files first, ``_metadata`` last, atomically, sealed.
"""

from __future__ import annotations

import dataclasses
import posixpath
import shutil
from collections.abc import Iterator
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from statectl.errors import StatectlError, wording
from statectl.io import FileIO
from statectl.operators import OperatorKind
from statectl.processor.bootstrap import build_base, describe_sources
from statectl.processor.edits import (
    Edit,
    Predicate,
    TableEdits,
    Transform,
    apply_edit,
    as_arrow,
    conform,
    placement,
    split_placed,
    with_partition,
)
from statectl.processor.model import OperatorInfo, TableInfo
from statectl.processor.reading import CheckpointHandle, SavepointHandle, StateHandle, open_handle
from statectl.processor.spill import Spill, chunks, is_stream
from statectl.query_plan import PlannedSource
from statectl.reader import as_url
from statectl.savepoints.create import take_savepoint
from statectl.savepoints.format import DataFile, SavepointMetadata
from statectl.savepoints.layout import part_path, stamped, write_metadata, write_table
from statectl.savepoints.tables import retype
from statectl.sources import START, copy_carried_sources, normalize_offset

# Re-exported: the edits' types and conform are named from here too.
__all__ = ["Predicate", "SavepointWriter", "Transform", "as_arrow", "conform"]


class SavepointWriter:
    """Edits of a base savepoint (or checkpoint), written as a new savepoint by :meth:`write`.

    Every method returns the writer, so edits chain. ``uid`` is an operator uid or id;
    ``table`` a store or state variable (default: ``default`` or the only one).
    """

    def __init__(self, base: StateHandle) -> None:
        self.base = base
        self._removed: set[str] = set()
        self._tables: dict[tuple[str, str], TableEdits] = {}
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
        current = self.base.recorded_offsets()
        logs = self.base.file_source_logs()
        for name, value in offsets.items():
            text = normalize_offset(value, f"with_offsets[{name!r}]")
            key = self._source_key(str(name), current)
            if text != START:
                self._check_offset(name, key, text, bool(logs.get(key)))
            self._offsets[key] = None if text == START else text
        return self

    def _check_offset(self, name: Any, key: str, text: str, has_log: bool) -> None:
        """Refuse an offset for a file source, or one the planned source cannot parse."""
        planned = next((s for s in self._sources or [] if str(s.index) == key), None)
        if has_log or (planned is not None and planned.is_file):
            raise StatectlError(
                f"with_offsets[{name!r}]: a file source's position is its seen-files log, "
                "not an offset; pass None to start it from its configured start"
            )
        if planned is not None:
            self._check_parse(name, planned, text)

    def _check_parse(self, name: Any, planned: PlannedSource, text: str) -> None:
        err = planned.parse_offset(text) if planned.parse_offset is not None else None
        if err:
            raise StatectlError(
                f"with_offsets[{name!r}]: {planned.description} cannot parse {text}: "
                f"{err} (sources: {describe_sources(self._sources or [])})"
            )

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
            # The command line's edit has no filter or remove_operator: --delete-where, --drop.
            raise StatectlError(
                f"{wording('edit', edit)} on {op.uid}/{info.name}: a stream-stream join's four "
                "stores must stay consistent with each other, so statectl edits a join only as "
                f"a whole ({wording('--drop leaves the whole join out', 'remove_operator')})"
            )
        return op, info

    def _edits(self, op: OperatorInfo, info: TableInfo) -> TableEdits:
        return self._tables.setdefault((op.uid, info.name), TableEdits())

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
        self._edits(op, info).edits.append(Edit("filter", predicate))
        return self

    def transform(self, uid: str | int, fn: Transform, table: str | None = None) -> SavepointWriter:
        """Replace each record batch by ``fn(batch)``: the same columns and types (values
        converting losslessly); rows whose key changed are re-placed."""
        op, info = self._target(uid, table, "transform")
        self._requireplacement(op, "transform")
        self._edits(op, info).edits.append(Edit("transform", fn))
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
        self._requireplacement(op, "with_state")
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
        kind = self.base.operator_kind(op)
        schema = pa.schema([f for f in info.schema if f.name != "partition_id"])
        spill = Spill(schema)
        try:
            for chunk in chunks(data):
                part = conform(as_arrow(chunk), info, what)
                pids = placement(part, info, op.partitions, kind)
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

    def _requireplacement(self, op: OperatorInfo, edit: str) -> None:
        if not op.restorable:
            raise StatectlError(
                f"{edit} on {op.uid}: statectl does not know how Spark places keys of a "
                f"{op.kind} operator, so it cannot place changed keys (filter works)"
            )

    # -- what it would do --------------------------------------------------------------------
    def binary_parts(
        self, op: OperatorInfo, info: TableInfo, edits: TableEdits, kind: Any
    ) -> Iterator[tuple[int, pa.Table]]:
        """``(partition, rows)`` after the edits, before re-placement (read from the base)."""
        what = f"{op.uid}/{info.name}"
        parts: Iterator[tuple[int, pa.Table]]
        if isinstance(edits.replacement, Spill):
            spill = edits.replacement
            parts = ((p, with_partition(spill.partition(p), p)) for p in range(op.partitions))
        elif edits.replacement is not None:
            parts = split_placed(edits.replacement, op, info, kind)
        else:
            parts = self.base.partitions(op.uid, info.name)
        for p, part in parts:
            for e in edits.edits:
                part = apply_edit(e, part, info, what)
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
                    t.num_rows
                    for _, t in self.binary_parts(op, info, edits, self.base.operator_kind(op))
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
        if self._spent:
            raise StatectlError(
                "this writer was written once and its streamed input (with_state of an "
                "iterator, or a for_query bootstrap) is consumed; build a new writer"
            )
        out_io, root = _new_target(target)
        base, scratch = _savepoint_base(self.base, out_io, root)
        try:
            write_metadata(out_io, root, _write(self, base, out_io, root))
        except BaseException:
            if out_io.exists(root):
                out_io.remove(root, recursive=True)
            raise
        finally:
            self._clean_up(out_io, scratch)
        written = open_handle(out_io.url(root))
        assert isinstance(written, SavepointHandle)  # a canonical savepoint, just written
        return written

    def _clean_up(self, out_io: FileIO, scratch: str | None) -> None:
        """After a write, whatever its outcome: the saved checkpoint base, the bootstrap's
        empty base, the spilled streamed input."""
        if scratch is not None and out_io.exists(scratch):
            out_io.remove(scratch, recursive=True)
        if self._scratch is not None:
            self._drop_scratch()
        self._remove_spills()

    def _drop_scratch(self) -> None:
        """The empty base of a bootstrap: a local temporary directory, written only here."""
        io, path = FileIO.for_url(self._scratch or "")
        if io.protocol == "file":
            shutil.rmtree(path, ignore_errors=True)
        self._scratch = None
        self._spent = True


def _new_target(target: Any) -> tuple[FileIO, str]:
    """The new savepoint's directory: one that does not exist yet, or is empty."""
    out_io, root = FileIO.for_url(as_url(target))
    root = root.rstrip("/")
    if out_io.exists(root) and (not out_io.is_dir(root) or out_io.list_dir(root)):
        raise StatectlError("already exists and is not empty; name a new directory", root)
    return out_io, root


def _savepoint_base(
    base: StateHandle, out_io: FileIO, root: str
) -> tuple[SavepointHandle, str | None]:
    """The base as a savepoint, and the scratch directory beside ``root`` a checkpoint base is
    saved into first (None for a savepoint base, which must not contain the target)."""
    if isinstance(base, SavepointHandle):
        if out_io.is_within(root, base.sp.io, base.sp.root):
            raise StatectlError("the target is inside the base savepoint", root)
        return base, None
    assert isinstance(base, CheckpointHandle)
    scratch = posixpath.join(posixpath.dirname(root), f".{posixpath.basename(root)}.base")
    uids = {op.id: op.uid for op in base.operators}
    url, _ = take_savepoint(base.ckpt.url(), out_io.url(scratch), batch=base.batch, uids=uids)
    saved = open_handle(url)
    assert isinstance(saved, SavepointHandle)
    return saved, scratch


def _edited_files(
    writer: SavepointWriter,
    op: OperatorInfo,
    info: TableInfo,
    edits: TableEdits,
    kind: OperatorKind,
    out_io: FileIO,
    root: str,
) -> list[DataFile]:
    """An edited table's data files, one partition at a time; rows whose key now belongs to
    another partition are appended to that partition's file (rewritten)."""
    files: list[DataFile] = []
    incoming: dict[int, list[pa.Table]] = {}
    for p, part in writer.binary_parts(op, info, edits, kind):
        part = with_partition(part, None)
        if edits.moves_keys and part.num_rows:
            pids = placement(part, info, op.partitions, kind)
            for q in np.unique(pids[pids != p]):
                incoming.setdefault(int(q), []).append(part.filter(pa.array(pids == q)))
            part = part.filter(pa.array(pids == p))
        rel = part_path(op.uid, info.name, p)
        files.append(write_table(out_io, root, rel, with_partition(part, p)))
    for q, moved in sorted(incoming.items()):
        # Rows whose new key belongs to another partition: that file is rewritten.
        written = _read_back(out_io, root, files[q], info)
        merged = pa.concat_tables([written, *(with_partition(m, q) for m in moved)])
        out_io.remove(posixpath.join(root, files[q].path))
        files[q] = write_table(out_io, root, files[q].path, merged)
    return files


def _write(
    writer: SavepointWriter, base: SavepointHandle, out_io: FileIO, root: str
) -> SavepointMetadata:
    """Every data file of the new savepoint (unchanged tables copied byte for byte, verified);
    returns its metadata, not yet written."""
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
            files = _edited_files(writer, op, op.table(t.name), edits, op_state.kind, out_io, root)
            tables.append(dataclasses.replace(t, files=files, rows=sum(f.rows for f in files)))
        operators.append(dataclasses.replace(op_state, tables=tables))
    # Sources' carried files (Kafka's initial offsets, ...), as _metadata "sources" lists them.
    copy_carried_sources(sp.metadata.sources, sp.io, sp.root, out_io, root)
    return stamped(_with_sources(sp.metadata, writer._offsets, operators))


def _with_sources(
    m: SavepointMetadata, given: dict[str, str | None], operators: list[Any]
) -> SavepointMetadata:
    """``m`` with the new operators and the offsets ``with_offsets`` gave."""
    offsets, previous, logs = m.offsets, m.previous_offsets, m.source_logs
    if given:
        offsets = {**offsets, **given}
        if previous is not None:
            previous = {**previous, **given}
        # a reset file source forgets the files it saw: it reads its directory again
        logs = {k: v for k, v in (logs or {}).items() if k not in given}
    return dataclasses.replace(
        m, offsets=offsets, previous_offsets=previous, source_logs=logs, operators=operators
    )


def _read_back(out_io: FileIO, root: str, f: DataFile, info: TableInfo) -> pa.Table:
    data = pq.read_table(pa.BufferReader(out_io.read_bytes(posixpath.join(root, f.path))))
    return pa.Table.from_arrays(
        [
            retype(c.combine_chunks(), fld.type)
            for c, fld in zip(data.columns, info.schema, strict=True)
        ],
        schema=info.schema,
    )

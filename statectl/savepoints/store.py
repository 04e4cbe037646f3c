"""Opening savepoints, read-only: ``_metadata`` parsed and checked, each data file verified
(size, sha256, row count) as it is read, and the tables typed as Spark's ``statestore``
source shows them. Writing is statectl/savepoints/layout.py's; disposing and relabelling
have modules of their own."""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import os
import posixpath
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from statectl import join_state
from statectl.checkpoint.model import Checkpoint
from statectl.errors import CorruptFileError, MissingFileError, NotACheckpointError, StatectlError
from statectl.io import FileIO
from statectl.operators import JOIN_V4_FAMILIES
from statectl.savepoints.format import (
    METADATA_FILE,
    DataFile,
    OperatorState,
    SavepointMetadata,
    StateTable,
    parse_metadata,
)
from statectl.savepoints.layout import EMBEDDED
from statectl.savepoints.tables import check_file_schema, retype, table_schema
from statectl.state import Selection, join_side_view, read_state


class Savepoint:
    """A savepoint directory opened read-only."""

    def __init__(self, io: FileIO, root: str) -> None:
        self.io = io
        self.root = root.rstrip("/")
        meta_path = posixpath.join(self.root, METADATA_FILE)
        if not io.exists(meta_path):
            raise NotACheckpointError(
                "not a complete savepoint (no _metadata: incomplete, or not a savepoint)", self.root
            )
        self.metadata: SavepointMetadata = parse_metadata(io.read_text(meta_path), meta_path)

    @classmethod
    def open(cls, url: str) -> Savepoint:
        io, root = FileIO.for_url(url)
        return cls(io, root)

    def url(self) -> str:
        return self.io.url(self.root)

    def resolve_operator(self, ref: str | int) -> Any:
        """An operator by uid, or by its original operator id."""
        for op in self.metadata.operators:
            if op.uid == str(ref) or str(op.operator_id) == str(ref):
                return op
        have = ", ".join(f"{o.uid} (id {o.operator_id})" for o in self.metadata.operators)
        raise StatectlError(f"savepoint has no operator {ref!r}; it has: {have}", self.root)

    def read_file(self, f: DataFile) -> bytes:
        """A data file's bytes, verified against ``_metadata``: it stays inside the savepoint
        (symbolic links included), and its size and sha256 match."""
        meta_path = posixpath.join(self.root, METADATA_FILE)
        path = self.io.inside(self.root, f.path, meta_path)
        if not self.io.exists(path):
            raise MissingFileError("data file listed in _metadata is missing", path)
        data = self.io.read_bytes(path)
        if len(data) != f.bytes:
            raise CorruptFileError(
                f"has {len(data)} bytes, _metadata records {f.bytes}; the savepoint is damaged",
                path,
            )
        if hashlib.sha256(data).hexdigest() != f.sha256:
            raise CorruptFileError(
                "sha256 differs from the one recorded in _metadata; the savepoint is damaged",
                path,
            )
        return data

    def read_table(self, table: StateTable) -> pa.Table:
        """A state table with Spark's column and field names (the Parquet files rename repeats).

        Every file is verified (size, sha256, row count) as it is read: one pass over the bytes.
        """
        parts = [self.read_part(table, f) for f in table.files]
        return pa.concat_tables(parts) if parts else self.table_schema(table).empty_table()

    def read_part(self, table: StateTable, f: DataFile) -> pa.Table:
        """One data file (one partition) of ``table``, verified and with Spark's names: the unit
        every reader streams in (``read_table``, the processor's ``batches``, ``diff``)."""
        data = self.read_file(f)
        path = posixpath.join(self.root, f.path)
        try:
            part = pq.read_table(pa.BufferReader(data))
        except Exception as e:
            raise CorruptFileError(f"not a readable Parquet file ({e})", path) from None
        if part.num_rows != f.rows:
            raise CorruptFileError(f"has {part.num_rows} rows, _metadata records {f.rows}", path)
        schema = self.table_schema(table)
        if part.num_columns != len(schema):
            raise CorruptFileError(
                f"table {table.name} has {part.num_columns} columns, its schema {len(schema)}",
                posixpath.join(self.root, METADATA_FILE),
            )
        check_file_schema(part.schema, table, path)
        try:
            columns = [
                retype(c.combine_chunks(), fld.type)
                for c, fld in zip(part.columns, schema, strict=True)
            ]
        except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError) as e:
            raise CorruptFileError(
                f"table {table.name} does not match its schema in _metadata ({e})",
                posixpath.join(self.root, METADATA_FILE),
            ) from None
        out = pa.Table.from_arrays(columns, schema=schema)
        check_partition_ids(out, _partition_of(table, f), path)
        return out

    def iter_file(
        self, table: StateTable, f: DataFile, batch_rows: Callable[[int], int], scratch: str
    ) -> Iterator[pa.Table]:
        """One data file of ``table`` in chunks of ``batch_rows(bytes per row)`` rows (the
        Parquet data's uncompressed size), as :meth:`read_table` types them, never the whole
        file in memory.

        The file is verified first (inside the savepoint, size, sha256, row count) in one
        streamed pass; a remote file is copied to ``scratch`` on the way, so the Parquet
        reader works on the verified bytes."""
        meta_path = posixpath.join(self.root, METADATA_FILE)
        path = self.io.inside(self.root, f.path, meta_path)
        if not self.io.exists(path):
            raise MissingFileError("data file listed in _metadata is missing", path)
        local = path if self.io.is_local else os.path.join(scratch, f"src-{uuid.uuid4()}.parquet")
        digest, size = hashlib.sha256(), 0
        with self.io.open_read(path) as src, contextlib.ExitStack() as stack:
            copy = None if self.io.is_local else stack.enter_context(open(local, "wb"))
            while block := src.read(8 << 20):
                digest.update(block)
                size += len(block)
                if copy is not None:
                    copy.write(block)
        try:
            if size != f.bytes:
                raise CorruptFileError(
                    f"has {size} bytes, _metadata records {f.bytes}; the savepoint is damaged",
                    path,
                )
            if digest.hexdigest() != f.sha256:
                raise CorruptFileError(
                    "sha256 differs from the one recorded in _metadata; the savepoint is damaged",
                    path,
                )
            for chunk in self._file_chunks(table, local, path, f.rows, batch_rows):
                check_partition_ids(chunk, _partition_of(table, f), path)
                yield chunk
        finally:
            if local != path and os.path.exists(local):
                os.remove(local)

    def _file_chunks(
        self, table: StateTable, local: str, path: str, rows: int, batch_rows: Callable[[int], int]
    ) -> Iterator[pa.Table]:
        schema = self.table_schema(table)
        try:
            pf = pq.ParquetFile(local)
        except Exception as e:
            raise CorruptFileError(f"not a readable Parquet file ({e})", path) from None
        if pf.metadata.num_rows != rows:
            raise CorruptFileError(
                f"has {pf.metadata.num_rows} rows, _metadata records {rows}", path
            )
        if pf.metadata.num_columns and len(pf.schema_arrow) != len(schema):
            raise CorruptFileError(
                f"table {table.name} has {len(pf.schema_arrow)} columns, its schema {len(schema)}",
                posixpath.join(self.root, METADATA_FILE),
            )
        check_file_schema(pf.schema_arrow, table, path)
        meta = pf.metadata
        size = sum(meta.row_group(i).total_byte_size for i in range(meta.num_row_groups))
        chunk_rows = max(1, batch_rows(size // max(1, rows)))
        try:
            for batch in _row_group_batches(pf, chunk_rows):
                try:
                    columns = [
                        retype(c, f.type) for c, f in zip(batch.columns, schema, strict=True)
                    ]
                except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError) as e:
                    raise CorruptFileError(
                        f"table {table.name} does not match its schema in _metadata ({e})",
                        posixpath.join(self.root, METADATA_FILE),
                    ) from None
                yield pa.Table.from_arrays(columns, schema=schema)
        except (OSError, pa.ArrowException) as e:
            raise CorruptFileError(f"not a readable Parquet file ({e})", path) from None
        finally:
            pf.close()

    def verify_native(self) -> None:
        """Check every file a native savepoint lists (size and sha256) before Spark's files are
        read from it; each is read once more, the price of never trusting a damaged copy."""
        for op in self.metadata.operators:
            for t in op.tables:
                for f in t.files:
                    self.read_file(f)
        for f in self.metadata.native_logs or []:
            self.read_file(f)

    table_schema = staticmethod(table_schema)  # the schema of a table's rows

    def _join_v4_view(
        self, op: OperatorState, by_name: dict[str, StateTable], sel: Selection
    ) -> pa.Table | None:
        """A format 4 join's reads (its column families, its join sides) from the format 2
        tables the savepoint holds; None for the other reads."""
        if sel.join_side:
            family = f"{sel.join_side}-keyWithTsToValues"
        elif sel.store in JOIN_V4_FAMILIES:
            family = sel.store
        else:
            return None
        t = by_name[f"{family.split('-', 1)[0]}-keyWithIndexToValue"]
        view = join_state.v2_to_v4(self.read_table(t), t.value_schema, family)
        if sel.join_side:
            value = join_side_view(view).column("value")
            return view.set_column(1, "value", value)
        return view

    def read(self, sel: Selection, operator: str | int) -> pa.Table:
        """The same table ``export`` gives for a checkpoint, from the savepoint's data files."""
        op = self.resolve_operator(operator)
        if self.metadata.savepoint_type == "native":
            return self._read_native(op, sel)
        by_name = {t.name: t for t in op.tables}
        if op.state_format == 4 and op.name == join_state.NAME:
            view = self._join_v4_view(op, by_name, sel)
            if view is not None:
                return view
        if sel.join_store:
            sel = Selection(sel.operator_id, store=sel.join_store)
        if sel.join_side:
            return join_side_view(self.read_table(self._join_side_table(op, by_name, sel)))
        return self.read_table(self._named_table(op, by_name, sel))

    def _named_table(
        self, op: OperatorState, by_name: dict[str, StateTable], sel: Selection
    ) -> StateTable:
        """The store, state variable or ``$timers`` table a selection names."""
        name = "$timers" if sel.registered_timers else (sel.state_var or sel.store or "default")
        if name not in by_name:
            raise StatectlError(
                f"operator {op.uid} has no store or state variable {name!r}; it has: "
                f"{', '.join(by_name)}",
                self.root,
            )
        return by_name[name]

    def _read_native(self, op: OperatorState, sel: Selection) -> pa.Table:
        """A native savepoint's table: read from its embedded checkpoint, verified first."""
        self.verify_native()
        embedded = Checkpoint(self.io, posixpath.join(self.root, EMBEDDED))
        return read_state(
            embedded,
            dataclasses.replace(sel, operator_id=op.operator_id, batch=self.metadata.batch_id),
        )

    def _join_side_table(
        self, op: OperatorState, by_name: dict[str, StateTable], sel: Selection
    ) -> StateTable:
        """The ``keyWithIndexToValue`` store a join side is read from."""
        t = by_name.get(f"{sel.join_side}-keyWithIndexToValue")
        if t is None:
            raise StatectlError(
                f"operator {op.operator_id} ({op.name}, uid {op.uid}) is not a stream-stream "
                "join; --join-side is for symmetricHashJoin operators",
                self.root,
            )
        return t


def _partition_of(table: StateTable, f: DataFile) -> int:
    """The partition a data file holds: its place in the table's files (one per partition,
    in order, as every writer lists them; validate_metadata checks there is one each)."""
    return next(i for i, g in enumerate(table.files) if g is f or g.path == f.path)


def _row_group_batches(pf: pq.ParquetFile, chunk_rows: int) -> Iterator[pa.RecordBatch]:
    """The file's rows in batches of up to ``chunk_rows``, read a window of row groups at a
    time: one reader over a whole file keeps memory for every row group it has passed
    (pyarrow 26: a 50M-row file's reader grew 4 MB per million rows, to 1.2 GB per restore
    worker at 100M keys); a reader per window holds one window's."""
    meta = pf.metadata
    window: list[int] = []
    rows = 0
    for group in range(meta.num_row_groups):
        group_rows = meta.row_group(group).num_rows
        if window and rows + group_rows > chunk_rows:
            yield from pf.iter_batches(batch_size=chunk_rows, row_groups=window)
            window, rows = [], 0
        window.append(group)
        rows += group_rows
    if window:
        yield from pf.iter_batches(batch_size=chunk_rows, row_groups=window)


def check_partition_ids(part: pa.Table, partition: int, path: str) -> None:
    """Every row's ``partition_id`` is the file's partition: export shows the column, and a
    forged one would be echoed as if Spark had placed the row there."""
    if part.num_rows == 0 or "partition_id" not in part.column_names:
        return
    col = part.column("partition_id")
    wrong = col.null_count + part.num_rows - int(pc.sum(pc.equal(col, partition)).as_py() or 0)
    if wrong:
        raise CorruptFileError(
            f"{wrong} of {part.num_rows} rows have a partition_id other than the file's "
            f"partition {partition}; the savepoint is damaged",
            path,
        )


def table_selection(operator_id: int, table: StateTable) -> Selection:
    """The ``statestore`` selection that reads ``table`` from a checkpoint (the inverse of
    what a savepoint stores per selection)."""
    if table.kind == "timers":
        return Selection(operator_id, registered_timers=True)
    if table.kind == "join-store":  # format 2's store, whatever the join's state format
        return Selection(operator_id, join_store=table.name)
    if table.kind in ("store", "join-store"):
        return Selection(operator_id, store=table.name)
    return Selection(operator_id, state_var=table.name)


def is_savepoint_dir(io: FileIO, path: str) -> bool:
    return io.exists(posixpath.join(path, METADATA_FILE)) and not io.is_dir(
        posixpath.join(path, METADATA_FILE)
    )

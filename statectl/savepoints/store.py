"""Opening savepoints: read ``_metadata`` and the state tables; find, dispose and relabel them."""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
import posixpath
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from statectl import join_state
from statectl.codecs.sparktypes import to_arrow_type
from statectl.errors import CorruptFileError, MissingFileError, NotACheckpointError, StatectlError
from statectl.export import retype
from statectl.inspection import maybe_json
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
from statectl.sources import carried_paths, savepoint_source_rows
from statectl.state import Selection, join_side_view


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
        return pa.Table.from_arrays(columns, schema=schema)

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
        with self.io.fs.open(path, "rb") as src, contextlib.ExitStack() as stack:
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
            yield from self._file_chunks(table, local, path, f.rows, batch_rows)
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
        meta = pf.metadata
        size = sum(meta.row_group(i).total_byte_size for i in range(meta.num_row_groups))
        try:
            for batch in pf.iter_batches(batch_size=max(1, batch_rows(size // max(1, rows)))):
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

    @staticmethod
    def table_schema(table: StateTable) -> pa.Schema:
        def arrow(schema_json: object) -> pa.DataType:
            try:
                return to_arrow_type(json.loads(schema_json))  # type: ignore[arg-type]
            except (ValueError, TypeError, KeyError, AttributeError, RecursionError) as e:
                raise CorruptFileError(
                    f"schema of table {table.name!r} in _metadata is invalid ({e})", METADATA_FILE
                ) from None

        key = arrow(table.key_schema)
        value = arrow(table.value_schema)
        if table.kind == "MapState":
            user_key = arrow(table.user_key_schema or "{}")
            return pa.schema(
                [
                    ("key", key.field("key").type),
                    ("user_map_key", user_key),
                    ("user_map_value", value),
                    ("partition_id", pa.int32()),
                ]
            )
        if table.kind == "timers":
            return pa.schema(
                [
                    ("key", key.field("key").type),
                    ("expiration_timestamp_ms", pa.int64()),
                    ("partition_id", pa.int32()),
                ]
            )
        name = "list_element" if table.kind == "ListState" else "value"
        return pa.schema([("key", key), (name, value), ("partition_id", pa.int32())])

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
            from statectl.checkpoint.model import Checkpoint
            from statectl.savepoints.native import EMBEDDED
            from statectl.state import read_state

            self.verify_native()
            embedded = Checkpoint(self.io, posixpath.join(self.root, EMBEDDED))
            return read_state(
                embedded,
                dataclasses.replace(sel, operator_id=op.operator_id, batch=self.metadata.batch_id),
            )
        by_name = {t.name: t for t in op.tables}
        if op.state_format == 4 and op.name == join_state.NAME:
            view = self._join_v4_view(op, by_name, sel)
            if view is not None:
                return view
        if sel.join_store:
            sel = Selection(sel.operator_id, store=sel.join_store)
        if sel.join_side:
            t = by_name.get(f"{sel.join_side}-keyWithIndexToValue")
            if t is None:
                raise StatectlError(
                    f"operator {op.operator_id} ({op.name}, uid {op.uid}) is not a stream-stream "
                    "join; --join-side is for symmetricHashJoin operators",
                    self.root,
                )
            return join_side_view(self.read_table(t))
        name = "$timers" if sel.registered_timers else (sel.state_var or sel.store or "default")
        if name not in by_name:
            raise StatectlError(
                f"operator {op.uid} has no store or state variable {name!r}; it has: "
                f"{', '.join(by_name)}",
                self.root,
            )
        return self.read_table(by_name[name])


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


def describe_savepoint(sp: Savepoint) -> dict[str, Any]:
    m = sp.metadata
    info = _describe(sp)
    if m.savepoint_type == "native":
        # Row counts and schemas come from the embedded checkpoint, as for a checkpoint.
        from statectl.checkpoint.model import Checkpoint
        from statectl.inspection import describe_operator
        from statectl.savepoints.native import EMBEDDED

        sp.verify_native()
        embedded = Checkpoint(sp.io, posixpath.join(sp.root, EMBEDDED))
        uids = {op.operator_id: op.uid for op in m.operators}
        info["operators"] = [
            {**describe_operator(embedded, op, m.batch_id), "uid": uids.get(op.operator_id)}
            for op in embedded.operators(m.batch_id)
        ]
    return info


def _describe(sp: Savepoint) -> dict[str, Any]:
    m = sp.metadata
    return {
        "kind": "savepoint",
        "path": sp.url(),
        "type": m.savepoint_type,
        "format_version": m.format_version,
        "query_id": m.query_id,
        "batch": m.batch_id,
        "created_at": m.created_at,
        "statectl_version": m.statectl_version,
        "spark_version": m.spark_version,
        "batch_timestamp_ms": m.batch_timestamp_ms,
        "batch_watermark_ms": m.batch_watermark_ms,
        "next_batch_watermark_ms": m.next_batch_watermark_ms,
        "backend": m.source_checkpoint.get("backend"),
        "partitions": m.source_checkpoint.get("partitions"),
        "checkpoint_format_version": m.source_checkpoint.get("checkpoint_format_version"),
        "source_offsets": {k: maybe_json(v) for k, v in m.offsets.items()},
        "sources": savepoint_source_rows(m),
        "pinned_confs": dict(sorted(m.pinned_confs.items())),
        "uncommitted_batches": [],
        "latest_committed_batch": m.batch_id,
        "operators": [
            {
                "id": op.operator_id,
                "uid": op.uid,
                "name": op.name,
                "kind": op.kind.kind,
                "state_format": op.kind.state_format(m.pinned_confs),
                "restorable": op.kind.restorable,
                "partitions": op.partitions,
                "stores": [
                    {
                        "name": t.name,
                        "kind": t.kind,
                        "key_schema": _short(t.key_schema),
                        "value_schema": _short(t.value_schema),
                        "rows": t.rows,
                    }
                    for t in op.tables
                ],
                "properties": op.properties,
                "bytes": sum(f.bytes for t in op.tables for f in t.files),
            }
            for op in m.operators
        ],
        "bytes": sp.io.du(sp.root),
    }


def _short(schema_json: str) -> str:
    from statectl.inspection import schema_string

    return schema_string(schema_json) if schema_json else ""


def summarize_savepoint(io: FileIO, path: str) -> dict[str, Any]:
    """One line of ``statectl list`` for a savepoint directory (complete or not)."""
    entry: dict[str, Any] = {
        "kind": "savepoint",
        "path": io.url(path),
        "bytes": io.du(path),
        "problems": [],
    }
    try:
        sp = Savepoint(io, path)
    except StatectlError as e:
        entry.update(health="incomplete", complete=False)
        entry["problems"].append(str(e))
        return entry
    m = sp.metadata
    entry.update(
        type=m.savepoint_type,
        query_id=m.query_id,
        latest_committed_batch=m.batch_id,
        created_at=m.created_at,
        complete=True,
        health="ok",
        backend=m.source_checkpoint.get("backend"),
        operators=[f"{op.uid}" for op in m.operators],
    )
    for op in m.operators:
        for t in op.tables:
            for f in t.files:
                if not io.exists(posixpath.join(path, f.path)):
                    entry["problems"].append(f"missing data file {f.path}")
    if entry["problems"]:
        entry["health"] = "damaged"
    return entry


@dataclasses.dataclass(frozen=True)
class DisposePlan:
    """What ``dispose`` deletes (exactly the savepoint's files) and what it leaves alone."""

    io: FileIO
    root: str
    delete: list[str]  # files, _metadata first
    keep: list[str]  # files and links that are not the savepoint's (only with force)
    bytes: int

    def to_dict(self, deleted: bool) -> dict[str, Any]:
        return {
            "path": self.io.url(self.root),
            "files": len(self.delete),
            "bytes": self.bytes,
            "kept": [self.io.url(p) for p in self.keep],
            "deleted": deleted,
        }


def _refuse_path_form(url: str) -> None:
    parts = url.replace("\\", "/").split("/")
    if ".." in parts or url.rstrip("/") in (".", "") or url.rstrip("/").endswith("/."):
        raise StatectlError(
            "name the savepoint directory by its own path, without '.' or '..'; refusing", url
        )


def _is_nested_checkpoint(io: FileIO, d: str) -> bool:
    return any(io.exists(posixpath.join(d, name)) for name in ("offsets", "commits", "state"))


def _local_entries(root: str) -> tuple[list[str], list[str], list[str]]:
    """(files, symbolic links, directories) under a local ``root``; links are never followed."""
    files, links, dirs = [], [], []
    for d, subdirs, names in os.walk(root, followlinks=False):
        for name in list(subdirs):
            full = os.path.join(d, name)
            if os.path.islink(full):
                links.append(full)
                subdirs.remove(name)
            else:
                dirs.append(full)
        for name in names:
            full = os.path.join(d, name)
            (links if os.path.islink(full) else files).append(full)
    return files, links, dirs


def dispose_plan(url: str, *, force: bool = False) -> DisposePlan:
    """What ``dispose`` would delete: exactly the files ``_metadata`` lists, ``_metadata`` and
    statectl's own temporary files. Anything else inside (a user's file, a nested checkpoint,
    a symbolic link) makes it refuse; ``force`` deletes the savepoint's files around them and
    still never follows a link or deletes a nested checkpoint."""
    _refuse_path_form(url)
    io, root = FileIO.for_url(url)
    if io.is_local:
        if os.path.islink(root):
            raise StatectlError(
                "is a symbolic link; dispose the savepoint by its real path", io.url(root)
            )
        real = os.path.realpath(root)
        cwd = os.path.realpath(os.getcwd())
        if real == "/" or cwd == real or cwd.startswith(real.rstrip("/") + "/"):
            raise StatectlError(
                "is the current directory or contains it; run dispose from outside it",
                io.url(root),
            )
    elif "/" not in root.strip("/"):
        raise StatectlError("is a bucket root, not a savepoint directory; refusing", io.url(root))
    if not io.is_dir(root):
        raise StatectlError("no such directory", io.url(root))
    if _is_nested_checkpoint(io, root):
        raise StatectlError(
            "is a Spark checkpoint, not a savepoint: refusing to delete it", io.url(root)
        )
    sp = Savepoint(io, root)  # raises unless _metadata says this is a statectl savepoint
    meta_path = posixpath.join(root, METADATA_FILE)
    m = sp.metadata
    listed = [f for op in m.operators for t in op.tables for f in t.files]
    listed += list(m.native_logs or [])
    ours = {posixpath.join(root, f.path) for f in listed} | {meta_path}
    ours |= {posixpath.join(root, p) for p in carried_paths(m.sources)}  # statectl/sources
    if io.is_local:
        files, links, dirs = _local_entries(root)
    else:
        files, links, dirs = [f.path for f in io.walk_files(root)], [], []
    # A nested checkpoint (e.g. a restore into SP/live) is never part of the savepoint.
    nested = [d for d in dirs if _is_nested_checkpoint(io, d)]

    def in_nested(p: str) -> bool:
        return any(p == d or p.startswith(d + "/") for d in nested)

    def bookkeeping(p: str) -> bool:
        parent, name = posixpath.split(p)
        if name.startswith(".") and name.endswith(".tmp"):
            return True  # an atomic write that never finished
        return (
            name.startswith(".")
            and name.endswith(".crc")
            and (
                posixpath.join(parent, name[1:-4]) in ours  # a Hadoop checksum of one of ours
            )
        )

    delete, foreign = [], []
    for p in files:
        if (p in ours or bookkeeping(p)) and not in_nested(p):
            delete.append(p)
        else:
            foreign.append(p)
    foreign += links
    if foreign and not force:
        sample = ", ".join(posixpath.relpath(p, root) for p in sorted(foreign)[:3])
        more = f" and {len(foreign) - 3} more" if len(foreign) > 3 else ""
        raise StatectlError(
            f"contains {len(foreign)} file(s) that are not part of the savepoint ({sample}{more}); "
            "refusing to delete it. Move them out, or pass --force to delete only the "
            "savepoint's own files",
            io.url(root),
        )
    delete.sort(key=lambda p: p != meta_path)  # _metadata first: never a half-deleted "complete"
    sizes = {f.path: f.size for f in io.walk_files(root)} if not io.is_local else None
    total = 0
    for p in delete:
        if sizes is not None:
            total += sizes.get(p, 0)
        else:
            total += os.lstat(p).st_size
    return DisposePlan(io, root, delete, sorted(foreign), total)


def dispose(url: str, *, force: bool = False) -> dict[str, Any]:
    plan = dispose_plan(url, force=force)
    io = plan.io
    for p in plan.delete:
        io.remove(p)
    if io.is_local:
        # Remove the directories the savepoint's files left empty, deepest first; links kept
        # with force are removed as links, never followed.
        for link in plan.keep:
            if os.path.islink(link) and force:
                os.unlink(link)
        _, _, dirs = _local_entries(plan.root)
        for d in [*sorted(dirs, key=len, reverse=True), plan.root]:
            with contextlib.suppress(OSError):  # not empty: what is not ours stays
                os.rmdir(d)
    else:
        for d in sorted({posixpath.dirname(p) for p in plan.delete}, key=len, reverse=True):
            if d != plan.root and io.exists(d) and not io.list_dir(d):
                io.remove(d, recursive=True)
        if not io.list_dir(plan.root) and io.exists(plan.root):
            io.remove(plan.root, recursive=True)
    return plan.to_dict(deleted=True)


def relabel(url: str, mapping: dict[str, str], target: str | None = None) -> dict[str, Any]:
    """A new savepoint whose operators ``OLD`` are named ``NEW``; the source is not modified.

    Savepoints are immutable (a deployment may point at one), so relabelling writes a copy
    beside the source (or under ``target``): the data files of a renamed uid move to
    ``operators/<NEW>/...``, so folder names keep matching uids; each file is written
    atomically and ``_metadata`` last, so the copy is complete or visibly incomplete.
    """
    from statectl.savepoints.create import _new_dir_name, _safe_name

    sp = Savepoint.open(url)
    uids = {op.uid for op in sp.metadata.operators}
    missing = sorted(set(mapping) - uids)
    if missing:
        raise StatectlError(
            f"no operator with uid {', '.join(missing)}; uids: {', '.join(sorted(uids))}", sp.root
        )
    new = [mapping.get(op.uid, op.uid) for op in sp.metadata.operators]
    if len(set(new)) != len(new):
        raise StatectlError(f"uids would not be unique: {new}", sp.root)
    if target:
        out_io, parent = FileIO.for_url(target)
    else:
        out_io, parent = sp.io, posixpath.dirname(sp.root)
    m = sp.metadata
    out_root = posixpath.join(parent, _new_dir_name(m.query_id, m.batch_id))

    def moved(rel: str, old: str, new_uid: str) -> str:
        prefix = f"operators/{_safe_name(old)}/"
        return (
            f"operators/{_safe_name(new_uid)}/{rel[len(prefix) :]}"
            if rel.startswith(prefix)
            else rel
        )

    renames: dict[str, str] = {}  # relative path in the source -> in the copy
    ops = []
    for op in m.operators:
        new_uid = mapping.get(op.uid, op.uid)
        tables = []
        for t in op.tables:
            files = []
            for f in t.files:
                renames[f.path] = moved(f.path, op.uid, new_uid)
                files.append(dataclasses.replace(f, path=renames[f.path]))
            tables.append(dataclasses.replace(t, files=files))
        ops.append(dataclasses.replace(op, uid=new_uid, tables=tables))
    # Every other file (a native savepoint's embedded checkpoint) is copied where it was.
    for f in sp.io.walk_files(sp.root):
        rel = f.path[len(sp.root) + 1 :]
        if rel == METADATA_FILE:
            continue
        dst = posixpath.join(out_root, renames.get(rel, rel))
        if out_io.fs is sp.io.fs:  # same filesystem: no bytes through this process
            out_io.copy_atomic(f.path, dst)
        else:
            out_io.write_atomic(dst, sp.io.read_bytes(f.path))
    meta = dataclasses.replace(m, operators=ops)
    out_io.write_atomic(posixpath.join(out_root, METADATA_FILE), meta.to_json().encode())
    return {
        "path": out_io.url(out_root),
        "source": sp.url(),
        "relabelled": {old: mapping[old] for old in mapping},
    }

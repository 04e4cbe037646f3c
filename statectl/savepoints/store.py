"""Opening savepoints: read ``_metadata`` and the state tables; find, dispose and relabel them."""

from __future__ import annotations

import dataclasses
import json
import posixpath
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from statectl.codecs.sparktypes import to_arrow_type
from statectl.errors import CorruptFileError, MissingFileError, NotACheckpointError, StatectlError
from statectl.export import retype
from statectl.inspection import maybe_json
from statectl.io import FileIO
from statectl.savepoints.format import METADATA_FILE, SavepointMetadata, StateTable, parse_metadata
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

    def read_table(self, table: StateTable) -> pa.Table:
        """A state table with Spark's column and field names (the Parquet files rename repeats)."""
        parts = []
        for f in table.files:
            path = posixpath.join(self.root, f.path)
            if not self.io.exists(path):
                raise MissingFileError("data file listed in _metadata is missing", path)
            with self.io.fs.open(path, "rb") as fh:
                try:
                    parts.append(pq.read_table(fh))
                except Exception as e:
                    raise CorruptFileError(f"not a readable Parquet file ({e})", path) from None
        data = pa.concat_tables(parts) if parts else None
        schema = self.table_schema(table)
        if data is None:
            return schema.empty_table()
        return pa.Table.from_arrays(
            [retype(c.combine_chunks(), f.type) for c, f in zip(data.columns, schema, strict=True)],
            schema=schema,
        )

    @staticmethod
    def table_schema(table: StateTable) -> pa.Schema:
        key = to_arrow_type(json.loads(table.key_schema))
        value = to_arrow_type(json.loads(table.value_schema))
        if table.kind == "MapState":
            user_key = to_arrow_type(json.loads(table.user_key_schema or "{}"))
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

    def read(self, sel: Selection, operator: str | int) -> pa.Table:
        """The same table ``export`` gives for a checkpoint, from the savepoint's data files."""
        op = self.resolve_operator(operator)
        if self.metadata.savepoint_type == "native":
            from statectl.checkpoint.model import Checkpoint
            from statectl.savepoints.native import EMBEDDED
            from statectl.state import read_state

            embedded = Checkpoint(self.io, posixpath.join(self.root, EMBEDDED))
            return read_state(
                embedded,
                dataclasses.replace(sel, operator_id=op.operator_id, batch=self.metadata.batch_id),
            )
        by_name = {t.name: t for t in op.tables}
        if sel.join_side:
            t = by_name.get(f"{sel.join_side}-keyWithIndexToValue")
            if t is None:
                raise StatectlError(f"operator {op.uid} is not a stream-stream join", self.root)
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
        "pinned_confs": dict(sorted(m.pinned_confs.items())),
        "uncommitted_batches": [],
        "latest_committed_batch": m.batch_id,
        "operators": [
            {
                "id": op.operator_id,
                "uid": op.uid,
                "name": op.name,
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


def dispose_plan(url: str) -> tuple[FileIO, str, list[str], int]:
    """What ``dispose`` would delete; refuses anything that is not a statectl savepoint."""
    io, root = FileIO.for_url(url)
    if not io.is_dir(root):
        raise StatectlError("no such directory", root)
    if io.exists(posixpath.join(root, "offsets")) or io.exists(posixpath.join(root, "commits")):
        raise StatectlError("is a Spark checkpoint, not a savepoint: refusing to delete it", root)
    Savepoint(io, root)  # raises unless _metadata says this is a statectl savepoint
    files = [f.path for f in io.walk_files(root)]
    return io, root, files, sum(f.size for f in io.walk_files(root))


def dispose(url: str) -> dict[str, Any]:
    io, root, files, size = dispose_plan(url)
    # _metadata first: a half-deleted savepoint must never look complete.
    io.remove(posixpath.join(root, METADATA_FILE))
    io.remove(root, recursive=True)
    return {"path": io.url(root), "files": len(files), "bytes": size, "deleted": True}


def relabel(url: str, mapping: dict[str, str]) -> dict[str, str]:
    """Change operator uids in ``_metadata`` without touching the data files."""
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
    ops = [dataclasses.replace(op, uid=mapping.get(op.uid, op.uid)) for op in sp.metadata.operators]
    meta = dataclasses.replace(sp.metadata, operators=ops)
    sp.io.write_atomic(
        posixpath.join(sp.root, METADATA_FILE), meta.to_json().encode(), overwrite=True
    )
    return {old: mapping[old] for old in mapping}

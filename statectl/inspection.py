"""Use cases ``inspect`` and ``list``: describe checkpoints and savepoints as plain, JSON-ready
dictionaries.

The CLI renders these dictionaries for people (rich) or prints them as JSON; both show the
same data.
"""

from __future__ import annotations

import json
import posixpath
from typing import Any

import numpy as np
import pyarrow as pa

from statectl.checkpoint.model import (
    PARTITIONS_CONF,
    PROVIDER_CONF,
    Checkpoint,
    Operator,
    partition_absent,
    store_dir,
)
from statectl.checksums import read_verified, size_problem
from statectl.errors import StatectlError
from statectl.in_progress import describe_in_progress, read_in_progress
from statectl.io import FileIO, redact, storage_options_for
from statectl.join_state import format_of
from statectl.savepoints.layout import EMBEDDED
from statectl.savepoints.store import Savepoint, is_savepoint_dir
from statectl.sources import checkpoint_sources, savepoint_source_rows
from statectl.state import (
    Selection,
    StoreEncoding,
    check_placement,
    load_raw,
    placement_checked,
    read_le_int,
    read_partition,
    state_variable_type,
)
from statectl.state_rows import decode_key
from statectl.verification import unverifiable_files

SAMPLE_ROWS = 5


def type_string(t: Any) -> str:
    """A Spark JSON data type in Spark's DDL-like short form, e.g. struct<key:string,count:bigint>."""
    if isinstance(t, str):
        return {"long": "bigint", "integer": "int", "short": "smallint", "byte": "tinyint"}.get(
            t, t
        )
    kind = t.get("type")
    if kind == "struct":
        return (
            "struct<" + ",".join(f"{f['name']}:{type_string(f['type'])}" for f in t["fields"]) + ">"
        )
    if kind == "array":
        return f"array<{type_string(t['elementType'])}>"
    if kind == "map":
        return f"map<{type_string(t['keyType'])},{type_string(t['valueType'])}>"
    if kind == "udt":
        return type_string(t.get("sqlType", "udt"))
    return str(kind)


def schema_string(schema_json: str) -> str:
    return type_string(json.loads(schema_json))


def _store_row_counts(
    ckpt: Checkpoint, op: Operator, batch: int, enc: StoreEncoding
) -> dict[str, int]:
    """Live entries per store (or per column family), summed over partitions, each
    partition's key placement checked as ``export`` checks it (unless ``--no-verify``)."""
    counts: dict[str, int] = {}
    for p in range(op.num_partitions):
        for store in op.store_names:
            raw = load_raw(ckpt, op, store, p, batch, enc)
            if op.uses_column_families:
                if len(raw.keys) == 0:
                    continue
                ids = read_le_int(raw.keys, 0, 2)
                by_id = {v: k for k, v in raw.cf_ids.items()}
                uniq, n = np.unique(ids, return_counts=True)
                here = {
                    by_id.get(i, f"cf#{i}"): c
                    for i, c in zip(uniq.tolist(), n.tolist(), strict=True)
                }
                for name, c in here.items():
                    counts[name] = counts.get(name, 0) + c
                _check_family_placement(ckpt, op, p, batch, enc, here)
            else:
                counts[store] = counts.get(store, 0) + len(raw)
                _check_store_placement(ckpt, op, store, p, batch, enc, raw)
    return counts


def _check_store_placement(
    ckpt: Checkpoint, op: Operator, store: str, p: int, batch: int, enc: StoreEncoding, raw: Any
) -> None:
    """Every key of a key-value store partition hashes to it (files swapped between
    partitions decode fine; only their keys tell)."""
    if not ckpt.verify or len(raw) == 0 or not placement_checked(ckpt, op, batch):
        return
    where = ckpt.path("state", str(op.operator_id), str(p))
    keys = enc.entry_codec().decode(raw.keys, raw.values)[0]
    key = decode_key(keys, op.schema(store), enc, where)
    check_placement(ckpt, op, pa.table({"key": key}), store, p, batch)


def _check_family_placement(
    ckpt: Checkpoint, op: Operator, p: int, batch: int, enc: StoreEncoding, here: dict[str, int]
) -> None:
    """A column-family partition's placement, read as ``export`` reads it: a join's sides, or
    the first state variable with rows (the families of a partition share its files)."""
    if not ckpt.verify or not placement_checked(ckpt, op, batch):
        return
    if format_of(op.kind) is not None:
        sels = [Selection(op.operator_id, join_side=side) for side in ("left", "right")]
    else:
        names = [s.name for s in op.schemas if not s.name.startswith("$") and here.get(s.name)]
        sels = [Selection(op.operator_id, state_var=names[0])] if names else []
    for sel in sels:
        read_partition(ckpt, op, sel, p, batch, enc)


def describe_operator(
    ckpt: Checkpoint, op: Operator, batch: int, *, rows: bool = True
) -> dict[str, Any]:
    enc = StoreEncoding.of(ckpt, batch)
    counts = _store_row_counts(ckpt, op, batch, enc) if rows else {}
    stores = []
    for s in op.schemas:
        entry: dict[str, Any] = {
            "name": s.name,
            "key_schema": schema_string(s.key_schema),
            "value_schema": schema_string(s.value_schema),
            "rows": counts.get(s.name, 0) if rows else None,
        }
        if op.uses_column_families:
            entry["kind"] = (
                "join column family"  # join state format 3/4, not transformWithState
                if format_of(op.kind)
                else "internal"
                if s.name.startswith("$")
                else state_variable_type(op, s.name)
            )
        if s.key_encoder_spec:
            entry["key_encoder"] = s.key_encoder_spec.get("keyStateEncoderType")
        stores.append(entry)
    kind = op.kind
    return {
        "id": op.operator_id,
        "name": op.name,
        "kind": kind.kind,
        "state_format": kind.state_format(ckpt.offsets(batch).conf),
        "restorable": kind.restorable,
        # Why restore refuses it (None when it restores): what the operator needs instead.
        "refusal": None if kind.restorable else kind.reason,
        "partitions": op.num_partitions,
        "metadata_version": op.metadata_version,
        "stores": stores,
        "properties": op.properties,
        "bytes": ckpt.io.du(ckpt.path("state", str(op.operator_id))),
    }


def inspect_checkpoint(
    ckpt: Checkpoint, batch: int | None = None, *, rows: bool = True
) -> dict[str, Any]:
    b = ckpt.resolve_batch(batch)
    off = ckpt.offsets(b)
    commit = ckpt.commit(b)
    confs = dict(sorted(off.conf.items()))
    return {
        "kind": "checkpoint",
        "path": ckpt.url(),
        "query_id": ckpt.query_id,
        "batch": b,
        "latest_committed_batch": ckpt.latest_committed_batch,
        "offset_batches": _span(ckpt.offset_batches),
        "commit_batches": _span(ckpt.commit_batches),
        "uncommitted_batches": ckpt.uncommitted_batches,
        "batch_timestamp_ms": off.batch_timestamp_ms,
        "batch_watermark_ms": off.batch_watermark_ms,
        "next_batch_watermark_ms": commit.next_batch_watermark_ms,
        "backend": ckpt.backend(b),
        "partitions": ckpt.num_partitions(b),
        "checkpoint_format_version": ckpt.checkpoint_format_version(b),
        "offset_log_version": off.version,
        "commit_log_version": commit.version,
        "source_offsets": {k: maybe_json(v) for k, v in off.offsets.items()},
        "sources": [s.describe() for s in checkpoint_sources(ckpt, b)],
        "pinned_confs": confs,
        "operators": [describe_operator(ckpt, op, b, rows=rows) for op in ckpt.operators(b)],
        **verification(unverifiable_files(ckpt, b)),
    }


def verification(files: list[str] | None) -> dict[str, Any]:
    """``verification``: "verified", or "unverifiable" with the files nothing can verify
    (statectl/verification.py); None for a savepoint older than the record."""
    state = None if files is None else "unverifiable" if files else "verified"
    return {"verification": state, "unverifiable_files": files}


def _span(ids: list[int]) -> dict[str, int] | None:
    return {"first": ids[0], "last": ids[-1], "count": len(ids)} if ids else None


def maybe_json(text: str | None) -> Any:
    if text is None:
        return None
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


# -- savepoints -------------------------------------------------------------------------
def describe_savepoint(sp: Savepoint) -> dict[str, Any]:
    """``inspect`` of a savepoint: the keys of a checkpoint's where they mean the same."""
    m = sp.metadata
    info = _describe(sp)
    if m.savepoint_type == "native":
        # Row counts and schemas come from the embedded checkpoint, as for a checkpoint.
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
        # Of the checkpoint it was taken from: the savepoint's own files are all verified.
        **verification(_recorded_unverifiable(m.source_checkpoint)),
    }


def _recorded_unverifiable(source: dict[str, Any]) -> list[str] | None:
    files = source.get("unverifiable_files")
    return [str(f) for f in files] if isinstance(files, list) else None


def _short(schema_json: str) -> str:
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
        **verification(_recorded_unverifiable(m.source_checkpoint)),
    )
    for op in m.operators:
        for t in op.tables:
            for f in t.files:
                if not io.exists(posixpath.join(path, f.path)):
                    entry["problems"].append(f"missing data file {f.path}")
    if entry["problems"]:
        entry["health"] = "damaged"
    return entry


# -- list ----------------------------------------------------------------------------------
def find_checkpoints(io: FileIO, root: str, max_depth: int = 4) -> list[str]:
    """Directories under ``root`` that look like checkpoints (they hold ``offsets/``)."""
    found: list[str] = []

    def visit(path: str, depth: int) -> None:
        entries = io.list_dir(path)
        names = {e.name for e in entries if e.is_dir}
        files = {e.name for e in entries if not e.is_dir}
        if "offsets" in names or "commits" in names:
            found.append(path)
            return
        if "metadata" in files and read_in_progress(io, path) is not None:
            found.append(path)  # a restore interrupted before it wrote its logs
            return
        if "_metadata" in files or posixpath.basename(path).startswith("savepoint-"):
            found.append(path)
            return
        if depth >= max_depth:
            return
        for e in entries:
            if e.is_dir and not e.name.startswith((".", "_")):
                visit(e.path, depth + 1)

    visit(root, 0)
    return found


def store_health(ckpt: Checkpoint, op: Operator, batch: int) -> list[str]:
    """Problems that would stop Spark from loading the state of ``batch`` (files only, no decode).

    Checkpoint format 2 names each version's files by the unique ids of its commit: their
    lineage is checked when the state is read."""
    if ckpt.checkpoint_format_version(batch) >= 2:
        return []
    backend = ckpt.store_backend(batch)
    problems = []
    budget = [_HEALTH_READ_BUDGET]
    for p in range(op.num_partitions):
        if partition_absent(ckpt, op, p):
            continue
        for store in op.store_names:
            d = store_dir(ckpt, op.operator_id, p, store)
            missing = backend.missing_files(
                ckpt.io, d, batch + 1, column_families=op.uses_column_families
            )
            problems += missing or _damaged_files(ckpt, backend, d, batch, budget)
    return problems


# Bytes of state files list's health check reads to verify them against their checksums; past
# it, a file is only checked for a size its checksum sidecar does not cover.
_HEALTH_READ_BUDGET = 16 << 20


def _damaged_files(
    ckpt: Checkpoint, backend: Any, d: str, batch: int, budget: list[int]
) -> list[str]:
    """The version's files that fail their checksums (read while ``budget`` lasts) or whose
    size disagrees with their checksum sidecar (a truncated delta)."""
    opts = StoreEncoding.of(ckpt, batch).read_options(None, True)
    try:
        files = backend.files_for_version(ckpt.io, d, batch + 1, opts)
        sizes = {f.path: f.size for f in ckpt.io.list_dir(d)}
    except StatectlError:
        return []  # the read reports it
    found = []
    for f in (f for f in files if f in sizes):
        if sizes[f] <= budget[0]:
            budget[0] -= sizes[f]
            try:
                read_verified(ckpt.io, f, data_file=True)
            except StatectlError as e:
                found.append(str(e))
        else:
            found.append(size_problem(ckpt.io, f, sizes[f]) or "")
    return [p for p in found if p]


def summarize_checkpoint(ckpt: Checkpoint) -> dict[str, Any]:
    """One line of ``statectl list``: never raises for a damaged checkpoint, reports it."""
    entry: dict[str, Any] = {"kind": "checkpoint", "path": ckpt.url(), "problems": []}
    try:
        entry["query_id"] = ckpt.query_id
        entry["latest_committed_batch"] = ckpt.latest_committed_batch
        if ckpt.uncommitted_batches:
            entry["problems"].append(
                f"uncommitted batch {ckpt.uncommitted_batches[-1]} (Spark re-runs it on restart)"
            )
        b = ckpt.latest_committed_batch
        if b is None:
            entry["problems"].append("no committed batch")
        else:
            _summarize_batch(ckpt, b, entry)
    except StatectlError as e:
        entry["problems"].append(str(e))
    try:
        entry["bytes"] = ckpt.io.du(ckpt.root)
    except StatectlError as e:  # a symbolic link loop
        entry["bytes"] = None
        entry["problems"].append(str(e))
    entry["health"] = _health(entry["problems"])
    return entry


def _health(problems: list[str]) -> str:
    if problems and all(p.startswith("uncommitted") for p in problems):
        return "uncommitted"
    return "ok" if not problems else "damaged"


def _summarize_batch(ckpt: Checkpoint, b: int, entry: dict[str, Any]) -> None:
    """The latest committed batch's part of a ``list`` line (into ``entry``)."""
    off = ckpt.offsets(b)
    entry["backend"] = ckpt.backend(b)
    value = off.conf.get(PARTITIONS_CONF, "")
    entry["partitions"] = int(value) if value.isdigit() and int(value) else None
    entry["provider"] = off.conf.get(PROVIDER_CONF)
    ops = ckpt.operators(b)
    entry["operators"] = [f"{op.operator_id}:{op.name}" for op in ops]
    for op in ops:
        entry["problems"].extend(store_health(ckpt, op, b))
    entry.update(verification(unverifiable_files(ckpt, b)))


def list_dir(url: str) -> list[dict[str, Any]]:
    io, root = FileIO.for_url(url)
    if not io.is_dir(root):
        raise StatectlError("no such directory", root)
    out = []
    for path in find_checkpoints(io, root):
        marker = read_in_progress(io, path)
        if marker is not None:
            out.append(
                {
                    "kind": "checkpoint",
                    "path": io.url(path),
                    "health": "interrupted",
                    "problems": [
                        f"{describe_in_progress(marker)}: not a usable checkpoint (Spark "
                        "refuses to start from it); re-run with --overwrite to replace it"
                    ],
                    "restore_in_progress": marker,
                    "bytes": io.du(path),
                }
            )
            continue
        if not io.exists(posixpath.join(path, "offsets")) and not io.exists(
            posixpath.join(path, "commits")
        ):
            out.append(summarize_savepoint(io, path))
            continue
        try:
            out.append(summarize_checkpoint(Checkpoint(io, path)))
        except StatectlError as e:
            out.append(
                {
                    "kind": "checkpoint",
                    "path": io.url(path),
                    "health": "damaged",
                    "problems": [str(e)],
                    "bytes": io.du(path),
                }
            )
    return sorted(out, key=lambda e: posixpath.basename(e["path"]))


def inspect_path(
    url: str, batch: int | None = None, *, rows: bool = True, verify: bool = True
) -> dict[str, Any]:
    """``inspect`` for a checkpoint or a savepoint (the same keys where they mean the same)."""
    io, root = FileIO.for_url(url)
    marker = read_in_progress(io, root)
    if marker is not None:
        raise StatectlError(
            f"{describe_in_progress(marker)}: not a usable checkpoint yet (Spark refuses to "
            "start from it); if that statectl is gone, re-run it with --overwrite",
            io.url(root),
        )
    if is_savepoint_dir(io, root):
        sp = Savepoint(io, root)
        if batch is not None and batch != sp.metadata.batch_id:
            raise StatectlError(f"a savepoint holds batch {sp.metadata.batch_id} only", root)
        info = describe_savepoint(sp)
    else:
        info = inspect_checkpoint(Checkpoint(io, root, verify=verify), batch, rows=rows)
    # What fsspec was given for this path (statectl.toml and --storage-option), secrets hidden.
    info["storage_options"] = redact(storage_options_for(url))
    return info

"""Native savepoints: a copy of only the backend files Spark needs to load one committed batch.

Layout: ``_metadata`` (same format, ``savepoint_type: "native"``) plus ``checkpoint/``, a
minimal Spark checkpoint (logs of batches N-1..N, the file source logs up to the batch's
offsets, operator metadata and schema files, and per store partition the newest snapshot at
or below version N+1 with the later deltas/changelogs and the SSTs its zip references).
Fast (bytes are copied, nothing is decoded), restorable only onto the same backend and
partition count; ``statectl savepoint --type canonical NATIVE`` converts it.
"""

from __future__ import annotations

import hashlib
import posixpath
from collections.abc import Callable

from statectl.backends import ReadOptions
from statectl.checkpoint.logs import batch_id_of
from statectl.checkpoint.model import Checkpoint, partition_absent, store_dir
from statectl.checksums import read_verified
from statectl.codecs.compression import normalize_codec
from statectl.io import FileIO
from statectl.savepoints.contents import default_uid
from statectl.savepoints.format import DataFile, OperatorState, SavepointMetadata, StateTable
from statectl.savepoints.layout import EMBEDDED
from statectl.sources.carry import native_source_files

__all__ = ["EMBEDDED", "build_native"]


def _at_or_before(name: str, batch: int) -> bool:
    """A file of no batch, or of one at or before ``batch``."""
    n = batch_id_of(name)
    return n is None or n <= batch


def _operator_files(ckpt: Checkpoint, op_id: int, batch: int) -> list[str]:
    """The operator's metadata and schema files, and every store partition's files that
    load ``batch``."""
    op = ckpt.operator(op_id, batch)
    meta_dir = ckpt.path("state", str(op_id), "_metadata")
    out = [
        f.path
        for f in ckpt.io.walk_files(meta_dir)
        if not f.name.startswith(".") and _at_or_before(f.name, batch)
    ]
    out += [
        f.path
        for f in ckpt.io.walk_files(ckpt.path("state", str(op_id), "_stateSchema"))
        if not f.name.startswith(".")
    ]
    for p in range(op.num_partitions):
        if not partition_absent(ckpt, op, p):
            out += _partition_files(ckpt, op_id, op.store_names, p, batch)
    return out


def _partition_files(
    ckpt: Checkpoint, op_id: int, stores: list[str], p: int, batch: int
) -> list[str]:
    """One state partition's files (every store) that load ``batch``."""
    codec = normalize_codec(
        ckpt.offsets(batch).pinned_conf("spark.sql.streaming.stateStore.compression.codec") or "lz4"
    )
    fmt2 = ckpt.checkpoint_format_version(batch) >= 2
    ids = ckpt.commit(batch).state_unique_ids or {}
    backend = ckpt.store_backend(batch)
    out: list[str] = []
    for i, store in enumerate(stores):
        d = store_dir(ckpt, op_id, p, store)
        if p == 0 and ckpt.io.exists(posixpath.join(d, "_metadata", "schema")):
            out.append(posixpath.join(d, "_metadata", "schema"))
        uid = ids[str(op_id)][p][i] if fmt2 else None
        out += backend.copy_files(ckpt.io, d, batch + 1, ReadOptions(codec, uid))
    return out


def _log_files(ckpt: Checkpoint, batch: int) -> list[str]:
    out = [ckpt.path("metadata")] if ckpt.io.exists(ckpt.path("metadata")) else []
    for b in (batch - 1, batch):
        if b >= 0 and b in ckpt.offset_batches:
            out.append(ckpt.path("offsets", str(b)))
    out.append(ckpt.path("commits", str(batch)))
    out += native_source_files(ckpt, batch)  # every source's files (statectl/sources)
    return out


def build_native(
    ckpt: Checkpoint,
    out_io: FileIO,
    out_root: str,
    batch: int,
    uids: dict[int, str],
    base: Callable[..., SavepointMetadata],
    progress: Callable[[str], None] | None = None,
) -> SavepointMetadata:
    """Copy the files of ``batch`` under ``out_root/checkpoint`` and describe them."""

    def copy(path: str) -> DataFile:
        rel = posixpath.join(EMBEDDED, posixpath.relpath(path, ckpt.root))
        # Verified like every checkpoint read: a native savepoint must not copy damage along.
        data = read_verified(ckpt.io, path, data_file=True, verify=ckpt.verify)
        out_io.write_atomic(posixpath.join(out_root, rel), data)
        return DataFile(rel, -1, len(data), hashlib.sha256(data).hexdigest())

    logs = [copy(p) for p in _log_files(ckpt, batch)]
    operators = []
    for op in ckpt.operators(batch):
        files = [copy(p) for p in _operator_files(ckpt, op.operator_id, batch)]
        if progress:
            progress(uids[op.operator_id])
        table = StateTable("native", "native", "", "", [], -1, files)
        operators.append(
            OperatorState(
                uids[op.operator_id],
                op.operator_id,
                op.name,
                op.num_partitions,
                op.properties,
                op.store_names,
                op.metadata_version,
                [table],
                default_uid(op),
            )
        )
    meta = base(operators=operators)
    meta.savepoint_type = "native"
    meta.native_logs = logs
    return meta

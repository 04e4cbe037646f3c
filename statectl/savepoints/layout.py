"""Where a savepoint's files go and how they are written: the one place that writes them.

A savepoint directory holds ``operators/<uid>/<table>/part-NNNNN.parquet`` data files (names
made filesystem-safe), a native savepoint's embedded checkpoint under ``checkpoint/``, and
``_metadata``. Data files are written first, each atomically; :func:`write_metadata` seals and
writes ``_metadata`` last (temporary name, then rename), so a savepoint without ``_metadata``
is incomplete by definition. Savepoint creation, relabel, the processor's ``SavepointWriter``
and its bootstrap all write through here.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import hashlib
import io as _io
import itertools
import os
import posixpath
import re
import secrets
from collections.abc import Iterator

import pyarrow as pa
import pyarrow.parquet as pq

from statectl.codecs.phases import phase
from statectl.io import FileIO
from statectl.savepoints.format import METADATA_FILE, DataFile, SavepointMetadata
from statectl.savepoints.tables import exportable
from statectl.version import __version__

EMBEDDED = "checkpoint"  # a native savepoint's embedded Spark checkpoint
# Row groups of ~8 MiB of Arrow data: a restore reads a row group at a time, so this bounds
# its memory whatever the partition size.
ROW_GROUP_BYTES = 8 << 20


def safe_name(name: str) -> str:
    """``name`` as one path segment on any filesystem (uids and table names are free text)."""
    return re.sub(r"[^A-Za-z0-9_.=-]", "_", name) or "_"


def table_dir(uid: str, table: str) -> str:
    """The directory, relative to the savepoint, of one operator table's data files."""
    return f"operators/{safe_name(uid)}/{safe_name(table)}"


def part_path(uid: str, table: str, partition: int) -> str:
    """The data file, relative to the savepoint, of one partition of one operator table."""
    return f"{table_dir(uid, table)}/part-{partition:05d}.parquet"


def new_dir_name(query_id: str | None, batch: int) -> str:
    """A new savepoint's directory name: the query, the batch, and a random part."""
    return f"savepoint-{(query_id or 'noquery')[:6]}-{batch}-{secrets.token_hex(4)}"


def now() -> str:
    """``created_at`` of a savepoint written now (UTC, milliseconds)."""
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="milliseconds")


def stamped(meta: SavepointMetadata) -> SavepointMetadata:
    """``meta`` as written now by this statectl (``created_at``, ``statectl_version``)."""
    return dataclasses.replace(meta, created_at=now(), statectl_version=__version__)


def _row_group(table: pa.Table) -> int:
    per_row = max(1, table.nbytes // max(1, table.num_rows))
    return max(1024, ROW_GROUP_BYTES // per_row)


def write_table(
    io: FileIO, root: str, rel: str, table: pa.Table | Iterator[pa.Table], scratch: str = ""
) -> DataFile:
    """One Parquet data file of ``table``, or of its chunks (written row group by row group
    through a local file in ``scratch`` when there is more than one)."""
    if not isinstance(table, pa.Table):
        chunks = table
        table = next(chunks)
        second = next(chunks, None)
        if second is not None:
            return write_chunks(io, root, rel, itertools.chain([table, second], chunks), scratch)
    buf = _io.BytesIO()
    with phase("parquet write"):
        pq.write_table(exportable(table), buf, compression="zstd", row_group_size=_row_group(table))
        data = buf.getvalue()
    with phase("upload"):
        io.write_atomic(posixpath.join(root, rel), data)
    with phase("sha256"):
        digest = hashlib.sha256(data).hexdigest()
    return DataFile(rel, table.num_rows, len(data), digest)


def write_chunks(
    io: FileIO, root: str, rel: str, chunks: Iterator[pa.Table], scratch: str
) -> DataFile:
    """A data file too large for memory: row groups of about ``ROW_GROUP_BYTES`` (sized by the
    first chunk) streamed to a local file, then uploaded atomically."""
    local = os.path.join(scratch, f"out-{secrets.token_hex(8)}.parquet")
    rows = 0
    writer: pq.ParquetWriter | None = None
    group = 0
    try:
        for chunk in chunks:
            with phase("parquet write"):
                chunk = exportable(chunk)
                if writer is None:
                    group = _row_group(chunk)
                    writer = pq.ParquetWriter(local, chunk.schema, compression="zstd")
                writer.write_table(chunk, row_group_size=group)
            rows += chunk.num_rows
        assert writer is not None
        with phase("parquet write"):
            writer.close()
        digest = hashlib.sha256()
        with phase("sha256"), open(local, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                digest.update(block)
        size = os.path.getsize(local)
        with phase("upload"):
            io.put_atomic(local, posixpath.join(root, rel))
    finally:
        if os.path.exists(local):
            os.remove(local)
    return DataFile(rel, rows, size, digest.hexdigest())


def write_metadata(io: FileIO, root: str, meta: SavepointMetadata) -> None:
    """Seal ``meta`` and write it as ``root``'s ``_metadata``, atomically: call it last, once
    every data file is in place (the savepoint is complete from that moment)."""
    io.write_atomic(posixpath.join(root, METADATA_FILE), meta.to_json().encode())

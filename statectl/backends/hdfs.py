"""HDFSBackedStateStoreProvider: ``N.snapshot`` (full map) and ``N.delta`` (changes) files.

Version V is the newest snapshot at or below V plus every later delta up to V, applied in order
(``HDFSBackedStateStoreProvider.loadMap``). A missing delta is an error, as in Spark.
"""

from __future__ import annotations

from collections.abc import Iterator

from statectl.backends import RawState, empty_raw_state, version_chain
from statectl.checksums import iter_verified, read_verified, stream_block
from statectl.codecs.compression import EXPANSION, decompress_stream, iter_decompressed
from statectl.codecs.records import (
    RecordBatch,
    iter_record_stream,
    iter_state_records,
    last_writer_wins,
    parse_state_records,
)
from statectl.io import FileIO


def list_versions(io: FileIO, store_dir: str) -> tuple[dict[int, str], dict[int, str]]:
    """(snapshots, deltas): version -> path, with Spark's ``fetchFiles`` name rules."""
    snapshots: dict[int, str] = {}
    deltas: dict[int, str] = {}
    for f in io.list_dir(store_dir):
        if f.is_dir:
            continue
        parts = f.name.split(".")
        if len(parts) != 2 or not parts[0].isdigit():
            continue
        kind = parts[1].lower()
        if kind == "snapshot":
            snapshots[int(parts[0])] = f.path
        elif kind == "delta":
            deltas[int(parts[0])] = f.path
    return snapshots, deltas


def files_for_version(io: FileIO, store_dir: str, version: int) -> list[str]:
    """The files Spark reads to load ``version``: a snapshot (if any) then deltas, in order."""
    if version == 0:
        return []
    snapshots, deltas = list_versions(io, store_dir)
    snapshot, chain = version_chain(snapshots, deltas, version, store_dir, "delta")
    return ([snapshot] if snapshot else []) + chain


def read_hdfs_store(
    io: FileIO, store_dir: str, version: int, codec: str, *, verify: bool = True
) -> RawState:
    files = files_for_version(io, store_dir, version)
    if not files:
        return empty_raw_state()
    batches = []
    for p in files:
        raw = decompress_stream(codec, read_verified(io, p, data_file=True, verify=verify), p)
        batches.append(parse_state_records(raw, p, allow_deletes=not p.endswith(".snapshot")))
    # A lone snapshot holds each key once: no replay needed.
    keys, values = last_writer_wins(batches, unique=files[0].endswith(".snapshot"))
    return RawState(keys, values, files=files)


def hdfs_events(
    io: FileIO, store_dir: str, version: int, codec: str, *, verify: bool = True, max_bytes: int
) -> tuple[bool, Iterator[RecordBatch]]:
    """The records that make up ``version``, in replay order and about ``max_bytes`` at a time
    (a file larger than that is read, verified, decompressed and scanned a window at a time),
    for a bounded read:
    (whether they are one snapshot's unique keys, needing no replay; chunks)."""
    files = files_for_version(io, store_dir, version)

    def chunks() -> Iterator[RecordBatch]:
        for p in files:
            deletes = not p.endswith(".snapshot")
            if io.size(p) * EXPANSION > max_bytes:  # read, decompressed and scanned in windows
                blocks = iter_verified(io, p, verify=verify, block=stream_block(max_bytes))
                yield from iter_record_stream(
                    iter_decompressed(codec, blocks, p),
                    p,
                    allow_deletes=deletes,
                    max_bytes=max_bytes,
                )
                continue
            data = read_verified(io, p, data_file=True, verify=verify)
            raw = decompress_stream(codec, data, p)
            yield from iter_state_records(raw, p, allow_deletes=deletes, max_bytes=max_bytes)

    return len(files) <= 1 and all(p.endswith(".snapshot") for p in files), chunks()

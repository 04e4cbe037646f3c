"""HDFSBackedStateStoreProvider: ``N.snapshot`` (full map) and ``N.delta`` (changes) files.

Version V is the newest snapshot at or below V plus every later delta up to V, applied in order
(``HDFSBackedStateStoreProvider.loadMap``). A missing delta is an error, as in Spark.
"""

from __future__ import annotations

import posixpath
from collections.abc import Callable, Iterator

import pyarrow as pa

from statectl.backends.base import (
    SNAPSHOT,
    Batches,
    Capabilities,
    RawState,
    ReadOptions,
    VersionRecords,
    WriteOptions,
    check_layout,
    empty_raw_state,
    version_chain,
)
from statectl.backends.entries import EntryCodec
from statectl.backends.streamed import write_records_streamed
from statectl.backends.writers import write_hdfs_store
from statectl.checksums import iter_verified, read_verified, stream_block
from statectl.codecs.compression import EXPANSION, decompress_stream, iter_decompressed
from statectl.codecs.record_replay import last_writer_wins
from statectl.codecs.records import (
    RecordBatch,
    iter_record_stream,
    iter_state_records,
    parse_state_records,
)
from statectl.errors import StatectlError
from statectl.io import FileIO

PROVIDER = "org.apache.spark.sql.execution.streaming.state.HDFSBackedStateStoreProvider"


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
) -> VersionRecords:
    """The records that make up ``version``, in replay order and about ``max_bytes`` at a time
    (a file larger than that is read, verified, decompressed and scanned a window at a time),
    for a bounded read: the snapshot's, then the deltas after it."""
    files = files_for_version(io, store_dir, version)

    def chunks(paths: list[str]) -> Iterator[RecordBatch]:
        for p in paths:
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

    snapshot = files[:1] if files and files[0].endswith(".snapshot") else []
    deltas = files[len(snapshot) :]
    return VersionRecords(
        (lambda: chunks(snapshot)) if snapshot else None,
        (lambda: chunks(deltas)) if deltas else None,
    )


class HdfsBackend:
    """HDFSBackedStateStoreProvider (see the module docstring): UnsafeRow keys and values,
    a 4-byte row checksum in front of values when Spark 4.1+ records one."""

    name: str = "hdfs"
    title: str = "HDFS"
    provider_classes: tuple[str, ...] = (PROVIDER,)
    capabilities: Capabilities = Capabilities(
        layouts=(SNAPSHOT,), column_families=False, checkpoint_format_2=False, row_checksums=True
    )

    def recognises(self, provider_class: str) -> bool:
        return provider_class.endswith("HDFSBackedStateStoreProvider")

    def owns_file(self, name: str) -> bool:
        head, _, ext = name.partition(".")
        return head.isdigit() and ext.lower() in ("snapshot", "delta")

    def versions(self, io: FileIO, store_dir: str) -> list[int]:
        """Versions with their own file; a version loads when its chain is whole."""
        snapshots, deltas = list_versions(io, store_dir)
        return sorted(set(snapshots) | set(deltas))

    def files_for_version(
        self, io: FileIO, store_dir: str, version: int, opts: ReadOptions
    ) -> list[str]:
        return files_for_version(io, store_dir, version)

    def copy_files(self, io: FileIO, store_dir: str, version: int, opts: ReadOptions) -> list[str]:
        return files_for_version(io, store_dir, version)

    def load(self, io: FileIO, store_dir: str, version: int, opts: ReadOptions) -> RawState:
        return read_hdfs_store(io, store_dir, version, opts.codec, verify=opts.verify)

    def events(
        self,
        io: FileIO,
        store_dir: str,
        version: int,
        opts: ReadOptions,
        *,
        max_bytes: int,
        metas: list | None = None,
    ) -> VersionRecords:
        del metas  # no snapshot metadata: HDFS stores have no column families
        return hdfs_events(
            io, store_dir, version, opts.codec, verify=opts.verify, max_bytes=max_bytes
        )

    def iterates_in_key_order(self) -> bool:
        return False  # a snapshot is a hash map's iteration order

    def entry_codec(
        self, *, cf_id: int | None = None, row_checksum: bool = False, key_version: bool = True
    ) -> EntryCodec:
        if cf_id is not None:
            raise StatectlError("HDFS stores have no column families")
        return EntryCodec(checksum_bytes=4 if row_checksum else 0)

    def write(
        self, io: FileIO, store_dir: str, opts: WriteOptions, keys: pa.Array, values: pa.Array
    ) -> str | None:
        check_layout(self, opts.layout)
        write_hdfs_store(io, store_dir, opts.version, opts.codec, keys, values)
        return None

    def write_streamed(
        self,
        io: FileIO,
        store_dir: str,
        opts: WriteOptions,
        batches: Batches,
        scratch: str,
        budget: int,
    ) -> str | None:
        del budget  # a record stream is written a batch at a time, whatever its size
        check_layout(self, opts.layout)
        path = posixpath.join(store_dir, f"{opts.version}.snapshot")
        write_records_streamed(io, path, opts.codec, batches, scratch)
        return None

    def check(self, io: FileIO, store_dir: str, version: int, opts: ReadOptions) -> list[str]:
        return check_files(io, lambda: files_for_version(io, store_dir, version))

    def missing_files(
        self, io: FileIO, store_dir: str, version: int, *, column_families: bool
    ) -> list[str]:
        try:
            files_for_version(io, store_dir, version)
        except StatectlError as e:
            return [str(e)]
        return []


def check_files(io: FileIO, files: Callable[[], list[str]]) -> list[str]:
    """Problems finding or verifying the files ``files()`` names, one line each."""
    try:
        paths = files()
    except StatectlError as e:
        return [str(e)]
    problems = []
    for p in paths:
        try:
            read_verified(io, p, data_file=True, verify=True)
        except StatectlError as e:
            problems.append(str(e))
    return problems


BACKEND = HdfsBackend()

"""RocksDBStateStoreProvider: ``N.zip`` snapshots (plus shared ``SSTs/``) and ``N.changelog`` files.

Version V is the newest zip at or below V (or the empty database) plus the changelogs after it
up to V (``RocksDB.loadWithoutCheckpointId``). With checkpoint format v2 the file names carry a
unique id and V's changelog names its lineage (``loadWithCheckpointId``).

Snapshots are opened read-only with rocksdict in a private temporary directory; the checkpoint is
never written to.
"""

from __future__ import annotations

import itertools
import posixpath
import re
import uuid
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from statectl.backends.base import (
    CHANGELOG,
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
from statectl.backends.hdfs import check_files
from statectl.backends.rocksdb_zip import SnapshotMetadata as SnapshotMetadata
from statectl.backends.rocksdb_zip import _read_zip as _read_zip
from statectl.backends.rocksdb_zip import bare_name as bare_name
from statectl.backends.rocksdb_zip import iter_zip, zip_references
from statectl.backends.rocksdb_zip import parse_snapshot_metadata as parse_snapshot_metadata
from statectl.backends.streamed import (
    empty_changelogs,
    merge_runs,
    run_rows,
    sorted_runs,
    write_records_streamed,
)
from statectl.backends.writers import write_rocksdb_snapshot, write_rocksdb_store
from statectl.checksums import iter_verified, read_verified, stream_block
from statectl.codecs.changelog import changelog_version, parse_changelog
from statectl.codecs.compression import EXPANSION, decompress_stream, iter_decompressed
from statectl.codecs.phases import phase, timed
from statectl.codecs.record_replay import last_writer_wins
from statectl.codecs.records import OP_PUT, RecordBatch, iter_record_stream
from statectl.errors import CorruptFileError, MissingFileError, StatectlError, display_path
from statectl.io import FileIO

PROVIDER = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
_FILE_RE = re.compile(r"^(\d+)(?:_([0-9a-fA-F-]{36}))?\.(zip|changelog)$")


@dataclass(frozen=True)
class VersionFile:
    version: int
    unique_id: str | None
    kind: str  # "zip" | "changelog"
    path: str


def list_version_files(io: FileIO, store_dir: str) -> list[VersionFile]:
    out = []
    for f in io.list_dir(store_dir):
        m = _FILE_RE.match(f.name)
        if m and not f.is_dir:
            out.append(VersionFile(int(m.group(1)), m.group(2), m.group(3), f.path))
    return out


def chain_v1(
    files: list[VersionFile], version: int, store_dir: str
) -> tuple[VersionFile | None, list[VersionFile]]:
    zips = {f.version: f for f in files if f.kind == "zip" and f.unique_id is None}
    logs = {f.version: f for f in files if f.kind == "changelog" and f.unique_id is None}
    return version_chain(zips, logs, version, store_dir, "changelog")


def chain_v2(
    io: FileIO,
    codec: str,
    files: list[VersionFile],
    version: int,
    unique_id: str,
    store_dir: str,
    verify: bool = True,
) -> tuple[VersionFile | None, list[VersionFile], dict[tuple[int, str], RecordBatch]]:
    by_key = {(f.version, f.unique_id, f.kind): f for f in files}
    if (version, unique_id, "zip") in by_key:
        return by_key[(version, unique_id, "zip")], [], {}
    top = by_key.get((version, unique_id, "changelog"))
    if top is None:
        raise MissingFileError(
            f"neither {version}_{unique_id}.zip nor .changelog exists for the id in the commit log",
            store_dir,
        )
    parsed = {
        (version, unique_id): parse_changelog(
            decompress_stream(
                codec, read_verified(io, top.path, data_file=True, verify=verify), top.path
            ),
            top.path,
        )
    }
    lineage = [
        (int(e["version"]), str(e["checkpointUniqueId"]))
        for e in parsed[(version, unique_id)].lineage or []
    ]
    lineage.sort()
    # The lineage runs up to version - 1 (empty for version 1 only): a changelog whose lineage
    # ends elsewhere is another version's, swapped in (issue 26: no checksum may say so).
    if (lineage[-1][0] if lineage else 0) != version - 1:
        raise CorruptFileError(
            f"its lineage ends at version {lineage[-1][0] if lineage else 0}, not {version - 1}; "
            "it is another version's changelog",
            top.path,
        )
    base, chain = _lineage_chain(by_key, lineage, version, top, store_dir)
    return base, chain, parsed


def _lineage_chain(
    by_key: dict[tuple[int, str | None, str], VersionFile],
    lineage: list[tuple[int, str]],
    version: int,
    top: VersionFile,
    store_dir: str,
) -> tuple[VersionFile | None, list[VersionFile]]:
    """The newest zip along ``lineage`` and the changelogs after it, then ``top``."""
    base = next(
        (by_key[(v, u, "zip")] for v, u in reversed(lineage) if (v, u, "zip") in by_key), None
    )
    start = base.version if base else 0
    if base is None and lineage and lineage[0][0] != 1:
        raise MissingFileError(
            f"no snapshot zip found along the lineage of version {version} (starts at {lineage[0][0]})",
            top.path,
        )
    chain = []
    for v, u in lineage:
        if v <= start:
            continue
        f = by_key.get((v, u, "changelog"))
        if f is None:
            raise MissingFileError(f"lineage needs {v}_{u}.changelog, which is missing", store_dir)
        chain.append(f)
    chain.append(top)
    return base, chain


def _version_chain(
    io: FileIO,
    store_dir: str,
    version: int,
    codec: str,
    unique_id: str | None,
    verify: bool,
) -> tuple[VersionFile | None, list[VersionFile], dict[tuple[int, str], RecordBatch]]:
    """The snapshot (or None) and changelogs ``version`` is built from, with the changelogs
    checkpoint format v2 had to parse to follow its lineage (so they are parsed once)."""
    files = list_version_files(io, store_dir)
    if unique_id is None:
        base, chain = chain_v1(files, version, store_dir)
        return base, chain, {}
    return chain_v2(io, codec, files, version, unique_id, store_dir, verify)


def read_rocksdb_store(
    io: FileIO,
    store_dir: str,
    version: int,
    codec: str,
    *,
    unique_id: str | None = None,
    merge_delimiter: bytes = b"",
    verify: bool = True,
) -> RawState:
    """Live entries of one RocksDB store at ``version``; merge operands are combined by us."""
    if version == 0:
        return empty_raw_state()
    base, chain, parsed = _version_chain(io, store_dir, version, codec, unique_id, verify)
    if base is not None:
        state, _ = _read_zip(io, store_dir, base.path, verify)
    else:
        state = empty_raw_state()
    if not chain:
        return state
    puts = np.full(len(state.keys), OP_PUT, dtype=np.uint8)
    batches = [RecordBatch(puts, state.keys, state.values, None, 1)]
    for f in chain:
        cached = parsed.get((f.version, f.unique_id or ""))
        if cached is None:
            cached = parse_changelog(
                decompress_stream(
                    codec, read_verified(io, f.path, data_file=True, verify=verify), f.path
                ),
                f.path,
            )
        batches.append(cached)
    keys, values = last_writer_wins(batches, merge_delimiter=merge_delimiter)
    return RawState(keys, values, cf_ids=state.cf_ids, files=state.files + [f.path for f in chain])


def rocksdb_events(
    io: FileIO,
    store_dir: str,
    version: int,
    codec: str,
    *,
    unique_id: str | None = None,
    verify: bool = True,
    max_bytes: int,
    metas: list[SnapshotMetadata] | None = None,
) -> VersionRecords:
    """The records that make up ``version``, in replay order and about ``max_bytes`` at a
    time, for a bounded read: the base snapshot's, then the changelogs after it. The base
    snapshot's metadata (its column family ids) is appended to ``metas`` before its first
    chunk."""
    if version == 0:
        return VersionRecords(None, None)
    base, chain, parsed = _version_chain(io, store_dir, version, codec, unique_id, verify)

    def snapshot() -> Iterator[RecordBatch]:
        assert base is not None
        found = [] if metas is None else metas
        for k, v in iter_zip(io, store_dir, base.path, verify, metas=found, max_bytes=max_bytes):
            yield RecordBatch(np.full(len(k), OP_PUT, dtype=np.uint8), k, v, None, 1)

    def changelogs() -> Iterator[RecordBatch]:
        for f in chain:
            batch = parsed.pop((f.version, f.unique_id or ""), None)
            if batch is None:
                if io.size(f.path) * EXPANSION > max_bytes:  # read and decompressed in windows
                    blocks = iter_verified(io, f.path, verify=verify, block=stream_block(max_bytes))
                    yield from timed(
                        _changelog_chunks(codec, blocks, f.path, max_bytes), "changelog read"
                    )
                    continue
                with phase("changelog read"):
                    data = read_verified(io, f.path, data_file=True, verify=verify)
                    batch = parse_changelog(decompress_stream(codec, data, f.path), f.path)
            rows = max(
                16, max_bytes * len(batch) // max(1, batch.keys.nbytes + batch.values.nbytes)
            )
            for i in range(0, len(batch), rows):
                yield RecordBatch(
                    batch.ops[i : i + rows],
                    batch.keys.slice(i, rows),
                    batch.values.slice(i, rows),
                    None,
                    batch.version,
                )

    return VersionRecords(snapshot if base is not None else None, changelogs if chain else None)


def _changelog_chunks(
    codec: str, data: Iterable[bytes], path: str, max_bytes: int
) -> Iterator[RecordBatch]:
    """A large changelog's records a window at a time: formats 1 and 3 (puts and deletes, as
    key-value stores write them) streamed, formats 2 and 4 (column families) parsed whole."""
    pieces = iter_decompressed(codec, data, path)
    head: list[bytes] = []
    size = 0
    for piece in pieces:  # enough of the stream for its header (and lineage)
        head.append(bytes(piece))
        size += len(piece)
        if size >= 1 << 20:
            break
    first = b"".join(head)
    version, start, _ = changelog_version(first, path)
    if version not in (1, 3):
        yield parse_changelog(first + b"".join(bytes(p) for p in pieces), path)
        return
    yield from iter_record_stream(
        itertools.chain([first], pieces), path, max_bytes=max_bytes, start=start
    )


class RocksDBBackend:
    """RocksDBStateStoreProvider (see the module docstring): keys and values carry the
    encoding-version byte, column-family stores a 2-byte family id in front of keys, and row
    checksums (Spark 4.1+) 8 bytes in front of values: the checksum, then the value's length."""

    name: str = "rocksdb"
    title: str = "RocksDB"
    provider_classes: tuple[str, ...] = (PROVIDER,)
    capabilities: Capabilities = Capabilities(
        layouts=(SNAPSHOT, CHANGELOG),
        column_families=True,
        checkpoint_format_2=True,
        row_checksums=True,
        sorted_layouts=(SNAPSHOT,),
        key_encoders=True,
    )

    def recognises(self, provider_class: str) -> bool:
        return provider_class.endswith("RocksDBStateStoreProvider")

    def owns_file(self, name: str) -> bool:
        return _FILE_RE.match(name) is not None

    def versions(self, io: FileIO, store_dir: str) -> list[int]:
        return sorted({f.version for f in list_version_files(io, store_dir)})

    def files_for_version(
        self, io: FileIO, store_dir: str, version: int, opts: ReadOptions
    ) -> list[str]:
        if version == 0:
            return []
        base, chain, _ = _version_chain(
            io, store_dir, version, opts.codec, opts.unique_id, opts.verify
        )
        return ([base.path] if base else []) + [f.path for f in chain]

    def copy_files(self, io: FileIO, store_dir: str, version: int, opts: ReadOptions) -> list[str]:
        files = list_version_files(io, store_dir)
        if opts.unique_id is None:
            base, chain = chain_v1(files, version, store_dir)
        else:
            base, chain, _ = chain_v2(
                io, opts.codec, files, version, opts.unique_id, store_dir, opts.verify
            )
        out = [f.path for f in chain]
        if base is not None:
            out += [base.path, *zip_references(io, store_dir, base.path)]
        # Checkpoint format v2 keeps a JSON checksum beside each state file: copy it when present.
        return out + [p + ".crc" for p in out if not p.endswith(".sst") and io.exists(p + ".crc")]

    def load(self, io: FileIO, store_dir: str, version: int, opts: ReadOptions) -> RawState:
        return read_rocksdb_store(
            io,
            store_dir,
            version,
            opts.codec,
            unique_id=opts.unique_id,
            merge_delimiter=opts.merge_delimiter,
            verify=opts.verify,
        )

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
        return rocksdb_events(
            io,
            store_dir,
            version,
            opts.codec,
            unique_id=opts.unique_id,
            verify=opts.verify,
            max_bytes=max_bytes,
            metas=metas,
        )

    def iterates_in_key_order(self) -> bool:
        return True  # a snapshot is iterated by RocksDB, in its key order

    def entry_codec(
        self, *, cf_id: int | None = None, row_checksum: bool = False, key_version: bool = True
    ) -> EntryCodec:
        return EntryCodec(
            version_byte=True,
            key_version=key_version,
            cf_id=cf_id,
            checksum_bytes=8 if row_checksum else 0,
        )

    def write(
        self, io: FileIO, store_dir: str, opts: WriteOptions, keys: pa.Array, values: pa.Array
    ) -> str | None:
        check_layout(self, opts.layout)
        if opts.layout == CHANGELOG:
            write_rocksdb_store(io, store_dir, opts.version, opts.codec, keys, values, encoded=True)
            return None
        uid = str(uuid.uuid4()) if opts.unique_ids else None
        write_rocksdb_snapshot(io, store_dir, opts.version, keys, values, unique_id=uid)
        return uid

    def write_streamed(
        self,
        io: FileIO,
        store_dir: str,
        opts: WriteOptions,
        batches: Batches,
        scratch: str,
        budget: int,
    ) -> str | None:
        check_layout(self, opts.layout)
        if opts.layout == CHANGELOG:
            empty_changelogs(io, store_dir, opts.codec, opts.version)
            path = posixpath.join(store_dir, f"{opts.version}.changelog")
            write_records_streamed(io, path, opts.codec, batches, scratch)
            return None
        uid = str(uuid.uuid4()) if opts.unique_ids else None
        runs = sorted_runs(batches(), scratch, budget)
        write_rocksdb_snapshot(
            io,
            store_dir,
            opts.version,
            None,
            None,
            unique_id=uid,
            batches=merge_runs(runs),
            num_keys=sum(run_rows(r) for r in runs),
        )
        return uid

    def check(self, io: FileIO, store_dir: str, version: int, opts: ReadOptions) -> list[str]:
        """Problems with the version files and, for a snapshot zip, the SSTs it names."""
        problems = check_files(io, lambda: self.files_for_version(io, store_dir, version, opts))
        if problems:
            return problems
        try:
            self.load(io, store_dir, version, opts)
        except StatectlError as e:
            return [str(e)]
        return []

    def missing_files(
        self, io: FileIO, store_dir: str, version: int, *, column_families: bool
    ) -> list[str]:
        try:
            base, _ = chain_v1(list_version_files(io, store_dir), version, store_dir)
        except StatectlError as e:
            return [str(e)]
        if base is None and column_families and version > 0:
            # Column families live only in a snapshot's metadata: changelogs alone lose them.
            return [f"{display_path(store_dir)}: no snapshot zip for a column-family store"]
        return []


BACKEND = RocksDBBackend()

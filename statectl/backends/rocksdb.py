"""RocksDBStateStoreProvider: ``N.zip`` snapshots (plus shared ``SSTs/``) and ``N.changelog`` files.

Version V is the newest zip at or below V (or the empty database) plus the changelogs after it
up to V (``RocksDB.loadWithoutCheckpointId``). With checkpoint format v2 the file names carry a
unique id and V's changelog names its lineage (``loadWithCheckpointId``).

Snapshots are opened read-only with rocksdict in a private temporary directory; the checkpoint is
never written to.
"""

from __future__ import annotations

import io as _io
import itertools
import os
import posixpath
import re
import tempfile
import uuid
import zipfile
import zlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import cast

import numpy as np
import pyarrow as pa

from statectl.backends.base import (
    CHANGELOG,
    SNAPSHOT,
    Batches,
    Capabilities,
    RawState,
    ReadOptions,
    WriteOptions,
    check_layout,
    empty_raw_state,
    version_chain,
)
from statectl.backends.entries import EntryCodec
from statectl.backends.hdfs import check_files
from statectl.backends.streamed import (
    empty_changelogs,
    merge_runs,
    run_rows,
    sorted_runs,
    write_records_streamed,
)
from statectl.backends.writers import write_rocksdb_snapshot, write_rocksdb_store
from statectl.checksums import iter_verified, read_verified, stream_block
from statectl.codecs.compression import EXPANSION, decompress_stream, iter_decompressed
from statectl.codecs.jsonfields import Fields, loads
from statectl.codecs.records import (
    OP_PUT,
    RecordBatch,
    changelog_version,
    iter_record_stream,
    last_writer_wins,
    parse_changelog,
)
from statectl.errors import CorruptFileError, MissingFileError, StatectlError
from statectl.io import FileIO, relative_inside

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


@dataclass
class SnapshotMetadata:
    sst_files: list[dict]
    log_files: list[dict]
    num_keys: int
    cf_ids: dict[str, int]
    raw: dict
    num_internal_keys: int = 0

    @property
    def expected_keys(self) -> int:
        """Keys a full iteration returns: user plus internal column families (checked against
        every bundled fixture); -1 when the writer did not count (Spark then recounts)."""
        if self.num_keys < 0:
            return -1
        return self.num_keys + max(self.num_internal_keys, 0)


def parse_snapshot_metadata(text: str, path: str) -> SnapshotMetadata:
    head, _, body = text.partition("\n")
    if head.strip() != "v1":
        raise CorruptFileError(f"RocksDB checkpoint metadata version {head!r} is not v1", path)
    obj = Fields(loads(body, path, "RocksDB checkpoint metadata"), path)
    # Typed here: jsonfields' ``list`` method shadows the builtin in its annotations.
    ssts: list[Fields] = list(obj.obj_list("sstFiles", []))
    logs: list[Fields] = list(obj.obj_list("logFiles", []))
    for e in ssts + logs:
        e.str("localFileName")
        e.str("dfsSstFileName" if e in ssts else "dfsLogFileName")
        e.int("sizeBytes", 0, minimum=0)
    return SnapshotMetadata(
        sst_files=[e.obj for e in ssts],
        log_files=[e.obj for e in logs],
        num_keys=obj.int("numKeys", -1),
        cf_ids=obj.int_map("columnFamilyMapping", {}),
        raw=obj.obj,
        num_internal_keys=obj.int("numInternalKeys", 0, minimum=0),
    )


def bare_name(name: object, source: str) -> str:
    """A file name from RocksDB checkpoint metadata: one path component, nothing else."""
    name = relative_inside(name, source)
    if "/" in name:
        raise CorruptFileError(f"file name {name!r} is not a plain file name", source)
    return name


def _raise_iterator_error(db: object, zip_path: str) -> None:
    it = db.iter()  # type: ignore[attr-defined]
    it.seek_to_first()
    while it.valid():
        it.next()
    try:
        it.status()
    except Exception as e:  # rocksdict raises plain Exception
        raise CorruptFileError(f"RocksDB failed while reading: {e}", zip_path) from None
    finally:
        del it


def _read_zip(
    io: FileIO, store_dir: str, zip_path: str, verify: bool = True
) -> tuple[RawState, SnapshotMetadata]:
    """Materialize a snapshot zip and its SSTs locally, then read every key read-only."""
    metas: list[SnapshotMetadata] = []
    keys: list[pa.Array] = []
    values: list[pa.Array] = []
    for k, v in iter_zip(io, store_dir, zip_path, verify, metas=metas):
        keys.append(k)
        values.append(v)
    empty = pa.array([], type=pa.large_binary())
    state = RawState(
        pa.concat_arrays(keys) if keys else empty,
        pa.concat_arrays(values) if values else empty,
        cf_ids=metas[0].cf_ids,
        files=[zip_path],
    )
    return state, metas[0]


def iter_zip(
    io: FileIO,
    store_dir: str,
    zip_path: str,
    verify: bool = True,
    *,
    metas: list[SnapshotMetadata],
    max_bytes: int | None = None,
) -> Iterator[tuple[pa.LargeBinaryArray, pa.LargeBinaryArray]]:
    """A snapshot's entries in key order, about ``max_bytes`` at a time (all at once when
    None); its
    metadata is appended to ``metas`` before the first chunk."""
    from rocksdict import AccessType, Options, Rdict  # native; imported only when needed

    data = read_verified(io, zip_path, data_file=True, verify=verify)
    try:
        archive = zipfile.ZipFile(_io.BytesIO(data))
    except (zipfile.BadZipFile, UnicodeDecodeError):  # a damaged member name flagged UTF-8
        raise CorruptFileError("not a valid zip archive (truncated?)", zip_path) from None
    with tempfile.TemporaryDirectory(prefix="statectl-rocksdb-") as tmp:
        try:
            archive.extractall(tmp)
        except (zipfile.BadZipFile, OSError, EOFError, zlib.error, ValueError) as e:
            raise CorruptFileError(f"cannot unpack snapshot zip: {e}", zip_path) from None
        meta_path = posixpath.join(tmp, "metadata")
        try:
            with open(meta_path, "rb") as f:
                raw_meta = f.read()
            try:
                text = raw_meta.decode("utf-8")
            except UnicodeDecodeError:
                raise CorruptFileError(
                    "metadata is not UTF-8 text", zip_path + "!metadata"
                ) from None
            meta = parse_snapshot_metadata(text, zip_path + "!metadata")
        except FileNotFoundError:
            raise CorruptFileError("snapshot zip has no 'metadata' entry", zip_path) from None
        except (UnicodeDecodeError, IsADirectoryError):
            raise CorruptFileError("snapshot zip 'metadata' is not UTF-8 text", zip_path) from None
        os.remove(meta_path)
        meta_source = zip_path + "!metadata"
        for entry, folder, dfs_key in [(e, "SSTs", "dfsSstFileName") for e in meta.sst_files] + [
            (e, "logs", "dfsLogFileName") for e in meta.log_files
        ]:
            if not isinstance(entry, dict):
                raise CorruptFileError(f"file entry {entry!r} is not an object", meta_source)
            # Both names come from the zip: bare file names only, or a crafted zip could
            # make this read (or write) any file.
            src = io.inside(
                posixpath.join(store_dir, folder),
                bare_name(entry.get(dfs_key), meta_source),
                meta_source,
            )
            local = posixpath.join(tmp, bare_name(entry.get("localFileName"), meta_source))
            blob = read_verified(io, src, data_file=True, verify=verify)
            size = entry.get("sizeBytes")
            if size is not None and (not isinstance(size, int) or len(blob) != size):
                raise CorruptFileError(
                    f"size {len(blob)} differs from {size!r} recorded in {zip_path}", src
                )
            try:
                with open(local, "xb") as out:
                    out.write(blob)
            except FileExistsError:
                raise CorruptFileError(
                    f"file {local.rsplit('/', 1)[-1]!r} is listed twice", meta_source
                ) from None
        opts = Options(raw_mode=True)
        opts.create_if_missing(False)
        try:
            db = Rdict(tmp, options=opts, access_type=AccessType.read_only())
        except Exception as e:  # rocksdict raises plain Exception subclasses
            raise CorruptFileError(f"RocksDB cannot open this snapshot: {e}", zip_path) from None
        metas.append(meta)
        try:
            keys: list[bytes] = []
            values: list[bytes] = []
            total = size = 0
            limit = max_bytes or 0  # bytes counted every 1,024 entries
            items = iter(db.items())
            while True:
                try:
                    k, v = cast(tuple[bytes, bytes], next(items))  # raw_mode: bytes
                except StopIteration:
                    break
                except Exception as e:  # rocksdict raises plain Exception
                    raise CorruptFileError(f"RocksDB failed while reading: {e}", zip_path) from None
                keys.append(k)
                values.append(v)
                if limit and len(keys) % 1024 == 0:
                    size += sum(map(len, keys[-1024:])) + sum(map(len, values[-1024:]))
                    if size >= limit:
                        total += len(keys)
                        yield _binary(keys), _binary(values)
                        keys, values, size = [], [], 0
            total += len(keys)
            if total != meta.expected_keys:
                # rocksdict's items() ends silently at a damaged block: ask a raw iterator
                # for RocksDB's own error, else report the count that does not add up.
                _raise_iterator_error(db, zip_path)
                if meta.expected_keys >= 0:
                    raise CorruptFileError(
                        f"RocksDB returned {total} keys, the snapshot metadata records "
                        f"{meta.expected_keys}; an SST file is damaged",
                        zip_path,
                    )
            if keys or total == 0:
                yield _binary(keys), _binary(values)
        finally:
            db.close()


def _binary(items: list[bytes]) -> pa.LargeBinaryArray:
    return pa.array(items, type=pa.large_binary())


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
    base = None
    for v, u in reversed(lineage):
        if (v, u, "zip") in by_key:
            base = by_key[(v, u, "zip")]
            break
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
    return base, chain, parsed


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
) -> tuple[bool, Iterator[RecordBatch]]:
    """The records that make up ``version``, in replay order and about ``max_bytes`` at a
    time, for a bounded read: (whether they are one snapshot's unique keys, needing no replay;
    chunks). The base snapshot's metadata (its column family ids) is appended to ``metas``
    before its first chunk."""
    if version == 0:
        return True, iter(())
    base, chain, parsed = _version_chain(io, store_dir, version, codec, unique_id, verify)

    def chunks() -> Iterator[RecordBatch]:
        if base is not None:
            found = [] if metas is None else metas
            for k, v in iter_zip(
                io, store_dir, base.path, verify, metas=found, max_bytes=max_bytes
            ):
                yield RecordBatch(np.full(len(k), OP_PUT, dtype=np.uint8), k, v, None, 1)
        for f in chain:
            batch = parsed.pop((f.version, f.unique_id or ""), None)
            if batch is None:
                if io.size(f.path) * EXPANSION > max_bytes:  # read and decompressed in windows
                    blocks = iter_verified(io, f.path, verify=verify, block=stream_block(max_bytes))
                    yield from _changelog_chunks(codec, blocks, f.path, max_bytes)
                    continue
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

    return not chain, chunks()


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
    ) -> tuple[bool, Iterator[RecordBatch]]:
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


BACKEND = RocksDBBackend()

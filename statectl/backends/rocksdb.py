"""RocksDBStateStoreProvider: ``N.zip`` snapshots (plus shared ``SSTs/``) and ``N.changelog`` files.

Version V is the newest zip at or below V (or the empty database) plus the changelogs after it
up to V (``RocksDB.loadWithoutCheckpointId``). With checkpoint format v2 the file names carry a
unique id and V's changelog names its lineage (``loadWithCheckpointId``).

Snapshots are opened read-only with rocksdict in a private temporary directory; the checkpoint is
never written to.
"""

from __future__ import annotations

import io as _io
import os
import posixpath
import re
import tempfile
import zipfile
import zlib
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from statectl.backends import RawState, empty_raw_state, version_chain
from statectl.codecs.compression import decompress_stream
from statectl.codecs.jsonfields import Fields, loads
from statectl.codecs.records import OP_PUT, RecordBatch, last_writer_wins, parse_changelog
from statectl.errors import CorruptFileError, MissingFileError
from statectl.io import FileIO

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


def parse_snapshot_metadata(text: str, path: str) -> SnapshotMetadata:
    head, _, body = text.partition("\n")
    if head.strip() != "v1":
        raise CorruptFileError(f"RocksDB checkpoint metadata version {head!r} is not v1", path)
    obj = Fields(loads(body, path, "RocksDB checkpoint metadata"), path)
    ssts = obj.obj_list("sstFiles", [])
    logs = obj.obj_list("logFiles", [])
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
    )


def _read_zip(io: FileIO, store_dir: str, zip_path: str) -> tuple[RawState, SnapshotMetadata]:
    """Materialize a snapshot zip and its SSTs locally, then read every key read-only."""
    from rocksdict import AccessType, Options, Rdict  # native; imported only when needed

    data = io.read_bytes(zip_path)
    try:
        archive = zipfile.ZipFile(_io.BytesIO(data))
    except (zipfile.BadZipFile, UnicodeDecodeError):  # a damaged member name flagged UTF-8
        raise CorruptFileError("not a valid zip archive (truncated?)", zip_path) from None
    with tempfile.TemporaryDirectory(prefix="statectl-rocksdb-") as tmp:
        try:
            archive.extractall(tmp)
        except (zipfile.BadZipFile, OSError, EOFError, zlib.error, UnicodeDecodeError) as e:
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
        os.remove(meta_path)
        for entry, folder, dfs_key in [(e, "SSTs", "dfsSstFileName") for e in meta.sst_files] + [
            (e, "logs", "dfsLogFileName") for e in meta.log_files
        ]:
            src = posixpath.join(store_dir, folder, entry[dfs_key])
            blob = io.read_bytes(src)
            if "sizeBytes" in entry and len(blob) != int(entry["sizeBytes"]):
                raise CorruptFileError(
                    f"size {len(blob)} differs from {entry['sizeBytes']} recorded in {zip_path}",
                    src,
                )
            with open(posixpath.join(tmp, entry["localFileName"]), "wb") as out:
                out.write(blob)
        opts = Options(raw_mode=True)
        opts.create_if_missing(False)
        try:
            db = Rdict(tmp, options=opts, access_type=AccessType.read_only())
        except Exception as e:  # rocksdict raises plain Exception subclasses
            raise CorruptFileError(f"RocksDB cannot open this snapshot: {e}", zip_path) from None
        try:
            keys, values = [], []
            for k, v in db.items():
                keys.append(k)
                values.append(v)
        except Exception as e:
            raise CorruptFileError(f"RocksDB failed while reading: {e}", zip_path) from None
        finally:
            db.close()
    state = RawState(
        pa.array(keys, type=pa.large_binary()),
        pa.array(values, type=pa.large_binary()),
        cf_ids=meta.cf_ids,
        files=[zip_path],
    )
    return state, meta


def chain_v1(
    files: list[VersionFile], version: int, store_dir: str
) -> tuple[VersionFile | None, list[VersionFile]]:
    zips = {f.version: f for f in files if f.kind == "zip" and f.unique_id is None}
    logs = {f.version: f for f in files if f.kind == "changelog" and f.unique_id is None}
    return version_chain(zips, logs, version, store_dir, "changelog")


def chain_v2(
    io: FileIO, codec: str, files: list[VersionFile], version: int, unique_id: str, store_dir: str
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
            decompress_stream(codec, io.read_bytes(top.path), top.path), top.path
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


def read_rocksdb_store(
    io: FileIO,
    store_dir: str,
    version: int,
    codec: str,
    *,
    unique_id: str | None = None,
    merge_delimiter: bytes = b"",
) -> RawState:
    """Live entries of one RocksDB store at ``version``; merge operands are combined by us."""
    if version == 0:
        return empty_raw_state()
    files = list_version_files(io, store_dir)
    parsed: dict[tuple[int, str], RecordBatch] = {}
    if unique_id is None:
        base, chain = chain_v1(files, version, store_dir)
    else:
        base, chain, parsed = chain_v2(io, codec, files, version, unique_id, store_dir)
    if base is not None:
        state, _ = _read_zip(io, store_dir, base.path)
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
                decompress_stream(codec, io.read_bytes(f.path), f.path), f.path
            )
        batches.append(cached)
    keys, values = last_writer_wins(batches, merge_delimiter=merge_delimiter)
    return RawState(keys, values, cf_ids=state.cf_ids, files=state.files + [f.path for f in chain])

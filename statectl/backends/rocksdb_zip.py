"""RocksDB snapshot zips: their metadata, and their entries read with RocksDB itself.

A zip holds RocksDB's small files and a ``metadata`` entry naming the SST (and log) files kept
beside it under ``SSTs/``. It is unpacked into a private temporary directory, the files it
names are copied next to it (bare names only: the names are untrusted), and the database is
opened read-only with rocksdict: the checkpoint is never written to.
"""

from __future__ import annotations

import io as _io
import itertools
import os
import posixpath
import tempfile
import zipfile
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
from rocksdict import AccessType, Options, Rdict

from statectl.backends import sst_read
from statectl.backends.base import RawState
from statectl.checksums import read_verified
from statectl.codecs.jsonfields import Fields, loads
from statectl.codecs.phases import phase, timed
from statectl.errors import CorruptFileError
from statectl.io import FileIO, relative_inside

# Entries read from rocksdict between two checks of the chunk's size.
STEP = 1024


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
    None); its metadata is appended to ``metas`` before the first chunk."""
    with tempfile.TemporaryDirectory(prefix="statectl-rocksdb-") as tmp:
        with phase("RocksDB open"):
            meta = _unpack(io, store_dir, zip_path, verify, tmp)
            db = _open_read_only(tmp, zip_path)
            run = _sorted_run(db, tmp, zip_path, max_bytes or 0)
        metas.append(meta)
        try:
            if run is None:
                yield from timed(_iter_db(db, meta, zip_path, max_bytes or 0), "RocksDB read")
            else:
                yield from timed(_iter_run(run, db, meta, zip_path, max_bytes or 0), "SST read")
        finally:
            db.close()


def _sorted_run(db: Any, tmp: str, zip_path: str, max_bytes: int) -> sst_read.Run | None:
    """The snapshot's SST files for statectl's own reader, when they are one sorted run (no
    LSM merge needed; see :mod:`statectl.backends.sst_read`), else None: RocksDB reads it."""
    try:
        return sst_read.sorted_run(tmp, db.live_files(), max_bytes)
    except sst_read.Unsupported:
        return None
    except CorruptFileError as e:
        raise _in_snapshot(e, zip_path) from None


def _in_snapshot(e: CorruptFileError, zip_path: str) -> CorruptFileError:
    """A damaged SST named by the snapshot that holds it (its local name is a temporary one)."""
    name = posixpath.basename(e.path or "")
    return CorruptFileError(f"RocksDB failed while reading {name}: {e.message}", zip_path)


def _iter_run(
    run: sst_read.Run, db: Any, meta: SnapshotMetadata, zip_path: str, limit: int
) -> Iterator[tuple[pa.LargeBinaryArray, pa.LargeBinaryArray]]:
    """:func:`_iter_db` for a sorted run read by statectl: the same entries, in pieces of
    about ``limit`` bytes (0: all at once), the count checked before the last piece."""
    total = 0
    held: list[tuple[pa.LargeBinaryArray, pa.LargeBinaryArray]] = []
    try:
        for keys, values in run:
            total += len(keys)
            if limit:
                for piece in _pieces(keys, values, limit):
                    yield from held
                    held = [piece]
            else:
                held.append((keys, values))
    except CorruptFileError as e:
        raise _in_snapshot(e, zip_path) from None
    if total != meta.expected_keys:
        _check_count(db, meta, zip_path, total)
    if limit or not held:
        yield from held or [(_binary([]), _binary([]))]
        return
    yield (
        pa.concat_arrays([k for k, _ in held]),
        pa.concat_arrays([v for _, v in held]),
    )


def _pieces(
    keys: pa.LargeBinaryArray, values: pa.LargeBinaryArray, limit: int
) -> Iterator[tuple[pa.LargeBinaryArray, pa.LargeBinaryArray]]:
    """Slices of about ``limit`` bytes (zero-copy)."""
    n = len(keys)
    rows = max(1, limit * n // max(1, keys.nbytes + values.nbytes))
    for start in range(0, n, rows):
        yield keys.slice(start, rows), values.slice(start, rows)


def _unpack(io: FileIO, store_dir: str, zip_path: str, verify: bool, tmp: str) -> SnapshotMetadata:
    """The zip unpacked into ``tmp`` and the files its metadata names copied beside it."""
    data = read_verified(io, zip_path, data_file=True, verify=verify)
    try:
        archive = zipfile.ZipFile(_io.BytesIO(data))
    except (zipfile.BadZipFile, UnicodeDecodeError):  # a damaged member name flagged UTF-8
        raise CorruptFileError("not a valid zip archive (truncated?)", zip_path) from None
    try:
        archive.extractall(tmp)
    except (zipfile.BadZipFile, OSError, EOFError, zlib.error, ValueError) as e:
        raise CorruptFileError(f"cannot unpack snapshot zip: {e}", zip_path) from None
    meta = _zip_metadata(tmp, zip_path)
    _fetch_files(io, store_dir, zip_path, meta, tmp, verify)
    return meta


def _zip_metadata(tmp: str, zip_path: str) -> SnapshotMetadata:
    """The unpacked zip's ``metadata`` entry, parsed (and removed: RocksDB must not see it)."""
    meta_path = posixpath.join(tmp, "metadata")
    try:
        with open(meta_path, "rb") as f:
            raw_meta = f.read()
        try:
            text = raw_meta.decode("utf-8")
        except UnicodeDecodeError:
            raise CorruptFileError("metadata is not UTF-8 text", zip_path + "!metadata") from None
        meta = parse_snapshot_metadata(text, zip_path + "!metadata")
    except FileNotFoundError:
        raise CorruptFileError("snapshot zip has no 'metadata' entry", zip_path) from None
    except (UnicodeDecodeError, IsADirectoryError):
        raise CorruptFileError("snapshot zip 'metadata' is not UTF-8 text", zip_path) from None
    os.remove(meta_path)
    return meta


def _fetch_files(
    io: FileIO, store_dir: str, zip_path: str, meta: SnapshotMetadata, tmp: str, verify: bool
) -> None:
    """Copy the SST and log files the metadata lists next to the unpacked zip."""
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


def _open_read_only(tmp: str, zip_path: str) -> Any:
    opts = Options(raw_mode=True)
    opts.create_if_missing(False)
    try:
        return Rdict(tmp, options=opts, access_type=AccessType.read_only())
    except Exception as e:  # rocksdict raises plain Exception subclasses
        raise CorruptFileError(f"RocksDB cannot open this snapshot: {e}", zip_path) from None


def _iter_db(
    db: Any, meta: SnapshotMetadata, zip_path: str, limit: int
) -> Iterator[tuple[pa.LargeBinaryArray, pa.LargeBinaryArray]]:
    """Every entry, ``limit`` bytes at a time (0: all at once; bytes counted every
    ``STEP`` entries), checked against the key count the metadata records."""
    keys: list[bytes] = []
    values: list[bytes] = []
    total = size = 0
    items = iter(db.items())
    while True:
        start = len(keys)
        _take(items, keys, values, zip_path)
        if len(keys) == start:
            break
        if limit:
            size += sum(map(len, keys[start:])) + sum(map(len, values[start:]))
            if size >= limit:
                total += len(keys)
                yield _binary(keys), _binary(values)
                keys, values, size = [], [], 0
    total += len(keys)
    if total != meta.expected_keys:
        _check_count(db, meta, zip_path, total)
    if keys or total == 0:
        yield _binary(keys), _binary(values)


def _take(items: Iterator[Any], keys: list[bytes], values: list[bytes], zip_path: str) -> None:
    """Up to ``STEP`` more entries appended: the read's inner loop, so no call per entry but
    the two appends (raw_mode: keys and values are bytes)."""
    add_key, add_value = keys.append, values.append
    try:
        for k, v in itertools.islice(items, STEP):
            add_key(k)
            add_value(v)
    except Exception as e:  # rocksdict raises plain Exception
        raise CorruptFileError(f"RocksDB failed while reading: {e}", zip_path) from None


def _check_count(db: Any, meta: SnapshotMetadata, zip_path: str, total: int) -> None:
    """rocksdict's items() ends silently at a damaged block: ask a raw iterator for RocksDB's
    own error, else report the count that does not add up."""
    _raise_iterator_error(db, zip_path)
    if meta.expected_keys >= 0:
        raise CorruptFileError(
            f"RocksDB returned {total} keys, the snapshot metadata records "
            f"{meta.expected_keys}; an SST file is damaged",
            zip_path,
        )


def _binary(items: list[bytes]) -> pa.LargeBinaryArray:
    """The bytes objects as one array: joined, and their lengths summed into the offsets
    (3x faster than ``pa.array`` of the list, which converts object by object)."""
    offsets = np.zeros(len(items) + 1, dtype=np.int64)
    np.cumsum(np.fromiter(map(len, items), dtype=np.int64, count=len(items)), out=offsets[1:])
    return pa.LargeBinaryArray.from_buffers(
        pa.large_binary(),
        len(items),
        [None, pa.py_buffer(offsets), pa.py_buffer(b"".join(items))],
    )


def zip_references(io: FileIO, store_dir: str, zip_path: str) -> list[str]:
    """The SST and log files a snapshot zip's metadata names, inside ``store_dir``."""
    source = zip_path + "!metadata"
    try:
        with zipfile.ZipFile(_io.BytesIO(io.read_bytes(zip_path))) as z:
            meta = parse_snapshot_metadata(z.read("metadata").decode(), source)
    except (zipfile.BadZipFile, KeyError, zlib.error, UnicodeDecodeError, EOFError):
        raise CorruptFileError("snapshot zip is corrupt or has no metadata", zip_path) from None
    out = []
    for entries, folder, key in (
        (meta.sst_files, "SSTs", "dfsSstFileName"),
        (meta.log_files, "logs", "dfsLogFileName"),
    ):
        for e in entries:
            name = bare_name(e.get(key) if isinstance(e, dict) else None, source)
            out.append(io.inside(posixpath.join(store_dir, folder), name, source))
    return out

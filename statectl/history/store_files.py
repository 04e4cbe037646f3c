"""One store partition's history from its files: per state version, the bytes written and by
kind, what a load of it reads (files, bytes, increments after the newest snapshot), and its
rows where the files say them.

Only names, sizes and small metadata are read, except for the record counts of increments
(``N.delta``, ``N.changelog``: puts and removes), which are decompressed and scanned but not
decoded. Rows come from RocksDB's ``numKeys`` in a snapshot zip (exact) or, between
snapshots, from the last known count plus puts minus removes: an estimate, since a put may
update a key that is already there (an aggregation's does, a deduplication's never does).
"""

from __future__ import annotations

import io as _io
import posixpath
import re
import zipfile
from collections.abc import Iterable
from dataclasses import dataclass, field

import numpy as np

from statectl.backends.rocksdb_zip import SnapshotMetadata, parse_snapshot_metadata
from statectl.codecs.changelog import parse_changelog
from statectl.codecs.compression import decompress_stream
from statectl.codecs.records import (
    OP_DELETE,
    OP_DELETE_RANGE,
    OP_PUT,
    RecordBatch,
    parse_state_records,
)
from statectl.errors import CorruptFileError
from statectl.io import FileInfo, FileIO

# Spark's state file names: HDFS ``N.delta``/``N.snapshot``, RocksDB ``N.zip``/``N.changelog``,
# with a checkpoint unique id after the version in checkpoint format 2.
_NAME = re.compile(r"^(\d+)(?:_([0-9a-fA-F-]{36}))?\.(delta|snapshot|zip|changelog)$")
INCREMENTS = ("delta", "changelog")
SNAPSHOTS = ("snapshot", "zip")
KINDS = ("delta", "snapshot", "zip", "sst", "changelog")


@dataclass
class VersionFigures:
    """One store partition at one state version (see the module docstring)."""

    version: int
    written: dict[str, int] = field(default_factory=dict)  # kind -> bytes written for it
    load_files: int | None = None  # files a load of this version reads (None: it cannot load)
    load_bytes: int | None = None
    lag: int | None = None  # increments after the newest snapshot at or below it
    rows: int | None = None
    rows_exact: bool = False
    puts: int | None = None
    removes: int | None = None


@dataclass
class _Snapshot:
    info: FileInfo
    meta: SnapshotMetadata | None  # a zip's metadata (None for an HDFS snapshot)
    sst_bytes: int = 0  # the SSTs its metadata names (on disk)
    sst_names: frozenset[str] = frozenset()


@dataclass
class _Listing:
    snapshots: dict[int, FileInfo]
    increments: dict[int, FileInfo]


def _pick(candidates: list[tuple[str | None, FileInfo]], wanted: str | None) -> FileInfo:
    """Of one version's files of one kind (several in checkpoint format 2, one per attempt),
    the one the commit log names, else the first by name."""
    for uid, info in candidates:
        if wanted is not None and uid == wanted:
            return info
    return candidates[0][1]


def list_store(io: FileIO, directory: str, unique_ids: dict[int, str]) -> _Listing:
    """A store directory's version files, one per version and kind (``unique_ids``: version ->
    the id the commit log records for it, checkpoint format 2)."""
    found: dict[tuple[int, str], list[tuple[str | None, FileInfo]]] = {}
    for f in io.list_dir(directory):
        m = _NAME.match(f.name)
        if m and not f.is_dir:
            found.setdefault((int(m.group(1)), m.group(3)), []).append((m.group(2), f))
    snaps: dict[int, FileInfo] = {}
    incs: dict[int, FileInfo] = {}
    for (v, kind), cands in sorted(found.items()):
        info = _pick(sorted(cands, key=lambda c: c[1].name), unique_ids.get(v))
        (snaps if kind in SNAPSHOTS else incs)[v] = info
    return _Listing(snaps, incs)


def zip_metadata(io: FileIO, path: str) -> SnapshotMetadata:
    """The ``metadata`` entry of a RocksDB snapshot zip (the zip holds RocksDB's small files;
    its SSTs live beside it)."""
    try:
        with zipfile.ZipFile(_io.BytesIO(io.read_bytes(path))) as z:
            text = z.read("metadata").decode("utf-8")
    except (zipfile.BadZipFile, KeyError, UnicodeDecodeError, OSError) as e:
        raise CorruptFileError(f"cannot read the snapshot zip's metadata: {e}", path) from None
    return parse_snapshot_metadata(text, path + "!metadata")


def count_records(io: FileIO, info: FileInfo, codec: str) -> tuple[int, int]:
    """(puts, removes) of one increment: its records scanned, not decoded. A merge (list state
    append) is neither: it adds to a key's value."""
    raw = decompress_stream(codec, io.read_bytes(info.path), info.path)
    batch: RecordBatch
    if info.name.endswith(".changelog"):
        batch = parse_changelog(raw, info.path)
    else:
        batch = parse_state_records(raw, info.path, allow_deletes=True)
    ops = batch.ops
    removes = int(np.count_nonzero((ops == OP_DELETE) | (ops == OP_DELETE_RANGE)))
    return int(np.count_nonzero(ops == OP_PUT)), removes


def _snapshots(io: FileIO, directory: str, listing: _Listing, upto: int) -> dict[int, _Snapshot]:
    """The snapshots at or below ``upto``, zips with their metadata and SST sizes."""
    ssts: dict[str, int] | None = None
    out: dict[int, _Snapshot] = {}
    for v, info in sorted(listing.snapshots.items()):
        if v > upto:
            break
        if not info.name.endswith(".zip"):
            out[v] = _Snapshot(info, None)
            continue
        if ssts is None:
            ssts = {f.name: f.size for f in io.list_dir(posixpath.join(directory, "SSTs"))}
        meta = zip_metadata(io, info.path)
        names = frozenset(str(e.get("dfsSstFileName")) for e in meta.sst_files)
        size = sum(ssts.get(n, int(e.get("sizeBytes", 0))) for n, e in _named(meta))
        out[v] = _Snapshot(info, meta, size, names)
    return out


def _named(meta: SnapshotMetadata) -> Iterable[tuple[str, dict]]:
    return ((str(e.get("dfsSstFileName")), e) for e in meta.sst_files)


def _load_cost(
    v: int, snaps: dict[int, _Snapshot], incs: dict[int, FileInfo]
) -> tuple[int | None, int | None, int | None]:
    """(files, bytes, lag) of loading version ``v``: the newest snapshot at or below it and the
    increments after it; (None, None, None) when one of those increments is gone."""
    base = max((s for s in snaps if s <= v), default=0)
    files, size = 0, 0
    if base:
        s = snaps[base]
        files += 1 + len(s.sst_names)
        size += s.info.size + s.sst_bytes
    for i in range(base + 1, v + 1):
        if i not in incs:
            return None, None, None
        files += 1
        size += incs[i].size
    return files, size, v - base


def scan_store(
    io: FileIO,
    directory: str,
    versions: list[int],
    *,
    codec: str,
    count: bool,
    unique_ids: dict[int, str] | None = None,
) -> dict[int, VersionFigures]:
    """Each of ``versions`` of one store partition directory (see the module docstring);
    ``count``: scan increments for their puts and removes."""
    if not versions:
        return {}
    listing = list_store(io, directory, unique_ids or {})
    top = max(versions)
    snaps = _snapshots(io, directory, listing, top)
    wanted = set(versions)
    # Rows are carried forward from the newest exact count at or below the first version
    # asked for: a zip's numKeys, or the empty store before version 1.
    first = min(versions)
    known = [s for s, sn in snaps.items() if s <= first and sn.meta and sn.meta.num_keys >= 0]
    start = max(known, default=0)
    rows: int | None = snaps[start].meta.num_keys if start else 0  # type: ignore[union-attr]
    exact = True
    if start == 0 and listing.increments and min(listing.increments) > 1:
        rows = None  # the increments from version 1 are gone: no base to count from
    previous_ssts = snaps[start].sst_names if start else frozenset()
    out: dict[int, VersionFigures] = {}
    for v in range(start + 1 if start else 1, top + 1):
        fig = VersionFigures(v)
        rows, exact = _step(
            io, fig, v, listing, snaps, codec, count and rows is not None, rows, exact
        )
        if v in snaps and snaps[v].meta is not None:
            fig.written["sst"] = _new_sst_bytes(snaps[v], previous_ssts)
            previous_ssts = snaps[v].sst_names
        if v in wanted:
            fig.load_files, fig.load_bytes, fig.lag = _load_cost(v, snaps, listing.increments)
            fig.rows, fig.rows_exact = rows, exact and rows is not None
            out[v] = fig
    if start and start in wanted:
        out[start] = _at_snapshot(start, snaps, listing)
    return out


def _new_sst_bytes(snap: _Snapshot, previous: frozenset[str]) -> int:
    """Bytes of the SSTs a zip names that the previous zip did not (uploaded for it)."""
    assert snap.meta is not None
    return sum(int(e.get("sizeBytes", 0)) for n, e in _named(snap.meta) if n not in previous)


def _at_snapshot(v: int, snaps: dict[int, _Snapshot], listing: _Listing) -> VersionFigures:
    """The version rows are counted from (a zip with numKeys): its own figures."""
    s = snaps[v]
    fig = VersionFigures(v, written={"zip": s.info.size, "sst": s.sst_bytes})
    fig.load_files, fig.load_bytes, fig.lag = _load_cost(v, snaps, listing.increments)
    fig.rows = s.meta.num_keys if s.meta else None
    fig.rows_exact = fig.rows is not None
    inc = listing.increments.get(v)
    if inc is not None:
        fig.written[inc.name.rsplit(".", 1)[1]] = inc.size
    return fig


def _step(
    io: FileIO,
    fig: VersionFigures,
    v: int,
    listing: _Listing,
    snaps: dict[int, _Snapshot],
    codec: str,
    count: bool,
    rows: int | None,
    exact: bool,
) -> tuple[int | None, bool]:
    """Version ``v``'s written bytes and record counts into ``fig``; the rows carried on."""
    inc = listing.increments.get(v)
    if inc is not None:
        fig.written[inc.name.rsplit(".", 1)[1]] = inc.size
        if count:
            fig.puts, fig.removes = count_records(io, inc, codec)
    snap = snaps.get(v)
    if snap is not None:
        fig.written["zip" if snap.meta is not None else "snapshot"] = snap.info.size
        if snap.meta is not None and snap.meta.num_keys >= 0:
            return snap.meta.num_keys, True
    if inc is None:
        # Neither a snapshot with a count nor an increment: the count is lost here.
        return (rows, exact) if snap is not None else (None, False)
    if rows is None or fig.puts is None or fig.removes is None:
        return None, False
    # A put may replace a key already there: from here on the count is an upper bound.
    return max(rows + fig.puts - fig.removes, 0), exact and fig.puts == 0

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
import xxhash

from statectl.backends.rocksdb_zip import SnapshotMetadata, parse_snapshot_metadata
from statectl.checksums import read_verified
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
# Keys per store partition whose hashes history keeps to count rows exactly (8 bytes each).
TRACK_LIMIT = 4_000_000


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


def zip_metadata(io: FileIO, path: str, verify: bool = True) -> SnapshotMetadata:
    """The ``metadata`` entry of a RocksDB snapshot zip (the zip holds RocksDB's small files;
    its SSTs live beside it)."""
    try:
        data = read_verified(io, path, data_file=True, verify=verify)
        with zipfile.ZipFile(_io.BytesIO(data)) as z:
            text = z.read("metadata").decode("utf-8")
    except (zipfile.BadZipFile, KeyError, UnicodeDecodeError, OSError) as e:
        raise CorruptFileError(f"cannot read the snapshot zip's metadata: {e}", path) from None
    return parse_snapshot_metadata(text, path + "!metadata")


def zip_rows(meta: SnapshotMetadata) -> int | None:
    """Rows of a zip as ``inspect`` counts them (every column family but the ``$`` ones of
    transformWithState), from its key counts: RocksDB's ``numKeys`` leaves out the column
    families its type map marks internal, which are the ``$`` ones or a join's ``tsWithKey``
    index (counted by inspect); None for a mix, or no count."""
    if meta.num_keys < 0:
        return None
    types = meta.raw.get("columnFamilyTypeMap") or {}
    internal = [name for name, flag in types.items() if flag is True]
    if all(n.startswith("$") for n in internal):
        return meta.num_keys
    if not any(n.startswith("$") for n in internal):
        return meta.num_keys + max(meta.num_internal_keys, 0)
    return None


def read_records(io: FileIO, info: FileInfo, codec: str, verify: bool = True) -> RecordBatch:
    """One increment's records, scanned, not decoded (its checksums checked, as every read)."""
    data = read_verified(io, info.path, data_file=True, verify=verify)
    raw = decompress_stream(codec, data, info.path)
    if info.name.endswith(".changelog"):
        return parse_changelog(raw, info.path)
    return parse_state_records(raw, info.path, allow_deletes=True)


def count_records(batch: RecordBatch) -> tuple[int, int]:
    """(puts, removes) of one increment. A merge (list state append) is neither: it adds to a
    key's value."""
    ops = batch.ops
    removes = int(np.count_nonzero((ops == OP_DELETE) | (ops == OP_DELETE_RANGE)))
    return int(np.count_nonzero(ops == OP_PUT)), removes


def _member(sorted_arr: np.ndarray, x: np.ndarray) -> np.ndarray:
    """Which of ``x`` are in ``sorted_arr`` (a binary search each)."""
    at = np.searchsorted(sorted_arr, x)
    found = at < len(sorted_arr)
    found[found] = sorted_arr[at[found]] == x[found]
    return found


class LiveKeys:
    """The live keys of a store partition replayed from version 1, as 64-bit hashes of their
    bytes: rows stay exact through every increment (a put of a key already there is an
    update) without keeping a row. Given up past ``limit`` keys (then rows are estimates).

    A large sorted array ``main``, and two small sets: ``recent`` keys added since, ``dead``
    keys of ``main`` removed since. An increment touches only the small sets (its keys are
    few); they are merged into ``main`` once they reach an eighth of it (copying the whole
    array per increment cost more than everything else together)."""

    def __init__(self, limit: int = TRACK_LIMIT) -> None:
        self.main = np.empty(0, np.uint64)
        self.recent: set[int] = set()  # added since the last merge, not in main
        self.dead: set[int] = set()  # of main, removed since the last merge
        self.limit = limit

    def __len__(self) -> int:
        return len(self.main) - len(self.dead) + len(self.recent)

    def apply(self, batch: RecordBatch) -> bool:
        """Replay one increment (the last record of a key wins); False once over the limit or
        for records it cannot follow (a range delete)."""
        ops = batch.ops
        if len(ops) == 0:
            return True
        if np.any(ops == OP_DELETE_RANGE):
            return False
        h = np.fromiter(
            (xxhash.xxh64_intdigest(k) for k in batch.keys.to_pylist()), np.uint64, len(ops)
        )
        uniq, last = np.unique(h[::-1], return_index=True)
        final = ops[::-1][last]
        in_main = _member(self.main, uniq).tolist()
        for key, op, known in zip(uniq.tolist(), final.tolist(), in_main, strict=True):
            if op == OP_DELETE:
                (self.dead.add if known else self.recent.discard)(key)
            elif known:
                self.dead.discard(key)
            else:
                self.recent.add(key)
        if len(self.recent) + len(self.dead) > max(len(self.main) // 8, 4096):
            self._merge()
        return len(self) <= self.limit

    def _merge(self) -> None:
        dead = np.sort(np.fromiter(self.dead, np.uint64, len(self.dead)))
        kept = self.main[~_member(dead, self.main)] if len(dead) else self.main
        recent = np.fromiter(self.recent, np.uint64, len(self.recent))
        self.main = np.sort(np.concatenate([kept, recent]))
        self.recent, self.dead = set(), set()


def _snapshots(
    io: FileIO, directory: str, listing: _Listing, upto: int, verify: bool = True
) -> dict[int, _Snapshot]:
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
        meta = zip_metadata(io, info.path, verify)
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


class _Replay:
    """Rows carried from version to version of one store partition: exact while the live keys
    are replayed (from version 1) or at a zip's numKeys, else an estimate (puts minus
    removes: a put may update a key already there, so an upper bound)."""

    def __init__(self, start: int, rows: int | None, keys: LiveKeys | None) -> None:
        self.start = start
        self.verify = True
        self.previous_ssts: frozenset[str] = frozenset()
        self.rows = rows
        self.exact = rows is not None
        self.keys = keys

    def increment(self, batch: RecordBatch | None) -> None:
        if batch is None or self.rows is None:
            self.rows, self.exact, self.keys = None, False, None
            return
        puts, removes = count_records(batch)
        if self.keys is not None and self.keys.apply(batch):
            self.rows = len(self.keys)
            return
        self.keys = None
        self.rows = max(self.rows + puts - removes, 0)
        self.exact = self.exact and puts == 0

    def snapshot(self, meta: SnapshotMetadata | None, replayed: bool) -> None:
        """A snapshot: a zip's key count wins unless its keys were just replayed exactly
        (``replayed``); a zip without a changelog ends the replay (its keys are not read)."""
        rows = None if meta is None else zip_rows(meta)
        if rows is None or (replayed and self.keys is not None):
            return
        self.rows, self.exact, self.keys = rows, True, None

    def step(
        self, io: FileIO, v: int, inc: FileInfo | None, snap: _Snapshot | None, codec: str | None
    ) -> VersionFigures:
        """Version ``v``: its files' bytes, its increment's records (``codec``: counting, else
        None), and the rows carried on."""
        fig = VersionFigures(v)
        if inc is not None:
            fig.written[inc.name.rsplit(".", 1)[1]] = inc.size
        if v > self.start:
            batch = read_records(io, inc, codec, self.verify) if inc is not None and codec else None
            if batch is not None:
                fig.puts, fig.removes = count_records(batch)
            if inc is not None or snap is None:  # an HDFS snapshot comes with its delta
                self.increment(batch)
        if snap is not None:
            fig.written["zip" if snap.meta is not None else "snapshot"] = snap.info.size
            self.snapshot(snap.meta, replayed=inc is not None and codec is not None)
            if snap.meta is not None:
                fig.written["sst"] = _new_sst_bytes(snap, self.previous_ssts)
                self.previous_ssts = snap.sst_names
        return fig


def scan_store(
    io: FileIO,
    directory: str,
    versions: list[int],
    *,
    codec: str,
    count: bool,
    unique_ids: dict[int, str] | None = None,
    column_families: bool = False,
    verify: bool = True,
) -> dict[int, VersionFigures]:
    """Each of ``versions`` of one store partition directory (see the module docstring);
    ``count``: scan increments for their puts and removes (and replay their keys, but for
    ``column_families``: their internal families are not rows)."""
    if not versions:
        return {}
    listing = list_store(io, directory, unique_ids or {})
    top = max(versions)
    snaps = _snapshots(io, directory, listing, top, verify)
    wanted = set(versions)
    incs = listing.increments
    if count and incs and min(incs) == 1:
        # Every increment from version 1 is here: replay them from the empty store.
        start, replay = 0, _Replay(0, 0, None if column_families else LiveKeys())
    else:
        # From the newest zip with a key count at or below the first version asked for.
        first = min(versions)
        known = {
            v: rows
            for v, sn in snaps.items()
            if v <= first and sn.meta and (rows := zip_rows(sn.meta)) is not None
        }
        start = max(known, default=0)
        replay = _Replay(start, known.get(start), None)
    replay.previous_ssts = snaps[start].sst_names if start else frozenset()
    replay.verify = verify
    out: dict[int, VersionFigures] = {}
    for v in range(start, top + 1):
        fig = replay.step(io, v, incs.get(v), snaps.get(v), codec if count else None)
        if v in wanted:
            fig.load_files, fig.load_bytes, fig.lag = _load_cost(v, snaps, incs)
            fig.rows, fig.rows_exact = replay.rows, replay.exact
            out[v] = fig
    return out


def _new_sst_bytes(snap: _Snapshot, previous: frozenset[str]) -> int:
    """Bytes of the SSTs a zip names that the previous zip did not (uploaded for it)."""
    assert snap.meta is not None
    return sum(int(e.get("sizeBytes", 0)) for n, e in _named(snap.meta) if n not in previous)

"""Use case ``gc``: retention for a directory of savepoints, and clean-up of a checkpoint.

Savepoints: per query (savepoints of several queries may share a directory), the newest
complete savepoint is always kept; older complete ones go when they are beyond ``keep_last``
(ordered by batch, then creation time) or older than ``max_age``, through ``dispose``'s own plan
and deletion (exactly the files ``_metadata`` lists; a savepoint holding anything else is
skipped with dispose's reason). A savepoint directory without ``_metadata`` (a writer killed
before it finished) goes once nothing in it changed for ``incomplete_after``, and only when it
holds nothing a savepoint writer does not write.

Checkpoints (format 1): the state files and log entries that no restart at the latest committed
batch, nor at any of the ``keep_batches`` batches before it, needs: per store partition, files of
versions older than the oldest file those restarts load (Spark's own cleanup rule,
``HDFSBackedStateStoreProvider.cleanup`` / ``RocksDBFileManager.deleteOldVersions``, with the
retention given here), the SSTs only such files name, and ``offsets``/``commits`` entries before
the batch ahead of the oldest kept one. Everything deleted is older than anything a running
writer loads or writes, and is deleted oldest first, so the checkpoint stays loadable at every
kept batch throughout. Checkpoint format 2 is refused: its files are named by the unique ids of
a lineage that a running writer may still be extending, which this rule cannot see.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import posixpath
import re
from dataclasses import dataclass, field
from typing import Any

from statectl.checkpoint.model import Checkpoint, store_dir
from statectl.errors import StatectlError
from statectl.in_progress import read_in_progress
from statectl.io import FileIO
from statectl.savepoints.dispose import dispose, dispose_plan
from statectl.savepoints.layout import EMBEDDED
from statectl.savepoints.store import Savepoint, is_savepoint_dir
from statectl.state import StoreEncoding

# Spark's default spark.sql.streaming.minBatchesToRetain: what its own maintenance keeps.
DEFAULT_KEEP_BATCHES = 100
DEFAULT_INCOMPLETE_AFTER = "1d"
_AGE = re.compile(r"^(\d+)([smhdw])$")
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
_SAVEPOINT_NAME = re.compile(r"^savepoint-.+-\d+-[0-9a-f]{8}$")
# What a savepoint writer puts in a savepoint directory before its _metadata (layout.py):
# data files, a native savepoint's embedded checkpoint, carried source files, temporaries.
_WRITER_TOPS = ("operators", EMBEDDED, "sources")


def parse_age(text: str, what: str) -> dt.timedelta:
    """``30d``, ``12h``, ``90m``, ``2w``, ``3600s`` as a duration."""
    m = _AGE.match(text.strip())
    if not m:
        raise StatectlError(f"{what} must look like 30d, 12h, 90m, 2w or 3600s, not {text!r}")
    return dt.timedelta(seconds=int(m.group(1)) * _UNITS[m.group(2)])


@dataclass
class Deletion:
    """One thing ``gc`` deletes: a savepoint (all of dispose's files) or a checkpoint file."""

    path: str  # URL
    bytes: int
    reason: str

    def to_dict(self) -> dict[str, Any]:
        return {"path": self.path, "bytes": self.bytes, "reason": self.reason}


@dataclass
class GcPlan:
    """What ``gc`` deletes and what it keeps (``to_dict`` is ``--json``)."""

    kind: str  # "savepoints" or "checkpoint"
    path: str
    delete: list[Deletion] = field(default_factory=list)
    kept: list[dict[str, Any]] = field(default_factory=list)
    skipped: list[dict[str, str]] = field(default_factory=list)
    # private: how to delete each entry (a savepoint URL for dispose, or a file of ``io``)
    io: FileIO | None = None
    files: list[str] = field(default_factory=list)
    savepoints: list[str] = field(default_factory=list)
    incomplete: list[str] = field(default_factory=list)

    @property
    def bytes(self) -> int:
        return sum(d.bytes for d in self.delete)

    def to_dict(self, deleted: bool) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "path": self.path,
            "deleted": deleted,
            "bytes": self.bytes,
            "delete": [d.to_dict() for d in self.delete],
            "kept": self.kept,
            "skipped": self.skipped,
        }


@dataclass(frozen=True)
class GcResult:
    """What ``gc`` deleted, or (``deleted`` False: a dry run, or nothing to delete) would
    delete; ``to_dict()`` is ``statectl gc --json``."""

    plan: GcPlan
    deleted: bool

    @property
    def kind(self) -> str:
        return self.plan.kind

    @property
    def path(self) -> str:
        return self.plan.path

    @property
    def bytes(self) -> int:
        return self.plan.bytes

    @property
    def delete(self) -> list[Deletion]:
        return list(self.plan.delete)

    def to_dict(self) -> dict[str, Any]:
        return self.plan.to_dict(deleted=self.deleted)


def gc_plan(
    url: str,
    *,
    keep_last: int | None = None,
    max_age: str | None = None,
    keep_batches: int | None = None,
    incomplete_after: str = DEFAULT_INCOMPLETE_AFTER,
    now: dt.datetime | None = None,
) -> GcPlan:
    """What ``gc`` would delete under ``url`` (a checkpoint, or a directory of savepoints)."""
    io, root = FileIO.for_url(url)
    if not io.is_dir(root):
        raise StatectlError("no such directory", io.url(root))
    if is_savepoint_dir(io, root):
        raise StatectlError(
            "is a savepoint; gc takes the directory that holds savepoints (or a checkpoint)",
            io.url(root),
        )
    if io.exists(posixpath.join(root, "offsets")) or read_in_progress(io, root) is not None:
        if keep_last is not None or max_age is not None:
            raise StatectlError("--keep-last and --max-age are for savepoints", io.url(root))
        keep = DEFAULT_KEEP_BATCHES if keep_batches is None else keep_batches
        return checkpoint_plan(io, root, keep)
    if keep_batches is not None:
        raise StatectlError("--keep-batches is for a checkpoint, not savepoints", io.url(root))
    if keep_last is None and max_age is None:
        raise StatectlError("say what to keep: --keep-last N and/or --max-age AGE", io.url(root))
    if keep_last is not None and keep_last < 1:
        raise StatectlError(f"--keep-last must be at least 1, got {keep_last}")
    when = now or dt.datetime.now(dt.timezone.utc)
    age = parse_age(max_age, "--max-age") if max_age else None
    return savepoints_plan(
        io, root, keep_last, age, parse_age(incomplete_after, "--incomplete-after"), when
    )


# -- savepoints ----------------------------------------------------------------------------
@dataclass
class _Found:
    path: str
    query_id: str | None
    batch: int
    created: dt.datetime


def savepoints_plan(
    io: FileIO,
    root: str,
    keep_last: int | None,
    max_age: dt.timedelta | None,
    incomplete_after: dt.timedelta,
    now: dt.datetime,
) -> GcPlan:
    plan = GcPlan("savepoints", io.url(root), io=io)
    complete: dict[str | None, list[_Found]] = {}
    for e in sorted(io.list_dir(root), key=lambda e: e.name):
        if not e.is_dir or e.is_link:
            continue
        if is_savepoint_dir(io, e.path):
            found = _open(io, e.path, plan)
            if found is not None:
                complete.setdefault(found.query_id, []).append(found)
        elif _SAVEPOINT_NAME.match(e.name):
            _consider_incomplete(io, e.path, incomplete_after, now, plan)
    for group in complete.values():
        group.sort(key=lambda f: (f.batch, f.created), reverse=True)
        for i, f in enumerate(group):
            why = _why_delete(i, f, keep_last, max_age, now)
            if why is None:
                plan.kept.append(_kept(io, f, "newest" if i == 0 else "retained"))
            else:
                _add_savepoint(io, f, why, plan)
    return plan


def _open(io: FileIO, path: str, plan: GcPlan) -> _Found | None:
    """A complete savepoint's identity; one whose ``_metadata`` does not open is never
    deleted (it may be a newer format, or damage someone must look at)."""
    try:
        m = Savepoint(io, path).metadata
        created = dt.datetime.fromisoformat(m.created_at.replace("Z", "+00:00"))
    except (StatectlError, ValueError, AttributeError) as e:
        plan.skipped.append({"path": io.url(path), "reason": f"_metadata does not open: {e}"})
        return None
    if created.tzinfo is None:
        created = created.replace(tzinfo=dt.timezone.utc)
    return _Found(path, m.query_id, m.batch_id, created)


def _why_delete(
    index: int,
    f: _Found,
    keep_last: int | None,
    max_age: dt.timedelta | None,
    now: dt.datetime,
) -> str | None:
    """Why the ``index``-th newest savepoint of its query goes (None: it stays)."""
    if index == 0:
        return None  # never the newest complete savepoint of a query
    if keep_last is not None and index >= keep_last:
        return f"beyond the newest {keep_last} of query {f.query_id}"
    if max_age is not None and now - f.created > max_age:
        return f"older than {_days(max_age)} (created {f.created.isoformat()})"
    return None


def _days(age: dt.timedelta) -> str:
    secs = int(age.total_seconds())
    return f"{secs // 86400}d" if secs % 86400 == 0 else f"{secs}s"


def _kept(io: FileIO, f: _Found, why: str) -> dict[str, Any]:
    return {"path": io.url(f.path), "batch": f.batch, "query_id": f.query_id, "why": why}


def _add_savepoint(io: FileIO, f: _Found, why: str, plan: GcPlan) -> None:
    """Through ``dispose``'s plan: what it would refuse is skipped with its reason."""
    try:
        dp = dispose_plan(io.url(f.path))
    except StatectlError as e:
        plan.skipped.append({"path": io.url(f.path), "reason": str(e)})
        return
    plan.delete.append(Deletion(io.url(f.path), dp.bytes, f"batch {f.batch}: {why}"))
    plan.savepoints.append(io.url(f.path))


def _consider_incomplete(
    io: FileIO, path: str, after: dt.timedelta, now: dt.datetime, plan: GcPlan
) -> None:
    """A savepoint directory without ``_metadata``: deleted when idle for ``after`` and made of
    nothing but what a savepoint writer writes."""
    files = list(io.walk_files(path))
    foreign = [f.path for f in files if f.is_link or not _writer_file(path, f.path)]
    if foreign:
        plan.skipped.append(
            {
                "path": io.url(path),
                "reason": f"incomplete, but holds {len(foreign)} file(s) a savepoint writer "
                f"does not write (e.g. {posixpath.relpath(sorted(foreign)[0], path)})",
            }
        )
        return
    times = [_mtime(io, f.path) for f in files] or [_mtime(io, path)]
    newest = None if None in times else max(t for t in times if t is not None)
    if newest is None or now - newest < after:
        plan.kept.append({"path": io.url(path), "why": "incomplete, possibly still being written"})
        return
    size = sum(f.size for f in files)
    plan.delete.append(
        Deletion(io.url(path), size, f"incomplete (no _metadata), unchanged for {_days(after)}")
    )
    plan.incomplete.append(path)


def _writer_file(root: str, path: str) -> bool:
    """Whether a savepoint writer writes ``path`` before ``_metadata`` (or a temporary)."""
    name = posixpath.basename(path)
    if name.startswith(".") and name.endswith(".tmp"):
        return True
    return posixpath.relpath(path, root).split("/")[0] in _WRITER_TOPS


def _mtime(io: FileIO, path: str) -> dt.datetime | None:
    """A file's modification time (UTC) as its filesystem reports it, or None."""
    try:
        info = io.fs.info(path)
    except (OSError, ValueError):
        return None
    value = info.get("mtime") or info.get("LastModified") or info.get("last_modified")
    if isinstance(value, (int, float)):
        return dt.datetime.fromtimestamp(value, dt.timezone.utc)
    if isinstance(value, dt.datetime):
        return value if value.tzinfo else value.replace(tzinfo=dt.timezone.utc)
    return None


# -- checkpoints ---------------------------------------------------------------------------
def checkpoint_plan(io: FileIO, root: str, keep_batches: int) -> GcPlan:
    """The files no restart at the latest committed batch or the ``keep_batches`` before it
    needs (see the module docstring)."""
    if keep_batches < 0:
        raise StatectlError(f"--keep-batches must be 0 or more, got {keep_batches}")
    if read_in_progress(io, root) is not None:
        raise StatectlError("is an unfinished statectl restore or migrate; refusing", io.url(root))
    ckpt = Checkpoint(io, root)
    try:
        latest = ckpt.latest_committed_batch
    except StatectlError as e:
        raise StatectlError(
            f"refusing gc of a damaged checkpoint ({e}); run statectl doctor"
        ) from None
    plan = GcPlan("checkpoint", io.url(root), io=io)
    if latest is None:
        return plan
    if ckpt.checkpoint_format_version(latest) >= 2:
        raise StatectlError(
            "checkpoint format 2 is not garbage-collected: its state files are named by the "
            "unique ids of a lineage a running query may still extend; Spark's own maintenance "
            "cleans it",
            io.url(root),
        )
    oldest = max(0, latest - keep_batches)
    plan.kept.append({"batches": f"{oldest}-{latest}", "why": "restartable batches kept"})
    _state_files(ckpt, latest, oldest, plan)
    _log_entries(ckpt, oldest, plan)
    return plan


def _state_files(ckpt: Checkpoint, latest: int, oldest: int, plan: GcPlan) -> None:
    enc = StoreEncoding.of(ckpt, latest)
    for op in ckpt.operators(latest):
        for p in range(op.num_partitions):
            for store in op.store_names:
                d = store_dir(ckpt, op.operator_id, p, store)
                if ckpt.io.exists(d):
                    _store_files(ckpt, enc, d, range(oldest + 1, latest + 2), plan)


def _store_files(ckpt: Checkpoint, enc: StoreEncoding, d: str, kept: range, plan: GcPlan) -> None:
    """One store partition: version files older than the oldest file a kept version loads,
    oldest first, then the files (SSTs) only they name, with their checksum sidecars."""
    io, backend, opts = ckpt.io, enc.store_backend, enc.read_options(None, False)
    needed: set[str] = set()
    for v in kept:
        try:
            needed.update(backend.copy_files(io, d, v, opts))
        except StatectlError as e:
            # A kept version that does not load: nothing in this store is touched.
            plan.skipped.append({"path": io.url(d), "reason": str(e)})
            return
    sizes = {f.path: f.size for f in io.list_dir(d) if not f.is_dir}
    versions = {p: _version(p) for p in sizes if backend.owns_file(posixpath.basename(p))}
    floor = min((versions[p] for p in needed if p in versions), default=kept.start)
    old = sorted((v, p) for p, v in versions.items() if v < floor and p not in needed)
    named: set[str] = set()
    for v, p in old:
        _delete_file(io, p, sizes[p], f"state version {v}: no kept batch loads it", plan)
        # A version whose own chain is broken names nothing: the others judge those files.
        with contextlib.suppress(StatectlError):
            named.update(backend.copy_files(io, d, v, opts))
    for p in sorted(named - needed - set(sizes) - {q for q in named if q.endswith(".crc")}):
        if io.exists(p):
            _delete_file(io, p, io.size(p), "named only by deleted state versions", plan)


def _version(path: str) -> int:
    return int(re.match(r"\d+", posixpath.basename(path)).group())  # type: ignore[union-attr]


def _delete_file(io: FileIO, path: str, size: int, reason: str, plan: GcPlan) -> None:
    """``path`` and the checksum sidecars Spark keeps beside it (Hadoop's and its own)."""
    parent, name = posixpath.split(path)
    plan.delete.append(Deletion(io.url(path), size, reason))
    plan.files.append(path)
    for side in (posixpath.join(parent, f".{name}.crc"), f"{path}.crc"):
        if io.exists(side):
            plan.files.append(side)


def _log_entries(ckpt: Checkpoint, oldest: int, plan: GcPlan) -> None:
    """``offsets/N`` and ``commits/N`` before ``oldest - 1`` (a restart at ``oldest`` reads
    the offsets of the batch before it)."""
    io = ckpt.io
    for log in ("offsets", "commits"):
        for f in sorted(io.list_dir(ckpt.path(log)), key=lambda f: f.name):
            if not f.is_dir and f.name.isdigit() and int(f.name) < oldest - 1:
                _delete_file(io, f.path, f.size, f"{log} entry of batch {f.name}", plan)


def run_gc(plan: GcPlan) -> dict[str, Any]:
    """Delete what ``plan`` lists: savepoints through ``dispose``, checkpoint files oldest
    first (the order the plan lists them)."""
    io = plan.io
    assert io is not None
    for url in plan.savepoints:
        dispose(url)
    for path in plan.incomplete:
        io.remove(path, recursive=True)
    for path in plan.files:
        if io.exists(path):
            io.remove(path)
    return plan.to_dict(deleted=True)


__all__ = ["Deletion", "GcPlan", "GcResult", "gc_plan", "parse_age", "run_gc"]

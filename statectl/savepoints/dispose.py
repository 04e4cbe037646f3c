"""``statectl dispose``: delete a savepoint, exactly its own files.

What it deletes is what ``_metadata`` lists, statectl's own temporary files and ``_metadata``
itself (last, once everything else is gone: what could not be deleted is reported and a retry
finds the savepoint again; a half-deleted savepoint is never "complete", readers find its
listed files missing); anything else inside (a
user's file, a nested checkpoint, a symbolic link) makes it refuse, and ``force`` deletes
around it without ever following a link or touching a nested checkpoint.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import os
import posixpath
from collections.abc import Callable
from typing import Any

from statectl.errors import StatectlError
from statectl.io import FileIO
from statectl.savepoints.format import METADATA_FILE
from statectl.savepoints.store import Savepoint
from statectl.sources.carry import carried_paths


@dataclasses.dataclass(frozen=True)
class DisposePlan:
    """What ``dispose`` deletes (exactly the savepoint's files) and what it leaves alone."""

    io: FileIO
    root: str
    delete: list[str]  # files, _metadata first (dispose deletes it last)
    keep: list[str]  # files and links that are not the savepoint's (only with force)
    bytes: int

    def to_dict(self, deleted: bool) -> dict[str, Any]:
        return {
            "path": self.io.url(self.root),
            "files": len(self.delete),
            "bytes": self.bytes,
            "kept": [self.io.url(p) for p in self.keep],
            "deleted": deleted,
        }


def _refuse_path_form(url: str) -> None:
    parts = url.replace("\\", "/").split("/")
    if ".." in parts or url.rstrip("/") in (".", "") or url.rstrip("/").endswith("/."):
        raise StatectlError(
            "name the savepoint directory by its own path, without '.' or '..'; refusing", url
        )


def _is_nested_checkpoint(io: FileIO, d: str) -> bool:
    return any(io.exists(posixpath.join(d, name)) for name in ("offsets", "commits", "state"))


def _local_entries(root: str) -> tuple[list[str], list[str], list[str]]:
    """(files, symbolic links, directories) under a local ``root``; links are never followed."""
    files: list[str] = []
    links: list[str] = []
    dirs: list[str] = []
    for d, subdirs, names in os.walk(root, followlinks=False):
        for name in list(subdirs):
            full = os.path.join(d, name)
            if os.path.islink(full):
                links.append(full)
                subdirs.remove(name)
            else:
                dirs.append(full)
        for name in names:
            full = os.path.join(d, name)
            (links if os.path.islink(full) else files).append(full)
    return files, links, dirs


def _refuse_root(io: FileIO, root: str) -> None:
    """Refuse a root that is no savepoint directory to delete: a link, the working directory
    or one of its parents, a bucket, a missing directory, a Spark checkpoint."""
    if io.is_local:
        if os.path.islink(root):
            raise StatectlError(
                "is a symbolic link; dispose the savepoint by its real path", io.url(root)
            )
        real = os.path.realpath(root)
        cwd = os.path.realpath(os.getcwd())
        if real == "/" or cwd == real or cwd.startswith(real.rstrip("/") + "/"):
            raise StatectlError(
                "is the current directory or contains it; run dispose from outside it",
                io.url(root),
            )
    elif "/" not in root.strip("/"):
        raise StatectlError("is a bucket root, not a savepoint directory; refusing", io.url(root))
    if not io.is_dir(root):
        raise StatectlError("no such directory", io.url(root))
    if _is_nested_checkpoint(io, root):
        raise StatectlError(
            "is a Spark checkpoint, not a savepoint: refusing to delete it", io.url(root)
        )


def _bookkeeping(p: str, ours: set[str]) -> bool:
    """An unfinished atomic write, or a Hadoop checksum of one of the savepoint's files."""
    parent, name = posixpath.split(p)
    if name.startswith(".") and name.endswith(".tmp"):
        return True  # an atomic write that never finished
    return (
        name.startswith(".")
        and name.endswith(".crc")
        and posixpath.join(parent, name[1:-4]) in ours
    )


def _split(io: FileIO, root: str, ours: set[str]) -> tuple[list[str], list[str]]:
    """(the savepoint's files to delete, everything else under ``root``)."""
    if io.is_local:
        files, links, dirs = _local_entries(root)
    else:
        files, links, dirs = [f.path for f in io.walk_files(root)], [], []
    # A nested checkpoint (e.g. a restore into SP/live) is never part of the savepoint.
    nested = [d for d in dirs if _is_nested_checkpoint(io, d)]

    def in_nested(p: str) -> bool:
        return any(p == d or p.startswith(d + "/") for d in nested)

    delete, foreign = [], []
    for p in files:
        if (p in ours or _bookkeeping(p, ours)) and not in_nested(p):
            delete.append(p)
        else:
            foreign.append(p)
    return delete, foreign + links


def _size(io: FileIO, root: str, paths: list[str]) -> int:
    if io.is_local:
        return sum(os.lstat(p).st_size for p in paths)
    sizes = {f.path: f.size for f in io.walk_files(root)}
    return sum(sizes.get(p, 0) for p in paths)


def _ours(sp: Savepoint, root: str) -> set[str]:
    """The files ``_metadata`` lists: data files, a native savepoint's copied logs and the
    sources' carried files (statectl/sources)."""
    m = sp.metadata
    listed = [f.path for op in m.operators for t in op.tables for f in t.files]
    listed += [f.path for f in m.native_logs or []]
    listed += carried_paths(m.sources)
    return {posixpath.join(root, p) for p in listed}


def dispose_plan(url: str, *, force: bool = False) -> DisposePlan:
    """What ``dispose`` would delete: exactly the files ``_metadata`` lists, ``_metadata`` and
    statectl's own temporary files. Anything else inside (a user's file, a nested checkpoint,
    a symbolic link) makes it refuse; ``force`` deletes the savepoint's files around them and
    still never follows a link or deletes a nested checkpoint."""
    _refuse_path_form(url)
    io, root = FileIO.for_url(url)
    _refuse_root(io, root)
    sp = Savepoint(io, root)  # raises unless _metadata says this is a statectl savepoint
    meta_path = posixpath.join(root, METADATA_FILE)
    ours = _ours(sp, root) | {meta_path}
    delete, foreign = _split(io, root, ours)
    if foreign and not force:
        sample = ", ".join(posixpath.relpath(p, root) for p in sorted(foreign)[:3])
        more = f" and {len(foreign) - 3} more" if len(foreign) > 3 else ""
        raise StatectlError(
            f"contains {len(foreign)} file(s) that are not part of the savepoint ({sample}{more}); "
            "refusing to delete it. Move them out, or pass --force to delete only the "
            "savepoint's own files",
            io.url(root),
        )
    delete.sort(key=lambda p: p != meta_path)  # listed first; dispose() deletes it last
    return DisposePlan(io, root, delete, sorted(foreign), _size(io, root, delete))


def dispose(url: str, *, force: bool = False) -> dict[str, Any]:
    """Delete the savepoint's files, then its directories, and ``_metadata`` only once
    everything else of it is gone: whatever cannot be deleted is reported (exit 2) and
    ``_metadata`` stays, so ``dispose`` can simply be run again."""
    plan = dispose_plan(url, force=force)
    io = plan.io
    meta_path = posixpath.join(plan.root, METADATA_FILE)
    failed: dict[str, str] = {}
    for p in plan.delete:
        if p != meta_path:
            _attempt(functools.partial(io.remove, p), p, failed)
    if io.is_local:
        _remove_local_dirs(plan, force, failed)
    else:
        for d in sorted({posixpath.dirname(p) for p in plan.delete}, key=len, reverse=True):
            if d != plan.root and io.exists(d) and not io.list_dir(d):
                _attempt(functools.partial(io.remove, d, recursive=True), d, failed)
    for p in _left_over(plan, meta_path):
        if p not in failed and not _holds_kept(p, list(failed)):  # not a failure's parent
            failed[p] = "still there"
    if failed:
        raise _not_deleted(plan, failed)
    io.remove(meta_path)  # last: until now a retry found the savepoint whole enough to dispose
    _remove_root(plan)
    return plan.to_dict(deleted=True)


def _remove_root(plan: DisposePlan) -> None:
    """The savepoint's directory, once empty (with force it may keep files that stay)."""
    io = plan.io
    if not io.is_local:
        if not io.list_dir(plan.root) and io.exists(plan.root):
            io.remove(plan.root, recursive=True)
        return
    with contextlib.suppress(OSError):  # not empty: files kept with force stay
        os.rmdir(plan.root)
    if os.path.lexists(plan.root) and not plan.keep:
        raise StatectlError(
            "deleted the savepoint's files, but not its (empty) directory; remove it with rmdir",
            io.url(plan.root),
        )


def _attempt(action: Callable[[], object], path: str, failed: dict[str, str]) -> None:
    """Run one deletion; a failure is recorded with its reason, and the rest goes on."""
    try:
        action()
    except (OSError, StatectlError) as e:
        reason = e.strerror if isinstance(e, OSError) and e.strerror else str(e)
        failed[path] = reason


def _not_deleted(plan: DisposePlan, failed: dict[str, str]) -> StatectlError:
    items = sorted(failed.items(), key=lambda i: (i[1] == "still there", i[0]))  # causes first
    sample = ", ".join(f"{posixpath.relpath(p, plan.root)} ({why})" for p, why in items[:3])
    more = f" and {len(items) - 3} more" if len(items) > 3 else ""
    return StatectlError(
        f"could not delete {len(items)} of its entries: {sample}{more}; _metadata is kept",
        plan.io.url(plan.root),
        "make them deletable and run dispose again",
    )


def _holds_kept(d: str, keep: list[str]) -> bool:
    return any(k.startswith(d.rstrip("/") + "/") for k in keep)


def _left_over(plan: DisposePlan, meta_path: str) -> list[str]:
    """What is still under the root besides ``_metadata``, the entries kept with force and the
    directories holding them."""
    keep = set(plan.keep)
    if plan.io.is_local:
        files, links, dirs = _local_entries(plan.root)
        dirs = [d for d in dirs if not _holds_kept(d, plan.keep)]
    else:
        files, links, dirs = [f.path for f in plan.io.walk_files(plan.root)], [], []
    return [p for p in [*files, *links, *dirs] if p != meta_path and p not in keep]


def _remove_local_dirs(plan: DisposePlan, force: bool, failed: dict[str, str]) -> None:
    """Remove the directories the savepoint's files left empty, deepest first (not the root,
    which holds ``_metadata``); links kept with force are removed as links, never followed.
    A directory that still holds what force keeps is not a failure."""
    for link in plan.keep:
        if os.path.islink(link) and force:
            _attempt(functools.partial(os.unlink, link), link, failed)
    _, _, dirs = _local_entries(plan.root)
    for d in sorted(dirs, key=len, reverse=True):
        if not _holds_kept(d, [*plan.keep, *failed]):  # a failure inside is reported already
            _attempt(functools.partial(os.rmdir, d), d, failed)

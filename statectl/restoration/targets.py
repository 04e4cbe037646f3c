"""The target directory of a restore: whether it may be written (not inside the savepoint,
its source checkpoint or any other checkpoint or savepoint; empty, or an interrupted restore
to overwrite), the one guard every written path goes through, and marking it in progress
(:mod:`statectl.in_progress`) before anything else is written there."""

from __future__ import annotations

import os
import posixpath
from typing import Any

from statectl.errors import StatectlError
from statectl.in_progress import describe_in_progress, marker_bytes, read_in_progress
from statectl.io import FileIO
from statectl.savepoints.store import Savepoint, is_savepoint_dir


def under(root: str, *parts: str) -> str:
    """A path of the target: every path a restore writes goes through here and must stay
    inside the target (names were validated when planning; this is the last guard)."""
    path = posixpath.join(root, *parts)
    norm, base = posixpath.normpath(path), posixpath.normpath(root)
    if not (norm == base or norm.startswith(base.rstrip("/") + "/")) or "/../" in f"/{path}/":
        raise StatectlError("refusing to write outside the target", path)
    return path


def _local_real(io: FileIO, path: str) -> str:
    """A path to compare containment with: symlinks resolved on the local filesystem."""
    if io.protocol == "file":
        return os.path.realpath(path)
    return posixpath.normpath(path)


def _inside(io: FileIO, path: str, parent: str) -> bool:
    a, b = _local_real(io, path), _local_real(io, parent)
    return a == b or a.startswith(b.rstrip("/") + "/")


def _is_checkpoint(io: FileIO, path: str) -> bool:
    return io.exists(posixpath.join(path, "offsets")) and io.exists(
        posixpath.join(path, "metadata")
    )


def _enclosing_state_dir(io: FileIO, root: str, levels: int = 8) -> tuple[str, str] | None:
    """The Spark checkpoint or statectl savepoint a target would be written into, if any
    (whatever the savepoint records: writing inside either would corrupt or be deleted with
    it)."""
    path = posixpath.dirname(root.rstrip("/"))
    for _ in range(levels):
        if not path or path == "/":
            return None
        if is_savepoint_dir(io, path):
            return "savepoint", path
        if _is_checkpoint(io, path):
            return "Spark checkpoint", path
        parent = posixpath.dirname(path)
        if parent == path:
            return None
        path = parent
    return None


def _containment_problems(
    io: FileIO, root: str, sources: list[tuple[str, FileIO, str]]
) -> list[str]:
    """The target inside one of ``sources`` or inside any checkpoint or savepoint."""
    url = io.url(root)
    for what, src_io, src in sources:
        if src_io.protocol == io.protocol and _inside(io, root, src):
            return [
                f"{url}: the target is inside the {what} {src_io.url(src)}; choose a "
                "directory outside it"
            ]
    enclosing = _enclosing_state_dir(io, root)
    if enclosing is not None:
        return [
            f"{url}: the target is inside the {enclosing[0]} {io.url(enclosing[1])}; choose a "
            "directory outside it"
        ]
    return []


def _existing_kind(io: FileIO, root: str) -> str:
    if io.exists(under(root, "offsets")) or io.exists(under(root, "commits")):
        return "a Spark checkpoint"
    if is_savepoint_dir(io, root):
        return "a statectl savepoint"
    return "not empty"


def target_problems(
    io: FileIO, root: str, overwrite: bool, sources: list[tuple[str, FileIO, str]]
) -> tuple[list[str], dict[str, Any] | None]:
    """Why ``root`` cannot be written (empty list: it can), and the interrupted restore's
    marker if it is one. ``sources`` are (what, io, path) the target must not be inside."""
    url = io.url(root)
    inside = _containment_problems(io, root, sources)
    if inside:
        return inside, None
    if not io.exists(root):
        return [], None
    if not io.is_dir(root):
        return [f"{url}: the target exists and is a file; choose a new directory"], None
    if not io.list_dir(root):
        return [], None
    marker = read_in_progress(io, root)
    if marker is not None:
        if overwrite:
            return [], marker
        return [
            f"{url}: the target is an unfinished restore ({describe_in_progress(marker)}); "
            "pass --overwrite to replace it, once no statectl is writing it"
        ], marker
    return [
        f"{url}: the target exists and is {_existing_kind(io, root)}; refusing to overwrite it "
        "(--overwrite replaces only an interrupted statectl restore); choose a new directory"
    ], None


def begin_target(
    io: FileIO, root: str, overwrite: bool, command: str, source: str, target: str
) -> None:
    """Mark the target in progress before anything else is written there. With --overwrite,
    first clear an interrupted restore (planning made sure that is all the target is)."""
    if overwrite and io.exists(root) and io.list_dir(root):
        marker = read_in_progress(io, root)
        if marker is None:  # re-checked here: never delete anything but an unfinished restore
            raise StatectlError("--overwrite replaces only an interrupted statectl restore", root)
        # The marker goes last: killed mid-way, what is left is still an overwritable restore.
        for entry in io.list_dir(root):
            if entry.name != "metadata":
                io.remove(entry.path, recursive=entry.is_dir and not entry.is_link)
        io.remove(root, recursive=True)
    io.makedirs(root)
    io.write_atomic(under(root, "metadata"), marker_bytes(command, source, target), overwrite=True)


def open_savepoint(url: str) -> Savepoint:
    """The savepoint to restore; a Spark checkpoint given instead is named as such."""
    io, root = FileIO.for_url(url)
    if not is_savepoint_dir(io, root) and (
        io.exists(posixpath.join(root, "offsets")) or io.exists(posixpath.join(root, "commits"))
    ):
        raise StatectlError(
            "is a Spark checkpoint, not a savepoint; use `statectl migrate CHECKPOINT TARGET` "
            "(it takes the savepoint and restores it in one step)",
            io.url(root),
        )
    return Savepoint(io, root)

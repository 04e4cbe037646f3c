"""The marker of an unfinished restore or migrate.

A restore writes the target's ``metadata`` first with this marker and replaces it with the real
``{"id": ...}`` last. Spark reads ``metadata`` before anything else when a query starts
(``StreamMetadata.read``) and fails on the marker's first token, so a query started on an
interrupted restore stops at once (naming ``STATECTL_RESTORE_IN_PROGRESS``) instead of starting
from scratch; ``list`` and ``inspect`` report it; a re-run with ``--overwrite`` replaces it.

This module also owns what a failed or interrupted run leaves: a restore that fails takes back
the target it created (:func:`discard_unfinished`), and the command line names the targets an
interrupted run left marked (:func:`marked_targets`).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import os
import posixpath
import re
import socket
from typing import Any

from statectl.errors import StatectlError
from statectl.io import FileIO

IN_PROGRESS_TOKEN = "STATECTL_RESTORE_IN_PROGRESS"

# Targets this process has marked (command, target URL), in order: when a run is interrupted
# the command line names those still marked and how to redo them.
_MARKED: list[tuple[str, str]] = []

# FileIO.write_atomic's temporary name for the marker itself: a restore killed while writing the
# marker leaves a directory holding only this.
_MARKER_TEMP = re.compile(
    r"\.metadata\.[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\.tmp"
)


def read_in_progress(io: FileIO, root: str) -> dict[str, Any] | None:
    """What an unfinished statectl restore's marker says, or None if ``root`` is not one."""
    p = posixpath.join(root, "metadata")
    try:
        if not io.exists(p):
            return {"before_marker": True} if _only_marker_temps(io, root) else None
        if io.is_dir(p) or io.size(p) > 65536:
            return None
        text = io.read_bytes(p).decode("utf-8", "replace")
    except (OSError, StatectlError):
        return None
    head, _, rest = text.partition("\n")
    if head.strip() != IN_PROGRESS_TOKEN:
        return None
    try:
        info = json.loads(rest)
    except json.JSONDecodeError:
        info = {}
    return info if isinstance(info, dict) else {}


def _only_marker_temps(io: FileIO, root: str) -> bool:
    """``root`` holds nothing but temporaries of the marker (killed before it was renamed)."""
    entries = io.list_dir(root)
    return bool(entries) and all(
        not e.is_dir and not e.is_link and _MARKER_TEMP.fullmatch(e.name) for e in entries
    )


def describe_in_progress(info: dict[str, Any]) -> str:
    what = info.get("command", "restore")
    if info.get("before_marker"):
        return "a statectl restore or migrate stopped while marking the target; it wrote nothing"
    src = f" from {info['source']}" if info.get("source") else ""
    when = f", started {info['started_at']}" if info.get("started_at") else ""
    who = f" by pid {info['pid']} on {info['host']}" if info.get("pid") else ""
    return f"statectl {what} in progress or interrupted{src}{when}{who}"


def marker_bytes(command: str, source: str, target: str) -> bytes:
    """The marker a restore (``command``: restore or migrate) of ``source`` into ``target``
    writes first: who writes it, from where, since when. The target is remembered for
    :func:`marked_targets`."""
    if (command, target) not in _MARKED:
        _MARKED.append((command, target))
    info = {
        "command": command,
        "source": source,
        "target": target,
        "started_at": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "pid": os.getpid(),
        "host": socket.gethostname(),
    }
    return f"{IN_PROGRESS_TOKEN}\n{json.dumps(info)}".encode()


def marked_targets() -> list[tuple[str, str]]:
    """(command, target URL) of the targets this process marked that still hold the marker:
    what an interrupted restore or migrate leaves behind."""
    out = []
    for command, url in _MARKED:
        with contextlib.suppress(Exception):  # only for a message: never fatal
            io, root = FileIO.for_url(url)
            if read_in_progress(io, root) is not None:
                out.append((command, url))
    return out


def target_was_empty(io: FileIO, root: str) -> bool:
    """Nothing is at ``root`` yet (absent, or an empty directory): a run that fails there must
    leave it that way."""
    try:
        return not io.exists(root) or (io.is_dir(root) and not io.list_dir(root))
    except (OSError, StatectlError):
        return False


def discard_unfinished(io: FileIO, root: str, existed: bool) -> None:
    """Take back what a failed restore wrote at ``root``, where nothing was before: only a
    target holding the marker (or nothing at all) is touched, the marker goes last (stopped
    half-way, what is left is still an overwritable restore), and a directory that existed
    (empty) is kept. Failures to clean are ignored: the marker then stays, and says so."""
    with contextlib.suppress(OSError, StatectlError):
        if not io.exists(root):
            return
        entries = io.list_dir(root)
        if entries and read_in_progress(io, root) is None:
            return  # not ours to delete
        for entry in entries:
            if entry.name != "metadata":
                io.remove(entry.path, recursive=entry.is_dir and not entry.is_link)
        if existed:
            if io.exists(posixpath.join(root, "metadata")):
                io.remove(posixpath.join(root, "metadata"))
        else:
            io.remove(root, recursive=True)

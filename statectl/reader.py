"""Opening a checkpoint or a savepoint, and naming the table a ``statestore`` selection reads.

``export`` and the API's ``read_state`` both open through :func:`open_source` and read through
the processor's handle (``statectl.open(path).read(...)``): one reader.
"""

from __future__ import annotations

import os
from typing import Any

from statectl.checkpoint.model import Checkpoint
from statectl.errors import StatectlError
from statectl.io import FileIO
from statectl.savepoints.store import Savepoint, is_savepoint_dir


def as_url(path: Any) -> str:
    """A path argument as a string: ``str``, ``os.PathLike`` (e.g. a ``SavepointResult``)."""
    return os.fspath(path) if hasattr(path, "__fspath__") else str(path)


def open_source(path: Any, *, verify: bool = True) -> Checkpoint | Savepoint:
    """A savepoint if ``path`` holds a statectl ``_metadata``, else a Spark checkpoint
    (``verify=False``: skip checksums over its state files and the key placement check)."""
    io, root = FileIO.for_url(as_url(path))
    if is_savepoint_dir(io, root):
        return Savepoint(io, root)
    return Checkpoint(io, root, verify=verify)


def selection_table(
    store: str | None, join_side: str | None, state_var: str | None, timers: bool
) -> str | None:
    """The table name (store, state variable or ``$timers``; None: the default store or a
    join side) a ``statestore`` selection reads, after checking that it names one thing."""
    if join_side not in (None, "left", "right"):
        raise StatectlError(f"--join-side must be left or right, not {join_side!r}")
    if sum(x is not None for x in (store, join_side, state_var)) + bool(timers) > 1:
        raise StatectlError("give at most one of --store, --join-side, --state-var, --timers")
    return state_var or store or ("$timers" if timers else None)

"""Phase timers: CPU and wall time per named phase of a command, for ``bench/scale.py``.

Off (one dictionary look-up per phase) unless ``$STATECTL_PHASES`` names a file. Then every
process of the command (the CLI and its fork workers) appends the time it spent in each phase
since its last :func:`flush` to that file, one JSON line per flush; the engine flushes after
every task, in the worker that ran it. Phases are exclusive: entering a phase pauses the one
around it, so the per-phase figures add up to the time inside phases and nothing is counted
twice. CPU is ``time.process_time`` (user + system of the whole process, Arrow's threads
included), wall is ``time.perf_counter``.

Sits in the codecs layer, the lowest that times anything, so every layer above can name its
phases ("read+replay", "decode", "place", "encode", "sort", "SST write", "upload", ...).
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
import time
from collections.abc import Iterable, Iterator
from typing import TypeVar

T = TypeVar("T")

ENV = "STATECTL_PHASES"
_totals: dict[str, list[float]] = {}  # phase -> [cpu seconds, wall seconds, entries]
_local = threading.local()  # .stack: [[phase, cpu at (re)start, wall at (re)start], ...]


def enabled() -> bool:
    return bool(os.environ.get(ENV))


def _charge(frame: list[float | str], cpu: float, wall: float) -> None:
    name = str(frame[0])
    t = _totals.setdefault(name, [0.0, 0.0, 0.0])
    t[0] += cpu - float(frame[1])
    t[1] += wall - float(frame[2])


@contextlib.contextmanager
def phase(name: str) -> Iterator[None]:
    """Time the block as ``name`` (when enabled), pausing any enclosing phase meanwhile."""
    if not os.environ.get(ENV):
        yield
        return
    cpu, wall = time.process_time(), time.perf_counter()
    stack = _frames()
    if stack:
        _charge(stack[-1], cpu, wall)
    stack.append([name, cpu, wall])
    _totals.setdefault(name, [0.0, 0.0, 0.0])[2] += 1
    try:
        yield
    finally:
        cpu, wall = time.process_time(), time.perf_counter()
        _charge(stack.pop(), cpu, wall)
        if stack:
            stack[-1][1], stack[-1][2] = cpu, wall


def timed(items: Iterable[T], name: str) -> Iterator[T]:
    """``items``, the time spent producing each one charged to ``name``."""
    it = iter(items)
    while True:
        with phase(name):
            item = next(it, _END)
        if item is _END:
            return
        yield item  # type: ignore[misc]
        del item  # not held while the next one is produced (a chunk of a partition, often)


_END: object = object()


def _frames() -> list[list[float | str]]:
    if not hasattr(_local, "stack"):
        _local.stack = []
    stack: list[list[float | str]] = _local.stack
    return stack


def _forget() -> None:
    """In a forked child: the parent's open phases and unflushed totals are the parent's."""
    _totals.clear()
    _frames().clear()


os.register_at_fork(after_in_child=_forget)


def flush() -> None:
    """Append this process's totals since the last flush to ``$STATECTL_PHASES``."""
    path = os.environ.get(ENV)
    if not path or not _totals:
        return
    line = json.dumps({"pid": os.getpid(), "phases": _totals})
    _totals.clear()
    with open(path, "a", encoding="utf-8") as f:  # one short write: lines do not interleave
        f.write(line + "\n")

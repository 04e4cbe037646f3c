"""Worker processes that never outlive statectl, and signals that run clean-up code.

A killed parent (even ``kill -9``) takes its workers with it: each worker asks Linux to send it
SIGKILL when its parent dies (``prctl(PR_SET_PDEATHSIG)``), so no orphan keeps writing files.
SIGTERM and SIGHUP raise ``SystemExit`` in the main thread, so every ``finally`` that removes
temporary files runs, as it does for Ctrl-C (``KeyboardInterrupt``).
"""

from __future__ import annotations

import concurrent.futures as cf
import contextlib
import ctypes
import multiprocessing as mp
import os
import signal
import sys
from collections.abc import Callable, Iterator
from typing import Any

_PR_SET_PDEATHSIG = 1


def die_with_parent(parent_pid: int) -> None:
    """Process-pool initializer: SIGKILL this worker when the parent process dies."""
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent_pid:  # the parent died before prctl took effect
        os._exit(1)


def run_in_pool(fn: Callable[[Any], Any], jobs: list[Any], workers: int) -> Iterator[Any]:
    """``fn(job)`` for each job in a fork process pool, results in job order.

    On any exception (Ctrl-C and SIGTERM included) the workers are killed and reaped before it
    propagates: nothing keeps writing while the caller removes its partial output.
    """
    with pool_futures(fn, jobs, workers) as futures:
        for fut in futures:
            yield fut.result()


@contextlib.contextmanager
def pool_futures(
    fn: Callable[[Any], Any], jobs: list[Any], workers: int
) -> Iterator[list[cf.Future[Any]]]:
    """``fn(job)`` for each job submitted to a fork process pool: the futures, in job order,
    for a caller that uses what a task leaves behind before the task ends (export reads a
    partition's chunk files while they are written).

    Every worker is forked here, before the block runs (in the thread that enters it). On any
    exception in the block (Ctrl-C and SIGTERM included) the workers are killed and reaped
    before it propagates; on a normal exit the pool is shut down, waiting for its tasks.
    """
    pool = cf.ProcessPoolExecutor(
        workers,
        mp_context=mp.get_context("fork"),
        initializer=die_with_parent,
        initargs=(os.getpid(),),
    )
    try:
        yield [pool.submit(fn, job) for job in jobs]
    except BaseException:
        procs = list((getattr(pool, "_processes", None) or {}).values())
        for p in procs:
            with contextlib.suppress(Exception):
                p.kill()
        for p in procs:
            with contextlib.suppress(Exception):
                p.join(5)
        pool.shutdown(wait=False, cancel_futures=True)
        raise
    pool.shutdown()


@contextlib.contextmanager
def exit_on_termination() -> Iterator[None]:
    """SIGTERM/SIGHUP become ``SystemExit(128 + signal)`` while the block runs."""

    def handler(signum: int, _frame: object) -> None:
        raise SystemExit(128 + signum)

    previous = {}
    for sig in (signal.SIGTERM, signal.SIGHUP):
        with contextlib.suppress(ValueError, OSError):  # not the main thread
            previous[sig] = signal.signal(sig, handler)
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)

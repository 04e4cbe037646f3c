"""Peak memory of a command's whole process tree (Linux; issue 11).

    python bench/treemem.py [--interval 0.025] [--max-share 0.1] [--devnull] -- CMD [ARGS...]

runs CMD and prints one JSON object on stdout's last line (figures in bytes, ``seconds`` the
command's wall time)::

    {"seconds": 4.1, "returncode": 0, "tree_rss": ..., "tree_pss": ..., "single_rss": ...,
     "max_rss_waited": ..., "processes": 3, "samples": 160, "sample_cost": 0.0011,
     "sample_every": 0.026, "at_peak": [[pid, "java", rss, pss], ...], ...}

``ru_maxrss`` (what ``resource.getrusage`` reports) is the high-water mark of the LARGEST
SINGLE waited-for process. statectl runs its partition tasks in worker processes and Spark runs
a JVM (and executor JVMs under ``local-cluster``), so the memory a machine must hold for a run
is the sum over the processes alive at the same moment. No kernel counter keeps that sum's
high-water mark, so it is sampled: every ``interval`` seconds (default 25 ms; less often when a
sample would take more than ``max_share`` of one core, 10%: a JVM's ``smaps_rollup`` costs ~3 ms
of CPU, so Spark trees are sampled about every 100 ms) the sampler reads ``/proc/*/stat``
(parent links and RSS), finds CMD's descendants and sums

* ``tree_rss``: their RSS. Pages shared after ``fork`` (the interpreter, imported modules,
  anything the parent held when the pool forked) and shared libraries count once per process:
  an upper bound.
* ``tree_pss``: their PSS from ``/proc/PID/smaps_rollup`` (each shared page split between the
  processes mapping it), the fairer sum; ``null`` when some tree process's file is unreadable
  (another user's process). Shared-library pages are split with processes outside the tree too,
  so PSS slightly undercounts what the tree alone would need.

and keeps the peak of each sum over the samples, beside ``single_rss`` (the peak of the largest
single process, comparable with ``ru_maxrss``), ``max_rss_waited`` (``ru_maxrss`` of this
sampler's waited-for children, exact but single-process: CLI only) and ``processes`` (the most
alive at once), and ``at_peak``: each process (pid, name, RSS, PSS) in the sample of the
largest tree RSS.

A process created with ``CLONE_VM`` (``vfork``, ``posix_spawn``: a JVM starting a command,
until the command execs) shares its parent's address space and reports the parent's RSS and PSS
whole; the sums count that memory once (``kcmp(2)`` tells; x86_64 and aarch64).

Sampling misses a peak shorter than the interval: a run's peak held for less than the interval
is underestimated. Processes that appear and exit between two samples are never seen; one that
exits between listing ``/proc`` and reading its files is skipped (its memory is freed).

A process that outlives its parent is reparented to the nearest "child subreaper": the sampler
makes itself one while CMD runs, so orphans (workers killed by ``PR_SET_PDEATHSIG`` once the
parent exits, a JVM still shutting down after its Python driver) stay in the tree and are
reaped. After CMD exits the sampler goes on for up to ``linger`` seconds while such orphans are
alive (their memory is still in use); ``seconds`` is CMD's own wall time.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import json
import os
import platform
import resource
import select
import subprocess
import sys
import time
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

_PAGE = os.sysconf("SC_PAGE_SIZE")
_PR_SET_CHILD_SUBREAPER = 36
_PR_GET_CHILD_SUBREAPER = 37


@dataclass
class TreePeak:
    """Peaks over the samples of one run (bytes)."""

    seconds: float  # CMD's wall time
    returncode: int
    tree_rss: int  # peak of the summed RSS of the tree
    tree_pss: int | None  # peak of the summed PSS; None when smaps_rollup was unreadable
    single_rss: int  # peak RSS of the largest single process
    processes: int  # most processes alive in one sample
    samples: int
    sample_cost: float  # mean CPU seconds one sample took (the sampler's own)
    sample_every: float  # mean seconds between samples (longer than `interval` if costly)
    lingering: list[int] = field(default_factory=list)  # orphans still alive after `linger`
    max_rss_waited: int | None = None  # ru_maxrss of the waited-for children (CLI only)
    # CPU seconds (user, system) of the waited-for tree (CLI only): processes that were
    # reaped, which is every statectl worker (its pool joins them) but not an orphaned JVM.
    cpu_user: float | None = None
    cpu_sys: float | None = None
    # (pid, command name, RSS, PSS) of each process in the sample with the largest tree RSS:
    # which processes the peak is made of.
    at_peak: list[tuple[int, str, int, int | None]] = field(default_factory=list)


@dataclass
class _Sample:
    rss: int
    pss: int | None
    single: int
    processes: int
    each: list[tuple[int, str, int, int | None]] = field(default_factory=list)


_Procs = dict[int, tuple[int, int, bytes, str, int]]


def _scan() -> _Procs:
    """pid -> (ppid, RSS bytes, state, comm, vsize) of every process (threads not listed)."""
    out: _Procs = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                data = f.read()
        except OSError:  # exited since listdir
            continue
        # comm (field 2) may hold spaces and parentheses: split after its last ")".
        rest = data[data.rfind(b")") + 2 :].split()
        if len(rest) < 22:
            continue
        # rest[0] is field 3 (state), rest[1] field 4 (ppid), rest[20] field 23 (vsize),
        # rest[21] field 24 (rss in pages).
        comm = data[data.find(b"(") + 1 : data.rfind(b")")].decode(errors="replace")
        out[int(name)] = (int(rest[1]), int(rest[21]) * _PAGE, rest[0], comm, int(rest[20]))
    return out


def _rollup(pid: int) -> tuple[int, int] | None:
    """(RSS, PSS) bytes from smaps_rollup; None when unreadable. Raises ProcessLookupError when
    the process is gone."""
    try:
        with open(f"/proc/{pid}/smaps_rollup", "rb") as f:
            data = f.read()
    except (FileNotFoundError, ProcessLookupError) as e:
        raise ProcessLookupError(pid) from e
    except OSError:  # EACCES: another user's process
        return None
    rss = pss = 0
    for line in data.splitlines():
        if line.startswith(b"Rss:"):
            rss = int(line.split()[1]) * 1024
        elif line.startswith(b"Pss:"):
            pss = int(line.split()[1]) * 1024
    return rss, pss  # a zombie's file is empty: (0, 0)


def _descendants(roots: Iterable[int], procs: _Procs) -> list[int]:
    children: dict[int, list[int]] = {}
    for pid, (ppid, *_) in procs.items():
        children.setdefault(ppid, []).append(pid)
    out: list[int] = []
    todo = [r for r in roots if r in procs]
    seen = set(todo)
    while todo:
        pid = todo.pop()
        out.append(pid)
        for c in children.get(pid, ()):
            if c not in seen:
                seen.add(c)
                todo.append(c)
    return out


_SYS_KCMP = {"x86_64": 312, "aarch64": 272}.get(platform.machine())
_KCMP_VM = 1
_libc: Any = None


def _same_vm(a: int, b: int) -> bool:
    """Whether processes a and b share one address space (``kcmp(2)``; False if unsupported)."""
    global _libc
    if _SYS_KCMP is None:
        return False
    if _libc is None:
        _libc = ctypes.CDLL(None, use_errno=True)
    return _libc.syscall(_SYS_KCMP, a, b, _KCMP_VM, 0, 0) == 0


def _shared_vm(pids: list[int], procs: _Procs) -> dict[int, int]:
    """pid -> the tree process whose address space it shares, for processes created with
    ``CLONE_VM`` (``vfork``, ``posix_spawn``: a JVM starting a command, until it execs).

    Their RSS and PSS are the other's, whole: counted twice, a JVM's heap doubles the sum. Only
    processes of equal virtual size can share one (the size is the address space's)."""
    by_size: dict[int, list[int]] = {}
    for pid in pids:
        by_size.setdefault(procs[pid][4], []).append(pid)
    out: dict[int, int] = {}
    for size, group in by_size.items():
        if size == 0:  # zombies: no address space
            continue
        for i, pid in enumerate(group[1:], 1):
            for other in group[:i]:
                if other not in out and _same_vm(pid, other):
                    out[pid] = other
                    break
    return out


def _sample(pids: list[int], procs: _Procs, pss: bool) -> _Sample:
    rss_sum = single = alive = 0
    pss_sum: int | None = 0 if pss else None
    each: list[tuple[int, str, int, int | None]] = []
    shared = _shared_vm(pids, procs)
    for pid in pids:
        if pid in shared:  # its memory is counted with the process it shares it with
            alive += 1
            each.append((pid, f"{procs[pid][3]} (memory of {shared[pid]})", 0, 0))
            continue
        rss = procs[pid][1]
        rolled = None
        if pss:
            try:
                rolled = _rollup(pid)
            except ProcessLookupError:
                continue  # exited since the scan: its memory is freed, leave it out of both sums
            if rolled is None:
                pss_sum = None
                pss = False  # one unreadable process makes the PSS sum meaningless
            else:
                # smaps_rollup's RSS is exact where stat's per-thread counters may lag.
                rss = rolled[0]
                if pss_sum is not None:
                    pss_sum += rolled[1]
        each.append((pid, procs[pid][3], rss, rolled[1] if rolled else None))
        rss_sum += rss
        single = max(single, rss)
        alive += 1
    return _Sample(rss_sum, pss_sum, single, alive, each)


def _set_subreaper(on: int) -> int | None:
    """Make this process a child subreaper (Linux >= 3.4); the previous setting, None if
    unsupported."""
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        old = ctypes.c_int(0)
        if libc.prctl(_PR_GET_CHILD_SUBREAPER, ctypes.byref(old), 0, 0, 0) != 0:
            return None
        if libc.prctl(_PR_SET_CHILD_SUBREAPER, on, 0, 0, 0) != 0:
            return None
        return old.value
    return None


def run(
    cmd: Sequence[str],
    interval: float = 0.025,
    max_share: float = 0.1,
    linger: float = 10.0,
    pss: bool = True,
    **popen: Any,
) -> TreePeak:
    """Run ``cmd`` (``subprocess.Popen(cmd, **popen)``) to completion, sampling its tree.

    While it runs this process is a child subreaper (restored afterwards): processes of the
    caller's that start meanwhile would be counted too, so call it from a process that does
    nothing else (``main`` below, as ``bench/scale.py`` does)."""
    me = os.getpid()
    before = {pid for pid, (ppid, *_) in _scan().items() if ppid == me}
    old = _set_subreaper(1)
    peak = _Sample(0, 0 if pss else None, 0, 0)
    samples = 0
    cost = 0.0
    seconds: float | None = None
    adopted: set[int] = set()
    try:
        t0 = time.perf_counter()
        proc = subprocess.Popen(list(cmd), **popen)
        pidfd = os.pidfd_open(proc.pid)
        try:
            end_linger = None
            while True:
                s0 = time.thread_time()
                procs = _scan()
                # Orphans reparented to this subreaper (not children it had before) are the
                # tree's too; zombies among them are reaped so they do not pile up.
                orphans = [
                    p
                    for p, (ppid, *_) in procs.items()
                    if ppid == me and p != proc.pid and p not in before
                ]
                for p in orphans:
                    if procs[p][2] == b"Z":
                        with contextlib.suppress(ChildProcessError):
                            os.waitpid(p, os.WNOHANG)
                live_orphans = [p for p in orphans if procs[p][2] != b"Z"]
                adopted.update(live_orphans)
                s = _sample(_descendants([proc.pid, *live_orphans], procs), procs, pss)
                samples += 1
                if s.rss > peak.rss:
                    peak.rss, peak.each = s.rss, s.each
                peak.single = max(peak.single, s.single)
                peak.processes = max(peak.processes, s.processes)
                if s.pss is None or peak.pss is None:
                    peak.pss = None
                    pss = False
                else:
                    peak.pss = max(peak.pss, s.pss)
                spent = time.thread_time() - s0
                cost += spent
                # A JVM's smaps_rollup costs ~3 ms of CPU (its many mappings): a Spark tree
                # would keep the sampler on half a core at 25 ms, on a machine whose cores the
                # measured command needs. Waiting longer keeps the sampler under `max_share` of
                # one core; the peaks that matter (a partition held in memory) last seconds.
                wait = max(interval - spent, spent * (1 / max_share - 1), 0.001)
                if seconds is None:
                    # Waiting on the pidfd wakes at CMD's exit, so `seconds` is exact.
                    ready, _, _ = select.select([pidfd], [], [], wait)
                    if ready:
                        seconds = time.perf_counter() - t0
                        proc.wait()
                        end_linger = time.perf_counter() + linger
                        continue  # one more sample: the orphans CMD left behind
                else:
                    if not live_orphans or time.perf_counter() >= (end_linger or 0):
                        break
                    time.sleep(wait)
        finally:
            os.close(pidfd)
            if proc.returncode is None:  # the sampler itself failed: do not leave CMD running
                proc.kill()
                proc.wait()
    finally:
        if old is not None:
            _set_subreaper(old)
    for p in adopted:  # orphans that died after the last sample: not left as zombies
        with contextlib.suppress(ChildProcessError):
            os.waitpid(p, os.WNOHANG)
    lingering = [p for p in adopted if _alive(p)]
    return TreePeak(
        seconds=seconds if seconds is not None else time.perf_counter() - t0,
        returncode=proc.returncode,
        tree_rss=peak.rss,
        tree_pss=peak.pss,
        single_rss=peak.single,
        processes=peak.processes,
        samples=samples,
        sample_cost=cost / max(samples, 1),
        sample_every=(time.perf_counter() - t0) / max(samples, 1),
        lingering=lingering,
        at_peak=peak.each,
    )


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
    except OSError:
        return False
    return data[data.rfind(b")") + 2 : data.rfind(b")") + 3] != b"Z"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--interval", type=float, default=0.025, help="seconds between samples")
    ap.add_argument(
        "--max-share", type=float, default=0.1, help="the sampler's most CPU, share of a core"
    )
    ap.add_argument("--linger", type=float, default=10.0, help="seconds to follow orphans")
    ap.add_argument("--no-pss", action="store_true", help="skip smaps_rollup (cheaper)")
    ap.add_argument("--devnull", action="store_true", help="CMD's stdout to /dev/null")
    ap.add_argument("cmd", nargs=argparse.REMAINDER)
    args = ap.parse_args(argv)
    cmd = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
    if not cmd:
        ap.error("no command")
    out = run(
        cmd,
        interval=args.interval,
        max_share=args.max_share,
        linger=args.linger,
        pss=not args.no_pss,
        stdout=subprocess.DEVNULL if args.devnull else None,
    )
    # This process does nothing but wait for CMD's tree: its RUSAGE_CHILDREN is that tree's
    # exact single-process high-water mark (kB on Linux), for the processes it reaped.
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    out.max_rss_waited = usage.ru_maxrss * 1024
    out.cpu_user, out.cpu_sys = usage.ru_utime, usage.ru_stime
    print(json.dumps(asdict(out)), flush=True)
    return out.returncode


if __name__ == "__main__":
    sys.exit(main())

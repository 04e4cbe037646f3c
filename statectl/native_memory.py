"""glibc malloc settings for bulk array work: keep freed memory for reuse instead of faulting
fresh pages in for every array, and Arrow's buffers from the same malloc.

statectl's hot paths build and drop many arrays of a partition's size (hashes, offsets,
gathered keys). Under glibc's defaults each one above the dynamic mmap threshold is a fresh
``mmap``: the kernel zeroes every page on first touch and ``munmap`` hands it back, so the
same memory is faulted in again for the next array. On a 10M-key savepoint that was 478k page
faults and 7.8 s of system CPU (``clear_page`` at the top of ``perf``); with the settings below,
200k faults and 4.6 s (bench/scale.py, issue 27).

The price is memory kept: freed blocks wait for reuse instead of going back to the system, so
a process's peak RSS is about 10% higher (a 10M-key savepoint's one worker under
``--memory 1G``: 1,149 -> 1,280 MB). ``STATECTL_MALLOC=default`` keeps glibc's defaults, for a
container whose memory limit is tighter than its CPU. Only the CLI applies the settings
(``statectl.cli.main``, inherited by its forked workers): a library must not change the
allocator of the process that imports it.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import sys

ENV_MALLOC = "STATECTL_MALLOC"
_ARROW_POOL = "ARROW_DEFAULT_MEMORY_POOL"

# mallopt(3) parameter numbers (malloc.h)
_M_TRIM_THRESHOLD = -1
_M_TOP_PAD = -2
_M_MMAP_THRESHOLD = -3

# Allocations up to 32 MiB (glibc's maximum for this setting) come from the heap, whose freed
# memory is reused; a fixed threshold also stops glibc's dynamic one from moving.
_MMAP_THRESHOLD_BYTES = 32 << 20
# Free memory at the top of the heap is returned to the system only above 2 GiB ...
_TRIM_BYTES = (1 << 31) - 1
# ... and each heap extension asks for 512 MiB more than it needs (address space, not RSS).
_TOP_PAD_BYTES = 512 << 20


def tune_for_bulk_work() -> bool:
    """Apply the settings to this process (and the processes it forks); False where the C
    library is not glibc, or ``$STATECTL_MALLOC`` is ``default`` (nothing changes then)."""
    if not sys.platform.startswith("linux") or os.environ.get(ENV_MALLOC) == "default":
        return False
    _arrow_on_malloc()
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL("libc.so.6")
        settings = (
            (_M_MMAP_THRESHOLD, _MMAP_THRESHOLD_BYTES),
            (_M_TRIM_THRESHOLD, _TRIM_BYTES),
            (_M_TOP_PAD, _TOP_PAD_BYTES),
        )
        return all(libc.mallopt(param, value) == 1 for param, value in settings)
    return False


def _arrow_on_malloc() -> None:
    """Arrow's buffers from the same tuned malloc (unless the user chose Arrow's pool).

    Arrow's default pool, mimalloc, keeps the segments it frees for itself, beside glibc's
    heap that keeps numpy's: a 10M-key savepoint's tree peaked at 2.5 GB under the default
    2 GiB budget, against 1.9 GB with one allocator for both (the same CPU time, measured
    back to back). Set through the environment when pyarrow is not imported yet (the CLI
    imports it lazily, after this), so ``--help`` does not pay for importing it."""
    if "pyarrow" not in sys.modules:
        os.environ.setdefault(_ARROW_POOL, "system")
        return
    if _ARROW_POOL not in os.environ:
        import pyarrow as pa

        pa.set_memory_pool(pa.system_memory_pool())


def release_above(limit: int) -> bool:
    """Hand the C heap's free memory back to the system when this process holds more than
    ``limit`` bytes (its RSS): the settings above keep freed blocks for reuse, which a task
    within its budget can afford and one over it cannot (a 100M-key restore's spill tasks held
    700 MB each under ``--memory 1G`` with Arrow's arrays at 126 MB). True if it trimmed; a
    no-op off glibc, and cheap to ask: one read of ``/proc/self/statm``."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        with open("/proc/self/statm", "rb") as f:
            rss = int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return False
    if rss <= limit:
        return False
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)
        return True
    return False

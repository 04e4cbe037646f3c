"""Spill files: a restore's rows by target partition, in Arrow IPC files of a private directory.

A spill task appends each target partition's rows to its own file (:class:`SpillWriters`,
:func:`split_by_partition`); a build task reads one partition's files back in source order
(:func:`read_spills`, :class:`SpilledTable`). The directory (:func:`spill_dir`) is removed on
every exit path.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import tempfile
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from statectl.backends.streamed import sorted_runs as sorted_batch_runs
from statectl.errors import StatectlError
from statectl.io import is_full

ENV_TMPDIR = "STATECTL_TMPDIR"


@contextlib.contextmanager
def spill_dir() -> Iterator[str]:
    """A private temporary directory (``$STATECTL_TMPDIR`` or the system's), removed on every
    exit: errors, Ctrl-C, and SIGTERM (the CLI turns it into ``SystemExit``).

    A full filesystem met inside is the scratch space's (writes to a target go through
    :class:`statectl.io.FileIO`, which names the target itself): the error names the scratch
    directory, not a file in it that is gone once this directory is removed."""
    base = os.environ.get(ENV_TMPDIR) or None
    try:
        path = tempfile.mkdtemp(prefix="statectl-spill-", dir=base)
    except OSError as e:
        raise scratch_full(e, base) if is_full(e) else e from None
    try:
        yield path
    except OSError as e:
        if not is_full(e):
            raise
        raise scratch_full(e, base) from e
    finally:
        shutil.rmtree(path, ignore_errors=True)


def scratch_full(e: OSError, base: str | None) -> StatectlError:
    """A one-line error for scratch space that filled up, naming the scratch directory: the
    one holding the ``statectl-*`` directory the failing file was in, else ``base`` (or the
    system's temporary directory)."""
    where = base or tempfile.gettempdir()
    for name in (e.filename, e.filename2):
        if isinstance(name, str) and "/statectl-" in name:
            where = name.split("/statectl-", 1)[0] or "/"
            break
    return StatectlError(
        f"cannot write statectl's scratch files here: {os.strerror(e.errno or errno.ENOSPC)}",
        where,
        f"free space there, or set {ENV_TMPDIR} (and TMPDIR) to a directory on a larger filesystem",
    )


def read_spills(paths: Iterable[str]) -> Iterator[pa.RecordBatch]:
    """The batches of spill files in order, as large as the spill task wrote them (bounded by
    its budget); read, not memory-mapped: pages of a mapped file would count as this
    process's memory."""
    for path in paths:
        if not os.path.exists(path):
            continue
        with pa.OSFile(path, "rb") as f:
            yield from pa.ipc.open_stream(f)


def spill_size(paths: Iterable[str]) -> int:
    return sum(os.path.getsize(p) for p in paths if os.path.exists(p))


def spill_paths(directory: str, files: int, p: int) -> list[str]:
    """Target partition ``p``'s spill files of a table spilled by ``files`` tasks, in order."""
    return [os.path.join(directory, f"f{i:06d}", f"{p}.arrow") for i in range(files)]


def sorted_runs(spills: list[str], scratch: str, budget: int) -> list[str]:
    """The spill files' rows cut into runs that fit ``budget``, each sorted bytewise by key."""
    return sorted_batch_runs(read_spills(spills), scratch, budget)


class SpillWriters:
    """One Arrow IPC stream file per target partition, opened when first written."""

    def __init__(self, directory: str, schema: pa.Schema) -> None:
        self.directory, self.schema = directory, schema
        self.files: dict[int, tuple[Any, Any]] = {}
        os.makedirs(directory, exist_ok=True)

    def write(self, p: int, batch: pa.RecordBatch) -> None:
        if p not in self.files:
            f = pa.OSFile(os.path.join(self.directory, f"{p}.arrow"), "wb")
            self.files[p] = (f, pa.ipc.new_stream(f, self.schema))
        self.files[p][1].write_batch(batch)

    def finish(self, p: int) -> None:
        """Close partition ``p``'s file (no more rows for it)."""
        if p in self.files:
            f, w = self.files.pop(p)
            w.close()
            f.close()

    def close(self) -> None:
        for p in list(self.files):
            self.finish(p)


def split_by_partition(table: pa.Table, pids: np.ndarray, out: SpillWriters) -> None:
    """Append each target partition's rows of ``table`` (in their order) to its spill file:
    one stable sort by partition, then contiguous slices."""
    if not table.num_rows:
        return
    counts = np.bincount(pids, minlength=int(pids.max()) + 1)
    # numpy's stable sort of 16-bit integers is a radix sort: O(n), where int64 is a merge sort.
    order = np.argsort(pids.astype(np.uint16) if len(counts) <= 1 << 16 else pids, kind="stable")
    ordered = table.take(pa.array(order)).combine_chunks()
    start = 0
    for p, n in enumerate(counts.tolist()):
        if n:
            for batch in ordered.slice(start, n).to_batches():
                out.write(p, batch)
        start += n


@dataclass(frozen=True)
class SpilledTable:
    """One table's rows of one target partition, in its spill files, read back on demand."""

    paths: list[str]
    schema: pa.Schema

    @property
    def nbytes(self) -> int:
        return spill_size(self.paths)

    def batches(self) -> Iterator[pa.RecordBatch]:
        """The rows a batch at a time (each as large as a spill task wrote it)."""
        return read_spills(self.paths)

    def read(self) -> pa.Table:
        batches = list(self.batches())
        return pa.Table.from_batches(batches, self.schema) if batches else self.schema.empty_table()

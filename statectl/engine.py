"""The local engine: repartition savepoint state in bounded memory, on every core.

Restore used to read each whole table and filter it once per target partition. Here it runs
in two phases of independent tasks (the unit a Spark engine would run as stages):

1. *Spill*, one task per savepoint data file (a source partition): read it in record-batch
   chunks, compute every row's target partition once (``OperatorKind.partition_key`` then
   Spark's murmur3 placement, vectorized), encode the rows, and append each target
   partition's rows to its own Arrow IPC spill file.
2. *Build*, one task per target partition (and store): read that partition's spill files in
   source order and write its state files. Rows keep the savepoint's order, so the files are
   the ones an in-memory restore writes. A partition larger than its share of the memory
   budget is written streamed instead: record chunks through the codec (HDFS, changelog), or
   an external merge sort into the SST writer (RocksDB snapshots).

Spill files live in a private temporary directory that is removed on every exit path. Tasks
run in a fork process pool (workers die with the parent) for local files, in threads for
object stores (concurrent transfers; s3fs and fork do not mix).
"""

from __future__ import annotations

import contextlib
import os
import posixpath
import re
import shutil
import tempfile
import uuid
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from statectl.backends.writers import (
    EMPTY_RECORDS,
    _bytewise_order,
    write_hdfs_store,
    write_rocksdb_snapshot,
    write_rocksdb_store,
)
from statectl.codecs.compression import SNAPPY_HEADER, compress_stream
from statectl.codecs.lz4block import DEFAULT_BLOCK_SIZE, HEADER
from statectl.codecs.records import write_state_records
from statectl.errors import StatectlError
from statectl.io import FileIO

# Where a table's keys go: (table name, keys, partitions) -> target partition per key
# (``OperatorKind.partitions_of``: the operator kind owns placement).
Place = Callable[[str, pa.StructArray, int], np.ndarray]
# (keys, values, table) -> the backend's key and value bytes.
Encoder = Callable[[pa.StructArray, pa.StructArray, Any], tuple[pa.Array, pa.Array]]

ENV_WORKERS = "STATECTL_WORKERS"
ENV_MEMORY = "STATECTL_MEMORY"
ENV_TMPDIR = "STATECTL_TMPDIR"
MIN_MEMORY = 16 << 20
DEFAULT_FRACTION = 4  # default budget: a quarter of the machine's physical memory,
# at most DEFAULT_CAP. More buys nothing: at 10M keys on 2 cores every command was as fast or
# faster under 2 GiB than under 6 GiB (export 6.8 vs 9.2 s, migrate RocksDB -> HDFS 6.2 vs
# 11.5 s; bench/scale.py), since bigger chunks cost page faults more than they save.
DEFAULT_CAP = 2 << 30
# Bytes of memory a build needs per byte of spilled state when it writes a partition from
# memory (arrays, the interleaved records, the compressed file; Python objects for the SST
# writer), and a decode step per byte of Parquet data: generous, measured on aggregations.
BUILD_FACTOR = 6
# Bytes per batch of a sorted run: a k-way merge reads one batch of each run at a time.
RUN_BATCH_BYTES = 256 << 10
DECODE_FACTOR = 8
MIN_BATCH_ROWS = 16
MAX_BATCH_ROWS = 1 << 20
_SIZE = re.compile(r"(?i)^\s*(\d+(?:\.\d+)?)\s*([kmgt]?)i?b?\s*$")
_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}


def parse_memory(text: str | int) -> int:
    """``512M``, ``2G``, ``1.5g``, ``300MiB`` or a plain number of bytes."""
    if isinstance(text, int):  # the Python API: any positive number of bytes (tests use tiny)
        if text < 1:
            raise StatectlError(f"memory must be a positive number of bytes, got {text}")
        return text
    else:
        m = _SIZE.match(text)
        if not m:
            raise StatectlError(f"--memory wants a size like 512M or 2G, got {text!r}")
        n = int(float(m.group(1)) * _UNITS[m.group(2).lower()])
    if n < MIN_MEMORY:
        raise StatectlError(f"--memory must be at least {MIN_MEMORY >> 20}M, got {text!r}")
    return n


def default_memory() -> int:
    """$STATECTL_MEMORY, else a quarter of the machine's physical memory (at least 256 MiB, at
    most 2 GiB)."""
    env = os.environ.get(ENV_MEMORY)
    if env:
        return parse_memory(env)
    try:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        total = 4 << 30
    return max(256 << 20, min(DEFAULT_CAP, total // DEFAULT_FRACTION))


def default_workers() -> int:
    """$STATECTL_WORKERS, else one per core."""
    env = os.environ.get(ENV_WORKERS)
    if env:
        try:
            return max(1, int(env))
        except ValueError:
            raise StatectlError(f"{ENV_WORKERS} must be a number, got {env!r}") from None
    return os.cpu_count() or 1


class TaskRunner(Protocol):
    """What runs a use case's tasks: the local :class:`~statectl.engine.Engine` or Spark's."""

    def run(self, jobs: list[Callable[[], Any]], *, threads: bool = False) -> Iterator[Any]:
        """Every job's result, in job order (``threads``: a hint for object stores)."""
        ...

    @property
    def per_task(self) -> int:
        """What one task may hold, in bytes."""
        ...


@dataclass(frozen=True)
class Engine:
    """How the local engine runs: the memory budget (bytes, all workers together) and the
    number of parallel tasks."""

    memory: int
    workers: int

    @classmethod
    def of(cls, memory: str | int | None = None, workers: int | None = None) -> Engine:
        if workers is not None and workers < 1:
            raise StatectlError(f"--workers must be at least 1, got {workers}")
        return cls(
            parse_memory(memory) if memory is not None else default_memory(),
            workers or default_workers(),
        )

    def run(self, jobs: list[Callable[[], Any]], *, threads: bool = False) -> Iterator[Any]:
        """Every job's result in job order (:func:`iter_tasks`)."""
        return iter_tasks(jobs, self.workers, threads=threads)

    @property
    def per_task(self) -> int:
        """What one task may hold: the budget shared by the tasks that run at once."""
        return max(1, self.memory // self.workers)


# -- running tasks --------------------------------------------------------------------------
def _call(job: Callable[[], Any]) -> Any:
    return job()


def iter_tasks(jobs: list[Callable[[], Any]], workers: int, *, threads: bool) -> Iterator[Any]:
    """Every job's result in job order, as they finish: inline for one worker, else in a fork
    process pool (:func:`statectl.processes.run_in_pool`: workers die with the parent) or, for
    object stores, a thread pool (concurrent transfers)."""
    workers = min(workers, len(jobs))
    if workers <= 1:
        for job in jobs:
            yield job()
        return
    if not threads:
        from statectl.processes import run_in_pool

        yield from run_in_pool(_call, jobs, workers)
        return
    import concurrent.futures as cf

    with cf.ThreadPoolExecutor(workers) as pool:
        futures = [pool.submit(job) for job in jobs]
        try:
            for f in futures:
                yield f.result()
        except BaseException:
            for f in futures:
                f.cancel()
            raise


def run_tasks(jobs: list[Callable[[], Any]], workers: int, *, threads: bool) -> list[Any]:
    return list(iter_tasks(jobs, workers, threads=threads))


@contextlib.contextmanager
def spill_dir() -> Iterator[str]:
    """A private temporary directory (``$STATECTL_TMPDIR`` or the system's), removed on every
    exit: errors, Ctrl-C, and SIGTERM (the CLI turns it into ``SystemExit``)."""
    base = os.environ.get(ENV_TMPDIR) or None
    path = tempfile.mkdtemp(prefix="statectl-spill-", dir=base)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def uses_threads(*ios: FileIO) -> bool:
    return not all(io.is_local for io in ios)


# -- target formats -------------------------------------------------------------------------
@dataclass(frozen=True)
class StoreFormat:
    """How one store partition is written at version ``version``: HDFS snapshot, RocksDB
    changelog files, or a RocksDB zip+SST snapshot (``unique_ids``: checkpoint format 2)."""

    backend: str  # "hdfs" or "rocksdb"
    layout: str  # "snapshot" or "changelog" (RocksDB)
    version: int
    codec: str
    unique_ids: bool = False

    @property
    def sorted(self) -> bool:
        return self.backend == "rocksdb" and self.layout == "snapshot"

    def write(self, io: FileIO, store_dir: str, keys: pa.Array, values: pa.Array) -> str | None:
        """One partition from memory (keys and values already in the backend's bytes: RocksDB's
        carry the encoding-version byte, prefix keys their prefix encoding); returns the unique
        id its files carry (or None)."""
        if self.backend == "hdfs":
            write_hdfs_store(io, store_dir, self.version, self.codec, keys, values)
            return None
        if self.layout == "changelog":
            write_rocksdb_store(io, store_dir, self.version, self.codec, keys, values, encoded=True)
            return None
        uid = str(uuid.uuid4()) if self.unique_ids else None
        write_rocksdb_snapshot(io, store_dir, self.version, keys, values, unique_id=uid)
        return uid

    def write_streamed(
        self, io: FileIO, store_dir: str, spills: list[str], scratch: str, budget: int
    ) -> str | None:
        """One partition larger than ``budget``, from its spill files, never all in memory."""
        if self.sorted:
            uid = str(uuid.uuid4()) if self.unique_ids else None
            runs = sorted_runs(spills, scratch, budget)
            write_rocksdb_snapshot(
                io,
                store_dir,
                self.version,
                None,
                None,
                unique_id=uid,
                batches=merge_runs(runs),
                num_keys=sum(_rows(r) for r in runs),
            )
            return uid
        prefix = b""  # the spilled rows are already the backend's bytes
        if self.layout == "changelog" and self.backend == "rocksdb":
            empty = compress_stream(self.codec, EMPTY_RECORDS)
            for v in range(1, self.version):
                io.write_atomic(posixpath.join(store_dir, f"{v}.changelog"), empty)
        name = f"{self.version}.snapshot" if self.backend == "hdfs" else f"{self.version}.changelog"
        local = os.path.join(scratch, f"out-{uuid.uuid4()}")
        # The record stream's size: 8 bytes of lengths, key, value (and prefixes) per entry.
        size = 4 + sum(
            b.num_rows * (8 + 2 * len(prefix)) + _data_size(b.column(0)) + _data_size(b.column(1))
            for b in read_spills(spills, budget)
        )
        with open(local, "wb") as out:
            stream = _CodecStream(self.codec, out, size)
            for batch in read_spills(spills, budget):
                keys, values = batch.column(0), batch.column(1)
                if len(keys):
                    stream.write(write_state_records(keys, values, prefix=prefix)[:-4])
            stream.write(EMPTY_RECORDS)
            stream.close()
        try:
            io.put_atomic(local, posixpath.join(store_dir, name))
        finally:
            os.remove(local)
        return None


class _CodecStream:
    """Spark's codec framing written incrementally, the same bytes as
    :func:`~statectl.codecs.compression.compress_stream` of everything at once (zstd: when
    ``size``, the total, is given)."""

    def __init__(self, codec: str, out: Any, size: int | None = None) -> None:
        self.codec, self.out = codec, out
        self.buf = bytearray()
        self.first = True
        self.block = {"lz4": DEFAULT_BLOCK_SIZE, "snappy": 32 * 1024, "lzf": 0xFFFF}.get(codec)
        self.zstd = None
        if codec == "zstd":
            import zstandard

            from statectl.codecs.compression import ZSTD_LEVEL

            # Pledging the size keeps it in the frame header, as a one-shot frame has it.
            self.zstd = zstandard.ZstdCompressor(level=ZSTD_LEVEL).compressobj(size=size or -1)

    def write(self, data: bytes) -> None:
        if self.zstd is not None:
            self.out.write(self.zstd.compress(data))
            return
        self.buf += data
        assert self.block is not None
        whole = len(self.buf) // self.block * self.block
        if whole:
            self._emit(bytes(self.buf[:whole]), last=False)
            del self.buf[:whole]

    def _emit(self, raw: bytes, last: bool) -> None:
        framed = compress_stream(self.codec, raw)
        if self.codec == "lz4" and not last:
            framed = framed[: -HEADER.size]  # the end mark comes once, at the end
        if self.codec == "snappy" and not self.first:
            framed = framed[len(SNAPPY_HEADER) :]  # the header comes once, at the start
        self.first = False
        self.out.write(framed)

    def close(self) -> None:
        if self.zstd is not None:
            self.out.write(self.zstd.flush())
            return
        self._emit(bytes(self.buf), last=True)
        self.buf.clear()


# -- spill files ----------------------------------------------------------------------------
def _rows(path: str) -> int:
    with pa.OSFile(path, "rb") as f:
        return sum(b.num_rows for b in pa.ipc.open_stream(f))


def read_spills(paths: Iterable[str], budget: int) -> Iterator[pa.RecordBatch]:
    """The batches of spill files in order (read, not memory-mapped: pages of a mapped file
    would count as this process's memory)."""
    del budget  # batches are as large as the spill task wrote them, bounded by its budget
    for path in paths:
        if not os.path.exists(path):
            continue
        with pa.OSFile(path, "rb") as f:
            yield from pa.ipc.open_stream(f)


def _data_size(a: pa.Array) -> int:
    offsets = np.frombuffer(a.buffers()[1], dtype=np.int64)[a.offset : a.offset + len(a) + 1]
    return int(offsets[-1] - offsets[0]) if len(a) else 0


def _spill_size(paths: Iterable[str]) -> int:
    return sum(os.path.getsize(p) for p in paths if os.path.exists(p))


def sorted_runs(spills: list[str], scratch: str, budget: int) -> list[str]:
    """The spill's rows cut into runs that fit ``budget``, each sorted bytewise by key."""
    runs: list[str] = []
    pending: list[pa.RecordBatch] = []
    size = 0

    def flush() -> None:
        nonlocal size
        if not pending:
            return
        table = pa.Table.from_batches(pending).combine_chunks()
        order = _bytewise_order(table.column(0).chunk(0).cast(pa.large_binary()))
        path = os.path.join(scratch, f"run-{uuid.uuid4()}.arrow")
        sorted_table = table.take(order)
        # Small batches: the merge holds one batch of every run at once.
        per_row = max(1, sorted_table.nbytes // max(1, sorted_table.num_rows))
        rows = max(64, RUN_BATCH_BYTES // per_row)
        with pa.OSFile(path, "wb") as f, pa.ipc.new_stream(f, sorted_table.schema) as w:
            for b in sorted_table.to_batches(max_chunksize=rows):
                w.write_batch(b)
        runs.append(path)
        pending.clear()
        size = 0

    for batch in read_spills(spills, budget):
        pending.append(batch)
        size += batch.nbytes
        if size * BUILD_FACTOR > budget:
            flush()
    flush()
    return runs


def _run_batches(path: str) -> Iterator[tuple[pa.Array, pa.Array]]:
    with pa.OSFile(path, "rb") as f:
        for batch in pa.ipc.open_stream(f):
            if batch.num_rows:
                yield batch.column(0), batch.column(1)


def merge_runs(runs: list[str]) -> Iterator[tuple[pa.Array, pa.Array]]:
    """A k-way merge of sorted runs (keys are unique within a store), a batch at a time: the
    rows of every run's current batch up to the smallest of their last keys are exactly the
    rows left at or below it (runs are sorted), so they are sorted together and yielded; the
    run that held that key moves to its next batch. Vectorized: no Python object per row."""
    if len(runs) == 1:
        yield from _run_batches(runs[0])
        return
    streams = [_run_batches(r) for r in runs]
    heads: dict[int, tuple[pa.Array, pa.Array]] = {}
    for i, stream in enumerate(streams):
        first = next(stream, None)
        if first is not None:
            heads[i] = first
    while heads:
        bound = min(keys[-1].as_py() for keys, _ in heads.values())
        limit = pa.scalar(bound, pa.large_binary())
        taken_keys, taken_values = [], []
        for i, (keys, values) in list(heads.items()):
            take = pc.sum(pc.less_equal(keys, limit)).as_py() or 0
            taken_keys.append(keys.slice(0, take))
            taken_values.append(values.slice(0, take))
            if take < len(keys):
                heads[i] = keys.slice(take), values.slice(take)
            elif (following := next(streams[i], None)) is not None:
                heads[i] = following
            else:
                del heads[i]
        keys, values = pa.concat_arrays(taken_keys), pa.concat_arrays(taken_values)
        order = _bytewise_order(keys)
        yield keys.take(order), values.take(order)


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
    order = np.argsort(pids, kind="stable")
    counts = np.bincount(pids, minlength=int(pids.max()) + 1)
    ordered = table.take(pa.array(order)).combine_chunks()
    start = 0
    for p, n in enumerate(counts.tolist()):
        if n:
            for batch in ordered.slice(start, n).to_batches():
                out.write(p, batch)
        start += n


def batch_rows(budget: int) -> Callable[[int], int]:
    """Rows per chunk, given the Parquet data's bytes per row, so that decoding, encoding and
    splitting a chunk stays within ``budget``."""

    def rows(bytes_per_row: int) -> int:
        per_row = max(1, bytes_per_row) * DECODE_FACTOR
        return int(min(MAX_BATCH_ROWS, max(MIN_BATCH_ROWS, budget // per_row)))

    return rows


# -- restoring ------------------------------------------------------------------------------
@dataclass
class SpillTask:
    """Phase 1: one savepoint data file of one table, spilled by target partition."""

    sp: Any  # Savepoint
    table: Any  # StateTable
    file_index: int
    place: Place
    partitions: int
    directory: str
    budget: int
    # (key, value, table) -> the backend's key and value bytes; None keeps the table's columns
    encoder: Encoder | None
    # (table, rows) -> the rows the target keeps (schema evolution, --transform), before placement
    convert: Callable[[Any, pa.Table], pa.Table] | None = None

    def __call__(self) -> int:
        f = self.table.files[self.file_index]
        schema = (
            pa.schema([("key", pa.large_binary()), ("value", pa.large_binary())])
            if self.encoder is not None
            else table_schema(self.sp, self.table, self.convert)
        )
        out = SpillWriters(os.path.join(self.directory, f"f{self.file_index:06d}"), schema)
        rows = 0
        try:
            chunks = self.sp.iter_file(self.table, f, batch_rows(self.budget), self.directory)
            for chunk in chunks:
                if self.convert is not None:
                    chunk = self.convert(self.table, chunk)
                key = chunk.column("key").combine_chunks()
                pids = np.asarray(self.place(self.table.name, key, self.partitions), dtype=np.int64)
                if self.encoder is not None:
                    k, v = self.encoder(key, chunk.column("value").combine_chunks(), self.table)
                    chunk = pa.table(
                        {"key": k.cast(pa.large_binary()), "value": v.cast(pa.large_binary())}
                    )
                split_by_partition(chunk, pids, out)
                rows += chunk.num_rows
        finally:
            out.close()
        return rows


def table_schema(
    sp: Any, table: Any, convert: Callable[[Any, pa.Table], pa.Table] | None
) -> pa.Schema:
    """The schema of a table's rows as spilled: the savepoint's, or what ``convert`` makes of
    it (schema evolution changes key and value types)."""
    schema = sp.table_schema(table)
    return convert(table, schema.empty_table()).schema if convert is not None else schema


def _spills(directory: str, files: int, p: int) -> list[str]:
    return [os.path.join(directory, f"f{i:06d}", f"{p}.arrow") for i in range(files)]


@dataclass
class BuildTask:
    """Phase 2: one target partition of one store, from its spill files."""

    directory: str
    files: int
    partition: int
    fmt: StoreFormat
    io: FileIO
    store_dir: str
    budget: int

    def __call__(self) -> str | None:
        spills = _spills(self.directory, self.files, self.partition)
        if _spill_size(spills) * BUILD_FACTOR <= self.budget:
            batches = list(read_spills(spills, self.budget))
            if batches:
                t = pa.Table.from_batches(batches).combine_chunks()
                keys, values = t.column(0).chunk(0), t.column(1).chunk(0)
            else:
                keys = values = pa.array([], pa.large_binary())
            return self.fmt.write(self.io, self.store_dir, keys, values)
        scratch = tempfile.mkdtemp(prefix=f"build-{self.partition}-", dir=self.directory)
        try:
            return self.fmt.write_streamed(self.io, self.store_dir, spills, scratch, self.budget)
        finally:
            shutil.rmtree(scratch, ignore_errors=True)


def spill_tables(
    sp: Any,
    tables: list[Any],
    place: Place,
    partitions: int,
    directory: str,
    engine: Engine,
    *,
    encoder: Encoder | None,
    threads: bool,
    convert: Callable[[Any, pa.Table], pa.Table] | None = None,
) -> list[str]:
    """Phase 1 for ``tables``: returns each table's spill directory."""
    dirs = [os.path.join(directory, f"t{i:04d}") for i in range(len(tables))]
    jobs = [
        SpillTask(sp, t, i, place, partitions, d, engine.per_task, encoder, convert)
        for t, d in zip(tables, dirs, strict=True)
        for i in range(len(t.files))
    ]
    run_tasks(jobs, engine.workers, threads=threads)  # type: ignore[arg-type]
    return dirs


def restore_stores(
    sp: Any,
    tables: list[Any],
    place: Place,
    partitions: int,
    fmt: StoreFormat,
    io: FileIO,
    store_dir: Callable[[str, int], str],
    engine: Engine | TaskRunner,
    *,
    encoder: Encoder,
    only: list[int] | None = None,
    convert: Callable[[Any, pa.Table], pa.Table] | None = None,
) -> list[list[tuple[int, str | None]]]:
    """Write the target partitions (all, or ``only`` these) of every store table; returns
    [table] -> [(partition, unique id)]. The Spark engine runs the same two phases as Spark
    stages (:meth:`statectl.spark_engine.SparkEngine.restore_stores`)."""
    if not isinstance(engine, Engine):
        return engine.restore_stores(
            sp,
            tables,
            place,
            partitions,
            fmt,
            io,
            store_dir,
            encoder=encoder,
            only=only,
            convert=convert,
        )
    threads = uses_threads(sp.io, io)
    built = list(range(partitions)) if only is None else only
    with spill_dir() as directory:
        dirs = spill_tables(
            sp,
            tables,
            place,
            partitions,
            directory,
            engine,
            encoder=encoder,
            threads=threads,
            convert=convert,
        )
        return build_stores(
            [(t.name, d, len(t.files)) for t, d in zip(tables, dirs, strict=True)],
            built,
            fmt,
            io,
            store_dir,
            engine,
            threads=threads,
        )


def build_stores(
    spilled: list[tuple[str, str, int]],
    built: list[int],
    fmt: StoreFormat,
    io: FileIO,
    store_dir: Callable[[str, int], str],
    engine: Engine,
    *,
    threads: bool,
) -> list[list[tuple[int, str | None]]]:
    """Phase 2 for tables spilled by phase 1, each given as (name, spill directory, spill
    tasks): the ``built`` partitions of every table; returns [table] -> [(partition, unique
    id)]."""
    jobs = [
        BuildTask(d, files, p, fmt, io, store_dir(name, p), engine.per_task)
        for name, d, files in spilled
        for p in built
    ]
    flat = run_tasks(jobs, engine.workers, threads=threads)  # type: ignore[arg-type]
    n = len(built)
    return [list(zip(built, flat[i * n : (i + 1) * n], strict=True)) for i in range(len(spilled))]


@dataclass(frozen=True)
class SpilledTable:
    """One table's rows of one target partition, in its spill files, read back on demand."""

    paths: list[str]
    schema: pa.Schema

    @property
    def nbytes(self) -> int:
        return _spill_size(self.paths)

    def batches(self) -> Iterator[pa.RecordBatch]:
        """The rows a batch at a time (each as large as a spill task wrote it)."""
        return read_spills(self.paths, 0)

    def read(self) -> pa.Table:
        batches = list(self.batches())
        return pa.Table.from_batches(batches, self.schema) if batches else self.schema.empty_table()


def partition_spills(
    sp: Any,
    tables: list[Any],
    place: Place,
    partitions: int,
    engine: Engine | TaskRunner,
    *,
    convert: Callable[[Any, pa.Table], pa.Table] | None = None,
) -> Iterator[tuple[int, dict[str, SpilledTable]]]:
    """Each target partition's rows of ``tables`` (by name, in savepoint order) as spill files,
    one partition after the other; the files live until the next partition is asked for.
    ``convert`` makes the rows the target keeps (schema evolution) before they are placed.
    For state whose partition is encoded as a unit (transformWithState, joins at 3/4)."""
    if not isinstance(engine, Engine):  # the Spark engine: a shuffle, then partition by partition
        yield from engine.partition_spills(sp, tables, place, partitions, convert=convert)
        return
    threads = uses_threads(sp.io)
    with spill_dir() as directory:
        dirs = spill_tables(
            sp,
            tables,
            place,
            partitions,
            directory,
            engine,
            encoder=None,
            threads=threads,
            convert=convert,
        )
        for p in range(partitions):
            yield (
                p,
                {
                    t.name: SpilledTable(_spills(d, len(t.files), p), table_schema(sp, t, convert))
                    for t, d in zip(tables, dirs, strict=True)
                },
            )

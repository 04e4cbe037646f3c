"""Use case ``export``: write one selection of state to Parquet, JSON lines or CSV."""

from __future__ import annotations

import concurrent.futures as cf
import contextlib
import datetime as dt
import io as _io
import json
import os
import select
import shutil
import tempfile
import threading
from collections.abc import Generator, Iterator
from dataclasses import dataclass
from typing import Any, BinaryIO, TypeAlias

import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq

from statectl.codecs.phases import flush as flush_phases
from statectl.codecs.phases import phase
from statectl.engine import Engine, spill_dir, task_futures
from statectl.errors import StatectlError, wording
from statectl.io import FileIO
from statectl.processor.handle import StateHandle
from statectl.processor.model import OperatorInfo
from statectl.processor.reading import handle_of
from statectl.reader import open_source, selection_table
from statectl.savepoints.tables import exportable
from statectl.state import join_side_view


def _flatten_all(table: pa.Table) -> pa.Table:
    while any(pa.types.is_struct(f.type) for f in table.schema):
        table = table.flatten()
    return table


def _json_default(v: Any) -> Any:
    if isinstance(v, bytes):
        return v.hex()
    return str(v)


def jsonable(value: Any, t: pa.DataType) -> Any:
    """A Python value of Arrow type ``t`` as JSON wants it: maps with string keys become
    objects (other maps stay ``[[key, value], ...]`` pairs, JSON keys being strings), integers
    stay Python ints (exact, however large), NaN and infinities become the strings Spark's
    ``to_json`` writes; the rest is left to :func:`_json_default` (bytes as hex, dates ISO)."""
    if value is None:
        return None
    if pa.types.is_map(t):
        return _jsonable_map(value, t)
    if pa.types.is_struct(t):
        return {f.name: jsonable(value.get(f.name), f.type) for f in t}
    if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t):
        return [jsonable(v, t.value_type) for v in value]
    if isinstance(value, float):
        return _jsonable_float(value)
    if isinstance(value, dt.datetime):
        return iso_timestamp(value)
    return value


def iso_timestamp(value: dt.datetime) -> str:
    """ISO 8601 with ``T`` (``2024-01-01T00:00:01+00:00``; no offset for TIMESTAMP_NTZ), the
    one form JSON lines and CSV both write."""
    return value.isoformat()


def _jsonable_map(value: Any, t: pa.DataType) -> Any:
    k_t, v_t = t.key_type, t.item_type
    if pa.types.is_string(k_t) or pa.types.is_large_string(k_t):
        return {k: jsonable(v, v_t) for k, v in value}
    return [[jsonable(k, k_t), jsonable(v, v_t)] for k, v in value]


def _jsonable_float(value: float) -> float | str:
    """NaN and the infinities as the strings Spark's ``to_json`` writes."""
    if value != value:
        return "NaN"
    if value in (float("inf"), float("-inf")):
        return "Infinity" if value > 0 else "-Infinity"
    return value


def _dumps(value: Any) -> str:
    # ensure_ascii=False: UTF-8 text, not \ud83d escapes; allow_nan=False: valid JSON only.
    return json.dumps(value, default=_json_default, ensure_ascii=False, allow_nan=False)


def encode_table(table: pa.Table, fmt: str) -> bytes:
    table = exportable(table)
    buf = _io.BytesIO()
    if fmt == "parquet":
        pq.write_table(table, buf)
    elif fmt == "jsonl":
        fields = list(table.schema)
        for row in table.to_pylist():
            obj = {f.name: jsonable(row[f.name], f.type) for f in fields}
            buf.write(_dumps(obj).encode("utf-8") + b"\n")
    elif fmt == "csv":
        pacsv.write_csv(_nested_as_text(_flatten_all(table)), buf)
    else:
        raise StatectlError(f"unknown output format {fmt!r}; use .parquet, .jsonl or .csv")
    return buf.getvalue()


def _nested_as_text(flat: pa.Table) -> pa.Table:
    """CSV has no nested values: lists and maps (after flattening) as their JSON text; and
    timestamps as JSON lines write them (Arrow's CSV writer puts a space and ``Z``)."""
    for name in [f.name for f in flat.schema if pa.types.is_timestamp(f.type)]:
        idx = flat.schema.get_field_index(name)
        as_text = pa.array(
            [None if v is None else iso_timestamp(v) for v in flat.column(name).to_pylist()],
            pa.string(),
        )
        flat = flat.set_column(idx, name, as_text)
    for name in [f.name for f in flat.schema if pa.types.is_nested(f.type)]:
        idx = flat.schema.get_field_index(name)
        t = flat.schema.field(idx).type
        as_text = pa.array(
            [None if v is None else _dumps(jsonable(v, t)) for v in flat.column(name).to_pylist()],
            pa.string(),
        )
        flat = flat.set_column(idx, name, as_text)
    return flat


def write_chunks(chunks: Iterator[pa.Table], fmt: str, out: BinaryIO) -> int:
    """:func:`encode_table` of the chunks' concatenation, written a chunk at a time (a Parquet
    row group, JSON lines, CSV rows under one header); returns the row count."""
    rows = 0

    def prepared() -> Iterator[Prepared]:
        nonlocal rows
        for table in chunks:
            rows += table.num_rows
            with phase("prepare"):
                ready = prepare(table, fmt)
            yield ready

    write_prepared(prepared(), fmt, out)
    return rows


# A chunk made ready for its format's writer: the table Parquet or CSV writes, JSON lines' bytes.
Prepared: TypeAlias = "pa.Table | bytes"


def prepare(table: pa.Table, fmt: str) -> Prepared:
    """What ``fmt``'s writer writes of one chunk (the part that needs no writer: an export
    task does it where it reads the chunk)."""
    if fmt == "parquet":
        return exportable(table)
    if fmt == "jsonl":
        return encode_table(table, fmt)
    if fmt == "csv":
        return _nested_as_text(_flatten_all(exportable(table)))
    raise StatectlError(f"unknown output format {fmt!r}; use .parquet, .jsonl or .csv")


def write_prepared(chunks: Iterator[Prepared], fmt: str, out: BinaryIO) -> None:
    """The prepared chunks written in order: a Parquet row group, CSV rows under one header
    (the writer made on the first chunk), or JSON lines' bytes each.

    The writer is closed here on every path: left to the garbage collector after a failure, a
    ParquetWriter closes itself after ``out`` is closed and prints a traceback on stderr."""
    writer: Any = None
    try:
        for ready in chunks:
            with phase(f"{fmt} write"):
                if isinstance(ready, bytes):
                    out.write(ready)
                elif fmt == "parquet":
                    writer = writer or pq.ParquetWriter(out, ready.schema)
                    writer.write_table(ready)
                else:
                    writer = writer or pacsv.CSVWriter(out, ready.schema)
                    writer.write_table(ready)
    except BaseException:
        if writer is not None:
            with contextlib.suppress(Exception):  # the output is discarded anyway
                writer.close()
        raise
    if writer is not None:
        with phase(f"{fmt} write"):
            writer.close()


def format_of(path: str) -> str:
    lower = path.lower()
    for suffix, fmt in (
        (".parquet", "parquet"),
        (".pq", "parquet"),
        (".jsonl", "jsonl"),
        (".json", "jsonl"),
        (".ndjson", "jsonl"),
        (".csv", "csv"),
    ):
        if lower.endswith(suffix):
            return fmt
    raise StatectlError(
        f"cannot tell the output format from {path!r}; end it in .parquet, .jsonl or .csv"
    )


@dataclass
class ExportPartTask:
    """One state partition of the selection, read where the task runs (a Spark executor) and
    returned as Arrow IPC bytes."""

    handle: Any  # StateHandle
    operator: str | int
    table: str | None
    join_side: str | None
    partition: int

    def __call__(self) -> bytes:
        part = self.handle.partition(
            self.operator, self.partition, self.table, join_side=self.join_side
        )
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, part.schema) as w:
            w.write_table(part)
        return sink.getvalue().to_pybytes()


def _parts_on(
    engine: Any, handle: Any, operator: str | int, table: str | None, join_side: str | None
) -> Iterator[pa.Table]:
    """The selection read by ``engine``'s tasks, one per state partition, in order."""
    jobs = [
        ExportPartTask(handle, operator, table, join_side, p)
        for p in range(handle.operator(operator).partitions)
    ]
    for b in engine.run(jobs):
        yield pa.ipc.open_stream(pa.py_buffer(b)).read_all()


@dataclass
class ExportChunksTask:
    """One state partition of the selection, read in chunks where the task runs (a local fork
    worker) within ``budget``: each chunk prepared for ``fmt`` (:func:`prepare`) and left as a
    file of its own (:func:`chunk_path`, renamed into place when complete) for the parent,
    which writes them in order while later chunks are still being read. Returns the
    partition's rows and its columns (none: the partition had no chunks)."""

    handle: Any  # StateHandle
    operator: str | int
    table: str | None
    join_side: str | None
    partition: int
    fmt: str
    directory: str
    budget: int
    notify: int = -1  # a pipe's write end (inherited at fork): one byte per chunk file left

    def __call__(self) -> tuple[int, list[str]]:
        rows, columns = 0, []
        scratch = tempfile.mkdtemp(prefix=f"read-{self.partition}-", dir=self.directory)
        try:
            chunks = self.handle.partition_chunks(
                self.operator,
                self.partition,
                self.table,
                join_side=self.join_side,
                budget=self.budget,
                scratch=scratch,
            )
            for i, table in enumerate(chunks):
                rows += table.num_rows
                columns = table.column_names
                with phase("prepare"):
                    ready = prepare(table, self.fmt)
                del table
                with phase("ipc write"):
                    _write_chunk_file(chunk_path(self.directory, self.partition, i), ready)
                del ready  # not held while the next chunk is read
                if self.notify >= 0:
                    with contextlib.suppress(OSError):  # the parent is gone: it reads no more
                        os.write(self.notify, b"\0")
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
        return rows, columns


def chunk_path(directory: str, partition: int, index: int) -> str:
    return os.path.join(directory, f"p{partition:06d}-{index:06d}.chunk")


def _write_chunk_file(path: str, ready: Prepared) -> None:
    """One prepared chunk: JSON lines' bytes as they are, a table as Arrow IPC (its record
    batches as they are, so the writer sees the chunk the serial export sees)."""
    temp = path + ".tmp"
    if isinstance(ready, bytes):
        with open(temp, "wb") as f:
            f.write(ready)
    else:
        with pa.OSFile(temp, "wb") as sink, pa.ipc.new_file(sink, ready.schema) as w:
            w.write_table(ready)
    os.rename(temp, path)  # complete: the parent may read it


def _read_chunk_file(path: str, fmt: str) -> Prepared:
    """A chunk file read back (and removed: the disk holds only what is not yet written)."""
    try:
        if fmt == "jsonl":
            with open(path, "rb") as f:
                return f.read()
        with pa.memory_map(path) as source:
            return pa.ipc.open_file(source).read_all()
    finally:
        os.remove(path)


class _Wakeup:
    """A pipe that wakes the parent: worker processes write a byte to its write end (inherited
    at fork) for each chunk file they leave, and each task's future writes one when it ends."""

    def __init__(self) -> None:
        self.read_fd, self.write_fd = os.pipe()
        os.set_blocking(self.read_fd, False)
        self._lock = threading.Lock()
        self._open = True

    def note(self, _: object = None) -> None:
        """One byte (a future's done callback, from the pool's thread); a no-op once closed,
        so that a late callback never writes to a file descriptor reused since."""
        with self._lock, contextlib.suppress(OSError):
            if self._open:
                os.write(self.write_fd, b"\0")

    def wait(self, timeout: float) -> None:
        """Until a byte arrives or ``timeout`` seconds passed; reads every byte there."""
        if select.select([self.read_fd], [], [], timeout)[0]:
            with contextlib.suppress(BlockingIOError):
                os.read(self.read_fd, 1 << 12)

    def close(self) -> None:
        with self._lock:
            self._open = False
            os.close(self.read_fd)
            os.close(self.write_fd)


def _parallel_chunks(
    jobs: list[ExportChunksTask], workers: int, fmt: str, counted: list[tuple[int, list[str]]]
) -> Iterator[Prepared]:
    """The prepared chunks of every partition in partition order, read by ``workers`` fork
    workers at once: a partition's chunks are yielded as its task leaves them, so the
    parent writes while the workers read. ``counted``: each task's result, once all ended."""
    wakeup = _Wakeup()
    try:
        for job in jobs:
            job.notify = wakeup.write_fd
        with task_futures(jobs, workers) as futures:  # type: ignore[arg-type]
            for fut in futures:
                fut.add_done_callback(wakeup.note)
            for job, fut in zip(jobs, futures, strict=True):
                i = 0
                while _await_chunk(chunk_path(job.directory, job.partition, i), fut, wakeup):
                    with phase("ipc read"):
                        ready = _read_chunk_file(chunk_path(job.directory, job.partition, i), fmt)
                    yield ready
                    del ready
                    i += 1
                counted.append(fut.result())  # a failed task raises here
    finally:
        wakeup.close()


def _await_chunk(path: str, fut: cf.Future[Any], wakeup: _Wakeup) -> bool:
    """Whether the chunk file at ``path`` exists: waits until it does or its task ended."""
    with phase("export wait"):
        while not os.path.exists(path):
            if fut.done():
                return os.path.exists(path)  # renamed just before the task ended
            wakeup.wait(0.5)  # a worker's note or a task's end; the timeout: a safety net
    return True


def export_state(
    path: str,
    operator: str | int = 0,
    store: str | None = None,
    join_side: str | None = None,
    state_var: str | None = None,
    timers: bool = False,
    batch: int | None = None,
    out_url: str = "",
    overwrite: bool = False,
    *,
    verify: bool = True,
    memory: str | int | None = None,
    engine: Any = None,
    workers: int | None = None,
) -> dict[str, Any]:
    """Export from a checkpoint (operator id) or a savepoint (uid or original operator id).

    Read and written in chunks within ``memory`` (bytes or ``"512M"``; default as the local
    engine's, :mod:`statectl.engine`), through a local file uploaded atomically. ``engine``:
    the Spark engine reads one partition per Spark task (None: here, one partition per task
    of ``workers`` fork workers, each within its share of ``memory``, ``memory / (workers +
    1)``: the parent holds one chunk at a time). The output is the bytes a serial export
    (``workers=1``) writes under that share (Parquet's row groups are the chunks read)."""
    fmt = format_of(out_url)
    io, out = FileIO.for_url(out_url)
    hint = f"pass {wording('--overwrite', 'overwrite=True')} to replace it"
    if not overwrite and io.exists(out):  # before any reading
        raise StatectlError("already exists; refusing to overwrite", out, hint)
    table_name = selection_table(store, join_side, state_var, timers)
    handle = handle_of(open_source(path, verify=verify), batch)
    schema = handle.schema(operator, table_name, join_side=join_side)  # checks the selection
    on_spark = getattr(engine, "name", "local") == "spark"
    local = Engine.of(memory, workers)
    info = handle.operator(operator)
    with spill_dir() as scratch:
        output = os.path.join(scratch, "export.out")
        with open(output, "wb") as f:
            if on_spark or not _worth_workers(handle, info, table_name, local.workers):
                chunks = (
                    _parts_on(engine, handle, operator, table_name, join_side)
                    if on_spark
                    else handle.chunks(
                        operator,
                        table_name,
                        join_side=join_side,
                        budget=local.memory,
                        scratch=scratch,
                    )
                )
                columns: list[str] = []
                rows = write_chunks(_or_empty(chunks, schema, join_side, columns), fmt, f)
            else:
                # One share of the budget per worker and one for the parent (the chunk it writes).
                share = max(1, local.memory // (local.workers + 1))
                jobs = [
                    ExportChunksTask(
                        handle, operator, table_name, join_side, p, fmt, scratch, share
                    )
                    for p in range(info.partitions)
                ]
                rows, columns = _write_parallel(jobs, local.workers, schema, join_side, fmt, f)
        with phase("upload"):
            io.put_atomic(output, out, overwrite=overwrite, overwrite_hint=hint)
    flush_phases()  # the parent's own phases (its writes): no task flushes them
    return {
        "path": io.url(out),
        "format": fmt,
        "rows": rows,
        "columns": columns,
        "engine": "spark" if on_spark else "local",
    }


def _write_parallel(
    jobs: list[ExportChunksTask],
    workers: int,
    schema: pa.Schema,
    join_side: str | None,
    fmt: str,
    out: BinaryIO,
) -> tuple[int, list[str]]:
    """The partitions read by ``jobs`` on ``workers`` and written to ``out`` in order (the
    bytes the serial export writes from chunks of the same size); returns (rows, columns)."""
    counted: list[tuple[int, list[str]]] = []

    def chunks() -> Generator[Prepared, None, None]:
        yield from _parallel_chunks(jobs, workers, fmt, counted)
        if not any(columns for _, columns in counted):  # no chunks at all
            yield prepare(_empty(schema, join_side), fmt)

    written = chunks()
    try:
        write_prepared(written, fmt, out)
    finally:
        written.close()  # a failed write: the workers are killed before the scratch goes
    columns = next((c for _, c in reversed(counted) if c), None)
    return sum(r for r, _ in counted), columns or _empty(schema, join_side).column_names


# Below this much state on disk a fork pool's start costs more than the workers save (a
# pytest process forks in ~50 ms; the export of a small fixture takes ~20 ms).
_PARALLEL_MIN_BYTES = 32 << 20


def _worth_workers(
    handle: StateHandle, info: OperatorInfo, table: str | None, workers: int
) -> bool:
    """Whether the export reads its partitions in fork workers: several of each, the state on
    this machine's disks, and enough of it (bytes on disk) to pay for starting them."""
    if workers < 2 or info.partitions < 2 or not handle.on_local_disk():
        return False
    try:
        on_disk = sum(handle.partition_bytes(info, info.table(table)))
    except StatectlError:  # a table the size listing does not name: the bytes are unknown
        return True
    return on_disk >= _PARALLEL_MIN_BYTES


def _empty(schema: pa.Schema, join_side: str | None) -> pa.Table:
    empty = schema.empty_table()
    return join_side_view(empty) if join_side else empty


def _or_empty(
    chunks: Iterator[pa.Table], schema: pa.Schema, join_side: str | None, columns: list[str]
) -> Iterator[pa.Table]:
    """The chunks, or one empty table of ``schema`` when there are none (``columns``: filled
    with the column names)."""
    for c in chunks:
        columns[:] = c.column_names
        yield c
    if not columns:
        empty = _empty(schema, join_side)
        columns[:] = empty.column_names
        yield empty

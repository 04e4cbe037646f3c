"""Use case ``export``: write one selection of state to Parquet, JSON lines or CSV."""

from __future__ import annotations

import contextlib
import datetime as dt
import io as _io
import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, BinaryIO

import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq

from statectl.engine import Engine, spill_dir
from statectl.errors import StatectlError, wording
from statectl.io import FileIO
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
    row group, JSON lines, CSV rows under one header); returns the row count.

    The writer is closed here on every path: left to the garbage collector after a failure, a
    ParquetWriter closes itself after ``out`` is closed and prints a traceback on stderr."""
    rows = 0
    writer: Any = None
    try:
        for table in chunks:
            rows += table.num_rows
            writer = _write_chunk(writer, table, fmt, out)
    except BaseException:
        if writer is not None:
            with contextlib.suppress(Exception):  # the output is discarded anyway
                writer.close()
        raise
    if writer is not None:
        writer.close()
    return rows


def _write_chunk(writer: Any, table: pa.Table, fmt: str, out: BinaryIO) -> Any:
    """One chunk written; returns the writer (made on the first chunk) that writes the next."""
    if fmt == "parquet":
        table = exportable(table)
        writer = writer or pq.ParquetWriter(out, table.schema)
        writer.write_table(table)
    elif fmt == "jsonl":
        out.write(encode_table(table, fmt))
    elif fmt == "csv":
        flat = _nested_as_text(_flatten_all(exportable(table)))
        writer = writer or pacsv.CSVWriter(out, flat.schema)
        writer.write_table(flat)
    else:
        raise StatectlError(f"unknown output format {fmt!r}; use .parquet, .jsonl or .csv")
    return writer


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
) -> dict[str, Any]:
    """Export from a checkpoint (operator id) or a savepoint (uid or original operator id).

    Read and written in chunks within ``memory`` (bytes or ``"512M"``; default as the local
    engine's, :mod:`statectl.engine`), through a local file uploaded atomically. ``engine``:
    the Spark engine reads one partition per Spark task (None: here)."""
    fmt = format_of(out_url)
    io, out = FileIO.for_url(out_url)
    hint = f"pass {wording('--overwrite', 'overwrite=True')} to replace it"
    if not overwrite and io.exists(out):  # before any reading
        raise StatectlError("already exists; refusing to overwrite", out, hint)
    table_name = selection_table(store, join_side, state_var, timers)
    handle = handle_of(open_source(path, verify=verify), batch)
    schema = handle.schema(operator, table_name, join_side=join_side)  # checks the selection
    on_spark = getattr(engine, "name", "local") == "spark"
    budget = Engine.of(memory, 1).memory
    with spill_dir() as scratch:
        if on_spark:
            chunks = _parts_on(engine, handle, operator, table_name, join_side)
        else:
            chunks = handle.chunks(
                operator, table_name, join_side=join_side, budget=budget, scratch=scratch
            )
        local = os.path.join(scratch, "export.out")
        columns: list[str] = []
        with open(local, "wb") as f:
            rows = write_chunks(_or_empty(chunks, schema, join_side, columns), fmt, f)
        io.put_atomic(local, out, overwrite=overwrite, overwrite_hint=hint)
    return {
        "path": io.url(out),
        "format": fmt,
        "rows": rows,
        "columns": columns,
        "engine": "spark" if on_spark else "local",
    }


def _or_empty(
    chunks: Iterator[pa.Table], schema: pa.Schema, join_side: str | None, columns: list[str]
) -> Iterator[pa.Table]:
    """The chunks, or one empty table of ``schema`` when there are none (``columns``: filled
    with the column names)."""
    for c in chunks:
        columns[:] = c.column_names
        yield c
    if not columns:
        empty = schema.empty_table()
        empty = join_side_view(empty) if join_side else empty
        columns[:] = empty.column_names
        yield empty

"""Streamed ``with_state`` input: rows placed by partition as they arrive, kept in Arrow IPC
files (exact types, no conversion) in a local temporary directory until the savepoint is
written, so an input larger than memory is held one record batch (and later one partition)
at a time."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from typing import Any

import pyarrow as pa


class Spill:
    def __init__(self, schema: pa.Schema) -> None:
        self.schema = schema
        self.dir = tempfile.mkdtemp(prefix="statectl-with-state-")
        self._writers: dict[int, Any] = {}
        self.rows = 0

    def _path(self, partition: int) -> str:
        return os.path.join(self.dir, f"part-{partition:05d}.arrow")

    def add(self, partition: int, table: pa.Table) -> None:
        writer = self._writers.get(partition)
        if writer is None:
            writer = pa.ipc.new_file(self._path(partition), self.schema)
            self._writers[partition] = writer
        writer.write_table(table.cast(self.schema))
        self.rows += table.num_rows

    def close(self) -> None:
        for writer in self._writers.values():
            writer.close()
        self._writers.clear()

    def partition(self, partition: int) -> pa.Table:
        path = self._path(partition)
        if not os.path.exists(path):
            return self.schema.empty_table()
        with pa.memory_map(path) as source:
            return pa.ipc.open_file(source).read_all()

    def remove(self) -> None:
        self.close()
        shutil.rmtree(self.dir, ignore_errors=True)


def is_stream(data: Any) -> bool:
    """Input ``with_state`` reads a record batch at a time: a ``RecordBatchReader``, a
    ``pyarrow.dataset`` (anything with ``to_batches`` that is not a Table), a Spark DataFrame,
    or an iterator or generator of record batches, Arrow tables or pandas DataFrames."""
    if isinstance(data, (pa.Table, pa.RecordBatch, str, bytes, dict)):
        return False
    if hasattr(data, "columns") and hasattr(data, "to_dict"):  # pandas
        return False
    if is_spark_dataframe(data):  # streamed a Spark partition at a time
        return True
    if isinstance(data, pa.RecordBatchReader) or hasattr(data, "to_batches"):
        return True
    return isinstance(data, Iterator) or (hasattr(data, "__iter__") and isinstance(data, list))


def is_spark_dataframe(data: Any) -> bool:
    return hasattr(data, "mapInArrow") and hasattr(data, "toLocalIterator")


def spark_chunks(df: Any) -> Iterator[pa.Table]:
    """A Spark DataFrame as Arrow tables, one Spark partition on the driver at a time: each
    executor serializes its Arrow batches to IPC bytes (``mapInArrow``, the same Arrow types
    ``toArrow`` gives), and ``toLocalIterator`` fetches them a partition per job, so the
    driver never holds the whole DataFrame."""

    def to_ipc(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        import pyarrow as pa  # runs on the executors

        for batch in batches:
            sink = pa.BufferOutputStream()
            with pa.ipc.new_stream(sink, batch.schema) as writer:
                writer.write_batch(batch)
            yield pa.RecordBatch.from_pydict(
                {"ipc": [sink.getvalue().to_pybytes()]}, schema=pa.schema([("ipc", pa.binary())])
            )

    for row in df.mapInArrow(to_ipc, "ipc binary").toLocalIterator(prefetchPartitions=False):
        yield pa.ipc.open_stream(pa.py_buffer(row["ipc"])).read_all()


def chunks(data: Any) -> Iterator[Any]:
    if is_spark_dataframe(data):
        yield from spark_chunks(data)
    elif isinstance(data, pa.RecordBatchReader):
        yield from data
    elif hasattr(data, "to_batches"):
        yield from data.to_batches()
    else:
        yield from data

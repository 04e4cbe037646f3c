"""Writing a store partition that does not fit in memory, with the bytes of a whole write.

* :class:`CodecStream`: Spark's codec framing written incrementally (HDFS snapshots, RocksDB
  changelogs), the same bytes as :func:`~statectl.codecs.compression.compress_stream` of
  everything at once.
* :func:`sorted_runs` and :func:`merge_runs`: an external merge sort of entries into RocksDB's
  bytewise key order, for the SST writer (RocksDB zip+SST snapshots).
* :func:`write_records_streamed`: a record stream file written a batch at a time.
"""

from __future__ import annotations

import itertools
import os
import posixpath
import uuid
from collections.abc import Iterable, Iterator
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import zstandard

from statectl.backends.base import Batches
from statectl.backends.writers import EMPTY_RECORDS, _bytewise_order
from statectl.codecs.compression import SNAPPY_HEADER, ZSTD_LEVEL, compress_stream
from statectl.codecs.lz4block import DEFAULT_BLOCK_SIZE, HEADER
from statectl.codecs.phases import phase
from statectl.codecs.records import record_stream
from statectl.io import FileIO
from statectl.native_memory import release_above

# Bytes of memory a build needs per byte of spilled state when it writes a partition from
# memory (arrays, the interleaved records, the compressed file; Python objects for the SST
# writer): generous, measured on aggregations.
BUILD_FACTOR = 6
# Bytes per batch of a sorted run: a k-way merge reads one batch of each run at a time.
RUN_BATCH_BYTES = 256 << 10


class CodecStream:
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
            # Pledging the size keeps it in the frame header, as a one-shot frame has it.
            self.zstd = zstandard.ZstdCompressor(level=ZSTD_LEVEL).compressobj(size=size or -1)

    def write(self, data: bytes | memoryview) -> None:
        if self.zstd is not None:
            self.out.write(self.zstd.compress(data))
            return
        assert self.block is not None
        view = memoryview(data).cast("B")
        if self.buf:  # first fill the block begun by the last write
            room = self.block - len(self.buf)
            self.buf += view[:room]
            view = view[room:]
            if len(self.buf) < self.block:
                return
            self._emit(memoryview(self.buf), last=False)
            self.buf = bytearray()
        # Whole blocks straight from the caller's bytes (no copy); the rest waits.
        whole = len(view) // self.block * self.block
        if whole:
            self._emit(view[:whole], last=False)
        self.buf += view[whole:]

    def _emit(self, raw: bytes | memoryview, last: bool) -> None:
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


def data_size(a: pa.Array) -> int:
    """The bytes of a large_binary array's values."""
    offsets = np.frombuffer(a.buffers()[1], dtype=np.int64)[a.offset : a.offset + len(a) + 1]
    return int(offsets[-1] - offsets[0]) if len(a) else 0


def write_records_streamed(
    io: FileIO, path: str, codec: str, batches: Batches, scratch: str, prefix: bytes = b""
) -> None:
    """A record stream file (HDFS snapshot, changelog v1) of every batch's keys and values (each
    with ``prefix``), compressed a block at a time into a local file, then put at ``path``."""
    # The record stream's size: 8 bytes of lengths, key, value (and prefixes) per entry.
    size = 4 + sum(
        b.num_rows * (8 + 2 * len(prefix)) + data_size(b.column(0)) + data_size(b.column(1))
        for b in batches()
    )
    local = os.path.join(scratch, f"out-{uuid.uuid4()}")
    with open(local, "wb") as out:
        stream = CodecStream(codec, out, size)
        for batch in batches():
            keys, values = batch.column(0), batch.column(1)
            if len(keys):
                with phase("encode records"):
                    records = record_stream(keys, values, prefix=prefix)
                with phase("compress"):
                    stream.write(records)
        with phase("compress"):
            stream.write(EMPTY_RECORDS)
            stream.close()
    try:
        with phase("upload"):
            io.put_atomic(local, path)
    finally:
        os.remove(local)


def empty_changelogs(io: FileIO, store_dir: str, codec: str, version: int) -> None:
    """Empty ``1..version-1.changelog`` files: Spark replays a store without a zip from 1."""
    empty = compress_stream(codec, EMPTY_RECORDS)
    for v in range(1, version):
        io.write_atomic(posixpath.join(store_dir, f"{v}.changelog"), empty)


def run_rows(path: str) -> int:
    with pa.OSFile(path, "rb") as f:
        return sum(b.num_rows for b in pa.ipc.open_stream(f))


def sorted_runs(batches: Iterable[pa.RecordBatch], scratch: str, budget: int) -> list[str]:
    """The batches' rows cut into runs that fit ``budget``, each sorted bytewise by key."""
    runs: list[str] = []
    pending: list[pa.RecordBatch] = []
    size = 0
    for batch in batches:
        pending.append(batch)
        size += batch.nbytes
        if size * BUILD_FACTOR > budget:
            runs.append(_write_run(pending, scratch))  # empties pending
            size = 0
            release_above(budget)  # the run's sorted copy is gone here
    if pending:
        runs.append(_write_run(pending, scratch))
    return runs


def _write_run(pending: list[pa.RecordBatch], scratch: str) -> str:
    with phase("run sort"):
        table = pa.Table.from_batches(pending).combine_chunks()
        pending.clear()  # the caller's batches: two copies of the run at most, not three
        order = _bytewise_order(table.column(0).chunk(0).cast(pa.large_binary()))
        sorted_table = table.take(order)
        del table, order
    path = os.path.join(scratch, f"run-{uuid.uuid4()}.arrow")
    # Small batches: the merge holds one batch of every run at once.
    per_row = max(1, sorted_table.nbytes // max(1, sorted_table.num_rows))
    rows = max(64, RUN_BATCH_BYTES // per_row)
    with (
        phase("run write"),
        pa.OSFile(path, "wb") as f,
        pa.ipc.new_stream(f, sorted_table.schema) as w,
    ):
        for b in sorted_table.to_batches(max_chunksize=rows):
            w.write_batch(b)
    return path


def _run_batches(path: str) -> Iterator[tuple[pa.Array, pa.Array]]:
    with pa.OSFile(path, "rb") as f:
        for batch in pa.ipc.open_stream(f):
            if batch.num_rows:
                yield batch.column(0), batch.column(1)


def merge_runs(runs: list[str]) -> Iterator[tuple[pa.Array, pa.Array]]:
    """A k-way merge of sorted runs (keys are unique within a store), a batch at a time: the
    rows of every run's current batch up to the smallest of their last keys are exactly the
    rows left at or below it (runs are sorted), so they are merged and yielded; the run that
    held that key moves to its next batch. Vectorized: no Python object per row."""
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
        with phase("merge"):  # never across the yield: the consumer's phase resumes there
            bound = min(keys[-1].as_py() for keys, _ in heads.values())
            segments = _take_up_to(heads, streams, pa.scalar(bound, pa.large_binary()))
            merged = _merge_segments(segments)
        yield merged


def _take_up_to(
    heads: dict[int, tuple[pa.Array, pa.Array]],
    streams: list[Iterator[tuple[pa.Array, pa.Array]]],
    limit: pa.Scalar,
) -> list[tuple[pa.Array, pa.Array]]:
    """Every head's rows at or below ``limit`` (the non-empty ones, each sorted); heads move
    on past them."""
    taken = []
    for i, (keys, values) in list(heads.items()):
        take = pc.sum(pc.less_equal(keys, limit)).as_py() or 0
        if take:
            taken.append((keys.slice(0, take), values.slice(0, take)))
        if take < len(keys):
            heads[i] = keys.slice(take), values.slice(take)
        elif (following := next(streams[i], None)) is not None:
            heads[i] = following
        else:
            del heads[i]
    return taken


def _merge_segments(segments: list[tuple[pa.Array, pa.Array]]) -> tuple[pa.Array, pa.Array]:
    """Sorted segments of unique keys as one sorted batch. Segments that follow each other
    (runs over disjoint key ranges, as a presorted input gives) are only concatenated;
    interleaved ones take Arrow's sort, which is quickest on a few presorted runs (a
    word-column sort starts over on every batch: issue 27, 3x slower here)."""
    if len(segments) == 1:
        return segments[0]
    segments.sort(key=lambda segment: segment[0][0].as_py())
    keys = pa.concat_arrays([k for k, _ in segments])
    values = pa.concat_arrays([v for _, v in segments])
    if all(a[0][-1].as_py() < b[0][0].as_py() for a, b in itertools.pairwise(segments)):
        return keys, values
    order = pc.sort_indices(keys)
    return keys.take(order), values.take(order)

"""Replay a store partition's records in bounded memory (savepoint, export, migrate).

A partition's live entries are the last record of every key across its snapshot and later
deltas or changelogs (:func:`~statectl.codecs.record_replay.last_writer_wins`). When the
records fit the budget they are replayed in memory, as before. Otherwise an external replay runs:

1. every record is appended, with its sequence number, to one of ``BUCKETS`` spill files
   chosen by a hash of its key (all records of a key meet in one bucket; a delete-range record
   goes to every bucket);
2. each bucket is replayed on its own (last writer wins, deletes and merges honoured) and its
   live entries are appended to spill files by sequence range;
3. each range is read back and ordered by sequence number.

The output is the in-memory replay's, in its order (keys by their last record), a chunk at a
time. Spill files live in the caller's private scratch directory.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import numpy as np
import pyarrow as pa

from statectl.backends.base import VersionRecords
from statectl.backends.hashed_replay import REPLAY_FACTOR, hashed_replay, nbytes
from statectl.backends.overlay_replay import overlay_replay
from statectl.codecs.murmur3 import hash_bytes
from statectl.codecs.record_replay import replay
from statectl.codecs.records import OP_DELETE_RANGE, RecordBatch

BUCKETS = 128
_SCHEMA = pa.schema(
    [
        ("seq", pa.int64()),
        ("op", pa.uint8()),
        ("key", pa.large_binary()),
        ("value", pa.large_binary()),
    ]
)
_LIVE = pa.schema([("seq", pa.int64()), ("key", pa.large_binary()), ("value", pa.large_binary())])
Chunk = tuple[pa.LargeBinaryArray, pa.LargeBinaryArray]


def bounded_replay(
    records: VersionRecords,
    *,
    budget: int,
    max_bytes: int,
    scratch: str,
    merge_delimiter: bytes = b"",
) -> Iterator[Chunk]:
    """The live (key, value) entries of ``records`` (in replay order), about ``max_bytes`` of
    them at a time, holding about ``budget`` bytes (plus one bucket).

    A snapshot and the records after it take the overlay replay
    (:mod:`statectl.backends.overlay_replay`); other puts and deletes (HDFS deltas, most
    changelogs) the hashed replay (:mod:`statectl.backends.hashed_replay`); merges and
    delete-ranges, a collision of key hashes, or more records than the budget has room for
    take the exact replay below. All give the same entries in the same order; the hashed and
    the exact replay in the same chunks too."""

    def general(chunks: Iterator[RecordBatch]) -> Iterator[Chunk]:
        return hashed_replay(
            chunks,
            budget=budget,
            max_bytes=max_bytes,
            scratch=scratch,
            exact=lambda it: exact_replay(
                it,
                budget=budget,
                max_bytes=max_bytes,
                scratch=scratch,
                merge_delimiter=merge_delimiter,
            ),
        )

    if records.base is not None and records.overlay is not None:
        yield from overlay_replay(
            records.base,
            records.overlay,
            budget=budget,
            general=lambda: general(records.chunks()),
        )
    else:
        yield from general(records.chunks())


def exact_replay(
    chunks: Iterator[RecordBatch],
    *,
    budget: int,
    max_bytes: int,
    scratch: str,
    merge_delimiter: bytes = b"",
) -> Iterator[Chunk]:
    """:func:`bounded_replay` by the keys' bytes: in memory when the records fit the budget
    (``REPLAY_FACTOR``), else through hash buckets on disk (the module docstring)."""
    pending: list[RecordBatch] = []
    size = 0
    events = 0
    for chunk in chunks:
        pending.append(chunk)
        size += nbytes(chunk)
        events += len(chunk)
        if size * REPLAY_FACTOR > budget:
            break
    rows = max(16, max_bytes // max(1, size // max(1, events)))
    if size * REPLAY_FACTOR <= budget:
        keys, values = replay(pending, merge_delimiter)[:2]
        for i in range(0, len(keys), rows):
            yield keys.slice(i, rows), values.slice(i, rows)
        return
    yield from _external(pending, chunks, rows, scratch, merge_delimiter)


class _Files:
    """Arrow IPC stream files ``<directory>/<n>.arrow``, opened on first write."""

    def __init__(self, directory: str, schema: pa.Schema) -> None:
        self.directory, self.schema = directory, schema
        self.open: dict[int, tuple[pa.NativeFile, pa.ipc.RecordBatchStreamWriter]] = {}
        os.makedirs(directory, mode=0o700, exist_ok=True)

    def path(self, n: int) -> str:
        return os.path.join(self.directory, f"{n}.arrow")

    def write(self, n: int, batch: pa.RecordBatch) -> None:
        if n not in self.open:
            f = pa.OSFile(self.path(n), "wb")
            self.open[n] = (f, pa.ipc.new_stream(f, self.schema))
        self.open[n][1].write_batch(batch)

    def close(self) -> None:
        for f, w in self.open.values():
            w.close()
            f.close()

    def read(self, n: int) -> pa.Table:
        """One file's rows (read, not memory-mapped: mapped pages would count as ours)."""
        if not os.path.exists(self.path(n)):
            return self.schema.empty_table()
        with pa.OSFile(self.path(n), "rb") as f:
            table = pa.ipc.open_stream(f).read_all()
        os.remove(self.path(n))
        return table


def _external(
    pending: list[RecordBatch],
    rest: Iterator[RecordBatch],
    rows: int,
    scratch: str,
    merge_delimiter: bytes,
) -> Iterator[Chunk]:
    buckets = _Files(os.path.join(scratch, "buckets"), _SCHEMA)
    seq = 0
    try:
        for chunk in _chain(pending, rest):
            n = len(chunk)
            seqs = np.arange(seq, seq + n, dtype=np.int64)
            seq += n
            table = pa.table(
                [pa.array(seqs), pa.array(chunk.ops), chunk.keys, chunk.values], schema=_SCHEMA
            )
            ids = (hash_bytes(chunk.keys, np.zeros(n, dtype=np.uint32)) % BUCKETS).astype(np.int64)
            ids[chunk.ops == OP_DELETE_RANGE] = -1  # a range may cover keys of every bucket
            _split(table, ids, buckets)
    finally:
        buckets.close()
    # Live entries by sequence range: a range holds at most ``rows`` of them.
    ranges = _Files(os.path.join(scratch, "ranges"), _LIVE)
    try:
        for b in range(BUCKETS):
            t = buckets.read(b)
            if not t.num_rows:
                continue
            ops = t.column("op").to_numpy()
            batch = RecordBatch(
                ops, t.column("key").combine_chunks(), t.column("value").combine_chunks()
            )
            keys, values, at = replay([batch], merge_delimiter)
            live_seq = t.column("seq").to_numpy()[at]
            live = pa.table([pa.array(live_seq), keys, values], schema=_LIVE)
            _split(live, live_seq // rows, ranges)
    finally:
        ranges.close()
    for r in range(seq // rows + 1):
        t = ranges.read(r)
        if not t.num_rows:
            continue
        order = np.argsort(t.column("seq").to_numpy(), kind="stable")
        t = t.take(pa.array(order))
        yield t.column("key").combine_chunks(), t.column("value").combine_chunks()


def _chain(pending: list[RecordBatch], rest: Iterator[RecordBatch]) -> Iterator[RecordBatch]:
    while pending:
        yield pending.pop(0)  # released as it is spilled
    yield from rest


def _split(table: pa.Table, ids: np.ndarray, out: _Files) -> None:
    """Append each id's rows (in order) to its file; id -1: to every bucket file."""
    everywhere = ids < 0
    if everywhere.any():
        for b in range(BUCKETS):
            # Keep the replay order inside each bucket: the shared rows go in at their places.
            mask = everywhere | (ids == b)
            part = table.filter(pa.array(mask))
            if part.num_rows:
                for batch in part.to_batches():
                    out.write(b, batch)
        return
    order = np.argsort(ids, kind="stable")
    counts = np.bincount(ids, minlength=int(ids.max()) + 1 if len(ids) else 0)
    ordered = table.take(pa.array(order))
    start = 0
    for n, c in enumerate(counts.tolist()):
        if c:
            for batch in ordered.slice(start, c).to_batches():
                out.write(n, batch)
        start += c

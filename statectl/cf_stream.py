"""Column-family target partitions larger than the budget, encoded without holding them.

A restore normally encodes a transformWithState partition (or a join's at state format 3/4)
whole (:func:`~statectl.tws_encode.encode_operator_partition`,
:func:`~statectl.join_state.encode_partition`). When a partition's spilled rows do not fit
``--memory``, its tables are encoded a chunk at a time instead: rows that stand alone (value
state, map state, timers, every join row at format 3) a spilled batch at a time; rows that
merge by key (a list state's elements, a format 4 join's values) bucket by bucket, split by a
hash of their encoded key, so that every row of a key meets in one bucket. The encoded entries
go to a spill file, which is sorted in runs that fit the budget and merged into the RocksDB SST
writer, as key-value stores are (:meth:`statectl.backends.base.Backend.write_streamed`). The
entries are the same as the whole encoding's.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from statectl.backends.streamed import BUILD_FACTOR, merge_runs
from statectl.codecs.murmur3 import hash_bytes
from statectl.join_state import join_key_bytes
from statectl.spill import (
    SpilledTable,
    SpillWriters,
    read_spills,
    sorted_runs,
    split_by_partition,
)
from statectl.state import read_le_int
from statectl.tws_encode import TableEncoder

_ENTRIES = pa.schema([("key", pa.large_binary()), ("value", pa.large_binary())])
_SEED = 17  # any seed: buckets only need to group equal keys


@dataclass(frozen=True)
class EncodedRuns:
    """A partition's encoded entries in sorted run files: what the SST writer merges."""

    runs: list[str]
    num_keys: int
    num_internal_keys: int

    def batches(self) -> Iterator[tuple[pa.Array, pa.Array]]:
        return merge_runs(self.runs)


def fits(spilled: dict[str, SpilledTable], budget: int) -> bool:
    """Whether a partition can be encoded whole within ``budget``."""
    return sum(t.nbytes for t in spilled.values()) * BUILD_FACTOR <= budget


class _Sink:
    """Encoded entries appended to one spill file, counted; sorted into runs at the end."""

    def __init__(self, scratch: str, internal_ids: np.ndarray) -> None:
        self.scratch, self.internal_ids = scratch, internal_ids
        self.out = SpillWriters(os.path.join(scratch, "encoded"), _ENTRIES)
        self.keys = self.internal = 0

    def emit(self, entries: Iterable[tuple[pa.Array, pa.Array]]) -> None:
        for keys, values in entries:
            if not len(keys):
                continue
            keys, values = keys.cast(pa.large_binary()), values.cast(pa.large_binary())
            self.out.write(0, pa.record_batch([keys, values], schema=_ENTRIES))
            self.keys += len(keys)
            self.internal += int(np.isin(read_le_int(keys, 0, 2), self.internal_ids).sum())

    def runs(self, budget: int) -> EncodedRuns:
        """The entries in sorted runs (after :attr:`out` is closed)."""
        path = os.path.join(self.scratch, "encoded", "0.arrow")
        runs = sorted_runs([path], self.scratch, budget) if os.path.exists(path) else []
        return EncodedRuns(runs, self.keys, self.internal)


def encode_spilled(
    spilled: dict[str, SpilledTable],
    kinds: dict[str, str],
    encoder: TableEncoder,
    internal_ids: np.ndarray,
    scratch: str,
    budget: int,
) -> EncodedRuns:
    """transformWithState: every entry of one partition's tables (``spilled``), encoded a chunk
    at a time into sorted runs under ``scratch``; ``internal_ids``: the column family ids of
    Spark's internal families (counted apart in the snapshot's metadata)."""
    encoder.check(spilled)
    sink = _Sink(scratch, internal_ids)
    try:
        for name, table in spilled.items():
            kind = kinds[name]
            if kind == "ListState":
                key_of = functools.partial(encoder.list_key, name)
                for group in _key_groups(table, key_of, scratch, budget):
                    sink.emit(encoder.encode(name, kind, group))
                    sink.emit(encoder.row_counters())
            else:
                for batch in table.batches():
                    sink.emit(encoder.encode(name, kind, pa.Table.from_batches([batch])))
        sink.emit(encoder.row_counters())
    finally:
        sink.out.close()
    return sink.runs(budget)


def encode_join_spilled(
    fmt: int,
    spilled: dict[str, SpilledTable],
    encode: Callable[[dict[str, pa.Table]], tuple[pa.Array, pa.Array]],
    scratch: str,
    budget: int,
) -> EncodedRuns:
    """A join at state format 3 or 4 from one partition's format 2 tables (``spilled``),
    ``encode`` (:func:`statectl.join_state.encode_partition`) a chunk at a time: at format 3
    each row stands alone; format 4 merges a join key's values, so its ``keyWithIndexToValue``
    rows go in buckets that hold every value of their keys (and the other stores are derived)."""
    empty = {name: t.schema.empty_table() for name, t in spilled.items()}
    sink = _Sink(scratch, np.zeros(0, np.int64))
    try:
        for name, table in spilled.items():
            if fmt == 3:
                chunks: Iterable[pa.Table] = (pa.Table.from_batches([b]) for b in table.batches())
            elif name.endswith("-keyWithIndexToValue"):
                chunks = _key_groups(table, join_key_bytes, scratch, budget)
            else:
                continue  # format 4 keeps no count store: derived from the values
            for chunk in chunks:
                sink.emit([encode({**empty, name: chunk})])
    finally:
        sink.out.close()
    return sink.runs(budget)


def _key_groups(
    table: SpilledTable, key_of: Callable[[pa.Table], pa.Array], scratch: str, budget: int
) -> Iterator[pa.Table]:
    """``table``'s rows in buckets that each hold every row of their keys (``key_of``: the
    rows' keys as bytes)."""
    buckets = max(2, table.nbytes * BUILD_FACTOR // max(1, budget) + 1)
    directory = os.path.join(scratch, f"groups-{len(os.listdir(scratch))}")
    writers = SpillWriters(directory, table.schema)
    try:
        for batch in table.batches():
            rows = pa.Table.from_batches([batch])
            keys = key_of(rows)
            h = hash_bytes(keys, np.full(len(keys), _SEED, np.uint32))
            split_by_partition(rows, (h % buckets).astype(np.int64), writers)
    finally:
        writers.close()
    for b in range(buckets):
        batches = list(read_spills([os.path.join(directory, f"{b}.arrow")]))
        if batches:
            yield pa.Table.from_batches(batches, table.schema)

"""transformWithState target partitions larger than the budget, encoded without holding them.

A restore normally encodes a transformWithState partition whole (:func:`~statectl.tws_encode.
encode_operator_partition`). When a partition's spilled rows do not fit ``--memory``, its
tables are encoded a chunk at a time instead: value state, map state and timers a spilled batch
at a time (each row stands alone); a list state bucket by bucket, the rows split by a hash of
their encoded key, so that every element of a key meets in one bucket (its entry merges them
and its row counter counts them). The encoded entries go to a spill file, which is sorted in
runs that fit the budget and merged into the RocksDB SST writer, as key-value stores are
(:meth:`statectl.engine.StoreFormat.write_streamed`). The entries are the same as the whole
encoding's.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from statectl.codecs.murmur3 import hash_bytes
from statectl.engine import (
    BUILD_FACTOR,
    SpilledTable,
    SpillWriters,
    merge_runs,
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

    def pairs(self) -> Iterator[tuple[bytes, bytes]]:
        return merge_runs(self.runs)


def fits(spilled: dict[str, SpilledTable], budget: int) -> bool:
    """Whether a partition can be encoded whole within ``budget``."""
    return sum(t.nbytes for t in spilled.values()) * BUILD_FACTOR <= budget


def encode_spilled(
    spilled: dict[str, SpilledTable],
    kinds: dict[str, str],
    encoder: TableEncoder,
    internal_ids: np.ndarray,
    scratch: str,
    budget: int,
) -> EncodedRuns:
    """Every entry of one partition's tables (``spilled``), encoded a chunk at a time into
    sorted runs under ``scratch``; ``internal_ids``: the column family ids of Spark's internal
    families (counted apart in the snapshot's metadata)."""
    encoder.check(spilled)
    out = SpillWriters(os.path.join(scratch, "encoded"), _ENTRIES)
    counts = [0, 0]  # entries, entries of internal families

    def emit(entries: Iterable[tuple[pa.Array, pa.Array]]) -> None:
        for keys, values in entries:
            if not len(keys):
                continue
            keys, values = keys.cast(pa.large_binary()), values.cast(pa.large_binary())
            out.write(0, pa.record_batch([keys, values], schema=_ENTRIES))
            ids = read_le_int(keys, 0, 2)
            counts[0] += len(keys)
            counts[1] += int(np.isin(ids, internal_ids).sum())

    try:
        for name, table in spilled.items():
            kind = kinds[name]
            if kind == "ListState":
                for group in _key_groups(name, table, encoder, scratch, budget):
                    emit(encoder.encode(name, kind, group))
                    emit(encoder.row_counters())
            else:
                for batch in table.batches():
                    emit(encoder.encode(name, kind, pa.Table.from_batches([batch])))
        emit(encoder.row_counters())
    finally:
        out.close()
    path = os.path.join(scratch, "encoded", "0.arrow")
    runs = sorted_runs([path], scratch, budget) if os.path.exists(path) else []
    return EncodedRuns(runs, counts[0], counts[1])


def _key_groups(
    name: str, table: SpilledTable, encoder: TableEncoder, scratch: str, budget: int
) -> Iterator[pa.Table]:
    """A list state's rows in buckets that each hold every element of their keys."""
    buckets = max(2, table.nbytes * BUILD_FACTOR // max(1, budget) + 1)
    directory = os.path.join(scratch, f"list-{len(os.listdir(scratch))}")
    writers = SpillWriters(directory, table.schema)
    try:
        for batch in table.batches():
            rows = pa.Table.from_batches([batch])
            keys = encoder.list_key(name, rows)
            h = hash_bytes(keys, np.full(len(keys), _SEED, np.uint32))
            split_by_partition(rows, (h % buckets).astype(np.int64), writers)
    finally:
        writers.close()
    for b in range(buckets):
        batches = list(read_spills([os.path.join(directory, f"{b}.arrow")], budget))
        if batches:
            yield pa.Table.from_batches(batches, table.schema)

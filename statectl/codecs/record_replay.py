"""Replaying record batches in memory: last writer wins, deletes, delete-ranges and merges
(list state) honoured, as Spark's state stores apply deltas and changelogs.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from statectl.codecs.record_scan import EMPTY
from statectl.codecs.records import (
    OP_DELETE,
    OP_DELETE_RANGE,
    OP_MERGE,
    OP_PUT,
    RecordBatch,
    as_large_binary,
)


# -- replay -----------------------------------------------------------------------------------
def last_writer_wins(
    batches: list[RecordBatch], merge_delimiter: bytes = b"", unique: bool = False
) -> tuple[pa.LargeBinaryArray, pa.LargeBinaryArray]:
    """Apply batches in order (snapshot first): the live keys and their final values, ordered
    by each key's last record.

    Vectorized for puts and deletes: dictionary-encode all keys, keep each key's last record,
    drop removals. Delete-range records become deletes of every known key in ``[begin, end)``
    (bytewise, like RocksDB's comparator). Keys with MERGE records (list state) are resolved in
    a loop: the value after the last put (none after a delete), then each operand appended
    with ``merge_delimiter`` between, as RocksDB's StringAppendOperator does.
    ``unique=True`` promises that a single all-put batch has no repeated key (a snapshot).
    """
    keys, values, _ = replay(batches, merge_delimiter, unique)
    return keys, values


def replay(
    batches: list[RecordBatch], merge_delimiter: bytes = b"", unique: bool = False
) -> tuple[pa.LargeBinaryArray, pa.LargeBinaryArray, np.ndarray]:
    """:func:`last_writer_wins` plus, per live key, the index of its last record in the
    concatenated batches (what a bounded replay orders its output by)."""
    batches = [b for b in batches if len(b)]
    if not batches:
        return EMPTY, EMPTY, np.zeros(0, dtype=np.int64)
    if unique and len(batches) == 1 and not batches[0].ops.any():
        return batches[0].keys, batches[0].values, np.arange(len(batches[0]), dtype=np.int64)
    keys, values, ops = _concat_batches(batches)
    uniq, ev = _key_events(keys, values, ops)
    final = _last_events(ev, len(uniq))
    merge_kids = np.unique(ev.kid[ev.op == OP_MERGE])
    if len(merge_kids) == 0:
        final = final[ev.op[final] == OP_PUT]
        rows = pa.array(ev.row[final])
        return keys.take(rows), values.take(rows), ev.row[final]
    return _replay_merges(ev, final, merge_kids, uniq, values, merge_delimiter)


def _concat_batches(
    batches: list[RecordBatch],
) -> tuple[pa.LargeBinaryArray, pa.LargeBinaryArray, np.ndarray]:
    keys = _concat([b.keys for b in batches])
    values = _concat([b.values for b in batches])
    return keys, values, np.concatenate([b.ops for b in batches]).astype(np.uint8, copy=False)


def _last_events(ev: _Events, n_keys: int) -> np.ndarray:
    """The last event of every key, in event order."""
    last = np.full(n_keys, -1, dtype=np.int64)
    np.maximum.at(last, ev.kid, np.arange(len(ev.row), dtype=np.int64))
    return np.sort(last[last >= 0])


def _key_events(
    keys: pa.LargeBinaryArray, values: pa.LargeBinaryArray, ops: np.ndarray
) -> tuple[pa.Array, _Events]:
    """The distinct keys, and the records as events on their ids. Delete-range rows turn into
    deletes of the keys they cover."""
    encoded = pc.dictionary_encode(keys)
    uniq = encoded.dictionary
    kid = np.asarray(encoded.indices.to_numpy(zero_copy_only=False), dtype=np.int64)
    ev_row, ev_kid, ev_op = np.arange(len(ops), dtype=np.int64), kid, ops
    ranges = np.flatnonzero(ops == OP_DELETE_RANGE)
    if len(ranges):
        ev_row, ev_kid, ev_op = _expand_ranges(ranges, keys, values, uniq, ev_row, kid, ops)
    return uniq, _Events(ev_row, ev_kid, ev_op)


@dataclass(frozen=True)
class _Events:
    """The replayed records: (row in the concatenated batches, key id, op) per event."""

    row: np.ndarray
    kid: np.ndarray
    op: np.ndarray


def _replay_merges(
    ev: _Events,
    final: np.ndarray,
    merge_kids: np.ndarray,
    uniq: pa.Array,
    values: pa.LargeBinaryArray,
    merge_delimiter: bytes,
) -> tuple[pa.LargeBinaryArray, pa.LargeBinaryArray, np.ndarray]:
    """:func:`replay`'s result when some keys have merge records: their values are combined
    from their records (``_resolve_merges``), the other keys' are their last put."""
    ev_row, ev_kid, ev_op = ev.row, ev.kid, ev.op
    merged = _resolve_merges(merge_kids, ev_row, ev_kid, ev_op, values, merge_delimiter)
    is_merge_key = np.zeros(len(uniq), dtype=bool)
    is_merge_key[merge_kids] = True
    out_kid = ev_kid[final]
    plain = ~is_merge_key[out_kid]
    live = np.where(plain, ev_op[final] == OP_PUT, False)
    merged_values: list[bytes | None] = [merged.get(int(k)) for k in out_kid[~plain]]
    live[~plain] = [v is not None for v in merged_values]
    # Final values: plain rows from ``values``, merged rows from the list, in ``final`` order.
    plain_vals = values.take(pa.array(ev_row[final[plain & live]]))
    merge_vals = pa.array([v for v in merged_values if v is not None], pa.large_binary())
    both = pa.concat_arrays([plain_vals, merge_vals])
    slot = np.empty(int(live.sum()), dtype=np.int64)
    live_plain = plain[live]
    slot[live_plain] = np.arange(int(live_plain.sum()))
    slot[~live_plain] = len(plain_vals) + np.arange(int((~live_plain).sum()))
    return uniq.take(pa.array(out_kid[live])), both.take(pa.array(slot)), ev_row[final[live]]


def _concat(arrays: list[pa.Array]) -> pa.LargeBinaryArray:
    arrays = [as_large_binary(a) for a in arrays]
    return arrays[0] if len(arrays) == 1 else pa.concat_arrays(arrays)


def _expand_ranges(
    ranges: np.ndarray,
    keys: pa.LargeBinaryArray,
    values: pa.LargeBinaryArray,
    uniq: pa.Array,
    ev_row: np.ndarray,
    kid: np.ndarray,
    ops: np.ndarray,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Replace each delete-range row by deletes of every key id in ``[begin, end)``."""
    rows = [ev_row[ops != OP_DELETE_RANGE]]
    kids = [kid[ops != OP_DELETE_RANGE]]
    kinds = [ops[ops != OP_DELETE_RANGE]]
    for r in ranges.tolist():  # delete-range records are rare (a loop per record, not per key)
        begin = keys[r]
        end = values[r]
        covered = pc.and_(pc.greater_equal(uniq, begin), pc.less(uniq, end))
        ids = np.flatnonzero(np.asarray(covered.to_numpy(zero_copy_only=False), dtype=bool))
        rows.append(np.full(len(ids), r, dtype=np.int64))
        kids.append(ids.astype(np.int64))
        kinds.append(np.full(len(ids), OP_DELETE, dtype=np.uint8))
    ev_row = np.concatenate(rows)
    order = np.argsort(ev_row, kind="stable")
    return ev_row[order], np.concatenate(kids)[order], np.concatenate(kinds)[order]


def _resolve_merges(
    merge_kids: np.ndarray,
    ev_row: np.ndarray,
    ev_kid: np.ndarray,
    ev_op: np.ndarray,
    values: pa.LargeBinaryArray,
    delimiter: bytes,
) -> dict[int, bytes | None]:
    """Final value of every key with merges (None = absent): a loop over those keys' events."""
    sel = np.flatnonzero(np.isin(ev_kid, merge_kids))
    row_vals = values.take(pa.array(ev_row[sel])).to_pylist()
    state: dict[int, bytes | None] = {}
    for k, op, v in zip(ev_kid[sel].tolist(), ev_op[sel].tolist(), row_vals, strict=True):
        if op == OP_PUT:
            state[k] = v
        elif op == OP_MERGE:
            cur = state.get(k)
            state[k] = v if cur is None else cur + delimiter + v
        else:
            state[k] = None
    return state

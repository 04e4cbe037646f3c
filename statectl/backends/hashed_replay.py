"""Last writer wins by sorted key hashes: the fast replay of puts and deletes (issue 27).

A partition's live entries are the last record of every key (snapshot first, then the deltas
or changelogs). Where the records hold only puts and deletes, a 64-bit hash of every key
(:mod:`statectl.codecs.key_hash`) is taken as the records stream in, the hashes are sorted
once, and each hash's last record wins (a put: live; a delete: gone). Records whose hashes are
equal have their key bytes compared before anything is emitted; if two differ (a hash
collision, about one in 10^12 for 5M keys) the exact replay runs instead, as it does for merges,
delete-ranges, or more records than the budget has room for (``HASH_BYTES`` each).

The records are held meanwhile: in memory up to an eighth of the budget, the rest appended to one Arrow
file in the caller's scratch directory (one sequential write and read, no buckets). The output
is :func:`statectl.backends.replay.exact_replay`'s exactly: the live entries ordered by their
last record, cut into the same chunks (``rows`` entries each, or by sequence range where the
exact replay would have gone to disk). A snapshot with records after it takes the overlay
replay instead (:mod:`statectl.backends.overlay_replay`): the same entries in the same order,
in the chunks it read.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Callable, Iterator

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from statectl.codecs.key_hash import key_hashes, last_of_each
from statectl.codecs.records import OP_DELETE, OP_PUT, RecordBatch, as_large_binary

# Bytes of memory an in-memory exact replay needs per byte of record data (concatenation, the
# dictionary of keys, event arrays, the result): generous, measured on aggregations.
REPLAY_FACTOR = 6
# Bytes per record the hashed replay needs besides the records: the hash, its sort order, the
# sorted hashes, ops and masks.
HASH_BYTES = 40
Chunk = tuple[pa.LargeBinaryArray, pa.LargeBinaryArray]
Exact = Callable[[Iterator[RecordBatch]], Iterator[Chunk]]
_HELD = pa.schema([("op", pa.uint8()), ("key", pa.large_binary()), ("value", pa.large_binary())])


def nbytes(b: RecordBatch) -> int:
    return b.keys.nbytes + b.values.nbytes + len(b.ops)


class _Held:
    """The records replayed, in order: in memory up to ``limit`` bytes, then in one file."""

    def __init__(self, path: str, limit: int) -> None:
        self.path, self.limit, self.used = path, limit, 0
        self.memory: list[RecordBatch] = []
        self.writer: tuple[pa.NativeFile, pa.ipc.RecordBatchStreamWriter] | None = None
        self.spilled = False
        self.records = 0
        self.key_bytes = 0

    def add(self, chunk: RecordBatch) -> None:
        size = nbytes(chunk)
        self.records += len(chunk)
        self.key_bytes += chunk.keys.nbytes
        if not self.spilled and self.used + size <= self.limit:
            # Compacted copies: a chunk's arrays may view the whole decompressed file, which
            # the budget does not count and holding the view would keep alive.
            keys, values = _compact(chunk.keys), _compact(chunk.values)
            self.memory.append(RecordBatch(chunk.ops.copy(), keys, values))
            self.used += size
            return
        if self.writer is None:
            f = pa.OSFile(self.path, "wb")
            self.writer = (f, pa.ipc.new_stream(f, _HELD))
            self.spilled = True
        keys, values = as_large_binary(chunk.keys), as_large_binary(chunk.values)
        batch = pa.record_batch([pa.array(chunk.ops), keys, values], schema=_HELD)
        self.writer[1].write_batch(batch)

    def finish(self) -> None:
        if self.writer is not None:
            self.writer[1].close()
            self.writer[0].close()
            self.writer = None

    def chunks(self, release: bool = False) -> Iterator[RecordBatch]:
        """The records in order (``release``: each in-memory chunk dropped once yielded)."""
        mem = self.memory
        if release:
            while mem:
                yield mem.pop(0)
        else:
            yield from list(mem)
        if not self.spilled:
            return
        with pa.OSFile(self.path, "rb") as f:  # read, not mapped: mapped pages count as ours
            for b in pa.ipc.open_stream(f):
                ops = b.column(0).to_numpy(zero_copy_only=False)
                yield RecordBatch(ops, b.column(1), b.column(2))

    def close(self) -> None:
        self.finish()
        self.memory = []
        if self.spilled and os.path.exists(self.path):
            os.remove(self.path)


def _compact(arr: pa.Array) -> pa.Array:
    """``arr``, copied when its buffers hold much more than its own bytes (a slice of a larger
    array: holding it would keep the rest alive); the record readers' own takes are compact."""
    bufs = arr.buffers()
    data = bufs[-1]
    used = arr.nbytes
    held = sum(b.size for b in bufs if b is not None)
    if arr.offset == 0 and data is not None and held <= used + used // 4 + 4096:
        return arr
    return pa.concat_arrays([arr])


def puts_and_deletes(chunk: RecordBatch) -> bool:
    """Only puts and deletes (no merges, no delete-ranges)."""
    return bool((chunk.ops <= max(OP_PUT, OP_DELETE)).all())


def hashed_replay(
    chunks: Iterator[RecordBatch], *, budget: int, max_bytes: int, scratch: str, exact: Exact
) -> Iterator[Chunk]:
    """The live entries of ``chunks`` as ``exact`` (the exact replay) gives them."""
    held = _Held(os.path.join(scratch, "held.arrow"), budget // 8)
    hashes: list[np.ndarray] = []
    ops: list[np.ndarray] = []
    size = events = 0
    cut: tuple[int, int] | None = None  # (bytes, records) where the exact replay goes to disk
    it = iter(chunks)
    try:
        for chunk in it:
            if not puts_and_deletes(chunk) or (events + len(chunk)) * HASH_BYTES > budget:
                held.finish()
                yield from exact(itertools.chain(held.chunks(release=True), [chunk], it))
                return
            hashes.append(key_hashes(chunk.keys))
            # A copy: the chunk's ops may view the whole decompressed file, kept alive by it.
            ops.append(np.array(chunk.ops, dtype=np.uint8, copy=True))
            held.add(chunk)
            size, events = size + nbytes(chunk), events + len(chunk)
            if cut is None and size * REPLAY_FACTOR > budget:
                cut = (size, events)
        held.finish()
        live = _live(hashes, ops, held, budget)
        if live is None:  # a hash collision (or too many keys to compare): the exact replay
            yield from exact(held.chunks(release=True))
            return
        at_bytes, at_events = cut or (size, events)
        rows = max(16, max_bytes // max(1, at_bytes // max(1, at_events)))
        yield from _emit(held, live, _sizes(live, rows, by_seq=cut is not None))
    finally:
        held.close()


def _live(
    hashes: list[np.ndarray], ops: list[np.ndarray], held: _Held, budget: int
) -> np.ndarray | None:
    """Per record, whether it is its key's live entry (its last record, a put); None when two
    records of equal hashes have different keys, or when comparing their keys would hold
    more than a quarter of the budget (every key updated many times: the exact replay,
    which bounds itself, decides)."""
    h = np.concatenate(hashes) if hashes else np.zeros(0, dtype=np.uint64)
    hashes.clear()
    last, order, same = last_of_each(h)
    del h
    if len(same):
        a, b = order[same], order[same + 1]
        compared = min(2 * len(a), held.records)  # the records whose keys are gathered
        if compared * (held.key_bytes // max(1, held.records) + 8) > budget // 4:
            return None
        if not _same_keys(a, b, held):
            return None
    all_ops = np.concatenate(ops) if ops else np.zeros(0, dtype=np.uint8)
    return last & (all_ops == OP_PUT)


def _same_keys(a: np.ndarray, b: np.ndarray, held: _Held) -> bool:
    """Whether records ``a[i]`` and ``b[i]`` (indexes in replay order) have equal keys."""
    mask = np.zeros(held.records, dtype=bool)
    mask[a] = True
    mask[b] = True
    slot = np.cumsum(mask) - 1  # record -> its place among the wanted keys
    parts: list[pa.Array] = []
    base = 0
    for chunk in held.chunks():
        sel = mask[base : base + len(chunk)]
        if sel.any():  # Arrow's filter: 4x faster than a take of the same rows
            parts.append(chunk.keys.filter(pa.array(sel)))
        base += len(chunk)
    keys = pa.concat_arrays(parts)
    pa_, pb = slot[a], slot[b]
    equal = pc.equal(keys.take(pa.array(pa_)), keys.take(pa.array(pb)))
    return bool(pc.all(equal).as_py())


def _sizes(live: np.ndarray, rows: int, *, by_seq: bool) -> list[int]:
    """How many live entries each output chunk has: ``rows`` each (the exact replay in memory),
    or those of each range of ``rows`` records (its replay on disk, by sequence range)."""
    seqs = np.flatnonzero(live)
    if not len(seqs):
        return []
    groups = seqs // rows if by_seq else np.arange(len(seqs)) // rows
    bounds = np.concatenate([[0], np.flatnonzero(np.diff(groups)) + 1, [len(seqs)]])
    return np.diff(bounds).tolist()


def _emit(held: _Held, live: np.ndarray, sizes: list[int]) -> Iterator[Chunk]:
    """The live entries, in record order, in chunks of ``sizes`` entries."""
    keys: list[pa.Array] = []
    values: list[pa.Array] = []
    have = base = 0
    want = iter(sizes)
    n_out = next(want, None)
    for chunk in held.chunks(release=True):
        sel = live[base : base + len(chunk)]
        base += len(chunk)
        count = int(np.count_nonzero(sel))
        if count:  # Arrow's filter: 4x faster than a take of the same rows
            mask = pa.array(sel)
            keys.append(chunk.keys.filter(mask))
            values.append(chunk.values.filter(mask))
            have += count
        while n_out is not None and have >= n_out:
            # Whole pieces and a slice of the last: each entry is copied once more, here.
            k, keys = _first(keys, n_out)
            v, values = _first(values, n_out)
            yield k, v
            have -= n_out
            # Arrow's allocator keeps freed pages; without this the peak grows with the state.
            pa.default_memory_pool().release_unused()
            n_out = next(want, None)


def _first(pieces: list[pa.Array], n: int) -> tuple[pa.Array, list[pa.Array]]:
    """The first ``n`` entries of ``pieces`` as one array, and the pieces left (the last one
    taken from cut by a zero-copy slice)."""
    out: list[pa.Array] = []
    rest = pieces
    while n:
        head, rest = rest[0], rest[1:]
        if len(head) > n:
            out.append(head.slice(0, n))
            rest = [head.slice(n), *rest]
            break
        out.append(head)
        n -= len(head)
    return _concat(out), rest


def _concat(arrays: list[pa.Array]) -> pa.Array:
    return arrays[0] if len(arrays) == 1 else pa.concat_arrays(arrays)

"""64-bit hashes of binary keys, and last-writer-wins by them (issue 27).

A replay keeps each key's last record. Sorting 64-bit hashes of the keys finds those records
far faster than a dictionary of the key bytes (Arrow's ``dictionary_encode``: 4.5 CPU-s for
5.5M 32-byte keys against 0.3 s for the hashes and 0.5 s for their sort). Hashes can collide,
so the caller compares the bytes of every pair of records whose hashes are equal
(:func:`duplicate_pairs`) and falls back to the exact replay if two differ.

The hash is no standard one (it never leaves the process): 8-byte little-endian words of the
key, the last one the key's last 8 bytes (overlapping the one before), each mixed in by
multiply-xorshift, then the length. Keys shorter than 8 bytes are read byte by byte.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from statectl.codecs.unaligned import loads

_P1 = np.uint64(0x9E3779B97F4A7C15)
_P2 = np.uint64(0xC2B2AE3D27D4EB4F)
_P3 = np.uint64(0x165667B19E3779F9)


def _parts(keys: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """(data bytes, int64 offsets) of a large binary array, zero-copy."""
    if keys.type != pa.large_binary():
        keys = keys.cast(pa.large_binary())
    n = len(keys)
    offsets = np.frombuffer(keys.buffers()[1], dtype=np.int64)[keys.offset : keys.offset + n + 1]
    buf = keys.buffers()[2]
    data = np.frombuffer(buf, dtype=np.uint8) if buf is not None else np.zeros(0, np.uint8)
    return data, offsets


def _mix(h: np.ndarray, word: np.ndarray) -> None:
    """``h = xorshift((h ^ word) * P1)`` in place."""
    h ^= word
    h *= _P1
    h ^= h >> np.uint64(31)


def key_hashes(keys: pa.Array) -> np.ndarray:
    """A uint64 hash of every key's bytes (nulls hash as empty keys)."""
    data, offsets = _parts(keys)
    starts = offsets[:-1]
    lengths = offsets[1:] - starts
    h = np.full(len(starts), _P3, dtype=np.uint64)
    if not len(h):
        return h
    if _whole_words(starts, lengths):
        _mix_whole_words(h, data, starts, lengths)
        return _finish(h, lengths)
    windows = loads(data, "<u8") if len(data) >= 8 else None
    words = (lengths + 7) >> 3  # the last word overlaps the one before (its last 8 bytes)
    # Every row in every word while all keys have one (no index arrays); else the rows left.
    every = int(words.min()) if int(lengths.min()) >= 8 else 0
    with np.errstate(over="ignore"):
        for w in range(int(words.max())):
            if w < every:
                assert windows is not None
                _mix(h, windows[starts + np.minimum(8 * w, lengths - 8)])
                continue
            rows = np.flatnonzero((words > w) & (lengths >= 8))
            if len(rows) and windows is not None:
                pos = starts[rows] + np.minimum(8 * w, lengths[rows] - 8)
                sub = h[rows]
                _mix(sub, windows[pos])
                h[rows] = sub
        _short_keys(h, data, starts, lengths)
    return _finish(h, lengths)


def _finish(h: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """Mix in the length, then a final avalanche, in place."""
    with np.errstate(over="ignore"):
        h ^= lengths.astype(np.uint64) * _P2
        h ^= h >> np.uint64(29)
        h *= _P3
        h ^= h >> np.uint64(32)
    return h


def _whole_words(starts: np.ndarray, lengths: np.ndarray) -> bool:
    """Every key is whole 8-byte words, all starting at the same offset modulo 8 (UnsafeRow
    keys are): then word ``w`` of a key is ``8 * w`` bytes in, with no overlapping last word."""
    return bool(
        int(lengths.min()) >= 8 and not (lengths & 7).any() and not ((starts - starts[0]) & 7).any()
    )


def _mix_whole_words(
    h: np.ndarray, data: np.ndarray, starts: np.ndarray, lengths: np.ndarray
) -> None:
    """:func:`key_hashes`' word loop for whole-word keys: a gather from the data viewed as
    little-endian uint64 (one 8-byte load per key and word, where the general loop gathers
    8-byte windows)."""
    base = int(starts[0]) & 7
    u64 = data[base : base + ((len(data) - base) >> 3 << 3)].view("<u8")
    at = (starts - base) >> 3  # each key's first word
    words = lengths >> 3
    every = int(words.min())
    with np.errstate(over="ignore"):
        for w in range(int(words.max())):
            if w < every:
                _mix(h, u64[at])
            else:
                rows = np.flatnonzero(words > w)
                sub = h[rows]
                _mix(sub, u64[at[rows]])
                h[rows] = sub
            at += 1


def _short_keys(h: np.ndarray, data: np.ndarray, starts: np.ndarray, lengths: np.ndarray) -> None:
    """Mix in the bytes of keys shorter than 8 bytes, one byte position at a time."""
    short = np.flatnonzero((lengths > 0) & (lengths < 8))
    if not len(short):
        return
    sub = h[short]
    for b in range(7):
        live = lengths[short] > b
        byte = np.zeros(len(short), dtype=np.uint64)
        byte[live] = data[starts[short][live] + b]
        _mix(sub, byte)
    h[short] = sub


def last_of_each(hashes: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """For events (records in replay order) with these key hashes: (a bool mask of each
    hash's last event; ``order``, the events sorted by hash, equal hashes by event;
    ``same``, the positions ``i`` in ``order`` whose event has the hash of the one at
    ``i + 1``): the pairs to compare."""
    n = len(hashes)
    last = np.zeros(n, dtype=bool)
    if not n:
        return last, np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    order, pairs = _order_by_hash(hashes)
    # Adjacent in ``order`` with the same high bits: the candidates; the same full hash: same.
    same = pairs[hashes[order[pairs]] == hashes[order[pairs + 1]]]
    # Within a hash, events ascend: each hash's last event ends its run.
    ends = np.ones(n, dtype=bool)
    ends[same] = False
    last[order[ends]] = True
    return last, order, same


def _order_by_hash(hashes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(the events sorted by (hash, event); the positions ``i`` of that order whose event shares
    its hash's high bits with the one at ``i + 1``).

    numpy's ``sort`` of uint64 is vectorized (AVX-512) where ``argsort`` is not: 0.06 against
    0.37 CPU-s for 5.5M hashes. So each hash's low bits are replaced by its event number and
    the packed words sorted; events that share the remaining high bits but not the hash (a
    few per million) are put back in (hash, event) order by a small lexsort."""
    n = len(hashes)
    bits = max(1, (n - 1).bit_length())
    if bits > 32:  # too few high bits left to tell hashes apart: sort the hashes themselves
        order = np.argsort(hashes, kind="stable")
        sh = hashes[order]
        return order, np.flatnonzero(sh[1:] == sh[:-1])
    low = np.uint64((1 << bits) - 1)
    packed = hashes & ~low
    packed |= np.arange(n, dtype=np.uint64)
    packed.sort()
    order = (packed & low).astype(np.int64)
    packed >>= np.uint64(bits)
    pairs = np.flatnonzero(packed[1:] == packed[:-1])
    del packed
    split = pairs[hashes[order[pairs]] != hashes[order[pairs + 1]]]
    if len(split):
        _sort_runs(hashes, order, pairs, split)
    return order, pairs


def _sort_runs(hashes: np.ndarray, order: np.ndarray, pairs: np.ndarray, split: np.ndarray) -> None:
    """Put the runs of ``order`` (adjacent positions linked by ``pairs``) that hold more than
    one hash (``split``: positions in them) in (hash, event) order, in place."""
    linked = np.zeros(len(order), dtype=bool)
    linked[pairs] = True  # position i is in the run of i + 1
    run = np.concatenate([[0], np.cumsum(~linked[:-1])])  # run id per position
    bad = np.isin(run, run[split])
    pos = np.flatnonzero(bad)
    sub = order[pos]
    perm = np.lexsort((sub, hashes[sub], run[pos]))
    order[pos] = sub[perm]


def equal_hash_pairs(left: np.ndarray, right: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The pairs ``(i, j)`` whose hashes ``left[i]`` and ``right[j]`` may be equal: every pair
    of equal hashes is among them, with the few equal in their high bits only (the caller
    compares the keys of each pair anyway). :class:`HashIndex` for one ``right`` and many
    ``left``."""
    return HashIndex(right).pairs(left)


class HashIndex:
    """Hashes that many others are looked up among (an overlay's, by each chunk of a
    snapshot).

    Both sides go into one sorted array of packed words (high hash bits, position), as in
    :func:`_order_by_hash`: a lookup of each hash among the others (a ``searchsorted``, or a
    hash table's gathers) misses the cache at every step, and took 4-9x as long for 1.1M
    hashes against 1.4M. The indexed side's words are sorted once; a lookup sorts only its
    own and merges the two (numpy's stable sort of two sorted runs is one merge): 16 chunks
    of 260k hashes against 1.37M took 0.28 CPU-s instead of 0.44 with one sort of both sides
    per chunk (issue 27)."""

    def __init__(self, hashes: np.ndarray) -> None:
        self.hashes = hashes
        self._bits = 0
        self._sorted = np.zeros(0, dtype=np.uint64)

    def pairs(self, left: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The pairs ``(i, j)`` whose hashes ``left[i]`` and ``self.hashes[j]`` may be equal
        (:func:`equal_hash_pairs`)."""
        n, m = len(self.hashes), len(left)
        none = np.zeros(0, dtype=np.int64)
        if not m or not n:
            return none, none
        # Positions: the indexed hashes 0..n-1, then left's. Spare low bits only cost a few
        # more pairs equal in their high bits; the indexed side is sorted again only when a
        # larger lookup needs more of them.
        resort = (n + m - 1).bit_length() > self._bits
        self._bits = max(1, self._bits, (n + m - 1).bit_length())
        bits = np.uint64(self._bits)
        low = np.uint64((1 << self._bits) - 1)
        if resort:
            self._sorted = self.hashes & ~low
            self._sorted |= np.arange(n, dtype=np.uint64)
            self._sorted.sort()
        mine = left & ~low
        mine |= np.arange(n, n + m, dtype=np.uint64)
        mine.sort()
        packed = np.concatenate([self._sorted, mine])
        del mine
        packed.sort(kind="stable")  # two sorted runs: a merge
        high = packed >> bits
        found: list[np.ndarray] = []
        theirs: list[np.ndarray] = []
        at = np.flatnonzero(high[1:] == high[:-1])
        gap = 1
        while len(at):  # the pairs ``gap`` apart in a run of equal high bits (a run is short)
            a = (packed[at] & low).astype(np.int64)
            b = (packed[at + gap] & low).astype(np.int64)
            across = (a < n) != (b < n)  # one hash from each side
            a, b = a[across], b[across]
            found.append(np.maximum(a, b) - n)
            theirs.append(np.minimum(a, b))
            gap += 1
            at = at[at + gap < len(high)]
            at = at[high[at + gap] == high[at]]
        if not found:
            return none, none
        return np.concatenate(found), np.concatenate(theirs)

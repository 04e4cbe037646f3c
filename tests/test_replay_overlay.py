"""The overlay replay (statectl/backends/overlay_replay.py): a snapshot streamed past the records
after it gives the exact replay's live entries in the exact replay's order; what it does not
model (merges, an overlay over its budget, colliding hashes) goes to the general replay; and
equal_hash_pairs (statectl/codecs/key_hash.py) finds every pair of equal hashes (issue 27)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

import statectl.backends.overlay_replay as overlay
from statectl.backends.base import VersionRecords
from statectl.backends.replay import bounded_replay, exact_replay
from statectl.checkpoint.model import store_dir
from statectl.codecs.key_hash import HashIndex, equal_hash_pairs
from statectl.codecs.records import OP_DELETE, OP_MERGE, OP_PUT, RecordBatch
from tests.helpers.records import after_no_snapshot, record_chunks

FIXTURES = Path(__file__).parent.parent / "fixtures" / "checkpoints"
RNG = np.random.default_rng(2027)


def _key(i: int) -> bytes:
    return (b"k%d-" % i) * (1 + i % 7)  # 4 to 70 bytes: short, long and unaligned keys


def _snapshot(ids: np.ndarray, per: int) -> list[RecordBatch]:
    """A snapshot of keys ``ids`` (distinct), ``per`` a chunk: puts only."""
    keys = [_key(i) for i in ids.tolist()]
    return [
        RecordBatch(
            np.full(len(keys[i : i + per]), OP_PUT, dtype=np.uint8),
            pa.array(keys[i : i + per], pa.large_binary()),
            pa.array([b"s%d" % j for j in range(i, i + len(keys[i : i + per]))], pa.large_binary()),
        )
        for i in range(0, len(keys), per)
    ]


def _overlay(n: int, space: int, per: int, deletes: float = 0.2) -> list[RecordBatch]:
    """``n`` records over keys ``0..space`` (the snapshot's and new ones), ``per`` a chunk."""
    ids = RNG.integers(0, space, n)
    ops = np.where(RNG.random(n) < deletes, OP_DELETE, OP_PUT).astype(np.uint8)
    keys = [_key(i) for i in ids.tolist()]
    values = [None if o == OP_DELETE else b"o%d" % j for j, o in enumerate(ops.tolist())]
    return record_chunks(ops, keys, values, per)


def _records(base: list[RecordBatch], over: list[RecordBatch]) -> VersionRecords:
    return VersionRecords(lambda: iter(base), lambda: iter(over))


def _entries(chunks: Iterator[tuple[pa.Array, pa.Array]]) -> list[tuple[bytes, bytes]]:
    return [e for k, v in chunks for e in zip(k.to_pylist(), v.to_pylist(), strict=True)]


def _exact(base, over, tmp_path, budget=1 << 30):  # type: ignore[no-untyped-def]
    scratch = tmp_path / "exact"
    scratch.mkdir(exist_ok=True)
    return _entries(
        exact_replay(iter(base + over), budget=budget, max_bytes=700, scratch=str(scratch))
    )


def _bounded(records, tmp_path, budget=1 << 30):  # type: ignore[no-untyped-def]
    scratch = tmp_path / "bounded"
    scratch.mkdir(exist_ok=True)
    return list(bounded_replay(records, budget=budget, max_bytes=700, scratch=str(scratch)))


@pytest.mark.parametrize(("snapshot_keys", "records", "space"), [(3000, 800, 4000), (50, 2000, 60)])
def test_same_entries_in_the_same_order_as_the_exact_replay(
    tmp_path, snapshot_keys, records, space
):
    # Overlay keys in and outside the snapshot, updated more than once, deleted, re-put.
    base = _snapshot(RNG.permutation(space)[:snapshot_keys], 250)
    over = _overlay(records, space, 300)
    chunks = _bounded(_records(base, over), tmp_path)
    want = _exact(base, over, tmp_path)
    assert _entries(iter(chunks)) == want
    assert len(want) > 40
    # Each chunk is the live part of one chunk read: a snapshot's, then the overlay's.
    assert len(chunks) <= len(base) + len(over)


def test_the_overlay_replay_decides_and_holds_nothing_on_disk(tmp_path, monkeypatch):
    general: list[bool] = []
    monkeypatch.setattr(overlay, "_Overlay", _spy_overlay(general))
    base = _snapshot(np.arange(2000), 200)
    over = _overlay(600, 2500, 200)
    got = _entries(iter(_bounded(_records(base, over), tmp_path)))
    assert got == _exact(base, over, tmp_path)
    assert general == [True]  # built once, and distinct: no fall-back
    assert not list((tmp_path / "bounded").iterdir())


def test_keys_are_compared_a_slice_of_pairs_at_a_time(tmp_path, monkeypatch):
    # 2000 records over 60 keys: nearly every record pairs with another of its key.
    monkeypatch.setattr(overlay, "_PAIRS", 7)
    built: list[bool] = []
    monkeypatch.setattr(overlay, "_Overlay", _spy_overlay(built))
    base = _snapshot(RNG.permutation(60)[:50], 16)
    over = _overlay(2000, 60, 300)
    got = _entries(iter(_bounded(_records(base, over), tmp_path)))
    assert got == _exact(base, over, tmp_path)
    assert built == [True]


def _spy_overlay(seen: list[bool]):  # type: ignore[no-untyped-def]
    original = overlay._Overlay

    def build(chunks):  # type: ignore[no-untyped-def]
        built = original(chunks)
        seen.append(built.distinct)
        return built

    return build


def test_snapshot_keys_of_an_overlay_keys_hash_but_other_bytes_survive(tmp_path, monkeypatch):
    # Every key hashes to its length's parity: each snapshot key shares its hash with one of
    # the two overlay keys (12 and 5 bytes long), and only the one of equal bytes is dropped.
    monkeypatch.setattr(
        overlay, "key_hashes", lambda keys: np.array([len(k) & 1 for k in keys.to_pylist()], "u8")
    )
    built: list[bool] = []
    monkeypatch.setattr(overlay, "_Overlay", _spy_overlay(built))
    base = _snapshot(np.arange(500), 100)
    over = [
        RecordBatch(
            np.array([OP_PUT, OP_DELETE], dtype=np.uint8),
            pa.array([_key(3), _key(700)], pa.large_binary()),
            pa.array([b"x", None], pa.large_binary()),
        )
    ]
    got = _entries(iter(_bounded(_records(base, over), tmp_path)))
    assert got == _exact(base, over, tmp_path)
    assert len(got) == 500 and (_key(3), b"x") == got[-1]
    assert built == [True]  # the overlay replay decided


def test_distinct_overlay_keys_of_equal_hash_prefixes_against_the_snapshot(tmp_path, monkeypatch):
    # Hashes alike in their high bits but not whole: the overlay is distinct, and each snapshot
    # key sharing high bits with it is compared, not dropped.
    def hashes(keys: pa.Array) -> np.ndarray:
        n = np.array([int(k.split(b"-")[0][1:]) for k in keys.to_pylist()], dtype=np.uint64)
        return (np.uint64(7) << np.uint64(60)) | n  # one high-bit prefix for all

    monkeypatch.setattr(overlay, "key_hashes", hashes)
    base = _snapshot(np.arange(1000), 128)
    over = _overlay(300, 1500, 100)
    got = _entries(iter(_bounded(_records(base, over), tmp_path)))
    assert got == _exact(base, over, tmp_path)


def test_merges_and_overlays_over_budget_take_the_general_replay(tmp_path, monkeypatch):
    built: list[bool] = []
    monkeypatch.setattr(overlay, "_Overlay", _spy_overlay(built))
    base = _snapshot(np.arange(1000), 200)
    merged = _overlay(400, 1200, 100, deletes=0)
    merged[-1].ops[::2] = OP_MERGE
    got = _entries(iter(_bounded(_records(base, merged), tmp_path)))
    assert got == _exact(base, merged, tmp_path)
    big = _overlay(3000, 1200, 100)
    budget = 150_000  # the overlay's 3000 records (and their hashes) take more than 3/4 of it
    got = _entries(iter(_bounded(_records(base, big), tmp_path, budget)))
    assert got == _exact(base, big, tmp_path)
    assert built == []  # neither overlay was held


def test_an_overlay_alone_or_a_snapshot_alone():
    only = after_no_snapshot(_overlay(10, 5, 4))
    assert not only.unique and sum(len(c) for c in only.chunks()) == 10
    snap = VersionRecords(lambda: iter(_snapshot(np.arange(7), 3)), None)
    assert snap.unique and sum(len(c) for c in snap.chunks()) == 7


def _brute_pairs(left: np.ndarray, right: np.ndarray) -> set[tuple[int, int]]:
    at: dict[int, list[int]] = {}
    for j, h in enumerate(right.tolist()):
        at.setdefault(h, []).append(j)
    return {(i, j) for i, h in enumerate(left.tolist()) for j in at.get(h, [])}


@pytest.mark.parametrize("groups", [0, 1000, 30])
def test_equal_hash_pairs_finds_every_equal_pair(groups):
    # 0: random hashes. Otherwise each hash's bits above its low 12 (the bits the packed sort
    # keeps, for 5000 hashes) are one of ``groups`` values: runs of many hashes alike there and
    # different below, every equal pair still found.
    def hashes(n: int) -> np.ndarray:
        h = RNG.integers(0, 1 << 63, n, dtype=np.uint64)
        if groups:
            h = (RNG.integers(0, groups, n).astype(np.uint64) << np.uint64(40)) | (h & 0xFFF)
        return np.unique(h)

    right = hashes(3000)
    left = np.unique(np.concatenate([hashes(2000), right[::3]]))
    RNG.shuffle(left)
    i, j = equal_hash_pairs(left, right)
    found = {(a, b) for a, b in zip(i.tolist(), j.tolist(), strict=True) if left[a] == right[b]}
    assert found == _brute_pairs(left, right)
    assert len(found) >= 900


def test_one_index_looked_up_by_chunks_of_every_size():
    """An overlay's index serves every chunk of the snapshot: small lookups after its words
    were sorted for a large one (spare low bits), and a larger one that needs more bits (its
    words sorted again), each finding exactly the equal pairs."""
    right = np.unique(RNG.integers(0, 1 << 63, 3000, dtype=np.uint64))
    index = HashIndex(right)
    for size in (500, 3, 2000, 40, 70_000, 1):
        left = np.unique(
            np.concatenate([RNG.integers(0, 1 << 63, size, dtype=np.uint64), right[:: 1 + size]])
        )
        RNG.shuffle(left)
        i, j = index.pairs(left)
        found = {(a, b) for a, b in zip(i.tolist(), j.tolist(), strict=True) if left[a] == right[b]}
        assert found == _brute_pairs(left, right), size
        assert len(found) == len(right[:: 1 + size])


def test_equal_hash_pairs_of_nothing():
    none = np.zeros(0, dtype=np.uint64)
    for a, b in [(none, none), (none, np.ones(3, "u8")), (np.ones(3, "u8"), none)]:
        i, j = equal_hash_pairs(a, b)
        assert len(i) == len(j) == 0


@pytest.mark.parametrize(
    "name",
    [
        f"{case}-snapshots-{backend}"
        for case in ("agg", "join", "dedup")
        for backend in ("hdfs", "rocksdb-changelog")
    ],
)
def test_spark_written_snapshots_and_later_files_at_every_batch(tmp_path, monkeypatch, name):
    """Spark's own files, at every batch: between two snapshots (most batches of a long-running
    query) a partition takes the overlay replay, and its live entries are the exact replay's,
    in order, and the whole load's."""
    from statectl.checkpoint.model import Checkpoint
    from statectl.state import StoreEncoding, live_entries, load_raw, store_unique_id

    taken: list[bool] = []
    monkeypatch.setattr(overlay, "_Overlay", _spy_overlay(taken))
    ckpt = Checkpoint.open(str(FIXTURES / name))
    batches = ckpt.commit_batches
    compared = 0
    for b in batches:
        enc = StoreEncoding.of(ckpt, b)
        for op in ckpt.operators(b):
            for store in op.store_names:
                for p in range(op.num_partitions):
                    scratch = tmp_path / f"{b}-{op.operator_id}-{store}-{p}"
                    scratch.mkdir()
                    args = (ckpt, op, store, p, b, enc, 64 << 20, str(scratch))
                    got = _entries(live_entries(*args))
                    records = enc.store_backend.events(
                        ckpt.io,
                        store_dir(ckpt, op.operator_id, p, store),
                        b + 1,
                        enc.read_options(store_unique_id(ckpt, op, store, p, b, enc), True),
                        max_bytes=1 << 20,
                    )
                    want = _entries(
                        exact_replay(
                            records.chunks(),
                            budget=64 << 20,
                            max_bytes=1 << 20,
                            scratch=str(scratch),
                            merge_delimiter=enc.merge_delimiter,
                        )
                    )
                    assert got == want, (b, op.operator_id, store, p)
                    raw = load_raw(ckpt, op, store, p, b, enc)
                    whole = zip(raw.keys.to_pylist(), raw.values.to_pylist(), strict=True)
                    assert sorted(got) == sorted(whole)
                    compared += len(got)
    assert compared > 50 and sum(taken) >= len(batches) - 2  # all but the snapshot batches

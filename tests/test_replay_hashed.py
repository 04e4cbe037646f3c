"""The hashed replay (statectl/backends/hashed_replay.py, statectl/codecs/key_hash.py): the
same live entries, in the same order and the same chunks, as the exact replay, in memory, with
its records spilled, and when key hashes collide (issue 27)."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

import statectl.backends.hashed_replay as hashed
from statectl.backends.replay import bounded_replay, exact_replay
from statectl.codecs.key_hash import key_hashes, last_of_each
from statectl.codecs.records import OP_DELETE, OP_MERGE, OP_PUT, RecordBatch
from tests.helpers.records import after_no_snapshot, record_chunks

RNG = np.random.default_rng(27)


def _batches(n: int, distinct: int, per: int, deletes: bool = True) -> list[RecordBatch]:
    """``n`` records over ``distinct`` keys of mixed lengths (1 to 40 bytes), ``per`` a batch."""
    ids = RNG.integers(0, distinct, n)
    keys = [(b"k%d-" % i) * (1 + i % 9) for i in ids.tolist()]
    ops = np.where(RNG.random(n) < (0.2 if deletes else 0), OP_DELETE, OP_PUT).astype(np.uint8)
    values = [None if o == OP_DELETE else b"v%d" % j for j, o in enumerate(ops.tolist())]
    return record_chunks(ops, keys, values, per)


def _run(replay, batches, tmp_path, budget):  # type: ignore[no-untyped-def]
    scratch = tmp_path / replay.__name__
    scratch.mkdir()
    records = after_no_snapshot(batches) if replay is bounded_replay else iter(batches)
    return [
        (k.to_pylist(), v.to_pylist())
        for k, v in replay(records, budget=budget, max_bytes=700, scratch=str(scratch))
    ]


@pytest.mark.parametrize("budget", [1 << 30, 200_000, 100_000])
def test_same_entries_and_chunks_as_the_exact_replay(tmp_path, budget):
    # 1 GiB: everything in memory; 200 kB: records spilled, the exact replay's on-disk
    # chunking; 100 kB: more records than the budget has room for (the exact replay itself).
    batches = _batches(3000, 500, 250)
    got = _run(bounded_replay, batches, tmp_path, budget)
    want = _run(exact_replay, batches, tmp_path, budget)
    assert len(want) > 5
    assert got == want


def test_spilled_records_are_read_back(tmp_path, monkeypatch):
    seen: list[tuple[bool, bool]] = []
    original = hashed._live

    def spy(h, ops, held, budget):  # type: ignore[no-untyped-def]
        live = original(h, ops, held, budget)
        seen.append((held.spilled, live is not None))
        return live

    monkeypatch.setattr(hashed, "_live", spy)
    batches = _batches(3000, 20_000, 250)  # a few keys repeat: their comparison fits
    got = _run(bounded_replay, batches, tmp_path, 200_000)
    assert seen == [(True, True)]  # spilled, and the hashed replay decided
    assert got == _run(exact_replay, batches, tmp_path, 200_000)
    assert not list((tmp_path / "bounded_replay").iterdir())  # the spill file is gone


def test_keys_updated_too_often_to_compare_take_the_exact_replay(tmp_path, monkeypatch):
    # 3000 records of 100 keys: comparing the keys of every repeated hash would gather nearly
    # every record's key, more than a quarter of a 200 kB budget.
    decided: list[bool] = []
    original = hashed._live

    def spy(h, ops, held, budget):  # type: ignore[no-untyped-def]
        live = original(h, ops, held, budget)
        decided.append(live is not None)
        return live

    monkeypatch.setattr(hashed, "_live", spy)
    monkeypatch.setattr(hashed, "_same_keys", lambda *a: pytest.fail("keys gathered"))
    batches = _batches(3000, 100, 250)
    got = _run(bounded_replay, batches, tmp_path, 200_000)
    assert decided == [False]
    assert got == _run(exact_replay, batches, tmp_path, 200_000)


def test_colliding_hashes_fall_back_to_the_exact_replay(tmp_path, monkeypatch):
    # Every key hashes alike: the byte comparison finds different keys under one hash.
    monkeypatch.setattr(hashed, "key_hashes", lambda keys: np.zeros(len(keys), dtype=np.uint64))
    batches = _batches(3000, 400, 250)
    assert _run(bounded_replay, batches, tmp_path, 1 << 30) == _run(
        exact_replay, batches, tmp_path, 1 << 30
    )


def test_merges_take_the_exact_replay(tmp_path):
    batches = _batches(2000, 300, 250, deletes=False)
    batches[-1].ops[::3] = OP_MERGE
    got = _run(bounded_replay, batches, tmp_path, 1 << 30)
    assert got == _run(exact_replay, batches, tmp_path, 1 << 30)
    assert any(v.count(b"v") > 1 for _, vs in got for v in vs)  # values merged


def test_key_hashes_see_every_byte_and_the_length():
    keys = [b"", b"a", b"ab", b"abcdefg", b"abcdefgh", b"abcdefghi", b"\x00", b"\x00\x00"]
    keys += [bytes(b) for b in RNG.integers(0, 256, (200, 37), dtype=np.uint8)]
    keys += [k[:-1] + bytes([k[-1] ^ 1]) for k in keys[8:]]  # differ in the last byte only
    keys += [bytes([k[0] ^ 1]) + k[1:] for k in keys[8:208]]  # ... in the first byte only
    h = key_hashes(pa.array(keys, pa.large_binary()))
    assert len(set(h.tolist())) == len(keys)
    again = key_hashes(pa.array(keys, pa.binary()).slice(0))  # binary, not large: the same
    assert (again == h).all()


def test_last_of_each_marks_each_hash_newest_record():
    h = np.array([5, 7, 5, 9, 7, 5], dtype=np.uint64)
    last, order, same = last_of_each(h)
    assert last.tolist() == [False, False, False, True, True, True]
    assert sorted(h[order].tolist()) == h[order].tolist() and len(same) == 3


def test_last_of_each_orders_hashes_that_share_high_bits():
    # The packed sort keeps a hash's high bits only; hashes that differ in their low bits
    # (here: in the last two) must still come out in (hash, event) order, each its own run.
    rng = np.random.default_rng(7)
    for n in (2, 3, 17, 1000, 50_000):
        base = rng.integers(0, 2**63, size=max(1, n // 3), dtype=np.int64).astype(np.uint64)
        h = base[rng.integers(0, len(base), size=n)]
        flip = rng.random(n) < 0.3
        h[flip] ^= rng.integers(1, 4, size=int(flip.sum())).astype(np.uint64)
        last, order, same = last_of_each(h)
        expect = np.argsort(h, kind="stable")  # by hash, then by event
        assert order.tolist() == expect.tolist()
        sh = h[expect]
        assert same.tolist() == np.flatnonzero(sh[1:] == sh[:-1]).tolist()
        newest = {int(x): i for i, x in enumerate(h)}
        assert np.flatnonzero(last).tolist() == sorted(newest.values())


def test_whole_word_keys_hash_as_the_general_loop_hashes_them(monkeypatch):
    # Chunks of one replay may take either path (a chunk of UnsafeRow keys, one with an odd
    # key): both must give every key the same hash, at any start offset of the data.
    rng = np.random.default_rng(3)
    keys = [
        bytes(rng.integers(0, 256, 8 * int(rng.integers(1, 6)), dtype=np.uint8)) for _ in range(300)
    ]
    arrays = [
        pa.array(keys, pa.large_binary()),
        pa.array([b"abc", *keys], pa.large_binary()).slice(1),  # data starts 3 bytes in
    ]
    fast = [key_hashes(a) for a in arrays]
    monkeypatch.setattr("statectl.codecs.key_hash._whole_words", lambda *a: False)
    for a, h in zip(arrays, fast, strict=True):
        assert h.tolist() == key_hashes(a).tolist()

"""The vectorized byte helpers under every backend's entry codec, against Python's slicing.

They run on every entry of every store (the encoding-version byte, column family ids, row
checksums), so each fast path (Arrow's ``binary_slice`` and ``binary_join_element_wise``) is
checked here on what reaches it: arrays that are slices of larger ones, empty elements,
``binary`` rather than ``large_binary``, per-element bounds.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from statectl.backends.entries import (
    EntryCodec,
    add_prefix,
    prepend,
    slice_bytes,
    strip_prefix,
)
from statectl.errors import StatectlError


def _rows(seed: int, n: int = 500, shortest: int = 0) -> list[bytes]:
    rng = np.random.default_rng(seed)
    return [rng.bytes(int(k)) for k in rng.integers(shortest, 40, n)]


def _arrays(rows: list[bytes]) -> list[pa.Array]:
    """The rows as Arrow sees them in statectl: whole, a slice of a larger array, binary."""
    padded = pa.array([b"head", *rows, b"tail"], pa.large_binary())
    return [
        pa.array(rows, pa.large_binary()),
        padded.slice(1, len(rows)),
        pa.array(rows, pa.binary()),
    ]


@pytest.mark.parametrize("seed", range(3))
def test_slice_bytes_with_one_start_and_end_equals_python(seed):
    rows = _rows(seed, shortest=5)
    for arr in _arrays(rows):
        assert slice_bytes(arr, 1).to_pylist() == [r[1:] for r in rows]
        assert slice_bytes(arr, 2, 5).to_pylist() == [r[2:5] for r in rows]
        assert slice_bytes(arr, 0).to_pylist() == rows
        assert slice_bytes(arr, 1).type == pa.large_binary()


def test_slice_bytes_with_bounds_per_element_equals_python():
    rows = _rows(7, shortest=8)
    ends = np.array([len(r) - 3 for r in rows])
    for arr in _arrays(rows):
        assert slice_bytes(arr, 0, ends).to_pylist() == [r[:-3] for r in rows]
        starts = np.array([i % 4 for i in range(len(rows))])
        assert slice_bytes(arr, starts).to_pylist() == [r[i % 4 :] for i, r in enumerate(rows)]


def test_slice_bytes_refuses_an_element_shorter_than_its_prefix():
    with pytest.raises(StatectlError, match="shorter than its encoding prefix"):
        slice_bytes(pa.array([b"abc", b""], pa.large_binary()), 1)


def test_slice_bytes_of_an_empty_array():
    assert slice_bytes(pa.array([], pa.large_binary()), 1).to_pylist() == []


@pytest.mark.parametrize("seed", range(3))
def test_prepend_and_add_prefix_equal_python(seed):
    rows = _rows(seed)
    heads = np.random.default_rng(seed).integers(0, 256, (len(rows), 3), dtype=np.uint8)
    for arr in _arrays(rows):
        assert prepend(arr, b"\x00").to_pylist() == [b"\x00" + r for r in rows]
        got = add_prefix(arr, heads)
        assert got.type == pa.large_binary()
        assert got.to_pylist() == [bytes(h) + r for h, r in zip(heads, rows, strict=True)]
        # A strided view of heads (a column slice) is laid out before it is used.
        assert add_prefix(arr, heads[:, 1:]).to_pylist() == [
            bytes(h[1:]) + r for h, r in zip(heads, rows, strict=True)
        ]


def test_strip_prefix_undoes_add_prefix():
    rows = _rows(11)
    heads = np.random.default_rng(11).integers(0, 256, (len(rows), 4), dtype=np.uint8)
    got_heads, rest = strip_prefix(add_prefix(pa.array(rows, pa.large_binary()), heads), 4)
    assert np.array_equal(got_heads, heads) and rest.to_pylist() == rows


@pytest.mark.parametrize(
    "codec",
    [
        EntryCodec(version_byte=True),
        EntryCodec(version_byte=True, key_version=False, cf_id=3),
        EntryCodec(version_byte=True, cf_id=-2, checksum_bytes=8),
        EntryCodec(checksum_bytes=4),
    ],
)
def test_entry_codec_lays_out_the_backend_bytes(codec):
    keys, values = _rows(1), _rows(2)
    checksums = np.arange(len(keys), dtype=np.int32) * 7919 - 5
    k, v = codec.encode(pa.array(keys), pa.array(values), checksums)
    version = b"\x00" if codec.version_byte else b""
    cf = b"" if codec.cf_id is None else int(codec.cf_id).to_bytes(2, "little", signed=True)
    key_version = version if codec.key_version else b""
    assert k.to_pylist() == [cf + key_version + x for x in keys]
    heads = [
        int(c).to_bytes(4, "little", signed=True)
        + (len(version + x).to_bytes(4, "little") if codec.checksum_bytes == 8 else b"")
        for c, x in zip(checksums, values, strict=True)
    ]
    assert v.to_pylist() == [
        (h if codec.checksum_bytes else b"") + version + x
        for h, x in zip(heads, values, strict=True)
    ]
    decoded = codec.decode(k, v)
    assert decoded.keys.to_pylist() == keys and decoded.values.to_pylist() == values
    if codec.checksum_bytes:
        assert np.array_equal(decoded.checksums, checksums)

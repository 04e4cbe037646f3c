"""A backend's own bytes around the rows of a store, and vectorized byte helpers.

:class:`EntryCodec` strips and adds, in one place, what a backend puts around the rows Spark
encodes: the column family id in front of keys, the row checksum in front of values, RocksDB's
encoding-version byte. The helpers work on Arrow binary arrays without a Python object per row.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import NamedTuple

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from statectl.codecs.records import NO_BYTES
from statectl.errors import StatectlError, UnsupportedError


def binary_parts(arr: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """(data as uint8, int64 offsets) of a large_binary array without copying the data."""
    arr = arr.cast(pa.large_binary()) if arr.type != pa.large_binary() else arr
    _, off_buf, data_buf = arr.buffers()
    offsets = np.frombuffer(off_buf, dtype=np.int64)[arr.offset : arr.offset + len(arr) + 1]
    data = (
        np.frombuffer(data_buf, dtype=np.uint8) if data_buf is not None else np.zeros(0, np.uint8)
    )
    return data, offsets


def slice_bytes(
    arr: pa.Array, start: int | np.ndarray, end: int | np.ndarray | None = None
) -> pa.LargeBinaryArray:
    """Element-wise ``b[start:end]`` (end defaults to the element's end)."""
    arr = _binary(arr)
    data, offsets = binary_parts(arr)
    begin = offsets[:-1] + start
    stop = offsets[1:] if end is None else offsets[:-1] + end
    if np.any(stop < begin):
        raise StatectlError("state entry shorter than its encoding prefix; the store is corrupt")
    n = len(begin)
    if n and arr.buffers()[2] is not None and _inside(begin, stop, offsets):
        if np.ndim(start) == 0 and (end is None or np.ndim(end) == 0) and not arr.null_count:
            # One start (and end) for every element, the common case (a version byte, a
            # column family id): Arrow's kernel, a quarter of the take's time (issue 27).
            last = int(np.max(stop - offsets[:-1]))
            return pc.binary_slice(arr, int(start), last if end is None else int(end))
        # Arrow's take over a zero-copy view whose even elements are the kept ranges: memory
        # and time linear in the rows and the kept bytes (a per-byte index costs 16x the data).
        bounds = np.empty(2 * n + 1, dtype=np.int64)
        bounds[0:-1:2] = begin
        bounds[1:-1:2] = stop
        bounds[-1] = stop[-1]
        view = pa.LargeBinaryArray.from_buffers(
            pa.large_binary(), 2 * n, [None, pa.py_buffer(bounds), arr.buffers()[2]]
        )
        return view.take(pa.array(np.arange(0, 2 * n, 2, dtype=np.int64)))
    lengths = stop - begin
    new_offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(lengths, out=new_offsets[1:])
    # Gather the kept byte ranges: index of every kept byte = its range start + position within.
    idx = np.repeat(begin - new_offsets[:-1], lengths) + np.arange(new_offsets[-1], dtype=np.int64)
    gathered = data[idx] if len(idx) else np.zeros(0, np.uint8)
    return pa.LargeBinaryArray.from_buffers(
        pa.large_binary(), len(lengths), [None, pa.py_buffer(new_offsets), pa.py_buffer(gathered)]
    )


def _inside(begin: np.ndarray, stop: np.ndarray, offsets: np.ndarray) -> bool:
    """Kept ranges that stay inside their elements (so they never overlap): then the
    zero-copy view of :func:`slice_bytes` is valid."""
    return bool((begin >= offsets[:-1]).all() and (stop <= offsets[1:]).all())


def read_le_int(arr: pa.Array, at: int, width: int, signed: bool = True) -> np.ndarray:
    data, offsets = binary_parts(arr)
    pos = offsets[:-1] + at
    cols = data[pos[:, None] + np.arange(width)]
    dtype = {2: "<i2", 4: "<i4", 8: "<i8"}[width]
    out = np.ascontiguousarray(cols).view(dtype).reshape(-1)
    return out if signed else out.astype(dtype.replace("i", "u"))


class Entries(NamedTuple):
    """Decoded entries: the row bytes of keys and values, and each row's checksum (or None)."""

    keys: pa.LargeBinaryArray
    values: pa.LargeBinaryArray
    checksums: np.ndarray | None = None


def _binary(arr: pa.Array) -> pa.LargeBinaryArray:
    return arr if arr.type == pa.large_binary() else arr.cast(pa.large_binary())


def _parts(arr: pa.LargeBinaryArray) -> tuple[np.ndarray, np.ndarray]:
    return binary_parts(arr)


def strip_prefix(arr: pa.Array, n: int) -> tuple[np.ndarray, pa.LargeBinaryArray]:
    """(each element's first ``n`` bytes as an (rows, n) uint8 array, the rest), vectorized."""
    arr = _binary(arr)
    data, offsets = _parts(arr)
    rest = slice_bytes(arr, n)  # checks every element is long enough
    starts = offsets[:-1]
    heads = data[starts[:, None] + np.arange(n)] if len(starts) else np.zeros((0, n), np.uint8)
    return heads, rest


def prepend(arr: pa.Array, head: bytes) -> pa.LargeBinaryArray:
    """``head ‖ element`` for every element: Arrow's join, one pass over the bytes."""
    return pc.binary_join_element_wise(pa.scalar(head, pa.large_binary()), _binary(arr), NO_BYTES)


def add_prefix(arr: pa.Array, heads: np.ndarray) -> pa.LargeBinaryArray:
    """Each element with its row of ``heads`` ((rows, n) uint8) in front: the heads as a
    zero-copy binary array and Arrow's join (8x a per-byte index, issue 27)."""
    rows, n = heads.shape
    offsets = np.arange(rows + 1, dtype=np.int64) * n
    packed = pa.LargeBinaryArray.from_buffers(
        pa.large_binary(),
        rows,
        [None, pa.py_buffer(offsets), pa.py_buffer(np.ascontiguousarray(heads, np.uint8))],
    )
    return pc.binary_join_element_wise(packed, _binary(arr), NO_BYTES)


@dataclass(frozen=True)
class EntryCodec:
    """A backend's own bytes around the rows of one store or column family: the 2-byte column
    family id in front of keys (``cf_id``), the row checksum in front of values
    (``checksum_bytes``: HDFS 4, RocksDB 8 (the checksum, then the value's int32 LE length)),
    and RocksDB's encoding-version byte in front of keys and values (``version_byte``; the row
    encoders of prefix-scan and timestamp keys place it inside the key themselves, so
    ``key_version`` says whether a key starts with it).

    ``decode`` strips them, ``encode`` puts them back: ``encode(*decode(k, v)) == (k, v)``.
    """

    version_byte: bool = False
    key_version: bool = True
    cf_id: int | None = None
    checksum_bytes: int = 0

    @property
    def row_prefix(self) -> int:
        """Bytes in front of each value row after :meth:`envelope` decoding: the version byte."""
        return 1 if self.version_byte else 0

    def envelope(self) -> EntryCodec:
        """This codec without the version byte: what a row decoder that strips the version byte
        itself (with an Avro schema id, or inside a prefix-scan key) needs stripped first."""
        return replace(self, version_byte=False)

    def decode(self, keys: pa.Array, values: pa.Array) -> Entries:
        keys, values = _binary(keys), _binary(values)
        if self.cf_id is not None:
            heads, keys = strip_prefix(keys, 2)
            ids = heads.view("<i2").reshape(-1) if len(heads) else np.zeros(0, "<i2")
            if np.any(ids != self.cf_id):
                raise StatectlError(
                    f"state entry of column family id {int(ids[ids != self.cf_id][0])} "
                    f"where {self.cf_id} was expected; the store is corrupt"
                )
        checksums = None
        if self.checksum_bytes:
            heads, values = strip_prefix(values, self.checksum_bytes)
            checksums = np.ascontiguousarray(heads[:, :4]).view("<i4").reshape(-1)
            if self.checksum_bytes == 8:
                recorded = np.ascontiguousarray(heads[:, 4:8]).view("<i4").reshape(-1)
                if np.any(recorded != np.diff(_parts(values)[1])):
                    raise StatectlError("a row checksum's value length is wrong; store corrupt")
        if self.version_byte:
            if self.key_version:
                keys = slice_bytes(keys, 1)
            values = slice_bytes(values, 1)
        return Entries(keys, values, checksums)

    def encode(
        self, keys: pa.Array, values: pa.Array, checksums: np.ndarray | None = None
    ) -> tuple[pa.LargeBinaryArray, pa.LargeBinaryArray]:
        """The backend's bytes of rows; ``checksums`` are required with row checksums (statectl
        does not compute Spark's row checksum: it carries the ones it read)."""
        keys, values = _binary(keys), _binary(values)
        n = len(keys)
        if self.version_byte:
            keys = prepend(keys, b"\0") if self.key_version else keys
            values = prepend(values, b"\0")
        if self.checksum_bytes:
            if checksums is None:
                raise UnsupportedError("writing new row checksums is not supported")
            heads = np.zeros((n, self.checksum_bytes), np.uint8)
            heads[:, :4] = np.asarray(checksums, "<i4").reshape(-1, 1).view(np.uint8)
            if self.checksum_bytes == 8:
                lengths = np.diff(_parts(values)[1]).astype("<i4")
                heads[:, 4:8] = lengths.reshape(-1, 1).view(np.uint8)
            values = add_prefix(values, heads)
        if self.cf_id is not None:
            keys = prepend(keys, np.int16(self.cf_id).astype("<i2").tobytes())
        return keys, values

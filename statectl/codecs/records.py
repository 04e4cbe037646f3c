"""Record streams inside Spark's state files (after the codec stream is removed).

* HDFS ``.delta``/``.snapshot`` and RocksDB changelog v1 (and v3 after its header):
  ``int32 BE klen, key, int32 BE vlen, value`` with ``vlen == -1`` for a removal; ``int32 -1`` ends.
* RocksDB changelog v2 (and v4 after its header): ``byte type`` first (0x01 put, 0x10 delete,
  0x11 merge); a 0x00 type byte ends.

Parsing returns Arrow binary arrays for keys and values, built by vectorized gathers; finding
the record boundaries is the only sequential step.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from statectl.codecs.javaio import DataReader, encode_modified_utf8
from statectl.errors import CorruptFileError

OP_PUT, OP_DELETE, OP_MERGE = 0, 1, 2
_TYPE_TO_OP = {0x01: OP_PUT, 0x10: OP_DELETE, 0x11: OP_MERGE}
_OP_TO_TYPE = {v: k for k, v in _TYPE_TO_OP.items()}
_INT = struct.Struct(">i")


@dataclass
class RecordBatch:
    """The records of one file, in file order."""

    ops: np.ndarray  # uint8, OP_*
    keys: pa.LargeBinaryArray
    values: pa.LargeBinaryArray  # null where ops == OP_DELETE
    lineage: list[dict] | None = None
    version: int = 1

    def __len__(self) -> int:
        return len(self.ops)


def gather(
    buf: np.ndarray, starts: np.ndarray, lengths: np.ndarray, valid: np.ndarray | None = None
) -> pa.LargeBinaryArray:
    """Byte ranges ``buf[s:s+l]`` as one Arrow large_binary array, without per-row slicing.

    The ranges must not overlap. A +1/-1 mark at every range start/end and a running sum give a
    byte mask; the masked bytes, in order, are the concatenated values.
    """
    n = len(starts)
    offsets = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    if n == 0 or offsets[-1] == 0:
        data = np.zeros(0, np.uint8)
    elif _word_aligned(starts, lengths):
        data = _gather_words(buf, starts, lengths, int(offsets[-1]))
    else:
        mark = np.zeros(len(buf) + 1, dtype=np.int8)
        nz = lengths > 0
        mark[starts[nz]] += 1
        mark[starts[nz] + lengths[nz]] -= 1
        mask = np.cumsum(mark[:-1], dtype=np.int8).view(np.bool_)
        data = buf[mask]
    validity = None
    if valid is not None and not valid.all():
        validity = pa.py_buffer(np.packbits(valid, bitorder="little"))
    return pa.LargeBinaryArray.from_buffers(
        pa.large_binary(), n, [validity, pa.py_buffer(offsets), pa.py_buffer(data)]
    )


def _word_aligned(starts: np.ndarray, lengths: np.ndarray) -> bool:
    return bool(len(starts)) and not ((starts - starts[0]) & 7).any() and not (lengths & 7).any()


def _gather_words(
    buf: np.ndarray, starts: np.ndarray, lengths: np.ndarray, total: int
) -> np.ndarray:
    """gather() for 8-byte-multiple ranges on one 8-byte grid: moves words, not bytes."""
    base = int(starts[0]) & 7
    words = buf[base : base + ((len(buf) - base) // 8) * 8].view("<u8")
    wstart = (starts - base) >> 3
    wlen = lengths >> 3
    woff = np.zeros(len(wlen) + 1, dtype=np.int64)
    np.cumsum(wlen, out=woff[1:])
    idx = np.repeat(wstart - woff[:-1], wlen) + np.arange(total // 8, dtype=np.int64)
    return words[idx].view(np.uint8)


def _be_int32_at(arr: np.ndarray, pos: np.ndarray) -> np.ndarray:
    b = arr[pos[:, None] + np.arange(4)].astype(np.int64)
    v = (b[:, 0] << 24) | (b[:, 1] << 16) | (b[:, 2] << 8) | b[:, 3]
    return np.where(v >= 1 << 31, v - (1 << 32), v)


def _constant_stride(
    arr: np.ndarray, start: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray, int] | None:
    """Fast path: every record has the first record's key and value sizes (fixed-width rows)."""
    size = len(arr)
    if size - start < 8:
        return None
    (klen,) = _INT.unpack_from(arr, start)
    if klen <= 0 or start + 8 + klen > size:
        return None
    (vlen,) = _INT.unpack_from(arr, start + 4 + klen)
    if vlen < 0:
        return None
    stride = 8 + klen + vlen
    body = size - start - 4
    if body <= 0 or body % stride:
        return None
    n = body // stride
    rec = start + stride * np.arange(n, dtype=np.int64)
    if not (
        np.all(_be_int32_at(arr, rec) == klen) and np.all(_be_int32_at(arr, rec + 4 + klen) == vlen)
    ):
        return None
    if _INT.unpack_from(arr, size - 4)[0] != -1:
        return None
    return rec + 4, np.full(n, klen, np.int64), np.full(n, vlen, np.int64), size


def _scan_grid(
    arr: np.ndarray, start: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray, int] | None:
    """Record boundaries when every key and value size is a multiple of 8 (UnsafeRows).

    Then every record starts on the 8-byte grid from ``start`` and every value length sits 4
    bytes past a grid point, so the buffer viewed as 8-byte rows gives, vectorized, where the
    next record would start from any grid point. Following that chain from the first record is
    one list lookup per record. Returns None (the caller falls back to the exact loop) on
    anything unexpected.
    """
    size = len(arr)
    n = (size - start + 7) // 8  # the 4-byte end marker may sit in a half row: pad it
    if n < 1:
        return None
    body = arr[start:]
    if len(body) != 8 * n:
        body = np.concatenate([body, np.zeros(8 * n - len(body), np.uint8)])
    rows = body.reshape(n, 8)
    head = np.ascontiguousarray(rows[:, :4]).view(">i4").reshape(-1).astype(np.int64)
    tail = np.ascontiguousarray(rows[:, 4:]).view(">i4").reshape(-1).astype(np.int64)
    # For a record at grid i: key length head[i]; its value length is at grid i + 1 + klen/8.
    klen = head
    vidx = np.arange(n, dtype=np.int64) + (klen >> 3)
    ok = (klen >= 0) & ((klen & 7) == 0) & (vidx < n)
    vlen = tail[np.where(ok, vidx, 0)]
    ok &= (vlen >= -1) & ((np.maximum(vlen, 0) & 7) == 0)
    step = np.where(ok, vidx + 1 + (np.maximum(vlen, 0) >> 3), -2)
    step[step >= n] = -2
    step[klen == -1] = -1  # the end marker
    chain = step.tolist()
    visited: list[int] = []
    add = visited.append
    i = 0
    while i >= 0:  # the one sequential step: two list operations per record
        add(i)
        i = chain[i]
    if i != -1:
        return None
    end = visited.pop()  # the grid point holding the end marker
    idx = np.array(visited, dtype=np.int64)
    return start + 8 * idx + 4, klen[idx], vlen[idx], start + 8 * end + 4


def _scan_v1(
    data: bytes, start: int, path: str | None
) -> tuple[list[int], list[int], list[int], int]:
    unpack = _INT.unpack_from
    kstarts: list[int] = []
    klens: list[int] = []
    vlens: list[int] = []
    pos = start
    try:
        while True:
            (k,) = unpack(data, pos)
            if k == -1:
                return kstarts, klens, vlens, pos + 4
            if k < 0:
                raise CorruptFileError(f"invalid key size {k} at byte {pos}", path)
            (v,) = unpack(data, pos + 4 + k)
            kstarts.append(pos + 4)
            klens.append(k)
            vlens.append(v)
            pos += 8 + k + (v if v > 0 else 0)
    except struct.error:
        raise CorruptFileError(
            f"truncated: record at byte {pos} runs past the end of the data (no end marker)", path
        ) from None


def _scan_typed(
    data: bytes, start: int, path: str | None
) -> tuple[list[int], list[int], list[int], list[int], int]:
    unpack = _INT.unpack_from
    types: list[int] = []
    kstarts: list[int] = []
    klens: list[int] = []
    vlens: list[int] = []
    pos = start
    try:
        while True:
            t = data[pos]
            if t == 0:
                return types, kstarts, klens, vlens, pos + 1
            if t not in _TYPE_TO_OP:
                raise CorruptFileError(
                    f"unknown changelog record type 0x{t:02x} at byte {pos}", path
                )
            (k,) = unpack(data, pos + 1)
            if k < 0:
                raise CorruptFileError(f"invalid key size {k} at byte {pos}", path)
            (v,) = unpack(data, pos + 5 + k)
            types.append(t)
            kstarts.append(pos + 5)
            klens.append(k)
            vlens.append(v)
            pos += 9 + k + (v if v > 0 else 0)
    except (struct.error, IndexError):
        raise CorruptFileError(
            f"truncated: record at byte {pos} runs past the end of the data (no end marker)", path
        ) from None


def _build(
    data: bytes,
    ops: np.ndarray,
    kstarts: np.ndarray,
    klens: np.ndarray,
    vlens: np.ndarray,
    end: int,
    path: str | None,
    allow_deletes: bool,
    lineage: list[dict] | None,
    version: int,
) -> RecordBatch:
    arr = np.frombuffer(data, dtype=np.uint8)
    if end > len(data):
        raise CorruptFileError("truncated: the last record runs past the end of the data", path)
    if end != len(data):
        raise CorruptFileError(f"{len(data) - end} unexpected bytes after the end marker", path)
    deleted = vlens < 0
    if np.any(vlens < -1):
        raise CorruptFileError("invalid value size below -1", path)
    if deleted.any() and not allow_deletes:
        raise CorruptFileError("a snapshot file contains a removal record", path)
    vstarts = kstarts + klens + 4
    vl = np.where(deleted, 0, vlens)
    keys = gather(arr, kstarts, klens)
    values = gather(arr, vstarts, vl, valid=~deleted)
    ops = np.where(deleted, OP_DELETE, ops).astype(np.uint8)
    return RecordBatch(ops, keys, values, lineage, version)


def parse_state_records(
    raw: bytes,
    path: str | None = None,
    *,
    allow_deletes: bool = True,
    start: int = 0,
    lineage: list[dict] | None = None,
    version: int = 1,
) -> RecordBatch:
    """A v1 record stream: HDFS delta/snapshot or changelog v1/v3 body."""
    arr = np.frombuffer(raw, dtype=np.uint8)
    fast = _constant_stride(arr, start)
    if fast is None and len(raw) > 1 << 16:
        fast = _scan_grid(arr, start)
    if fast is not None:
        kstarts, klens, vlens, end = fast
    else:
        ks, kl, vl, end = _scan_v1(raw, start, path)
        kstarts, klens, vlens = (np.array(x, dtype=np.int64) for x in (ks, kl, vl))
    ops = np.zeros(len(kstarts), dtype=np.uint8)
    return _build(raw, ops, kstarts, klens, vlens, end, path, allow_deletes, lineage, version)


def changelog_version(raw: bytes) -> tuple[int, int, list[dict] | None]:
    """(version, body start, lineage) the way ``StateStoreChangelogReaderFactory`` decides."""
    if len(raw) >= 2:
        (n,) = struct.unpack_from(">H", raw, 0)
        if n > 0 and 2 + n <= len(raw) and raw[2:3] == b"v":
            r = DataReader(raw)
            head = r.read_utf()
            if head in ("v2", "v3", "v4"):
                version = int(head[1])
                lineage = None
                if version in (3, 4):
                    try:
                        lineage = json.loads(r.read_utf())
                    except json.JSONDecodeError:
                        raise CorruptFileError("changelog lineage is not JSON", None) from None
                return version, r.pos, lineage
    return 1, 0, None


def parse_changelog(raw: bytes, path: str | None = None) -> RecordBatch:
    try:
        version, start, lineage = changelog_version(raw)
    except CorruptFileError as e:
        raise CorruptFileError(str(e), path) from None
    if version in (1, 3):
        return parse_state_records(raw, path, start=start, lineage=lineage, version=version)
    types, ks, kl, vl, end = _scan_typed(raw, start, path)
    ops = np.array([_TYPE_TO_OP[t] for t in types], dtype=np.uint8)
    kstarts, klens, vlens = (np.array(x, dtype=np.int64) for x in (ks, kl, vl))
    return _build(raw, ops, kstarts, klens, vlens, end, path, True, lineage, version)


# -- writing -------------------------------------------------------------------------------
def _as_list(a: pa.Array | list) -> list:
    return a.to_pylist() if isinstance(a, pa.Array) else list(a)


def _parts(arr: pa.Array) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(bytes, starts, lengths) of a binary array; null elements have length -1."""
    arr = arr.cast(pa.large_binary()) if arr.type != pa.large_binary() else arr
    n = len(arr)
    _, off_buf, data_buf = arr.buffers()
    offs = np.frombuffer(off_buf, dtype=np.int64)[arr.offset : arr.offset + n + 1]
    data = (
        np.frombuffer(data_buf, dtype=np.uint8) if data_buf is not None else np.zeros(0, np.uint8)
    )
    lengths = np.diff(offs)
    if arr.null_count:
        valid = np.asarray(arr.is_valid().to_numpy(zero_copy_only=False), dtype=bool)
        lengths = np.where(valid, lengths, -1)
    return data, offs[:-1], lengths


def _copy_ranges(
    out: np.ndarray, dst: np.ndarray, src: np.ndarray, src_starts: np.ndarray, lengths: np.ndarray
) -> None:
    lengths = np.maximum(lengths, 0)
    total = int(lengths.sum())
    if total == 0:
        return
    offs = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offs[1:])
    within = np.arange(total, dtype=np.int64) - np.repeat(offs[:-1], lengths)
    out[np.repeat(dst, lengths) + within] = src[np.repeat(src_starts, lengths) + within]


def write_state_records(
    keys: pa.Array | list[bytes], values: pa.Array | list[bytes | None], prefix: bytes = b""
) -> bytes:
    """A v1 record stream (None value = removal) with the end marker, built with numpy.

    ``prefix`` is prepended to every key and value (RocksDB's encoding-version byte).
    """
    if not isinstance(keys, pa.Array):
        keys = pa.array(keys, type=pa.large_binary())
    if not isinstance(values, pa.Array):
        values = pa.array(values, type=pa.large_binary())
    kdata, kstart, klen = _parts(keys)
    vdata, vstart, vlen = _parts(values)
    p = len(prefix)
    klen_out = klen + p
    vlen_out = np.where(vlen < 0, -1, vlen + p)
    rec = 8 + klen_out + np.maximum(vlen_out, 0)
    starts = np.zeros(len(rec) + 1, dtype=np.int64)
    np.cumsum(rec, out=starts[1:])
    out = np.zeros(int(starts[-1]) + 4, dtype=np.uint8)
    rs = starts[:-1]

    def put_int(pos: np.ndarray, v: np.ndarray) -> None:
        b = v.astype(">i4").view(np.uint8).reshape(-1, 4)
        for j in range(4):
            out[pos + j] = b[:, j]

    put_int(rs, klen_out)
    vpos = rs + 4 + klen_out
    put_int(vpos, vlen_out)
    pre = np.frombuffer(prefix, dtype=np.uint8)
    for j in range(p):
        out[rs + 4 + j] = pre[j]
        live = vlen_out >= 0
        out[vpos[live] + 4 + j] = pre[j]
    _copy_ranges(out, rs + 4 + p, kdata, kstart, klen)
    _copy_ranges(out, vpos + 4 + p, vdata, vstart, vlen)
    out[-4:] = 0xFF
    return out.tobytes()


def write_changelog(
    version: int,
    ops: np.ndarray | list[int],
    keys: pa.Array | list[bytes],
    values: pa.Array | list[bytes | None],
    lineage: list[dict] | None = None,
) -> bytes:
    head = b""
    if version >= 2:
        tag = f"v{version}".encode()
        head = struct.pack(">H", len(tag)) + tag
    if version in (3, 4):
        text = encode_modified_utf8(json.dumps(lineage or [], separators=(",", ":")))
        head += struct.pack(">H", len(text)) + text
    if version in (1, 3):
        return head + write_state_records(keys, values)
    parts = [head]
    pack = _INT.pack
    for op, k, v in zip(list(ops), _as_list(keys), _as_list(values), strict=True):
        parts.append(bytes([_OP_TO_TYPE[int(op)]]) + pack(len(k)) + k)
        parts.append(pack(-1) if v is None or op == OP_DELETE else pack(len(v)) + v)
    parts.append(b"\x00")
    return b"".join(parts)


# -- replay --------------------------------------------------------------------------------
def last_writer_wins(
    batches: list[RecordBatch], merge_delimiter: bytes = b"", unique: bool = False
) -> tuple[pa.LargeBinaryArray, pa.LargeBinaryArray]:
    """Apply batches in order (snapshot first): the live keys and their final values.

    Vectorized: dictionary-encode all keys, keep each key's last record, drop removals. Keys
    touched by MERGE records (list state) are resolved in a loop: the value after the last PUT
    or DELETE, then each merged operand appended with ``merge_delimiter``.
    """
    batches = [b for b in batches if len(b)]
    if not batches:
        empty = pa.array([], type=pa.large_binary())
        return empty, empty
    if unique and len(batches) == 1 and not (batches[0].ops != OP_PUT).any():
        return batches[0].keys, batches[0].values  # a snapshot: every key once, no removals
    keys = pa.concat_arrays([b.keys for b in batches]) if len(batches) > 1 else batches[0].keys
    values = (
        pa.concat_arrays([b.values for b in batches]) if len(batches) > 1 else batches[0].values
    )
    ops = np.concatenate([b.ops for b in batches])
    n = len(ops)
    encoded = pc.dictionary_encode(keys)
    if len(encoded.dictionary) == n and not (ops != OP_PUT).any():
        return keys, values  # every key once, no removals or merges: nothing to replay
    idx = np.asarray(encoded.indices.to_numpy(zero_copy_only=False), dtype=np.int64)
    _, first_in_reversed = np.unique(idx[::-1], return_index=True)
    last = np.sort(n - 1 - first_in_reversed)
    merged: dict[int, bytes | None] = {}
    if (ops == OP_MERGE).any():
        merge_ids = set(np.unique(idx[ops == OP_MERGE]).tolist())
        rows = np.nonzero(np.isin(idx, list(merge_ids)))[0]
        vals = values.take(pa.array(rows)).to_pylist()
        state: dict[int, bytes | None] = {}
        for r, v in zip(rows.tolist(), vals, strict=True):
            key_id = int(idx[r])
            op = ops[r]
            if op == OP_PUT:
                state[key_id] = v
            elif op == OP_DELETE:
                state[key_id] = None
            else:
                cur = state.get(key_id)
                state[key_id] = v if cur is None else cur + merge_delimiter + v
        merged = state
    keep = last[ops[last] != OP_DELETE] if not merged else last
    out_keys = keys.take(pa.array(keep))
    out_values = values.take(pa.array(keep))
    if merged:
        vals = out_values.to_pylist()
        ids = idx[keep]
        live = []
        for j, key_id in enumerate(ids.tolist()):
            if key_id in merged:
                vals[j] = merged[key_id]
            live.append(
                vals[j] is not None and not (key_id not in merged and ops[keep[j]] == OP_DELETE)
            )
        mask = np.array(live, dtype=bool)
        out_keys = out_keys.filter(pa.array(mask))
        out_values = pa.array(
            [v for v, m in zip(vals, live, strict=True) if m], type=pa.large_binary()
        )
    return out_keys, out_values

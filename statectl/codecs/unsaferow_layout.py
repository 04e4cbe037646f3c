"""Spark's UnsafeRow (and UnsafeArrayData / UnsafeMapData) ⇄ Arrow, column by column.

Layout (catalyst ``UnsafeRow``, ``UnsafeRowWriter``, ``UnsafeArrayWriter``; all little-endian):

* row = null bitset (ceil(n/64) words) ‖ one 8-byte slot per field ‖ variable-length region.
  Fixed-width values sit in their zeroed slot; variable-length ones (string, binary, decimal
  with precision > 18, calendar interval, struct, array, map) store ``offset << 32 | size``,
  the offset counted from the start of the enclosing row (or array), and their bytes in the
  variable region, zero padded to a multiple of 8. A null field has its bit set and slot 0,
  except a row's decimal(p > 18): it keeps 16 zeroed bytes and the slot ``cursor << 32``.
* array = int64 count ‖ null bits (ceil(count/64) words) ‖ count × element size (1/2/4/8,
  padded to 8) ‖ variable region. Variable elements are 8-byte offset/size slots, the offset
  counted from the array start; a decimal(p > 18) element takes only its rounded length.
* map = int64 byte length of the key array ‖ key array ‖ value array.

Decoding never loops over rows: positions are numpy int64 arrays into one byte buffer and each
field (and nesting level) costs a handful of whole-array operations. Encoding builds the same
bytes the same way, column by column.

This module holds what both directions share: decoding is
:mod:`statectl.codecs.unsaferow_decode`, encoding :mod:`statectl.codecs.unsaferow_encode`.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa

from statectl.codecs.sparktypes import FIXED_KINDS, SparkType, kind

MASK32 = np.int64(0xFFFFFFFF)
Valid = np.ndarray | None  # per-value validity; None means every value is valid


def bitmap(valid: Valid) -> pa.Buffer | None:
    if valid is None or valid.all():
        return None
    return pa.py_buffer(np.packbits(valid, bitorder="little"))


def valid_and(a: Valid, b: Valid) -> Valid:
    if a is None:
        return b
    return a if b is None else a & b


def pad8(n: np.ndarray) -> np.ndarray:
    return (n + 7) & ~7


def exclusive_cumsum(x: np.ndarray) -> np.ndarray:
    out = np.zeros(len(x) + 1, dtype=np.int64)
    np.cumsum(x, out=out[1:])
    return out


def bitset_bytes(n: int | np.ndarray) -> Any:
    return ((n + 63) >> 6) << 3


def element_size(t: SparkType) -> int:
    return FIXED_KINDS.get(kind(t), 8)

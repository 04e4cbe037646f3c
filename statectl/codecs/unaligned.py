"""Integer loads at any byte offset of a buffer, vectorized.

``loads(data, ">i4")[pos]`` reads a big-endian int32 at every position of ``pos`` (any byte
offsets, overlapping or not): the integer type viewed over the bytes with a stride of one
byte, so numpy's gather does one unaligned load per position. That is about 40% faster than
gathering ``sliding_window_view(data, 4)`` rows and viewing them as integers (the gathers of
record sizes, key words and hash words of every read; issue 27).
"""

from __future__ import annotations

from typing import Literal

import numpy as np


def loads(data: np.ndarray, dtype: str) -> np.ndarray:
    """A read-only array whose element ``i`` is the ``dtype`` integer at byte ``i`` of the
    uint8 array ``data`` (empty where ``data`` is shorter than one integer)."""
    width = np.dtype(dtype).itemsize
    count = max(0, len(data) - width + 1)
    if count == 0:
        return np.zeros(0, dtype=dtype)
    view = np.ndarray((count,), dtype=dtype, buffer=data, offset=0, strides=(1,))
    view.flags.writeable = False
    return view


def loads_at(data: np.ndarray, dtype: str, at: np.ndarray) -> np.ndarray:
    """The unsigned ``dtype`` integer at each byte offset ``at`` of the uint8 array ``data``,
    in native byte order, its bytes past the end of ``data`` read as zeros (the last keys or
    strings of a buffer may end within its last word)."""
    width = np.dtype(dtype).itemsize
    if len(data) < width:  # fewer bytes than one integer in all: padded
        data = np.concatenate([data, np.zeros(width, dtype=np.uint8)])
    view = loads(data, dtype)
    last = len(view) - 1  # the last offset a whole integer can be read at
    out = view[np.minimum(at, last)].astype(np.dtype(f"u{width}"))
    order: Literal["big", "little"] = "big" if np.dtype(dtype).byteorder == ">" else "little"
    for i in np.flatnonzero(at > last).tolist():  # a few offsets at the end of the data
        out[i] = int.from_bytes(bytes(data[at[i] : at[i] + width]).ljust(width, b"\0"), order)
    return out

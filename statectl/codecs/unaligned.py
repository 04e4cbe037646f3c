"""Integer loads at any byte offset of a buffer, vectorized.

``loads(data, ">i4")[pos]`` reads a big-endian int32 at every position of ``pos`` (any byte
offsets, overlapping or not): the integer type viewed over the bytes with a stride of one
byte, so numpy's gather does one unaligned load per position. That is about 40% faster than
gathering ``sliding_window_view(data, 4)`` rows and viewing them as integers (the gathers of
record sizes, key words and hash words of every read; issue 27).
"""

from __future__ import annotations

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

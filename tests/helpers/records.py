"""Record batches for the replay tests: ops, keys and values cut into chunks as a reader
yields them."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from statectl.codecs.records import RecordBatch


def record_chunks(
    ops: np.ndarray, keys: list[bytes], values: list[bytes | None], per: int
) -> list[RecordBatch]:
    """The records, ``per`` a chunk."""
    return [
        RecordBatch(
            ops[i : i + per],
            pa.array(keys[i : i + per], pa.large_binary()),
            pa.array(values[i : i + per], pa.large_binary()),
        )
        for i in range(0, len(keys), per)
    ]

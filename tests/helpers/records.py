"""Record batches for the replay tests: ops, keys and values cut into chunks as a reader
yields them."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from statectl.backends.base import VersionRecords
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


def after_no_snapshot(batches: list[RecordBatch]) -> VersionRecords:
    """``batches`` as the records of a version with no snapshot under them (deltas or
    changelogs only)."""
    return VersionRecords(None, lambda: iter(batches))

"""State store backends: load one store (one partition) at one version as raw key/value bytes."""

from __future__ import annotations

from dataclasses import dataclass, field

import pyarrow as pa


@dataclass
class RawState:
    """The live entries of one store partition at one version, as the backend stores them.

    HDFS: UnsafeRow bytes. RocksDB: the RocksDB key and value bytes, still carrying the encoding
    version byte and, for column-family stores, the 2-byte column family id (``cf_ids``).
    """

    keys: pa.LargeBinaryArray
    values: pa.LargeBinaryArray
    # RocksDB virtual column families: name -> id, from the snapshot's metadata.
    cf_ids: dict[str, int] = field(default_factory=dict)
    files: list[str] = field(default_factory=list)  # the files it was rebuilt from

    def __len__(self) -> int:
        return len(self.keys)


def empty_raw_state() -> RawState:
    empty = pa.array([], type=pa.large_binary())
    return RawState(empty, empty)

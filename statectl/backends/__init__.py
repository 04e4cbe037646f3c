"""State store backends: load one store (one partition) at one version as raw key/value bytes."""

from __future__ import annotations

import posixpath
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TypeVar

import pyarrow as pa

from statectl.errors import MissingFileError

F = TypeVar("F")


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


def version_chain(
    snapshots: Mapping[int, F], increments: Mapping[int, F], version: int, store_dir: str, ext: str
) -> tuple[F | None, list[F]]:
    """The newest snapshot at or below ``version`` and the increments (deltas or changelogs)
    after it up to ``version``, the way both providers load a version."""
    base = max((v for v in snapshots if v <= version), default=0)
    chain = []
    for v in range(base + 1, version + 1):
        if v not in increments:
            raise MissingFileError(
                f"state version {version} needs {v}.{ext}, which is missing "
                f"(newest usable snapshot: {base or 'none'})",
                posixpath.join(store_dir, f"{v}.{ext}"),
                "the checkpoint is incomplete; pick an older --batch",
            )
        chain.append(increments[v])
    return snapshots.get(base), chain

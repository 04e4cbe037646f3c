"""Write one store partition at one version in a backend's native files.

* HDFS: ``<version>.snapshot`` holding every entry (Spark loads the newest snapshot at or
  below the version it wants, so nothing older is needed).
* RocksDB (stores without column families): changelog files only, which Spark replays from
  version 0 when no snapshot zip exists: empty ``1..version-1.changelog`` and everything in
  ``<version>.changelog``. Spark 4.3 accepted this route in real restarts (the test suite
  restarts queries on it); it writes its own zip snapshot later.
"""

from __future__ import annotations

import posixpath

import pyarrow as pa

from statectl.codecs.compression import compress_stream
from statectl.codecs.records import write_state_records
from statectl.io import FileIO

EMPTY_RECORDS = b"\xff\xff\xff\xff"


def write_hdfs_store(
    io: FileIO, store_dir: str, version: int, codec: str, keys: pa.Array, values: pa.Array
) -> list[str]:
    path = posixpath.join(store_dir, f"{version}.snapshot")
    io.write_atomic(path, compress_stream(codec, write_state_records(keys, values)))
    return [path]


def write_rocksdb_store(
    io: FileIO, store_dir: str, version: int, codec: str, keys: pa.Array, values: pa.Array
) -> list[str]:
    """Changelog v1 files; keys and values get RocksDB's 0x00 encoding-version byte."""
    written = []
    empty = compress_stream(codec, EMPTY_RECORDS)
    for v in range(1, version):
        path = posixpath.join(store_dir, f"{v}.changelog")
        io.write_atomic(path, empty)
        written.append(path)
    path = posixpath.join(store_dir, f"{version}.changelog")
    data = write_state_records(keys, values, prefix=b"\x00")
    io.write_atomic(path, compress_stream(codec, data))
    written.append(path)
    return written

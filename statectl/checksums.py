"""Checksums the checkpoint formats carry, verified on every read.

Two kinds exist beside the files statectl reads (docs/spark-state-format.md §10):

* Hadoop ``.<name>.crc`` sidecars, written by Hadoop's local file system for every file: ``crc\\0``,
  int32 BE bytes-per-checksum, then one uint32 BE zlib CRC-32 per chunk.
* Spark's checkpoint file checksums ``<name>.crc``: JSON with the CRC32C of the whole file and
  its size. Spark 4.1 writes one beside every state file (deltas, changelogs, zips; not SSTs)
  whatever the checkpoint format; Spark 4.2 and 4.3 only under checkpoint format v2.

Spark itself reads a file whose Hadoop sidecar is stale without complaint; statectl treats every
mismatch as damage, because rows that silently differ are the one failure it may never have.
A missing sidecar is fine (object stores have none, Python-written files have none).

Every read of a checkpoint file goes through :func:`read_verified`.
"""

from __future__ import annotations

import json
import posixpath
import struct
import zlib

import numpy as np

from statectl.errors import CorruptFileError
from statectl.io import FileIO

_HADOOP_MAGIC = b"crc\x00"


def hadoop_crc_path(path: str) -> str:
    parent, name = posixpath.split(path)
    return posixpath.join(parent, f".{name}.crc")


def spark_crc_path(path: str) -> str:
    return path + ".crc"


def _mismatch(path: str, sidecar: str) -> CorruptFileError:
    return CorruptFileError(
        f"does not match its checksum {posixpath.basename(sidecar)}; the file was changed or damaged",
        path,
    )


def check_hadoop_crc(data: bytes, sidecar: bytes, path: str, sidecar_path: str) -> None:
    """Verify ``data`` against the bytes of its Hadoop ``.crc`` sidecar."""
    if len(sidecar) < 8 or sidecar[:4] != _HADOOP_MAGIC:
        raise CorruptFileError("is not a Hadoop checksum file (bad header)", sidecar_path)
    (chunk,) = struct.unpack(">i", sidecar[4:8])
    if chunk <= 0:
        raise CorruptFileError(f"invalid bytesPerChecksum {chunk}", sidecar_path)
    n_chunks = -(-len(data) // chunk)
    if len(sidecar) != 8 + 4 * n_chunks:  # also a file that grew or shrank
        raise _mismatch(path, sidecar_path)
    if n_chunks == 0:
        return
    stored = np.frombuffer(sidecar, dtype=">u4", offset=8)
    view = memoryview(data)
    crc = zlib.crc32
    computed = np.fromiter(
        (crc(view[i : i + chunk]) for i in range(0, len(data), chunk)),
        dtype=np.uint32,
        count=n_chunks,
    )
    if not np.array_equal(computed, stored):
        raise _mismatch(path, sidecar_path)


def crc32c(data: bytes) -> int:
    import google_crc32c  # native; imported only when a checkpoint carries CRC32C checksums

    return int(google_crc32c.value(data))


def check_spark_checksum(data: bytes, text: bytes, path: str, sidecar_path: str) -> None:
    """Verify ``data`` against Spark's JSON checksum file (``ChecksumCheckpointFileManager``)."""
    try:
        obj = json.loads(text)
        algorithm = str(obj["algorithm"])
        value = int(obj["value"])
        size = int(obj["mainFileSize"])
    except (ValueError, KeyError, TypeError, RecursionError):
        raise CorruptFileError(
            "is not a Spark checksum file (invalid JSON)", sidecar_path
        ) from None
    if algorithm.upper() != "CRC32C":
        return  # a future algorithm: nothing we can check, and not damage
    # Spark stores (int) CRC32C: a signed int32.
    if len(data) != size or crc32c(data) != value & 0xFFFFFFFF:
        raise _mismatch(path, sidecar_path)


def spark_checksum_file(data: bytes, timestamp_ms: int) -> bytes:
    """The JSON ``<name>.crc`` Spark (4.1+, checkpoint format v2) writes beside a state file;
    a restore writes one for every such file, so Spark verifies what statectl wrote."""
    value = crc32c(data)
    signed = value - (1 << 32) if value >= 1 << 31 else value  # Spark stores (int) CRC32C
    obj = {
        "algorithm": "CRC32C",
        "value": signed,
        "mainFileSize": len(data),
        "timestampMs": timestamp_ms,
        "creator": {"executorId": "statectl", "taskInfo": "restore"},
    }
    return json.dumps(obj, separators=(",", ":")).encode()


def read_verified(io: FileIO, path: str, *, data_file: bool = False, verify: bool = True) -> bytes:
    """Read ``path`` and check it against the checksums stored beside it.

    ``data_file``: a state file (delta, snapshot, changelog, zip, SST), which may also have a
    Spark ``<name>.crc``. Checksums over data files are the expensive part of verification and
    are skipped when ``verify`` is false; metadata files (logs, operator metadata, schemas) are
    small and always checked.
    """
    data = io.read_bytes(path)
    if data_file and not verify:
        return data
    check_hadoop_crc_of(io, path, data)
    if data_file:
        spark_path = spark_crc_path(path)
        text = io.read_bytes_if_exists(spark_path)
        if text is not None:
            check_hadoop_crc_of(io, spark_path, text)
            check_spark_checksum(data, text, path, spark_path)
    return data


def check_hadoop_crc_of(io: FileIO, path: str, data: bytes) -> None:
    """The Hadoop sidecar of an already read file (Spark's JSON checksums have one too)."""
    sidecar_path = hadoop_crc_path(path)
    sidecar = io.read_bytes_if_exists(sidecar_path)
    if sidecar is not None:
        check_hadoop_crc(data, sidecar, path, sidecar_path)


def read_text_verified(io: FileIO, path: str) -> str:
    data = read_verified(io, path)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise CorruptFileError("is not UTF-8 text; the file is corrupt", path) from None

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
from collections.abc import Iterator
from typing import Any

import numpy as np

from statectl.errors import CorruptFileError
from statectl.io import FileIO

_HADOOP_MAGIC = b"crc\x00"


def hadoop_crc_path(path: str) -> str:
    parent, name = posixpath.split(path)
    return posixpath.join(parent, f".{name}.crc")


def size_problem(io: FileIO, path: str, size: int) -> str | None:
    """A file whose size disagrees with what its Hadoop ``.crc`` sidecar covers (truncated or
    extended), told from the sidecar's length alone, without reading the file: ``list``'s
    cheap health check. None when they agree, or when there is no readable sidecar (the full
    read reports a damaged one)."""
    sidecar = io.read_bytes_if_exists(hadoop_crc_path(path))
    if sidecar is None or len(sidecar) < 8 or sidecar[:4] != _HADOOP_MAGIC:
        return None
    (chunk,) = struct.unpack(">i", sidecar[4:8])
    if chunk <= 0 or (len(sidecar) - 8) % 4:
        return None
    chunks = (len(sidecar) - 8) // 4
    if -(-size // chunk) == chunks:
        return None
    return (
        f"{path}: {size} bytes, but its checksum file covers {chunks} chunk(s) of {chunk} bytes "
        "(truncated or changed; statectl doctor says what can be recovered)"
    )


def spark_crc_path(path: str) -> str:
    return path + ".crc"


def _mismatch(path: str, sidecar: str) -> CorruptFileError:
    return CorruptFileError(
        f"does not match its checksum {posixpath.basename(sidecar)}; the file was changed or damaged",
        path,
    )


def check_hadoop_crc(data: bytes, sidecar: bytes, path: str, sidecar_path: str) -> None:
    """Verify ``data`` against the bytes of its Hadoop ``.crc`` sidecar."""
    crc = _HadoopCrc(sidecar, path, sidecar_path)
    crc.update(data)
    crc.finish()


def crc32c(data: bytes) -> int:
    import google_crc32c  # native; imported only when a checkpoint carries CRC32C checksums

    return int(google_crc32c.value(data))


def check_spark_checksum(data: bytes, text: bytes, path: str, sidecar_path: str) -> None:
    """Verify ``data`` against Spark's JSON checksum file (``ChecksumCheckpointFileManager``)."""
    check_spark_checksum_of(len(data), None, text, path, sidecar_path, data)


def check_spark_checksum_of(
    size_read: int,
    value_read: int | None,
    text: bytes,
    path: str,
    sidecar_path: str,
    data: bytes | None = None,
) -> None:
    """Spark's JSON checksum against a file's size and CRC32C (``value_read``, or computed
    from ``data`` when the checksum's algorithm is one statectl knows)."""
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
    if size_read != size:
        raise _mismatch(path, sidecar_path)
    actual = value_read if value_read is not None else crc32c(data or b"")
    if actual != value & 0xFFFFFFFF:  # Spark stores (int) CRC32C: a signed int32
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
    checks = _FileChecks(io, path, data_file=data_file)
    checks.update(data)
    checks.finish()
    return data


def iter_verified(
    io: FileIO, path: str, *, verify: bool = True, block: int = 8 << 20
) -> Iterator[bytes]:
    """A state file's bytes ``block`` at a time, checked as :func:`read_verified` checks them
    but without holding the file: the checksums are computed as the blocks pass, and a
    mismatch is raised after the last block, before the iterator ends. A reader that goes
    through to the end (every codec reader does) never finishes on damaged data, and the
    writes it feeds are atomic, so nothing complete-looking comes of it."""
    if not verify:
        yield from io.iter_bytes(path, block)
        return
    checks = _FileChecks(io, path, data_file=True)
    for chunk in io.iter_bytes(path, block):
        checks.update(chunk)
        yield chunk
    checks.finish()


class _FileChecks:
    """The checksums stored beside one file (its Hadoop ``.crc``; for a state file also Spark's
    ``<name>.crc``), computed over its bytes as they pass, whole or in blocks."""

    def __init__(self, io: FileIO, path: str, *, data_file: bool) -> None:
        self.io, self.path = io, path
        hadoop_path = hadoop_crc_path(path)
        sidecar = io.read_bytes_if_exists(hadoop_path)
        self.hadoop = _HadoopCrc(sidecar, path, hadoop_path) if sidecar is not None else None
        self.spark_path = spark_crc_path(path)
        self.spark = io.read_bytes_if_exists(self.spark_path) if data_file else None
        self.crc32c = _crc32c_state() if self.spark is not None else None
        self.size = 0

    def update(self, data: bytes) -> None:
        self.size += len(data)
        if self.hadoop is not None:
            self.hadoop.update(data)
        if self.crc32c is not None:
            self.crc32c.update(data)

    def finish(self) -> None:
        if self.hadoop is not None:
            self.hadoop.finish()
        if self.spark is not None and self.crc32c is not None:
            check_hadoop_crc_of(self.io, self.spark_path, self.spark)
            value = int.from_bytes(self.crc32c.digest(), "big")
            check_spark_checksum_of(self.size, value, self.spark, self.path, self.spark_path)


class _HadoopCrc:
    """A Hadoop ``.crc`` sidecar checked incrementally: one CRC-32 per ``bytesPerChecksum``."""

    def __init__(self, sidecar: bytes, path: str, sidecar_path: str) -> None:
        if len(sidecar) < 8 or sidecar[:4] != _HADOOP_MAGIC:
            raise CorruptFileError("is not a Hadoop checksum file (bad header)", sidecar_path)
        (self.chunk,) = struct.unpack(">i", sidecar[4:8])
        if self.chunk <= 0:
            raise CorruptFileError(f"invalid bytesPerChecksum {self.chunk}", sidecar_path)
        self.stored = (
            np.frombuffer(sidecar, dtype=">u4", offset=8) if len(sidecar) % 4 == 0 else None
        )
        self.path, self.sidecar_path = path, sidecar_path
        self.done = 0  # chunks checked
        self.carry = b""

    def update(self, data: bytes) -> None:
        view = memoryview(self.carry + data) if self.carry else memoryview(data)
        whole = len(view) // self.chunk * self.chunk
        if whole:
            self._check(view[:whole])
        self.carry = bytes(view[whole:])

    def _check(self, view: memoryview) -> None:
        n = -(-len(view) // self.chunk)
        step = self.chunk
        # map over a list of slices: a quarter less time than a generator expression (one CRC
        # per 512 bytes, 144k calls for a 72 MB snapshot).
        pieces = [view[i : i + step] for i in range(0, len(view), step)]
        computed = np.fromiter(map(zlib.crc32, pieces), dtype=np.uint32, count=n)
        stored = self.stored
        if stored is None or self.done + n > len(stored):
            raise _mismatch(self.path, self.sidecar_path)
        if not np.array_equal(computed, stored[self.done : self.done + n]):
            raise _mismatch(self.path, self.sidecar_path)
        self.done += n

    def finish(self) -> None:
        if self.carry:
            self._check(memoryview(self.carry))
            self.carry = b""
        if self.stored is None or self.done != len(self.stored):  # the file grew or shrank
            raise _mismatch(self.path, self.sidecar_path)


def _crc32c_state() -> Any:
    import google_crc32c  # native; imported only when a checkpoint carries CRC32C checksums

    return google_crc32c.Checksum()


def stream_block(max_bytes: int) -> int:
    """The read size of a bounded read whose chunks are ``max_bytes``."""
    return max(64 << 10, min(8 << 20, max_bytes // 8))


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

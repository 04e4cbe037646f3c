"""RocksDB ``.changelog`` files (after the codec stream): the version header Spark writes
(``v2``..``v4``, with v3/v4's lineage JSON) and the typed record stream of v2/v4
(``byte type | int32 klen | key | int32 vlen | value``); v1/v3 bodies are v1 streams
(:func:`statectl.codecs.records.parse_state_records`).
"""

from __future__ import annotations

import json
import struct

import numpy as np

from statectl.codecs.record_scan import (
    TYPE_DELETE,
    TYPE_DELETE_RANGE,
    TYPE_MERGE,
    TYPE_PUT,
    be32_at,
    extract_records,
    scan_records,
)
from statectl.codecs.records import (
    OP_DELETE,
    OP_DELETE_RANGE,
    OP_MERGE,
    OP_PUT,
    RecordBatch,
    parse_state_records,
)
from statectl.errors import CorruptFileError, UnsupportedError

CHANGELOG_VERSIONS = (1, 2, 3, 4)
_TYPE_TO_OP = np.full(256, 255, dtype=np.uint8)  # 255 = not a record type
_TYPE_TO_OP[[TYPE_PUT, TYPE_DELETE, TYPE_MERGE, TYPE_DELETE_RANGE]] = [
    OP_PUT,
    OP_DELETE,
    OP_MERGE,
    OP_DELETE_RANGE,
]


def changelog_version(
    raw: bytes | memoryview, path: str | None = None
) -> tuple[int, int, list[dict] | None]:
    """(version, body start, lineage), decided like ``StateStoreChangelogReaderFactory``.

    Spark reads one ``readUTF``: EOF, malformed modified UTF-8, a string not starting with
    ``v`` or a non-number after it all mean v1 (read from the first byte). Otherwise the number
    is the version (only 1-4 exist); the v2-v4 readers re-read the string and insist that it is
    exactly ``v<n>``, and v3/v4 then read the lineage JSON with a second ``readUTF``.
    """
    head = _read_java_utf(raw, 0)
    if head is None or not head[0].startswith("v"):
        return 1, 0, None
    tag, pos = head
    version = _java_short(tag[1:])
    if version is None or version == 1:
        return 1, 0, None
    if version not in CHANGELOG_VERSIONS:
        raise UnsupportedError(f"changelog format version {version} (statectl reads v1-v4)", path)
    if tag != f"v{version}":
        raise CorruptFileError(f"changelog header {tag!r} is not 'v{version}'", path)
    if version == 2:
        return 2, pos, None
    lineage, start = _read_lineage(raw, pos, version, path)
    return version, start, lineage


def _read_lineage(
    raw: bytes | memoryview, pos: int, version: int, path: str | None
) -> tuple[list[dict], int]:
    """The lineage JSON of a v3/v4 changelog header at ``pos``, and where the body starts."""
    text = _read_java_utf(raw, pos)
    if text is None:
        raise CorruptFileError(f"changelog v{version}: truncated or malformed lineage", path)
    try:
        lineage = json.loads(text[0])
    except json.JSONDecodeError:
        raise CorruptFileError(f"changelog v{version}: lineage is not JSON", path) from None
    if not isinstance(lineage, list) or not all(isinstance(e, dict) for e in lineage):
        raise CorruptFileError(
            f"changelog v{version}: lineage is not a JSON array of objects", path
        )
    return lineage, text[1]


def parse_changelog(raw: bytes | memoryview, path: str | None = None) -> RecordBatch:
    """A RocksDB ``.changelog`` (after the codec stream), any of versions 1-4."""
    version, start, lineage = changelog_version(raw, path)
    if version in (1, 3):
        return parse_state_records(raw, path, start=start, lineage=lineage, version=version)
    return _parse_typed(raw, start, path, lineage, version)


def _parse_typed(
    raw: bytes | memoryview, start: int, path: str | None, lineage: list[dict] | None, version: int
) -> RecordBatch:
    arr = np.frombuffer(raw, dtype=np.uint8)
    rs, end = scan_records(raw, arr, start, True, path)
    if end + 1 != len(arr):
        raise CorruptFileError(
            f"{len(arr) - end - 1} unexpected bytes after the end record at byte {end}", path
        )
    ops = _TYPE_TO_OP[arr[rs]]
    if (ops == 255).any():
        at = int(rs[np.argmax(ops == 255)])
        raise CorruptFileError(f"unknown changelog record type 0x{arr[at]:02x} at byte {at}", path)
    klen = be32_at(arr, rs + 1)
    vlen = be32_at(arr, rs + 5 + klen)
    deleted = ops == OP_DELETE
    bad = np.where(deleted, vlen != -1, vlen < 0)  # Spark: assert(-1) / NegativeArraySize
    if bad.any():
        at = int(rs[np.argmax(bad)])
        raise CorruptFileError(
            f"invalid value size {int(vlen[np.argmax(bad)])} in the record at byte {at}", path
        )
    keys, values = extract_records(raw, rs, rs + 5, klen, vlen, end, deleted)
    return RecordBatch(ops, keys, values, lineage, version)


def _read_java_utf(raw: bytes | memoryview, pos: int) -> tuple[str, int] | None:
    """``DataInputStream.readUTF`` at ``pos``: (text, next position), or None where Java throws
    EOFException or UTFDataFormatException (Spark's version detection catches both)."""
    if pos + 2 > len(raw):
        return None
    n = (raw[pos] << 8) | raw[pos + 1]
    data = bytes(raw[pos + 2 : pos + 2 + n])
    if len(data) < n:
        return None
    units: list[int] = []
    i = 0
    while i < n:  # only header strings: short
        unit, size = _utf_unit(data, i)
        if not size:
            return None
        units.append(unit)
        i += size
    text = struct.pack(f"<{len(units)}H", *units).decode("utf-16-le", "surrogatepass")
    return text, pos + 2 + n


def _utf_unit(data: bytes, i: int) -> tuple[int, int]:
    """The UTF-16 unit whose modified UTF-8 form starts at ``data[i]`` and that form's length;
    length 0 where ``readUTF`` throws UTFDataFormatException."""
    c = data[i]
    if c < 0x80:
        return c, 1
    if c >> 5 == 0b110:
        if i + 2 > len(data) or data[i + 1] & 0xC0 != 0x80:
            return 0, 0
        return ((c & 0x1F) << 6) | (data[i + 1] & 0x3F), 2
    if c >> 4 == 0b1110:
        if i + 3 > len(data) or data[i + 1] & 0xC0 != 0x80 or data[i + 2] & 0xC0 != 0x80:
            return 0, 0
        return ((c & 0x0F) << 12) | ((data[i + 1] & 0x3F) << 6) | (data[i + 2] & 0x3F), 3
    return 0, 0


def _java_short(text: str) -> int | None:
    """``Short.parseShort`` (decimal), or None where it throws NumberFormatException."""
    digits = text[1:] if text[:1] in ("+", "-") else text
    if not digits or not all(ch.isdecimal() for ch in digits):
        return None
    value = int(text)
    return value if -(1 << 15) <= value < 1 << 15 else None

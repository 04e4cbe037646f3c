"""RocksDB changelog files (v1–v4, before the codec stream) as Spark's
``StateStoreChangelogWriterV<n>`` writes them: the tests' input for statectl's changelog
parser. Record by record in plain Python, so the bytes do not come from the code under test
(v1/v3 records are delta records, written by ``write_state_records``, which the delta tests
check against Spark's own files)."""

from __future__ import annotations

import json
import struct
from collections.abc import Sequence
from typing import Any

from statectl.codecs.changelog import CHANGELOG_VERSIONS
from statectl.codecs.javaio import encode_modified_utf8
from statectl.codecs.record_scan import (
    TYPE_DELETE,
    TYPE_DELETE_RANGE,
    TYPE_EOF,
    TYPE_MERGE,
    TYPE_PUT,
)
from statectl.codecs.records import (
    OP_DELETE,
    OP_DELETE_RANGE,
    OP_MERGE,
    OP_PUT,
    write_state_records,
)
from statectl.errors import UnsupportedError

_RECORD_TYPE = {OP_PUT: TYPE_PUT, OP_DELETE: TYPE_DELETE, OP_MERGE: TYPE_MERGE}
_RECORD_TYPE[OP_DELETE_RANGE] = TYPE_DELETE_RANGE


def java_utf(text: str) -> bytes:
    """``DataOutputStream.writeUTF``: a big-endian length, then modified UTF-8."""
    data = encode_modified_utf8(text)
    return struct.pack(">H", len(data)) + data


def changelog_header(version: int, lineage: list[dict] | None = None) -> bytes:
    """What ``StateStoreChangelogWriterV<n>`` writes before the first record."""
    if version not in CHANGELOG_VERSIONS:
        raise UnsupportedError(f"changelog format version {version} (statectl writes v1-v4)")
    if version == 1:
        return b""
    head = java_utf(f"v{version}")
    if version >= 3:  # json4s Serialization.write(Array[LineageItem]): compact
        head += java_utf(json.dumps(lineage or [], separators=(",", ":"), ensure_ascii=False))
    return head


def _pylist(values: Any) -> list[Any]:
    return values.to_pylist() if hasattr(values, "to_pylist") else list(values)


def write_changelog(
    version: int,
    ops: Sequence[int],
    keys: Sequence[bytes | None],
    values: Sequence[bytes | None],
    lineage: list[dict] | None = None,
) -> bytes:
    """A whole changelog (before the codec stream) as Spark's writer of that version makes it.

    ``ops`` are OP_*; DELETE values are ignored; DELETE_RANGE records carry the end key as the
    value. v1/v3 only know puts and deletes.
    """
    head = changelog_header(version, lineage)
    ops, keys, values = [int(op) for op in ops], _pylist(keys), _pylist(values)
    if not len(ops) == len(keys) == len(values):
        raise ValueError(f"{len(ops)} ops, {len(keys)} keys and {len(values)} values")
    if any(op not in _RECORD_TYPE for op in ops):
        raise ValueError("unknown op (use OP_PUT, OP_DELETE, OP_MERGE, OP_DELETE_RANGE)")
    if version in (1, 3):
        if any(op in (OP_MERGE, OP_DELETE_RANGE) for op in ops):
            raise UnsupportedError(
                f"changelog v{version} has no merge or delete-range records (use v2 or v4)"
            )
        return head + write_state_records(keys, values, deletes=[op == OP_DELETE for op in ops])
    out = [head]
    for op, key, value in zip(ops, keys, values, strict=True):
        if key is None or (value is None and op != OP_DELETE):
            raise ValueError(
                "a record has a null key, or a put, merge or delete-range a null value"
            )
        out += [bytes([_RECORD_TYPE[op]]), struct.pack(">i", len(key)), key]
        if op == OP_DELETE:
            out.append(struct.pack(">i", -1))
        else:
            out += [struct.pack(">i", len(value)), value]
    out.append(bytes([TYPE_EOF]))
    return b"".join(out)

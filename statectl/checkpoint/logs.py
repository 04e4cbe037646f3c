"""Spark's text metadata logs: ``metadata``, ``offsets/N``, ``commits/N``, ``sources/<i>/N``.

One parser per file kind, validating the version line the way Spark's
``MetadataVersionUtil.validateVersion`` does, returning plain dataclasses.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from statectl.codecs.jsonfields import Fields, loads
from statectl.errors import CorruptFileError, UnsupportedError

MAX_OFFSET_LOG_VERSION = 2
MAX_COMMIT_LOG_VERSION = 3
MAX_SOURCE_LOG_VERSION = 1

# The confs Spark 4.3 pins in the offset log, with the value it assumes when a key is missing
# (OffsetSeqMetadata.relevantSQLConfDefaultValues). None: no legacy default, session value wins.
PINNED_CONF_LEGACY_DEFAULTS: dict[str, str | None] = {
    "spark.sql.shuffle.partitions": None,
    "spark.sql.streaming.stateStore.providerClass": None,
    "spark.sql.streaming.multipleWatermarkPolicy": "min",
    "spark.sql.streaming.flatMapGroupsWithState.stateFormatVersion": "1",
    "spark.sql.streaming.aggregation.stateFormatVersion": "1",
    "spark.sql.streaming.join.stateFormatVersion": "1",
    "spark.sql.streaming.stateStore.compression.codec": "lz4",
    "spark.sql.streaming.stateStore.rocksdb.formatVersion": None,
    "spark.sql.streaming.stateStore.rocksdb.mergeOperatorVersion": "1",
    "spark.sql.streaming.statefulOperator.useStrictDistribution": "false",
    "spark.sql.optimizer.pruneFiltersCanPruneStreamingSubplan": "true",
    "spark.sql.streaming.stateStore.encodingFormat": "unsaferow",
    "spark.sql.streaming.stateStore.rowChecksum.enabled": "false",
    "spark.sql.function.protobufExtensions.enabled": "false",
    "spark.sql.streaming.queryEvolution.enableSourceEvolution": "false",
    "spark.sql.streaming.statefulOperator.alwaysNullableOutput.enabled": "false",
    "spark.sql.dropDuplicates.deterministicKeyOrder.enabled": "false",
}

_VERSION_RE = re.compile(r"^v(\d+)$")


def parse_version_line(line: str, max_version: int, path: str) -> int:
    m = _VERSION_RE.match(line.strip())
    if not m:
        raise CorruptFileError(f"expected a version line like 'v1', found {line[:20]!r}", path)
    version = int(m.group(1))
    if version < 1:
        raise CorruptFileError(f"invalid log version {line!r}", path)
    if version > max_version:
        raise UnsupportedError(
            f"log version v{version} is newer than statectl supports (max v{max_version})",
            path,
            "upgrade statectl, or check which Spark version wrote this checkpoint",
        )
    return version


def _parse_json(text: str, path: str) -> Any:
    return loads(text, path)


def parse_stream_metadata(text: str, path: str) -> str:
    """``<ckpt>/metadata``: ``{"id":"<query id>"}``."""
    obj = _parse_json(text.strip() or "null", path)
    if not isinstance(obj, dict) or not isinstance(obj.get("id"), str):
        raise CorruptFileError("not a streaming query metadata file (no 'id')", path)
    return obj["id"]


@dataclass
class OffsetSeq:
    """``offsets/N``: the write-ahead log entry of a planned batch."""

    batch_id: int
    version: int
    batch_watermark_ms: int
    batch_timestamp_ms: int
    conf: dict[str, str]
    # v1: one entry per source in plan order (source index as the key); v2: source id -> offset.
    # None where Spark wrote "-" (no offset yet). Offsets are kept as Spark's JSON text.
    offsets: dict[str, str | None]
    metadata_extra: dict[str, Any] = field(default_factory=dict)
    raw: str = ""

    def pinned_conf(self, key: str) -> str | None:
        if key in self.conf:
            return self.conf[key]
        return PINNED_CONF_LEGACY_DEFAULTS.get(key)


def parse_offset_seq(text: str, batch_id: int, path: str) -> OffsetSeq:
    lines = text.split("\n")
    if not lines or not lines[0]:
        raise CorruptFileError("empty offset log entry (a crash while writing?)", path)
    version = parse_version_line(lines[0], MAX_OFFSET_LOG_VERSION, path)
    meta_line = lines[1] if len(lines) > 1 else ""
    meta = Fields(
        _parse_json(meta_line, path) if meta_line.strip() else {}, path, "offset metadata"
    )
    offsets = _source_offsets(lines[2:], version, path)
    known = {"batchWatermarkMs", "batchTimestampMs", "conf"}
    return OffsetSeq(
        batch_id=batch_id,
        version=version,
        batch_watermark_ms=meta.int("batchWatermarkMs", 0),
        batch_timestamp_ms=meta.int("batchTimestampMs", 0),
        conf=meta.str_map("conf", {}),
        offsets=offsets,
        metadata_extra={k: v for k, v in meta.obj.items() if k not in known},
        raw=text,
    )


def _source_offsets(lines: list[str], version: int, path: str) -> dict[str, str | None]:
    """Each source's offset (None: ``-``, no data yet): by position in v1, ``sourceId:offset``
    in v2."""
    offsets: dict[str, str | None] = {}
    for i, line in enumerate(lines):
        if version == 1:
            offsets[str(i)] = None if line == "-" else line
            continue
        source_id, sep, offset = line.partition(":")
        if not sep:
            raise CorruptFileError(
                f"v2 offset line without 'sourceId:' prefix: {line[:40]!r}", path
            )
        offsets[source_id] = None if offset == "-" else offset
    return offsets


@dataclass
class CommitMetadata:
    """``commits/N``: batch N completed; ``stateUniqueIds`` only with checkpoint format v2."""

    batch_id: int
    version: int
    next_batch_watermark_ms: int
    # operator id -> partition -> one checkpoint unique id per store (checkpoint format v2)
    state_unique_ids: dict[str, list[list[str]]] | None
    extra: dict[str, Any] = field(default_factory=dict)
    raw: str = ""


def parse_commit(text: str, batch_id: int, path: str) -> CommitMetadata:
    lines = text.split("\n")
    if not lines or not lines[0]:
        raise CorruptFileError("empty commit log entry (a crash while writing?)", path)
    version = parse_version_line(lines[0], MAX_COMMIT_LOG_VERSION, path)
    body = lines[1] if len(lines) > 1 and lines[1].strip() else "{}"
    obj = Fields(_parse_json(body, path), path, "commit metadata")
    ids = _state_unique_ids(obj, path)
    return CommitMetadata(
        batch_id=batch_id,
        version=version,
        next_batch_watermark_ms=obj.int("nextBatchWatermarkMs", 0),
        state_unique_ids=ids,
        extra={
            k: v for k, v in obj.obj.items() if k not in {"nextBatchWatermarkMs", "stateUniqueIds"}
        },
        raw=text,
    )


def _state_unique_ids(obj: Fields, path: str) -> dict[str, list[list[str]]] | None:
    """``stateUniqueIds`` (checkpoint format v2): operator id -> one entry per partition ->
    one unique id per store (or null); None when the commit has none."""
    ids = obj.fields("stateUniqueIds", None)
    if ids is None:
        return None
    for op, parts in ids.obj.items():
        if not isinstance(parts, list) or not all(_ids_of_a_partition(p) for p in parts):
            raise CorruptFileError(
                f"stateUniqueIds of operator {op} is not an array of arrays of ids", path
            )
    return ids.obj


def _ids_of_a_partition(p: Any) -> bool:
    return isinstance(p, list) and all(u is None or isinstance(u, str) for u in p)


def parse_source_log(text: str, path: str) -> list[dict[str, Any]]:
    """A file source log entry (``sources/<i>/N`` or ``N.compact``): ``v1`` then JSON lines."""
    lines = text.split("\n")
    parse_version_line(lines[0], MAX_SOURCE_LOG_VERSION, path)
    entries = [_parse_json(line, path) for line in lines[1:] if line.strip()]
    for e in entries:
        Fields(e, path, "source log entry")  # each line is one object (path, timestamp, ...)
    return entries


def batch_id_of(name: str) -> int | None:
    """Spark's log file names: ``N`` or ``N.compact``; anything else (hidden, tmp, crc) is not a batch."""
    stem = name[: -len(".compact")] if name.endswith(".compact") else name
    return int(stem) if stem.isdigit() else None

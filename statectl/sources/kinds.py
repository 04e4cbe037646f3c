"""What statectl knows about each kind of streaming source: one spec per kind, as
statectl/operators.py is for operator kinds.

A spec says what the source's offset looks like (its line in ``offsets/N``), what Spark keeps
in its ``sources/<index>/`` directory, how to describe its position (``inspect``) and which
offsets an edit (``--source-offsets``) may give it. Layouts are read from Spark's and the
connectors' own source code, cited per spec.

Recognition is conservative: a source is of a kind only when its offset *and* its
``sources/<index>/`` files are exactly what that kind writes; anything else is
:data:`OPAQUE`, carried byte for byte and shown raw, whose position is never edited.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

from statectl.checkpoint.logs import parse_source_log
from statectl.errors import StatectlError

MISSING = object()  # no offset yet (Spark's "-"), or not JSON


def offset_value(text: str | None) -> Any:
    """An offset line as JSON, or :data:`MISSING`."""
    if text is None:
        return MISSING
    try:
        return json.loads(text)
    except ValueError:
        return MISSING


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


class SourceKind:
    """A kind of source. ``name`` is what ``inspect`` and savepoint ``_metadata`` call it."""

    name = "opaque"
    title = "opaque (kind not recognised)"
    editable = False
    # Its files in sources/<index>/ are a file source's seen-files log (parsed, compacted by
    # the savepoint); every other kind's files are carried as bytes.
    parsed_log = False

    def matches(self, offset: Any, files: Mapping[str, bytes]) -> bool:
        return False

    def position(self, offset: Any) -> list[dict[str, Any]]:
        """The position as rows (inspect): empty where only the raw offset says it."""
        return []

    def check(self, offset: Any) -> str | None:
        """Why ``offset`` (parsed JSON) is not an offset of this kind; None if it is."""
        return (
            "statectl does not know this source's offsets (its kind is not recognised), so it "
            "cannot check a new position; its offset and sources/ files are kept as they are"
        )

    def change(self, old: Any, new: Any) -> str:
        """What a new position changes in the old one, in words ("" if nothing to say)."""
        return ""

    def serialise(self, offset: Any) -> str | None:
        """A given (checked) offset as this kind's Spark writer writes it in ``offsets/N``;
        None: written as given."""
        return None


class FileSourceKind(SourceKind):
    """File sources (``readStream.json(...)``, ``parquet``, ...).

    Offset: ``FileStreamSourceOffset`` (sql/core/.../execution/streaming/
    FileStreamSourceOffset.scala): ``{"logOffset":N}``, a batch of its log. ``sources/<i>/N``
    and every 10th batch ``N.compact``: ``FileStreamSourceLog`` (FileStreamSourceLog.scala,
    a ``CompactibleFileStreamLog``): ``v1`` then one ``FileEntry`` JSON per line (``path``,
    ``timestamp``, ``batchId``). The options ``latestFirst``, ``maxFilesPerTrigger`` and
    ``cleanSource`` (FileStreamOptions.scala) change which files the next batches take or
    remove; they live in the query, not the checkpoint, so a plan that changes the query must
    mention them. Its position is its seen-files log, not an offset one can give."""

    name = "file"
    title = "file source"
    parsed_log = True

    def matches(self, offset: Any, files: Mapping[str, bytes]) -> bool:
        if isinstance(offset, dict) and set(offset) == {"logOffset"}:
            return _is_int(offset["logOffset"])
        if offset is MISSING and files:
            return all(_looks_like_file_log(n, b) for n, b in files.items())
        return False

    def position(self, offset: Any) -> list[dict[str, Any]]:
        return [{"log_offset": offset["logOffset"]}] if isinstance(offset, dict) else []

    def check(self, offset: Any) -> str | None:
        return (
            "a file source's position is its seen-files log, not an offset; it keeps the log "
            "of the savepoint's source, or starts from its files (NAME=-)"
        )


def _looks_like_file_log(name: str, data: bytes) -> bool:
    if not re.fullmatch(r"\d+(\.compact)?", name) or not data.startswith(b"v1\n"):
        return False
    try:
        parse_source_log(data.decode("utf-8"), name)
    except (StatectlError, UnicodeDecodeError):
        return False
    return True


def _topic_offsets(v: Any) -> bool:
    """``{"topic":{"0":42,...},...}``: KafkaSourceOffset's JSON (JsonUtils.partitionOffsets)."""
    return (
        isinstance(v, dict)
        and bool(v)
        and all(
            isinstance(parts, dict)
            and bool(parts)
            and all(p.isdigit() and _is_int(o) and o >= -2 for p, o in parts.items())
            for parts in v.values()
        )
    )


KAFKA_LOG_HEADER = b"\x00v1\n"


def _int32(v: int) -> int:
    v &= 0xFFFFFFFF
    return v - (1 << 32) if v & 0x80000000 else v


def _java_string_hash(s: str) -> int:
    """``java.lang.String.hashCode``: over UTF-16 code units, 32-bit overflow."""
    h = 0
    units = s.encode("utf-16-be")
    for i in range(0, len(units), 2):
        h = (31 * h + int.from_bytes(units[i : i + 2], "big")) & 0xFFFFFFFF
    return _int32(h)


class _ScalaHashMapOrder:
    """The iteration order of a Scala 2.13 ``mutable.HashMap`` (scala/collection/mutable/
    HashMap.scala), which Jackson's Scala module writes keys in: buckets by ``improveHash(h) &
    (table length - 1)``, a bucket's nodes by ascending (signed) hash, then insertion. The
    table starts at 16 and doubles in ``put0`` when ``size + 1 >= 0.75 * length`` (checked
    on every put, an update too)."""

    def __init__(self) -> None:
        self.length = 16
        self.keys: dict[Any, int] = {}  # key -> improved hash, in insertion order

    def put(self, key: Any, hash_code: int) -> None:
        if len(self.keys) + 1 >= int(self.length * 0.75):
            self.length *= 2
        if key not in self.keys:
            self.keys[key] = _int32(hash_code ^ ((hash_code & 0xFFFFFFFF) >> 16))

    def order(self) -> list[Any]:
        return sorted(self.keys, key=lambda k: (self.keys[k] & (self.length - 1), self.keys[k]))


def kafka_json(offsets: Mapping[str, Mapping[str, int]]) -> str:
    """``{"topic":{"partition":offset}}`` exactly as ``JsonUtils.partitionOffsets``
    (connector/kafka-0-10-sql/.../kafka010/JsonUtils.scala) writes a ``KafkaSourceOffset``:
    it puts the partitions, sorted by (topic, partition), into a ``mutable.HashMap[String,
    mutable.HashMap[Int, Long]]`` (``result += topic -> parts`` once per partition) and
    Jackson writes both maps in their iteration order, compact."""
    pairs = sorted((t, int(p), o) for t, parts in offsets.items() for p, o in parts.items())
    topics = _ScalaHashMapOrder()
    parts: dict[str, _ScalaHashMapOrder] = {}
    values: dict[tuple[str, int], int] = {}
    for topic, p, o in pairs:
        parts.setdefault(topic, _ScalaHashMapOrder()).put(p, _int32(p))
        values[topic, p] = o
        topics.put(topic, _java_string_hash(topic))
    body = ",".join(
        json.dumps(t, ensure_ascii=False)
        + ":{"
        + ",".join(f'"{p}":{values[t, p]}' for p in parts[t].order())
        + "}"
        for t in topics.order()
    )
    return "{" + body + "}"


class KafkaKind(SourceKind):
    """Kafka (connector/kafka-0-10-sql).

    Offset: ``KafkaSourceOffset`` (KafkaSourceOffset.scala) as ``JsonUtils.partitionOffsets``
    writes it: ``{"topic":{"partition":offset}}``. ``-1`` and ``-2`` are the latest and
    earliest markers ``startingOffsets`` accepts (``KafkaOffsetRangeLimit.LATEST`` /
    ``EARLIEST``). ``sources/<i>/0``: the initial offsets, written once by
    ``KafkaSourceInitialOffsetWriter`` (KafkaSourceInitialOffsetWriter.scala, used by
    ``KafkaMicroBatchStream`` and ``KafkaSource``): one zero byte (SPARK-19517, so that
    Spark 2.1.0's reader fails cleanly), ``v1\\n``, then the same JSON. Recognised only with
    that file: an offset of this shape alone is any source's (a Python data source's may look
    the same)."""

    name = "kafka"
    title = "Kafka"
    editable = True

    def matches(self, offset: Any, files: Mapping[str, bytes]) -> bool:
        if set(files) != {"0"} or not files["0"].startswith(KAFKA_LOG_HEADER):
            return False
        try:
            initial = json.loads(files["0"][len(KAFKA_LOG_HEADER) :].decode("utf-8"))
        except (ValueError, UnicodeDecodeError):
            return False
        return _topic_offsets(initial) and (offset is MISSING or _topic_offsets(offset))

    def position(self, offset: Any) -> list[dict[str, Any]]:
        if not isinstance(offset, dict):
            return []
        rows = []
        for topic, parts in offset.items():
            for p, o in sorted(parts.items(), key=lambda kv: int(kv[0])):
                row: dict[str, Any] = {"topic": topic, "partition": int(p), "offset": o}
                if o in (-1, -2):
                    row["marker"] = "latest" if o == -1 else "earliest"
                rows.append(row)
        return rows

    def check(self, offset: Any) -> str | None:
        if not _topic_offsets(offset):
            return (
                'a Kafka offset is {"topic":{"partition":offset,...},...} with integer offsets '
                "(-2 earliest)"
            )
        latest = [f"{t}/{p}" for t, parts in offset.items() for p, o in parts.items() if o == -1]
        if latest:
            # KafkaBatchPartitionReader.resolveRange (KafkaBatchPartitionReader.scala) asserts
            # that a batch's start offset, if a marker, is EARLIEST: -1 fails the next batch.
            return (
                f"{', '.join(latest)}: -1 (latest) is not a position Spark continues from "
                "(its readers accept only -2, earliest, as a start); give the offset"
            )
        return None

    def serialise(self, offset: Any) -> str | None:
        return kafka_json(offset)

    def change(self, old: Any, new: Any) -> str:
        if not (_topic_offsets(old) and _topic_offsets(new)):
            return ""
        before = {(t, int(p)) for t, parts in old.items() for p in parts}
        after = {(t, int(p)): o for t, parts in new.items() for p, o in parts.items()}
        added = [
            f"{t}/{p} @ {'earliest' if after[t, p] == -2 else after[t, p]}"
            for t, p in sorted(set(after) - before)
        ]
        gone = [f"{t}/{p}" for t, p in sorted(before - set(after))]
        return "; ".join(
            [*([f"added {', '.join(added)}"] if added else []),
             *([f"no longer read: {', '.join(gone)}"] if gone else [])]
        )  # fmt: skip


class RateKind(SourceKind):
    """``rate`` (RateStreamProvider.scala, ``RateStreamMicroBatchStream``).

    Offset: ``LongOffset`` (LongOffset.scala): a bare number, the seconds since the source
    was created. ``sources/<i>/0``: that creation time, an ``HDFSMetadataLog[LongOffset]``
    written by ``RateStreamMicroBatchStream.creationTimeMs``: ``v1\\n`` then the number."""

    name = "rate"
    title = "rate"
    editable = True

    def matches(self, offset: Any, files: Mapping[str, bytes]) -> bool:
        return (
            (offset is MISSING or _is_int(offset))
            and set(files) == {"0"}
            and re.fullmatch(rb"v1\n\d+", files["0"]) is not None
        )

    def position(self, offset: Any) -> list[dict[str, Any]]:
        return [{"seconds": offset}] if _is_int(offset) else []

    def check(self, offset: Any) -> str | None:
        return None if _is_int(offset) and offset >= 0 else "a rate offset is a number (>= 0)"


class RateMicroBatchKind(SourceKind):
    """``rate-micro-batch`` (RatePerMicroBatchProvider.scala, ``RatePerMicroBatchStream``).

    Offset: ``RatePerMicroBatchStreamOffset(offset, timestamp)``: ``{"offset":N,
    "timestamp":MS}``. It writes nothing under ``sources/``."""

    name = "rate-micro-batch"
    title = "rate-micro-batch"
    editable = True

    def matches(self, offset: Any, files: Mapping[str, bytes]) -> bool:
        return not files and self.check(offset) is None

    def position(self, offset: Any) -> list[dict[str, Any]]:
        return [dict(offset)] if isinstance(offset, dict) else []

    def check(self, offset: Any) -> str | None:
        if (
            isinstance(offset, dict)
            and set(offset) == {"offset", "timestamp"}
            and all(_is_int(v) for v in offset.values())
        ):
            return None
        return 'a rate-micro-batch offset is {"offset":N,"timestamp":MS}'


DELTA_KEYS = {"sourceVersion", "reservoirId", "reservoirVersion", "index"}
DELTA_EXAMPLE = (
    '{"sourceVersion":1,"reservoirId":"<table id>","reservoirVersion":4,"index":-1,'
    '"isStartingVersion":false}'
)


class DeltaKind(SourceKind):
    """Delta Lake (delta-io/delta, spark/src/main/scala/org/apache/spark/sql/delta/sources/
    DeltaSourceOffset.scala, ``DeltaSourceOffset``).

    Offset: ``{"sourceVersion":1,"reservoirId":"<table id>","reservoirVersion":V,
    "index":I,"isStartingVersion":B}`` (``isStartingVersion`` absent in newer
    ``sourceVersion``s). ``DeltaSource`` writes nothing under ``sources/`` (its schema
    tracking log lives where the user points it)."""

    name = "delta"
    title = "Delta Lake"
    editable = True

    def matches(self, offset: Any, files: Mapping[str, bytes]) -> bool:
        return not files and self.check(offset) is None

    def position(self, offset: Any) -> list[dict[str, Any]]:
        if not isinstance(offset, dict):
            return []
        return [
            {
                "table_id": offset.get("reservoirId"),
                "version": offset.get("reservoirVersion"),
                "index": offset.get("index"),
                "starting_version": offset.get("isStartingVersion"),
            }
        ]

    def check(self, offset: Any) -> str | None:
        if (
            isinstance(offset, dict)
            and set(offset) >= DELTA_KEYS
            and isinstance(offset["reservoirId"], str)
            and all(_is_int(offset[k]) for k in ("sourceVersion", "reservoirVersion", "index"))
            and isinstance(offset.get("isStartingVersion", False), bool)
        ):
            return None
        return (
            'a Delta offset is {"sourceVersion":N,"reservoirId":"<table id>",'
            '"reservoirVersion":V,"index":I,"isStartingVersion":B}'
        )


class PythonKind(SourceKind):
    """PySpark Python data sources (python/pyspark/sql/datasource.py: ``DataSource`` with
    ``streamReader`` / ``simpleStreamReader``; the JVM side is ``PythonMicroBatchStream``).

    Offset: the reader's own JSON, the dict its ``latestOffset`` returns as Python's
    ``json.dumps`` writes it (python/pyspark/sql/streaming/python_streaming_source_runner.py,
    default separators ``", "`` and ``": "``). It writes nothing under ``sources/``.

    Recognised without a plan when its ``offsets/N`` line is exactly ``json.dumps`` of a
    non-empty JSON object and ``sources/<index>/`` is empty: Spark's JVM sources write their
    offsets with Jackson or json4s, compact, never with a space after ``:``. A Python
    source whose offset is not an object (or an empty one), or whose line was written by
    anything else, is :data:`OPAQUE` unless ``--query`` plans it. An edit must be a JSON
    object (the reader checks the rest); it is written as ``json.dumps`` writes it."""

    name = "python"
    title = "Python data source"
    editable = True

    def matches_text(self, text: str | None, files: Mapping[str, bytes]) -> bool:
        value = offset_value(text)
        return not files and isinstance(value, dict) and bool(value) and json.dumps(value) == text

    def check(self, offset: Any) -> str | None:
        return (
            None if isinstance(offset, dict) else "a Python data source's offset is a JSON object"
        )

    def serialise(self, offset: Any) -> str | None:
        return json.dumps(offset)


FILE = FileSourceKind()
KAFKA = KafkaKind()
RATE = RateKind()
RATE_MICRO_BATCH = RateMicroBatchKind()
DELTA = DeltaKind()
PYTHON = PythonKind()
OPAQUE = SourceKind()

# Tried in this order; the first that matches wins, then a Python data source by its offset's
# text (PythonKind.matches_text), else OPAQUE.
RECOGNISED: tuple[SourceKind, ...] = (FILE, KAFKA, RATE, RATE_MICRO_BATCH, DELTA)
KINDS: dict[str, SourceKind] = {k.name: k for k in (*RECOGNISED, PYTHON, OPAQUE)}


def recognise(offset_text: str | None, files: Mapping[str, bytes]) -> SourceKind:
    """The kind of a source from its offset line and its ``sources/<index>/`` files."""
    offset = offset_value(offset_text)
    found = next((k for k in RECOGNISED if k.matches(offset, files)), None)
    if found is None and PYTHON.matches_text(offset_text, files):
        return PYTHON
    return found or OPAQUE


def kind_named(name: str | None) -> SourceKind:
    """A recorded kind (savepoint ``_metadata``); unknown names are opaque."""
    return KINDS.get(name or "", OPAQUE)


def planned_kind(description: str) -> SourceKind | None:
    """The kind Spark's description of a planned source names (``--query``), if any."""
    d = description.lower()
    if d.startswith("filesource"):
        return FILE
    if d.startswith("kafka"):
        return KAFKA
    if d.startswith("ratepermicrobatch") or d.startswith("rate-micro-batch"):
        return RATE_MICRO_BATCH
    if d.startswith("ratestream") or d == "rate":
        return RATE
    if d.startswith("delta"):
        return DELTA
    if "python" in d:
        return PYTHON
    return None

"""Each source's position per batch and how far it advanced, where its offsets say it.

A batch's offset in ``offsets/N`` is where it *ended*; its advance is the difference from the
previous batch's. What the difference counts depends on the kind (statectl/sources/kinds.py):
Kafka and rate-micro-batch offsets count records, a rate offset counts seconds (records are
``rowsPerSecond`` times that, an option of the query, not the checkpoint), a Delta offset
counts table versions, and a file source's seen-files log names the files each batch took.
Other kinds' offsets are shown as they are, with no advance.
"""

from __future__ import annotations

from typing import Any

from statectl.checkpoint.model import Checkpoint
from statectl.errors import StatectlError
from statectl.sources.carry import CheckpointSource, checkpoint_sources
from statectl.sources.kinds import (
    DELTA,
    FILE,
    KAFKA,
    KAFKA_LOG_HEADER,
    MISSING,
    RATE,
    RATE_MICRO_BATCH,
    offset_value,
)


def _kafka_total(offset: Any) -> int | None:
    """Records up to ``offset`` summed over topic partitions (None with a latest/earliest
    marker, which names no position)."""
    if not isinstance(offset, dict):
        return None
    values = [o for parts in offset.values() for o in parts.values()]
    return None if any(o < 0 for o in values) else sum(values)


def _kafka_advance(before: Any, after: Any) -> int | None:
    """Records between two Kafka offsets, partition by partition (a partition new in
    ``after`` counts from 0, as Spark reads a new partition from its start)."""
    if not isinstance(after, dict) or not isinstance(before, dict):
        return None
    total = 0
    for topic, parts in after.items():
        for p, o in parts.items():
            b = before.get(topic, {}).get(p, 0)
            if o < 0 or b < 0:
                return None
            total += o - b
    return total


def _initial(src: CheckpointSource) -> Any:
    """Where a source started, when its files record it (Kafka's ``sources/<i>/0``) or its
    offsets start at zero (rate-micro-batch); MISSING otherwise."""
    if src.kind is KAFKA and "0" in src.files:
        return offset_value(src.files["0"][len(KAFKA_LOG_HEADER) :].decode("utf-8"))
    if src.kind is RATE_MICRO_BATCH:
        return {"offset": 0, "timestamp": None}
    return MISSING


def advance(kind: Any, before: Any, after: Any) -> dict[str, int] | None:
    """How far a source of ``kind`` moved from offset ``before`` to ``after`` (parsed JSON;
    MISSING where there is none), in the unit its offsets count."""
    if before is MISSING or after is MISSING:
        return None
    if kind is KAFKA:
        n = _kafka_advance(before, after)
        return None if n is None else {"records": n}
    if kind is RATE_MICRO_BATCH and isinstance(before, dict) and isinstance(after, dict):
        return {"records": int(after["offset"]) - int(before["offset"])}
    if kind is RATE and isinstance(before, int) and isinstance(after, int):
        return {"seconds": after - before}
    if kind is DELTA and isinstance(before, dict) and isinstance(after, dict):
        return {"versions": int(after["reservoirVersion"]) - int(before["reservoirVersion"])}
    return None


class SourceHistory:
    """The sources of a checkpoint, batch by batch (one object per history run: it caches the
    file sources' compacted logs it has read)."""

    def __init__(self, ckpt: Checkpoint, batch: int) -> None:
        self.ckpt = ckpt
        self.sources = checkpoint_sources(ckpt, batch)
        self._compacts: dict[tuple[str, int], dict[int, int]] = {}

    def describe(self) -> list[dict[str, Any]]:
        return [{"key": s.key, "name": s.name, "kind": s.kind.name} for s in self.sources]

    def at(self, batch: int, previous: int | None) -> list[dict[str, Any]]:
        """Each source's position after ``batch`` and its advance since ``previous`` (the
        batch before it in the log; None for the first batch the log still has)."""
        off = self.ckpt.offsets(batch).offsets
        before_off = self.ckpt.offsets(previous).offsets if previous is not None else None
        rows = []
        for src in self.sources:
            after = offset_value(off.get(src.key))
            if before_off is not None:
                before = offset_value(before_off.get(src.key))
            else:
                before = _initial(src) if batch == 0 else MISSING
            row: dict[str, Any] = {
                "key": src.key,
                "kind": src.kind.name,
                "position": src.kind.position(after) if after is not MISSING else [],
                "advance": advance(src.kind, before, after),
            }
            if src.kind is KAFKA:
                row["records_total"] = _kafka_total(after)
            if src.kind is FILE:
                row["advance"] = self._files_between(src, before, after)
            rows.append(row)
        return rows

    def _files_between(
        self, src: CheckpointSource, before: Any, after: Any
    ) -> dict[str, int] | None:
        """Files a file source took between two offsets: its seen-files log is numbered by
        ``logOffset``, which moves only when a batch takes files (a no-data batch: 0)."""
        if not isinstance(after, dict):
            return None
        end = int(after["logOffset"])
        start = (
            int(before["logOffset"])
            if isinstance(before, dict)
            else (-1 if before is MISSING and end == 0 else None)
        )
        if start is None:
            return None
        total = 0
        for n in range(start + 1, end + 1):
            got = self._files_of(src, n)
            if got is None:
                return None
            total += got
        return {"files": total}

    def _files_of(self, src: CheckpointSource, batch: int) -> int | None:
        """Files in entry ``batch`` of a file source's log: its own file, or the entries of a
        compacted log that name it."""
        if str(batch) in src.files:
            try:
                return len(self.ckpt.source_log(src.key, batch))
            except StatectlError:
                return None
        compact = next(
            (int(n[:-8]) for n in sorted(src.files, key=_compact_order) if _covers(n, batch)),
            None,
        )
        if compact is None:
            return None
        counts = self._compacts.get((src.key, compact))
        if counts is None:
            counts = {}
            for e in self.ckpt.source_log(src.key, compact):
                b = e.get("batchId")
                if isinstance(b, int):
                    counts[b] = counts.get(b, 0) + 1
            self._compacts[(src.key, compact)] = counts
        return counts.get(batch, 0)


def _compact_order(name: str) -> int:
    return int(name[:-8]) if name.endswith(".compact") and name[:-8].isdigit() else -1


def _covers(name: str, batch: int) -> bool:
    """Whether ``name`` is a compacted seen-files log holding ``batch``'s entries."""
    return name.endswith(".compact") and name[:-8].isdigit() and int(name[:-8]) >= batch

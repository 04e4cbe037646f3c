"""How a restored checkpoint goes on from its batch: the query id it runs under (the same
query continued, or a fork: ``--new-query-id``) and the event-time watermark its next batch
starts from (``--watermark``: kept, repaired or rewound), with the state rows that next batch
evicts under it. Each planner records its decision in the plan and what it means in the
plan's report; the writer (statectl/restoration/write.py) reads the decisions.

The watermark lives in the logs only: ``offsets/N``'s ``batchWatermarkMs`` and ``commits/N``'s
``nextBatchWatermarkMs``. Spark 4.3 restarts at batch N+1 with the larger of the two
(``MicroBatchExecution.populateStartOffsets``), filters late rows of batch N+1 with offsets/N's
(the previous batch's, SPARK-40925) and evicts with the restarted one; no operator keeps it in
its state. A new value therefore goes into both.
"""

from __future__ import annotations

import datetime as dt
import json
import tempfile
import uuid
from collections.abc import Callable
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from statectl.backends.rocksdb import list_version_files
from statectl.checkpoint.model import ROW_CHECKSUM_CONF, SOURCE_EVOLUTION_CONF, Checkpoint
from statectl.errors import StatectlError
from statectl.operators import JOIN_KINDS
from statectl.restoration.plan import RestorePlan
from statectl.savepoints.format import OperatorState
from statectl.savepoints.store import Savepoint

# Spark's EventTimeWatermark.delayKey: the column of a state key (or value) that carries the
# event time the operator evicts by.
DELAY_KEY = "spark.watermarkDelayMs"


def plan_query_id(plan: RestorePlan, m: Any, new_query_id: bool) -> None:
    """The id the target's ``metadata`` gets: the savepoint's (the same query continues, so
    sinks that deduplicate by query id and batch id keep doing so), or a new one (a fork that
    runs beside the original)."""
    plan.fork = new_query_id
    plan.query_id = str(uuid.uuid4()) if new_query_id else m.query_id


def parse_time(value: str | int) -> int:
    """``--watermark``: epoch milliseconds, or an ISO 8601 time (UTC unless it says)."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    text = str(value).strip()
    if text.lstrip("-").isdigit():
        return int(text)
    try:
        t = dt.datetime.fromisoformat(text)
    except ValueError:
        raise StatectlError(
            f"--watermark wants epoch milliseconds or an ISO time "
            f"(2024-01-01T00:00:00Z), not {text!r}"
        ) from None
    if t.tzinfo is None:
        t = t.replace(tzinfo=dt.timezone.utc)
    return int(t.timestamp() * 1000)


def _iso(ms: int) -> str:
    t = dt.datetime.fromtimestamp(ms / 1000, dt.timezone.utc)
    return t.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _event_time_field(schema_json: str) -> tuple[str, bool] | None:
    """The field carrying the watermark's delay metadata and whether it is a window struct
    (Spark evicts by the window's ``end``), or None."""
    try:
        fields = json.loads(schema_json).get("fields", [])
    except (ValueError, AttributeError):
        return None
    for f in fields:
        if isinstance(f, dict) and DELAY_KEY in (f.get("metadata") or {}):
            return f["name"], isinstance(f.get("type"), dict)
    return None


def _evicted_rows(sp: Savepoint, op: OperatorState, watermark_ms: int) -> int | None:
    """Rows of ``op`` whose event time is at or before the watermark (Spark's eviction
    predicate ``eventTime <= watermark``), or None when its eviction does not follow a key
    or value column (joins, dedupe within watermark, transformWithState timers)."""
    if op.kind in JOIN_KINDS or op.column_families:
        return None
    total = 0
    for table in op.tables:
        found = [
            (part, hit)
            for part, schema in (("key", table.key_schema), ("value", table.value_schema))
            if (hit := _event_time_field(schema)) is not None
        ]
        if not found:
            return None
        part, (name, window) = found[0]
        with tempfile.TemporaryDirectory(prefix="statectl-wm-") as scratch:
            for f in table.files:
                for rows in sp.iter_file(table, f, _chunk_rows, scratch):
                    total += _at_or_before(rows, part, name, window, watermark_ms)
    return total


def _chunk_rows(bytes_per_row: int) -> int:
    """Rows per chunk counted: about 64 MiB of Parquet data at a time."""
    return max(1, (64 << 20) // max(bytes_per_row, 1))


def _at_or_before(rows: pa.Table, part: str, name: str, window: bool, watermark_ms: int) -> int:
    column = pc.struct_field(rows.column(part).combine_chunks(), name)
    if window:
        column = pc.struct_field(column, "end")
    micros = column.cast(pa.timestamp("us", tz="UTC")).cast(pa.int64())
    return int(pc.sum(pc.less_equal(micros, watermark_ms * 1000)).as_py() or 0)


def plan_watermark(plan: RestorePlan, m: Any, asked: str | int | None) -> None:
    """``--watermark``: the event-time watermark the next batch starts from, and how many
    restored state rows that batch evicts under it."""
    if asked is None:
        return
    ms = parse_time(asked)
    if m.savepoint_type == "native":
        plan.problems.append(
            "a native savepoint keeps its logs as they are; convert it first to set "
            "--watermark: statectl savepoint --type canonical SAVEPOINT"
        )
        return
    plan.watermark_ms = ms
    before = max(m.batch_watermark_ms, m.next_batch_watermark_ms)
    sp = plan.run.sp
    assert sp is not None
    evicts: dict[str, int | None] = {}
    for op in m.operators:
        if op.uid in plan.restored:
            evicts[op.uid] = _evicted_rows(sp, op, ms)
    direction = "rewound" if ms < before else "moved forward" if ms > before else "kept"
    plan.report.watermark = {
        "from_ms": before,
        "to_ms": ms,
        "from": _iso(before),
        "to": _iso(ms),
        "evicts": evicts,
    }
    plan.conversions.append(f"watermark {direction}: {_iso(before)} -> {_iso(ms)}")
    for uid, n in evicts.items():
        if n is None:
            plan.conversions.append(
                f"uid {uid}: rows the next batch evicts not counted (no event-time column in "
                "its state)"
            )
        else:
            plan.conversions.append(f"uid {uid}: the next batch evicts {n} rows")


def _rekey(d: dict[str, Any] | None, keys: dict[str, str]) -> dict[str, Any] | None:
    return None if d is None else {keys.get(k, k): v for k, v in d.items()}


def _offset_log_v1(plan: RestorePlan) -> None:
    """Offset log v2 -> v1: the one named source becomes source 0 (its offset line, its
    ``sources/0`` files) and source evolution is unpinned; v1 orders sources by their place in
    the plan, which statectl knows only for one source."""
    pos = plan.positions
    names = list(pos.offsets) if pos is not None else []
    if pos is None or len(names) != 1:
        plan.problems.append(
            f"--offset-log 1: offset log v2 names {len(names)} sources and v1 orders them by "
            "their place in the query's plan, which the checkpoint does not record, so only a "
            "query with one source converts; keep offset log v2 (Spark 4.2+ runs it, with the "
            "same readStream.name() names)"
        )
        return
    keys = {names[0]: "0"}
    pos.offsets = _rekey(pos.offsets, keys) or {}
    pos.previous_offsets = _rekey(pos.previous_offsets, keys)
    pos.source_logs = _rekey(pos.source_logs, keys) or {}
    pos.carried = {old: keys.get(new, new) for old, new in pos.carried.items()}
    plan.pinned_overrides[SOURCE_EVOLUTION_CONF] = "false"
    plan.conversions.append(
        f"offset log v2 -> v1: source {names[0]!r} becomes source 0 (sources/0); "
        f"{SOURCE_EVOLUTION_CONF}=false: run the query without readStream.name()"
    )


def plan_logs(plan: RestorePlan, m: Any, offset_log: int | None) -> None:
    """``--offset-log``: the offset log version written, with the commit log version that
    goes with it."""
    if offset_log not in (None, 1, 2):
        raise StatectlError(f"--offset-log must be 1 or 2, not {offset_log}")
    source = m.offset_log_version
    plan.offset_log_version = offset_log or source
    commit = m.source_checkpoint.get("commit_log_version")
    plan.commit_log_version = 3 if commit == 3 else None
    if offset_log is not None and offset_log != source:
        if m.savepoint_type == "native":
            plan.problems.append(
                "a native savepoint keeps its logs as they are; convert it first: statectl "
                "savepoint --type canonical SAVEPOINT"
            )
        elif offset_log == 1:
            _offset_log_v1(plan)
            if commit == 3:
                # Commit log v3 (sink evolution) comes with v2 offsets (Spark 4.2+); Spark
                # before 4.2 reads commit logs up to v2.
                plan.commit_log_version = None
                plan.conversions.append(
                    "commit log v3 -> v" + str(plan.checkpoint_format) + ": sink metadata dropped"
                )
        else:
            plan.problems.append(
                "--offset-log 2: offset log v2 keys each source by the name the query gives it "
                "(readStream.name()), which a v1 checkpoint does not record; keep offset log v1 "
                "and run the query without names (Spark 4.3 runs it), or name the sources on a "
                "new checkpoint"
            )


CHANGELOG_CONF = "spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled"


def writes_changelogs(ckpt: Checkpoint, batch: int) -> bool:
    """Whether the checkpoint's RocksDB stores took changelog checkpointing at ``batch``: its
    state version (batch + 1) is a ``.changelog`` file (Spark writes one per version with it
    on, besides the zips its maintenance makes; only zips with it off). Not a pinned conf:
    Spark leaves it out of the offset log, so the files are the only record."""
    if ckpt.backend(batch) != "rocksdb" or not ckpt.io.exists(ckpt.path("state")):
        return False
    for op in ckpt.operator_ids():
        base = ckpt.path("state", str(op), "0")
        if not ckpt.io.is_dir(base):
            continue
        dirs = [base] + [f.path for f in ckpt.io.list_dir(base) if f.is_dir]
        for d in dirs:
            if any(
                f.version == batch + 1 and f.kind == "changelog"
                for f in list_version_files(ckpt.io, d)
            ):
                return True
    return False


def plan_changelog(plan: RestorePlan, source: Checkpoint, batch: int) -> None:
    """Migrate: name the change when the source took RocksDB changelog checkpointing and the
    target is written without changelogs, or the other way round."""
    before = writes_changelogs(source, batch)
    after = plan.backend == "rocksdb" and plan.layout == "changelog"
    if before and not after:
        plan.conversions.append(
            "RocksDB changelog checkpointing on -> off: each store is written as one snapshot; "
            f"the query's {CHANGELOG_CONF} decides what it writes next"
        )
    elif after and not before:
        plan.conversions.append(
            "RocksDB changelog checkpointing off -> on: each store is written as changelog "
            f"files; run the query with {CHANGELOG_CONF}=true to keep writing them"
        )


def plan_row_checksums(plan: RestorePlan, m: Any, asked: bool | None) -> None:
    """``--row-checksums``: every restored store row carries Spark's row checksum (SPARK-54106,
    Spark 4.1+), pinned on, as :func:`with_row_checksums` writes it. Default and
    ``--no-row-checksums``: plain rows, pinned off (what restore has always written)."""
    if not asked:
        return
    if m.savepoint_type == "native":
        plan.problems.append(
            "--row-checksums: a native savepoint restores its files as they are; convert it "
            "first: statectl savepoint --type canonical SAVEPOINT"
        )
        return
    cf = [uid for uid in plan.restored if m.operator(uid).column_families]
    if cf or plan.join_state_format in (3, 4) or plan.started_empty:
        plan.problems.append(
            "--row-checksums: statectl writes row checksums for plain stores only, not for "
            "column families (transformWithState, joins at formats 3/4) or new operators"
        )
        return
    plan.row_checksums = True
    plan.pinned_overrides[ROW_CHECKSUM_CONF] = "true"
    plan.conversions.append(
        f"row checksums on: each state row carries CRC32C(key, value), {ROW_CHECKSUM_CONF}="
        "true pinned (Spark 4.1+ reads it)"
    )


def _native_crc32c() -> Callable[[bytes], int]:
    """The native CRC32C of one bytes value (google-crc32c, a base dependency, imported on
    first use as statectl.checksums does)."""
    import google_crc32c

    return google_crc32c.value


def with_row_checksums(
    encoder: Callable[..., tuple[pa.Array, pa.Array]], header: int, *args: Any
) -> tuple[pa.Array, pa.Array]:
    """``encoder``'s keys and values, each value behind Spark's row checksum: int32 LE
    CRC32C(key bytes ‖ value bytes), then (RocksDB, ``header`` 8) the value's int32 LE length
    (``KeyValueChecksumEncoder``; checked against Spark-written fixtures of both backends).
    Top-level so that the Spark engine can ship it to executors.

    Only the CRC itself is per row (the native function mapped over the joined bytes); the
    concatenation and the header are Arrow and numpy work on whole arrays."""
    keys, values = encoder(*args)
    plain_keys = keys.combine_chunks() if isinstance(keys, pa.ChunkedArray) else keys
    if isinstance(values, pa.ChunkedArray):
        values = values.combine_chunks()
    empty = pa.scalar(b"", values.type)
    joined = pc.binary_join_element_wise(plain_keys.cast(values.type), values, empty)
    crc = np.fromiter(map(_native_crc32c(), joined.to_pylist()), dtype="<u4", count=len(values))
    parts = [crc.view(np.uint8).reshape(-1, 4)]
    if header == 8:
        lens = pc.binary_length(values).to_numpy(zero_copy_only=False).astype("<i4")
        parts.append(lens.view(np.uint8).reshape(-1, 4))
    head = np.ascontiguousarray(np.hstack(parts)).reshape(-1)
    heads = pa.FixedSizeBinaryArray.from_buffers(
        pa.binary(header), len(values), [None, pa.py_buffer(head)]
    ).cast(values.type)
    return keys, pc.binary_join_element_wise(heads, values, empty)

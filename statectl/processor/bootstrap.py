"""Bootstrap: the empty savepoint of a query that never ran, built from planning alone.

``SavepointWriter.for_query`` starts from it: Spark plans the query (statectl/query_plan.py)
and writes the operator metadata and state schemas it would write for the real run; each
operator gets a table per store or state variable with no rows, the confs Spark would pin in
the offset log (the session's, as ``MicroBatchExecution`` takes them for a new query), and
every source at ``-`` (its configured start). ``with_state`` then fills tables, validated
against the planned schemas, and ``write`` places and writes them like any edit.
"""

from __future__ import annotations

import shutil
import tempfile
import uuid
from collections.abc import Callable
from typing import Any

from statectl.backends import backend_names
from statectl.checkpoint.logs import PINNED_CONF_LEGACY_DEFAULTS
from statectl.checkpoint.model import PARTITIONS_CONF
from statectl.errors import StatectlError
from statectl.io import FileIO
from statectl.processor.reading import CheckpointHandle
from statectl.query_plan import (
    PlannedQuery,
    PlannedSource,
    plan_query,
    planning_confs,
    planning_session,
)
from statectl.savepoints.contents import assign_uids, operator_state, table_tasks
from statectl.savepoints.format import SavepointMetadata
from statectl.savepoints.layout import part_path, stamped, write_metadata, write_table


def _session_conf(spark: Any, key: str) -> str | None:
    """The session's value of a conf, its default included (None: no value and no default)."""
    try:
        value = spark.conf.get(key)
    except Exception:  # py4j: NoSuchElementException for a conf without a default
        return None
    return None if value is None else str(value)


def pinned_confs(spark: Any, confs: dict[str, str]) -> dict[str, str]:
    """What a new query pins in ``offsets/0``: every relevant conf's session value."""
    out = {}
    for key in PINNED_CONF_LEGACY_DEFAULTS:
        value = confs.get(key) or _session_conf(spark, key)
        if value is not None:
            out[key] = value
    return out


def _check_arguments(batch: int, backend: str) -> None:
    if isinstance(batch, bool) or not isinstance(batch, int) or not 0 <= batch < 2**62:
        raise StatectlError(f"for_query: batch must be a non-negative integer, not {batch!r}")
    if backend not in backend_names():
        raise StatectlError(
            f"for_query: backend must be {' or '.join(backend_names())}, not {backend!r}"
        )


def _partitions(spark: Any, partitions: int | None) -> int:
    """The given partition count, else the session's ``spark.sql.shuffle.partitions``."""
    if partitions is None:
        partitions = int(_session_conf(spark, PARTITIONS_CONF) or 200)
    if partitions < 1:
        raise StatectlError(f"for_query: partitions must be at least 1, got {partitions}")
    return partitions


def build_base(
    spec: str,
    *,
    batch: int,
    partitions: int | None,
    backend: str,
    output_mode: str | None,
    watermark_ms: int,
    spark: Any,
    progress: Callable[[str], None] | None = None,
) -> tuple[str, PlannedQuery]:
    """Plan ``spec`` and write its empty savepoint into a new local temporary directory;
    returns the savepoint's URL (the caller removes the directory) and the plan."""
    _check_arguments(batch, backend)
    if spark is None:
        spark = planning_session(progress)
    partitions = _partitions(spark, partitions)
    confs = planning_confs({}, backend, partitions)
    planned = plan_query(spec, output_mode=output_mode, confs=confs, spark=spark)
    if not planned.operators:
        raise StatectlError(f"for_query: {spec} has no stateful operator to bootstrap")
    pinned = pinned_confs(spark, confs)

    root = tempfile.mkdtemp(prefix="statectl-bootstrap-")
    try:
        return _write_base(
            root,
            spec,
            planned,
            pinned,
            batch,
            partitions,
            backend,
            watermark_ms,
            str(spark.version),
        ), planned
    except BaseException:
        shutil.rmtree(root, ignore_errors=True)
        raise


def _write_base(
    root: str,
    spec: str,
    planned: PlannedQuery,
    pinned: dict[str, str],
    batch: int,
    partitions: int,
    backend: str,
    watermark_ms: int,
    spark_version: str,
) -> str:
    io = FileIO.for_url(root)[0]
    uids = assign_uids(planned.operators, {})
    operators = []
    for op in planned.operators:
        uid = uids[op.operator_id]
        info = CheckpointHandle.operator_info(op, uid)
        parts = []
        for task, table in zip(table_tasks(op), info.tables, strict=False):
            empty = table.schema.empty_table()
            parts.append(
                [
                    (
                        write_table(io, root, part_path(uid, task.name, p), empty),
                        empty.column_names,
                    )
                    for p in range(op.num_partitions)
                ]
            )
        operators.append(operator_state(op, uid, parts, None))
    meta = SavepointMetadata(
        query_id=str(uuid.uuid4()),
        batch_id=batch,
        batch_timestamp_ms=0,
        batch_watermark_ms=watermark_ms,
        next_batch_watermark_ms=watermark_ms,
        offsets={str(s.index): None for s in planned.sources},
        offset_log_version=1,
        offset_metadata_extra={},
        pinned_confs=pinned,
        source_logs={},
        source_checkpoint={
            "backend": backend,
            "partitions": partitions,
            "checkpoint_format_version": 1,
            "commit_log_version": 1,
            "bootstrapped_from": spec,
        },
        operators=operators,
        created_at="",  # stamped when written
        statectl_version="",
        spark_version=spark_version,
    )
    write_metadata(io, root, stamped(meta))
    return io.url(root)


def describe_sources(sources: list[PlannedSource]) -> str:
    return ", ".join(f"{s.index} {s.description}" for s in sources) or "none"

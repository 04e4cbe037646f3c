"""``write_restore``: writes the checkpoint a problem-free plan describes, reading only the
plan's decisions. The target is marked in progress first (a ``metadata`` Spark refuses to
start from); state files are written, then the logs (source logs, offsets), ``commits/N``
and the real ``metadata`` last, so an interrupted restore never looks like a finished
checkpoint, to Spark or to statectl."""

from __future__ import annotations

import posixpath
from collections.abc import Callable
from typing import Any

from statectl import join_state
from statectl.checkpoint.model import (
    CODEC_CONF,
    MERGE_OPERATOR_CONF,
    PARTITIONS_CONF,
    PROVIDER_CONF,
    ROW_CHECKSUM_CONF,
    Operator,
)
from statectl.checkpoint.writers import (
    commit_log_bytes,
    offset_log_bytes,
    offset_seq_meta,
    stream_metadata_bytes,
)
from statectl.codecs.compression import normalize_codec
from statectl.errors import StatectlError
from statectl.io import FileIO
from statectl.operators import JOIN_KINDS
from statectl.restoration.families import (
    merge_operator_version,
    write_cf_operator,
    write_empty_cf_operator,
    write_join_families,
)
from statectl.restoration.plan import RestorePlan
from statectl.restoration.source_logs import write_source_logs
from statectl.restoration.stores import write_empty_store_operator, write_store_operator
from statectl.restoration.targets import begin_target, under
from statectl.savepoints.format import OperatorState
from statectl.savepoints.store import Savepoint
from statectl.sources import write_carried_sources


def _handles(plan: RestorePlan) -> tuple[Savepoint, FileIO, str]:
    sp, io = plan.run.sp, plan.run.io
    assert sp is not None and io is not None
    return sp, io, plan.run.root


def write_operator(
    sp: Savepoint, op: OperatorState, new_id: int, plan: RestorePlan, codec: str
) -> dict[str, int]:
    """One restored operator's state at ``new_id``; its rows by store."""
    if op.column_families:
        return write_cf_operator(sp, op, new_id, plan)
    if op.kind in JOIN_KINDS and plan.join_state_format in join_state.COLUMN_FAMILY_FORMATS:
        return write_join_families(sp, op, new_id, plan)
    return write_store_operator(sp, op, new_id, plan, codec)


def write_empty_operator(sp: Savepoint, op: Operator, plan: RestorePlan, codec: str) -> None:
    """A new operator of the changed query: valid empty state at the version Spark loads,
    with the metadata and schemas Spark's planning of the query wrote."""
    if op.uses_column_families:
        write_empty_cf_operator(sp, op, plan)
    else:
        write_empty_store_operator(op, plan, codec)


def _copy_native(plan: RestorePlan) -> None:
    """A native savepoint at its own backend and partition count: its files as they are,
    ``metadata`` last (the marker stays until everything else is in place)."""
    sp, io, root = _handles(plan)
    m = sp.metadata
    files = [f.path for op in m.operators for t in op.tables for f in t.files]
    files += [f.path for f in m.native_logs or []]
    prefix = "checkpoint/"
    for rel in sorted(set(files), key=lambda r: (r.startswith(prefix + "commits/"), r)):
        inner = rel[len(prefix) :]
        if inner == "metadata":
            continue
        io.write_atomic(
            under(root, *inner.split("/")), sp.io.read_bytes(posixpath.join(sp.root, rel))
        )


def write_restore(plan: RestorePlan, *, before_finish: Callable[[], None] | None = None) -> None:
    """Write the checkpoint ``plan`` describes. The target is marked in progress first (a
    ``metadata`` Spark refuses to start from) and gets its real ``metadata`` last, so an
    interrupted restore is never mistaken for a checkpoint, by Spark or by statectl."""
    if plan.problems:
        raise StatectlError(f"the restore plan has problems: {plan.problems[0]}", plan.target)
    sp, io, root = _handles(plan)
    m = sp.metadata
    if not plan.run.started:
        begin_target(io, root, plan.overwrite, "restore", plan.savepoint, plan.target)
        plan.run.started = True
    if m.savepoint_type == "native":
        _copy_native(plan)
    else:
        _write_canonical(plan)
    if before_finish is not None:
        before_finish()
    io.write_atomic(under(root, "metadata"), stream_metadata_bytes(plan.query_id), overwrite=True)


def _pinned_confs(plan: RestorePlan, pinned: dict[str, str]) -> dict[str, str]:
    """The savepoint's pinned confs, rewritten for the target."""
    confs = dict(pinned)
    confs[PROVIDER_CONF] = plan.target_backend.provider_classes[0]
    confs[PARTITIONS_CONF] = str(plan.partitions)
    if plan.join_state_format is not None:  # Spark reads the joins at the pinned format
        confs[join_state.FORMAT_CONF] = str(plan.join_state_format)
    for conf, written in plan.state_formats.items():  # and the converted kinds likewise
        confs[conf] = str(written)
    if (merge := merge_operator_version(plan, pinned)) is not None:
        confs[MERGE_OPERATOR_CONF] = merge
    # statectl writes plain rows; the restarted query keeps writing them.
    if confs.get(ROW_CHECKSUM_CONF) == "true":
        confs[ROW_CHECKSUM_CONF] = "false"
    confs.update(plan.pinned_overrides)  # the log conversions' (continuation.py)
    return confs


def _offset_metadata_extra(extra: dict[str, Any], offsets: dict[str, Any]) -> dict[str, Any]:
    """The savepoint's extra offset metadata (v2's ``sourceMetadataInfo``), without the named
    sources a restore dropped."""
    info = extra.get("sourceMetadataInfo")
    if not isinstance(info, dict):
        return dict(extra)
    return {**extra, "sourceMetadataInfo": {k: v for k, v in info.items() if k in offsets}}


Offsets = dict[str, str | None]
V2_METADATA = ("sourceMetadataInfo", "controlBatchInfo")


def _source_positions(
    plan: RestorePlan, m: Any
) -> tuple[Offsets, Offsets | None, dict[str, list[dict]]]:
    """The offsets of batch N and N-1 and the file source logs written: the plan's source
    positions, else the savepoint's as they are."""
    pos = plan.positions
    if pos is not None:
        return pos.offsets, pos.previous_offsets, pos.source_logs
    return m.offsets, m.previous_offsets or m.offsets, m.source_logs


def _write_offsets(plan: RestorePlan, m: Any, offsets: Offsets, previous: Offsets | None) -> None:
    """``offsets/N`` (and ``N-1``, whose offsets a restart re-plans batch N from)."""
    _, io, root = _handles(plan)
    version = plan.offset_log_version or m.offset_log_version
    extra = _offset_metadata_extra(m.offset_metadata_extra, offsets)
    if version == 1:  # v2's OffsetSeqMetadataV2 fields (an --offset-log 1 conversion)
        extra = {k: v for k, v in extra.items() if k not in V2_METADATA}
    meta = offset_seq_meta(
        plan.watermarks(m)[0], m.batch_timestamp_ms, _pinned_confs(plan, m.pinned_confs), extra
    )
    b = m.batch_id
    if b > 0:
        io.write_atomic(
            under(root, "offsets", str(b - 1)), offset_log_bytes(previous or offsets, meta, version)
        )
    io.write_atomic(under(root, "offsets", str(b)), offset_log_bytes(offsets, meta, version))


def _write_commit(plan: RestorePlan, m: Any) -> None:
    """``commits/N``, last of the logs: batch N is done, the query resumes at N+1."""
    _, io, root = _handles(plan)
    commit: dict[str, Any] = {"nextBatchWatermarkMs": plan.watermarks(m)[1]}
    if plan.checkpoint_format == 2:
        commit["stateUniqueIds"] = {str(k): v for k, v in sorted(plan.run.unique_ids.items())}
    version = plan.checkpoint_format
    if plan.commit_log_version == 3:
        # Commit log v3 (sink evolution) stays v3 with its sinkMetadataMap: Spark keeps the
        # version of the latest commit, and takes the checkpoint format from stateUniqueIds.
        version = 3
        extra = m.source_checkpoint.get("commit_metadata_extra")
        for key, value in (extra if isinstance(extra, dict) else {}).items():
            if key not in ("nextBatchWatermarkMs", "stateUniqueIds"):  # ours decide those
                commit[key] = value
    io.write_atomic(under(root, "commits", str(m.batch_id)), commit_log_bytes(commit, version))


def _write_canonical(plan: RestorePlan) -> None:
    sp, io, root = _handles(plan)
    m = sp.metadata
    codec = normalize_codec(m.pinned_confs.get(CODEC_CONF, "lz4"))
    by_uid = {op.uid: op for op in m.operators}
    for uid, new_id in plan.restored.items():
        write_operator(sp, by_uid[uid], new_id, plan, codec)
    for op_id in plan.started_empty:
        write_empty_operator(sp, plan.query_operators[op_id], plan, codec)
    offsets, previous, source_logs = _source_positions(plan, m)
    write_source_logs(io, root, source_logs, previous or {})
    # Every other kind's sources/ files, byte for byte, under the key the query gives them.
    pos = plan.positions
    write_carried_sources(m.sources, sp.io, sp.root, io, root, pos.carried if pos else None)
    _write_offsets(plan, m, offsets, previous)
    _write_commit(plan, m)

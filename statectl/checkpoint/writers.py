"""The bytes of Spark's checkpoint metadata files, beside their parsers (``logs.py``,
``state_metadata.py``): ``metadata``, ``offsets/N`` (v1 and v2), ``commits/N`` and operator
metadata (``state/<op>/_metadata/metadata`` v1, ``_metadata/v2/<batch>`` v2).

Each writer is the inverse of its parser: JSON as Spark's json4s writes it (compact, keys in
the order given), no trailing newline. Pure functions returning bytes; where they go is the
caller's business (a restore writes them through ``FileIO.write_atomic``). Schema files are
written by :mod:`statectl.checkpoint.state_metadata`; source logs (``sources/<i>/N``) by the
restore (statectl/restoration/source_logs.py).
"""

from __future__ import annotations

import json
from typing import Any

from statectl.checkpoint.logs import CommitMetadata, OffsetSeq
from statectl.checkpoint.state_metadata import OperatorMetadata


def _compact(obj: Any) -> str:
    return json.dumps(obj, separators=(",", ":"))


def stream_metadata_bytes(query_id: str | None) -> bytes:
    """``<ckpt>/metadata``: ``{"id":"<query id>"}`` (``null`` for None, as a savepoint
    that records no query id is restored)."""
    return _compact({"id": query_id}).encode()


def offset_log_bytes(offsets: dict[str, str | None], meta: dict[str, Any], version: int) -> bytes:
    """``offsets/N``: the version line, the batch metadata, then v1 one offset per source in
    source index order, v2 (named sources, Spark 4.3's
    ``queryEvolution.enableSourceEvolution``) ``name:offset`` lines; ``-`` for no offset."""
    lines = [f"v{version}", _compact(meta)]
    if version == 1:
        keys = sorted(offsets, key=int)
        lines += ["-" if offsets[k] is None else str(offsets[k]) for k in keys]
    else:
        lines += [f"{k}:{'-' if v is None else v}" for k, v in offsets.items()]
    return "\n".join(lines).encode()


def offset_seq_meta(
    batch_watermark_ms: int,
    batch_timestamp_ms: int,
    conf: dict[str, str],
    extra: dict[str, Any],
) -> dict[str, Any]:
    """An offset log entry's metadata line, in Spark's key order (extra keys last)."""
    return {
        "batchWatermarkMs": batch_watermark_ms,
        "batchTimestampMs": batch_timestamp_ms,
        "conf": conf,
        **extra,
    }


def offset_seq_bytes(seq: OffsetSeq) -> bytes:
    """A parsed ``offsets/N`` written back."""
    meta = offset_seq_meta(
        seq.batch_watermark_ms, seq.batch_timestamp_ms, seq.conf, seq.metadata_extra
    )
    return offset_log_bytes(seq.offsets, meta, seq.version)


def commit_log_bytes(commit: dict[str, Any], version: int) -> bytes:
    """``commits/N``: the version line and the commit metadata (``nextBatchWatermarkMs``,
    with checkpoint format 2 ``stateUniqueIds``, with commit log v3 the sink's metadata)."""
    return f"v{version}\n{_compact(commit)}".encode()


def commit_bytes(c: CommitMetadata) -> bytes:
    """A parsed ``commits/N`` written back."""
    commit: dict[str, Any] = {"nextBatchWatermarkMs": c.next_batch_watermark_ms}
    if c.state_unique_ids is not None:
        commit["stateUniqueIds"] = c.state_unique_ids
    commit.update(c.extra)
    return commit_log_bytes(commit, c.version)


def store_info(
    name: str, prefix_columns: int, partitions: int, schema_paths: list[str] | None = None
) -> dict[str, Any]:
    """One ``stateStoreInfo`` entry; v2 metadata lists the store's schema files."""
    info: dict[str, Any] = {
        "storeName": name,
        "numColsPrefixKey": prefix_columns,
        "numPartitions": partitions,
    }
    if schema_paths is not None:
        info["stateSchemaFilePaths"] = schema_paths
    return info


def operator_metadata_v1_bytes(op_id: int, name: str, stores: list[dict[str, Any]]) -> bytes:
    """``state/<op>/_metadata/metadata``: operator metadata v1."""
    meta = {"operatorInfo": {"operatorId": op_id, "operatorName": name}, "stateStoreInfo": stores}
    return ("v1\n" + _compact(meta)).encode()


def operator_metadata_v2_bytes(
    op_id: int, name: str, stores: list[dict[str, Any]], properties: dict[str, Any]
) -> bytes:
    """``state/<op>/_metadata/v2/<batch>``: operator metadata v2, the operator's properties
    as JSON text inside the JSON (as Spark keeps them)."""
    meta = {
        "operatorInfo": {"operatorId": op_id, "operatorName": name},
        "stateStoreInfo": stores,
        "operatorPropertiesJson": _compact(properties),
    }
    return ("v2\n" + _compact(meta)).encode()


def operator_metadata_bytes(m: OperatorMetadata) -> bytes:
    """A parsed operator metadata file written back at its version."""
    v2 = m.version == 2
    stores = [
        store_info(
            s.store_name,
            s.num_cols_prefix_key,
            s.num_partitions,
            list(s.schema_file_paths) if v2 else None,
        )
        for s in m.stores
    ]
    if v2:
        return operator_metadata_v2_bytes(m.operator_id, m.operator_name, stores, m.properties)
    return operator_metadata_v1_bytes(m.operator_id, m.operator_name, stores)

"""``statectl history``: a checkpoint's batches as its logs and state files still describe them,
and what they add up to (growth, skew, the cost of a restart, the largest keys).

Rows modes: ``sizes`` reads names, sizes and RocksDB zip metadata only; ``counts`` (the
default) also scans increments (``N.delta``/``N.changelog``) for their puts and removes, not
decoding a row; ``exact`` loads every retained version of every partition (what ``inspect``
counts at one batch). Every rows figure says whether it is exact.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from statectl.checkpoint.model import Checkpoint, Operator, partition_absent, store_dir
from statectl.errors import StatectlError
from statectl.history.sources import SourceHistory
from statectl.history.store_files import KINDS, VersionFigures, scan_store
from statectl.history.summary import health, operator_summary
from statectl.io import FileIO
from statectl.processor.reading import open_handle
from statectl.savepoints.store import is_savepoint_dir
from statectl.state import StoreEncoding, load_raw, read_le_int

ROWS_MODES = ("sizes", "counts", "exact")
THREADS = 8


def _unique_ids(
    ckpt: Checkpoint, op: Operator, p: int, store: str, batches: list[int]
) -> dict[int, str]:
    """Version -> the checkpoint id the commit log records (checkpoint format 2), else {}."""
    out: dict[int, str] = {}
    idx = op.store_names.index(store)
    for b in batches:
        if b not in ckpt.commit_batches:
            continue
        ids = ckpt.commit(b).state_unique_ids or {}
        try:
            uid = ids[str(op.operator_id)][p][idx]
        except (KeyError, IndexError):
            continue
        if uid:
            out[b + 1] = uid
    return out


def _partition_figures(
    ckpt: Checkpoint, op: Operator, p: int, batches: list[int], codec: str, count: bool
) -> dict[int, list[VersionFigures]]:
    """Version -> the figures of each of the partition's stores."""
    versions = [b + 1 for b in batches]
    out: dict[int, list[VersionFigures]] = {v: [] for v in versions}
    if partition_absent(ckpt, op, p):
        return out
    for store in op.store_names:
        figs = scan_store(
            ckpt.io,
            store_dir(ckpt, op.operator_id, p, store),
            versions,
            codec=codec,
            count=count,
            unique_ids=_unique_ids(ckpt, op, p, store, batches),
            column_families=op.uses_column_families,
            verify=ckpt.verify,
        )
        for v in versions:
            out[v].append(figs.get(v, VersionFigures(v)))
    return out


def _sum(values: list[int | None]) -> int | None:
    return None if any(v is None for v in values) else sum(v for v in values if v is not None)


def _merge(figs: list[VersionFigures]) -> dict[str, Any]:
    """One partition's figures at one version, its stores added up."""
    return {
        "rows": _sum([f.rows for f in figs]) if figs else 0,
        "rows_exact": all(f.rows_exact for f in figs),
        "puts": _sum([f.puts for f in figs]) if figs else 0,
        "removes": _sum([f.removes for f in figs]) if figs else 0,
        "bytes": _sum([f.load_bytes for f in figs]) if figs else 0,
        "files": _sum([f.load_files for f in figs]) if figs else 0,
        "snapshot_lag": max((f.lag for f in figs if f.lag is not None), default=None)
        if figs and all(f.lag is not None for f in figs)
        else (0 if not figs else None),
        "written": {k: sum(f.written.get(k, 0) for f in figs) for k in KINDS},
    }


def _operator_batch(parts: list[dict[str, Any]]) -> dict[str, Any]:
    """An operator's figures at one batch from its partitions'."""
    return {
        "rows": _sum([p["rows"] for p in parts]),
        "rows_exact": all(p["rows_exact"] for p in parts),
        "puts": _sum([p["puts"] for p in parts]),
        # Rows removed: for aggregations, deduplication and joins, evicted by the watermark.
        "evicted": _sum([p["removes"] for p in parts]),
        "bytes": _sum([p["bytes"] for p in parts]),
        "files": _sum([p["files"] for p in parts]),
        "snapshot_lag_max": max((p["snapshot_lag"] or 0 for p in parts), default=0)
        if all(p["snapshot_lag"] is not None for p in parts)
        else None,
        "written": {k: sum(p["written"][k] for p in parts) for k in KINDS},
        "partitions": [{"partition": i, **p} for i, p in enumerate(parts)],
    }


def _exact_rows(
    ckpt: Checkpoint, op: Operator, p: int, batch: int, enc: StoreEncoding
) -> int | None:
    """Live keys of one partition after ``batch``, all its stores loaded (user column families
    only, as RocksDB's numKeys counts them); None when the version no longer loads."""
    total = 0
    try:
        for store in op.store_names:
            raw = load_raw(ckpt, op, store, p, batch, enc)
            internal = [i for name, i in raw.cf_ids.items() if name.startswith("$")]
            if internal and len(raw):
                ids = read_le_int(raw.keys, 0, 2)  # the column family id, as inspect reads it
                total += int(np.count_nonzero(~np.isin(ids, internal)))
            else:
                total += len(raw)
    except StatectlError:
        return None
    return total


def _operators(ckpt: Checkpoint, batch: int, operator: str | None) -> list[Operator]:
    ops = ckpt.operators(batch)
    if operator is None:
        return ops
    picked = [o for o in ops if str(o.operator_id) == operator or o.name == operator]
    if not picked:
        have = ", ".join(f"{o.operator_id} ({o.name})" for o in ops) or "none"
        raise StatectlError(f"has no operator {operator!r}; it has: {have}", ckpt.root)
    return picked


def _operator_history(
    ckpt: Checkpoint, op: Operator, batches: list[int], rows: str, enc: StoreEncoding
) -> dict[int, dict[str, Any]]:
    """Batch -> the operator's figures at it."""
    # Partitions are independent and their reads wait on storage (an object store's latency
    # above all): threads overlap them.
    with ThreadPoolExecutor(max_workers=min(THREADS, op.num_partitions)) as pool:
        per_partition = list(
            pool.map(
                lambda p: _partition_figures(ckpt, op, p, batches, enc.codec, rows != "sizes"),
                range(op.num_partitions),
            )
        )
    out = {}
    committed = set(ckpt.commit_batches)
    for b in batches:
        parts = [_merge(pf[b + 1]) for pf in per_partition]
        if rows == "exact" and b in committed:
            for p, part in enumerate(parts):
                part["rows"] = _exact_rows(ckpt, op, p, b, enc)
                part["rows_exact"] = part["rows"] is not None
        out[b] = _operator_batch(parts)
    return out


def open_checkpoint(url: str, verify: bool = True) -> Checkpoint:
    io, root = FileIO.for_url(url)
    if is_savepoint_dir(io, root):
        raise StatectlError(
            "is a savepoint: it holds one batch, so it has no history (statectl inspect "
            "--stats shows its state)",
            io.url(root),
        )
    return Checkpoint(io, root, verify=verify)


def history(
    url: str,
    *,
    operator: str | None = None,
    rows: str = "counts",
    top: int = 0,
    verify: bool = True,
) -> dict[str, Any]:
    """The history document (docs/guide.md, "History and report"): batches, operators with
    their summaries, and the checkpoint's health."""
    if rows not in ROWS_MODES:
        raise StatectlError(f"--rows must be one of {', '.join(ROWS_MODES)}, not {rows!r}")
    ckpt = open_checkpoint(url, verify)
    latest = ckpt.resolve_batch(None)
    batches = ckpt.offset_batches
    enc = StoreEncoding.of(ckpt, latest)
    ops = _operators(ckpt, latest, operator)
    sources = SourceHistory(ckpt, latest)
    figures = {op.operator_id: _operator_history(ckpt, op, batches, rows, enc) for op in ops}
    entries = []
    committed = set(ckpt.commit_batches)
    for i, b in enumerate(batches):
        off = ckpt.offsets(b)
        entries.append(
            {
                "batch": b,
                "committed": b in committed,
                "timestamp_ms": off.batch_timestamp_ms,
                "watermark_ms": off.batch_watermark_ms,
                "sources": sources.at(b, batches[i - 1] if i else None),
                "operators": {str(op.operator_id): figures[op.operator_id][b] for op in ops},
            }
        )
    largest = _largest_keys(ckpt, latest, ops, top)
    return {
        "path": ckpt.url(),
        "query_id": ckpt.query_id,
        "backend": enc.backend,
        "latest_committed_batch": latest,
        "rows_mode": rows,
        "sources": sources.describe(),
        "batches": entries,
        "operators": [
            operator_summary(op, entries, largest.get(op.operator_id), latest) for op in ops
        ],
        "health": health(ckpt),
    }


def _largest_keys(
    ckpt: Checkpoint, batch: int, ops: list[Operator], top: int
) -> dict[int, dict[str, Any]]:
    """Operator id -> ``inspect --stats`` of the latest batch (its largest keys, exact rows per
    partition), when ``top`` asks for it: it reads the state."""
    if top <= 0:
        return {}
    handle = open_handle(ckpt.url(), batch=batch, verify=ckpt.verify)
    out = {}
    for op in ops:
        stats = handle.stats(op.operator_id, top=top)
        out[op.operator_id] = next(iter(stats["operators"].values()))
    return out

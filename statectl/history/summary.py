"""What a checkpoint's history adds up to, per operator: growth per batch and per hour, the
partition skew of the latest batch, what a restart reads, and the largest keys; and the
checkpoint's health (the checks ``list`` makes)."""

from __future__ import annotations

from typing import Any

from statectl.checkpoint.model import Checkpoint, Operator
from statectl.inspection import summarize_checkpoint
from statectl.processor.stats import is_skewed, spread

HOUR_MS = 3_600_000


def _growth(points: list[tuple[int, int, int]]) -> dict[str, float | None]:
    """(batch, timestamp ms, value) of the first and last point: change per batch and per
    hour of batch time (None with fewer than two points, or no time between them)."""
    if len(points) < 2:
        return {"per_batch": None, "per_hour": None}
    (b0, t0, v0), (b1, t1, v1) = points[0], points[-1]
    per_hour = (v1 - v0) / ((t1 - t0) / HOUR_MS) if t1 > t0 else None
    return {
        "per_batch": round((v1 - v0) / (b1 - b0), 3) if b1 > b0 else None,
        "per_hour": None if per_hour is None else round(per_hour, 3),
    }


def _series(entries: list[dict[str, Any]], uid: str, key: str) -> list[tuple[int, int, int]]:
    return [
        (e["batch"], e["timestamp_ms"], e["operators"][uid][key])
        for e in entries
        if e["committed"] and e["operators"][uid][key] is not None
    ]


def _skew(last: dict[str, Any], stats: dict[str, Any] | None) -> dict[str, Any]:
    """Rows and bytes per partition at the latest batch: max/median, and the flag. Exact rows
    from ``inspect --stats`` when it ran, else the history's own."""
    parts = last["partitions"]
    rows = [p["rows"] for p in parts]
    if stats:
        per = [0] * len(parts)
        for table in stats.values():
            for p in table["partitions"]:
                if p["partition"] < len(per):
                    per[p["partition"]] += p["rows"]
        rows = per
    sizes = [p["bytes"] for p in parts]
    known = None not in rows
    return {
        "rows": spread(rows) if known else None,
        "bytes": spread(sizes) if None not in sizes else None,
        "skewed": is_skewed(rows) if known else None,
    }


def operator_summary(
    op: Operator, entries: list[dict[str, Any]], stats: dict[str, Any] | None, latest: int
) -> dict[str, Any]:
    """One operator's description and summaries (see the module docstring)."""
    uid = str(op.operator_id)
    last = next(e for e in entries if e["batch"] == latest)["operators"][uid]
    evicted = [e["operators"][uid]["evicted"] for e in entries if e["committed"]]
    return {
        "id": op.operator_id,
        "name": op.name,
        "kind": op.kind.kind,
        "partitions": op.num_partitions,
        "stores": list(op.store_names),
        "rows": last["rows"],
        "rows_exact": last["rows_exact"],
        "bytes": last["bytes"],
        "growth": {
            "rows": _growth(_series(entries, uid, "rows")),
            "bytes": _growth(_series(entries, uid, "bytes")),
        },
        "evicted_total": None if None in evicted else sum(evicted),
        "skew": _skew(last, stats),
        # What a restart from the latest batch reads: every partition's newest snapshot and
        # the increments after it (the deltas or changelogs it replays).
        "restart": {
            "files": last["files"],
            "bytes": last["bytes"],
            "increments_to_replay": _sum_lags(last),
            "snapshot_lag_max": last["snapshot_lag_max"],
        },
        "largest_keys": {t: s["largest_keys"] for t, s in stats.items()} if stats else None,
    }


def _sum_lags(last: dict[str, Any]) -> int | None:
    lags = [p["snapshot_lag"] for p in last["partitions"]]
    return None if None in lags else sum(lags)


def health(ckpt: Checkpoint) -> dict[str, Any]:
    """The checks ``statectl list`` makes (logs, missing state files), as it reports them."""
    entry = summarize_checkpoint(ckpt)
    return {"health": entry["health"], "problems": entry["problems"]}

"""File source logs (``sources/<i>/N``) of the restored checkpoint: their layout, as Spark's
compaction and cleanup leave it, and writing them. Kept in one place so that source
positions (statectl/sources/positions.py) can take it over whole."""

from __future__ import annotations

import json

from statectl.io import FileIO
from statectl.restoration.targets import under

FILE_SOURCE_COMPACT_INTERVAL = 10
# A restore re-creates each file source log from its latest compaction on (as Spark's own log
# cleanup leaves it); more files than this means the savepoint's batch ids are not credible.
MAX_SOURCE_LOG_FILES = 1000


def source_log_layout(entries: list[dict], previous_offset: int | None) -> list[tuple[str, list]]:
    """The files of one file source log, as Spark leaves them: from the latest compaction at or
    before the first batch a restart may re-read, then every later batch (compactions as
    ``N.compact`` with all entries so far). Spark reads older batches from a compaction."""
    by_batch: dict[int, list[dict]] = {}
    for e in entries:
        by_batch.setdefault(int(e["batchId"]), []).append(e)
    if not by_batch:
        return []
    last = max(by_batch)
    # A restart re-plans the last batch: its range starts after the previous batch's offset.
    need = last if previous_offset is None else max(0, min(last, previous_offset + 1))
    first = (need + 1) // FILE_SOURCE_COMPACT_INTERVAL * FILE_SOURCE_COMPACT_INTERVAL - 1
    first = max(first, 0)
    files = []
    for b in range(first, last + 1):
        compact = (b + 1) % FILE_SOURCE_COMPACT_INTERVAL == 0
        if compact:
            body = [e for k in sorted(by_batch) if k <= b for e in by_batch[k]]
        else:
            body = by_batch.get(b, [])
        files.append((f"{b}.compact" if compact else str(b), body))
    return files


def log_offset(text: str | None) -> int | None:
    """A file source's ``logOffset`` in its offset JSON, None when it has none."""
    try:
        v = json.loads(text or "null")["logOffset"]
    except (TypeError, KeyError, ValueError):
        return None
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def write_source_logs(
    io: FileIO, root: str, source_logs: dict[str, list[dict]], previous: dict[str, str | None]
) -> None:
    """Re-create each file source log as Spark lays it out (compaction every 10 batches),
    from the compaction a restart may read on (older files are what Spark's own log cleanup
    deletes), so the file count stays bounded however long the query ran."""
    for source, entries in source_logs.items():
        for name, body in source_log_layout(entries, log_offset(previous.get(source))):
            text = "\n".join(["v1", *(json.dumps(e, separators=(",", ":")) for e in body)])
            io.write_atomic(under(root, "sources", source, name), text.encode())

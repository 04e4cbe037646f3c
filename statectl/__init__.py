"""statectl: savepoints for Spark Structured Streaming.

Python API (the CLI calls the same functions)::

    import statectl
    path = statectl.savepoint("s3://bucket/ckpt", "s3://bucket/savepoints")
    path = statectl.stop_with_savepoint(query, "/savepoints")
"""

from __future__ import annotations

import time
from typing import Any

__version__ = "0.1.0"


def savepoint(
    checkpoint: str,
    target: str | None = None,
    *,
    batch: int | None = None,
    uids: dict[int, str] | None = None,
) -> str:
    """Take a canonical savepoint of a (possibly running) query's checkpoint; returns its URL."""
    from statectl.savepoints.create import take_savepoint

    url, _ = take_savepoint(checkpoint, target, batch=batch, uids=uids)
    return url


def stop_with_savepoint(
    query: Any,
    target: str | None = None,
    *,
    checkpoint: str | None = None,
    uids: dict[int, str] | None = None,
    timeout_s: float = 600.0,
) -> str:
    """Let a running PySpark ``StreamingQuery`` finish its current batch, stop it, and take a
    savepoint of the last committed batch. ``checkpoint`` defaults to the query's own location."""
    if checkpoint is None:
        checkpoint = _checkpoint_of(query)
    deadline = time.monotonic() + timeout_s
    # A trigger in flight would be interrupted by stop(): wait for it to commit first.
    while query.isActive and query.status.get("isTriggerActive") and time.monotonic() < deadline:
        time.sleep(0.05)
    query.stop()
    return savepoint(checkpoint, target, uids=uids)


def _checkpoint_of(query: Any) -> str:
    """The checkpoint root of a classic PySpark StreamingQuery (through its JVM object)."""
    jsq = query._jsq
    for path in (("streamingQuery",), ("query",), ()):
        obj = jsq
        try:
            for attr in path:
                obj = getattr(obj, attr)()
            return str(obj.resolvedCheckpointRoot())
        except Exception:
            continue
    from statectl.errors import StatectlError

    raise StatectlError("cannot find the query's checkpoint location; pass checkpoint=...")

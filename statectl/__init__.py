"""statectl: savepoints for Spark Structured Streaming.

Python API (the CLI calls the same functions; each result's ``to_dict()`` is the command's
``--json`` output; see docs/api.md)::

    import statectl
    info = statectl.inspect("s3://bucket/ckpt")                    # InspectResult
    table = statectl.read_state("s3://bucket/ckpt", operator=0)    # pyarrow.Table
    sp = statectl.savepoint("s3://bucket/ckpt", "s3://bucket/savepoints")  # SavepointResult
    statectl.restore(sp, "s3://bucket/ckpt-v2", partitions=8)      # RestoreResult
    statectl.migrate("/ckpt/orders", "/ckpt/orders-rocksdb", backend="rocksdb")
    sp = statectl.stop_with_savepoint(query, "/savepoints")
    state = statectl.open("/savepoints/sp-1").read("order-totals")   # the state processor
"""

from __future__ import annotations

__version__ = "0.1.0"

from statectl.api import (  # after __version__: create.py reads it
    diff,
    edit,
    inspect,
    migrate,
    read_state,
    restore,
    savepoint,
    stop_with_savepoint,
)
from statectl.api import open_state as open  # statectl.open, like tarfile.open
from statectl.results import (
    SCHEMA_VERSION,
    DiffResult,
    EditResult,
    InspectResult,
    MigrateResult,
    OperatorInfo,
    RestoreError,
    RestoreResult,
    SavepointResult,
    StoreInfo,
)


def __getattr__(name: str) -> object:
    """``statectl.SavepointWriter`` is imported on first use (it needs pyarrow)."""
    if name == "SavepointWriter":
        from statectl.processor.writing import SavepointWriter

        return SavepointWriter
    raise AttributeError(f"module 'statectl' has no attribute {name!r}")


__all__ = [
    "SCHEMA_VERSION",
    "DiffResult",
    "EditResult",
    "InspectResult",
    "MigrateResult",
    "OperatorInfo",
    "RestoreError",
    "RestoreResult",
    "SavepointResult",
    "SavepointWriter",
    "StoreInfo",
    "__version__",
    "diff",
    "edit",
    "inspect",
    "migrate",
    "open",
    "read_state",
    "restore",
    "savepoint",
    "stop_with_savepoint",
]

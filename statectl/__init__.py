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
"""

from __future__ import annotations

import sys
import types

__version__ = "0.1.0"

from statectl.api import (  # after __version__: create.py reads it
    inspect,
    migrate,
    read_state,
    restore,
    savepoint,
    stop_with_savepoint,
)
from statectl.results import (
    SCHEMA_VERSION,
    InspectResult,
    MigrateResult,
    OperatorInfo,
    RestoreError,
    RestoreResult,
    SavepointResult,
    StoreInfo,
)

__all__ = [
    "SCHEMA_VERSION",
    "InspectResult",
    "MigrateResult",
    "OperatorInfo",
    "RestoreError",
    "RestoreResult",
    "SavepointResult",
    "StoreInfo",
    "__version__",
    "inspect",
    "migrate",
    "read_state",
    "restore",
    "savepoint",
    "stop_with_savepoint",
]

_API_FUNCTIONS = {"inspect": inspect, "restore": restore}


class _Package(types.ModuleType):
    """``statectl.inspect`` and ``statectl.restore`` are API functions, and also the names of
    the use-case modules statectl/inspect.py and statectl/restore.py. Python's import system
    sets a submodule as an attribute of its package the first time it is imported, which
    would replace the function; here those two names keep the function (the modules stay
    importable by their full names: ``from statectl.restore import ...``)."""

    def __setattr__(self, name: str, value: object) -> None:
        if name in _API_FUNCTIONS and isinstance(value, types.ModuleType):
            return
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package

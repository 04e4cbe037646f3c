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
    statectl.doctor("/ckpt/orders").recovery                    # Diagnosis
    statectl.gc("/savepoints", keep_last=5, dry_run=True)         # GcResult
    state = statectl.open("/savepoints/sp-1").read("order-totals")   # the state processor
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

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
from statectl.version import __version__

if TYPE_CHECKING:
    from statectl.api import (
        diff,
        doctor,
        edit,
        gc,
        inspect,
        migrate,
        read_state,
        restore,
        savepoint,
        stop_with_savepoint,
    )
    from statectl.api import open_state as open
    from statectl.processor.writing import SavepointWriter

# The API's functions and the state processor's writer, imported on first use (PEP 562):
# they bring pyarrow and the readers, and ``import statectl`` (the CLI's ``--help`` too)
# should not pay for them. Name -> (module, attribute).
_LAZY = {
    "diff": ("statectl.api", "diff"),
    "doctor": ("statectl.api", "doctor"),
    "edit": ("statectl.api", "edit"),
    "gc": ("statectl.api", "gc"),
    "inspect": ("statectl.api", "inspect"),
    "migrate": ("statectl.api", "migrate"),
    "open": ("statectl.api", "open_state"),  # statectl.open, like tarfile.open
    "read_state": ("statectl.api", "read_state"),
    "restore": ("statectl.api", "restore"),
    "savepoint": ("statectl.api", "savepoint"),
    "stop_with_savepoint": ("statectl.api", "stop_with_savepoint"),
    "SavepointWriter": ("statectl.processor.writing", "SavepointWriter"),
}


def __getattr__(name: str) -> object:
    """The lazily imported names of :data:`_LAZY`, cached in the module once imported."""
    if name not in _LAZY:
        raise AttributeError(f"module 'statectl' has no attribute {name!r}")
    module, attr = _LAZY[name]
    value = getattr(importlib.import_module(module), attr)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))


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
    "doctor",
    "edit",
    "gc",
    "inspect",
    "migrate",
    "open",
    "read_state",
    "restore",
    "savepoint",
    "stop_with_savepoint",
]

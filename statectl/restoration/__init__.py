"""Restore: write a Spark checkpoint from a savepoint, in either backend, at any partition
count, from which the query resumes at batch N+1 with exactly-once positions; and migrate
(a savepoint of a checkpoint restored in one step).

The savepoint is only read (Flink's NO_CLAIM). Every key is placed where Spark will look for
it, ``pmod(murmur3(key), partitions)``; the pinned confs are rewritten for the chosen backend
and partition count. State files are written first, the logs after them, ``commits/N`` last,
so an interrupted restore never looks like a finished checkpoint.

The package is named ``restoration``, not ``restore``: ``statectl.restore`` is the API
function, and importing a submodule ``statectl.restore`` would rebind that attribute of the
``statectl`` package to the module.

- ``options.py``: :class:`RestoreOptions` / :class:`MigrateOptions`, every user choice;
- ``plan.py``: :class:`RestorePlan` (decisions), its report and execution handles;
- ``planning.py``: :func:`plan_restore`, a pipeline of the planners in ``targets.py``,
  ``safety.py``, ``matching.py``, ``evolve.py``, ``formats.py``;
- ``write.py``: :func:`write_restore`, with ``stores.py`` (store operators),
  ``families.py`` (column-family operators) and ``source_logs.py``;
- ``usecase.py``: :func:`restore`; ``migrate.py``: :func:`migrate`.
"""

from __future__ import annotations

from statectl.restoration.migrate import migrate
from statectl.restoration.options import MigrateOptions, RestoreOptions
from statectl.restoration.plan import RestorePlan
from statectl.restoration.planning import plan_restore
from statectl.restoration.source_logs import MAX_SOURCE_LOG_FILES, source_log_layout
from statectl.restoration.usecase import restore
from statectl.restoration.write import write_restore

__all__ = [
    "MAX_SOURCE_LOG_FILES",
    "MigrateOptions",
    "RestoreOptions",
    "RestorePlan",
    "migrate",
    "plan_restore",
    "restore",
    "source_log_layout",
    "write_restore",
]

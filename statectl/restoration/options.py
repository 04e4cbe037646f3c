"""Every choice a user makes for a restore or a migrate, in one frozen value.

The CLI (``statectl restore`` / ``migrate``) and the Python API (:func:`statectl.restore`,
:func:`statectl.migrate`, whose keyword signatures are these fields) build it once; the use
case (:mod:`statectl.restoration.usecase`, :mod:`statectl.restoration.migrate`) and the
planner read it. Session handles (a SparkSession, a progress callback, the engine built from
``engine``/``memory``/``workers``) are not choices and travel beside it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from statectl.operators import AGG_FORMAT_CONF, GROUP_STATE_FORMAT_CONF


@dataclass(frozen=True)
class RestoreOptions:
    """``statectl restore``'s choices (migrate's too: :class:`MigrateOptions` adds its own)."""

    backend: str | None = None  # hdfs or rocksdb; None: the savepoint's
    partitions: int | None = None  # None: the savepoint's
    mapping: Mapping[str, int] = field(default_factory=dict)  # --map UID=OPERATOR_ID
    drop: tuple[str, ...] = ()  # --drop UID
    allow_non_restored: bool = False  # -n
    # --query: MODULE:FUNCTION / FILE.py:FUNCTION, or an already planned query
    query: Any = None
    output_mode: str | None = None
    # --from-query: the query the savepoint was taken with (MODULE:FUNCTION), planned like
    # --query, so aggregation buffers are matched by the aggregate that owns them
    from_query: Any = None
    changelog: bool = False  # RocksDB changelog checkpoints instead of snapshots
    checkpoint_format: int | None = None  # 1 or 2; None: the savepoint source's
    dry_run: bool = False
    overwrite: bool = False  # replace an interrupted statectl restore
    join_state_format: int | None = None
    aggregation_state_format: int | None = None
    group_state_format: int | None = None
    # source index or description -> offset (JSON text, or a dict; "-" or None: the
    # configured start); the API normalizes it to JSON text by description before planning
    source_offsets: Mapping[Any, Any] = field(default_factory=dict)
    transforms: Mapping[str, str] = field(default_factory=dict)  # uid -> FILE.py:FUNCTION
    memory: str | int | None = None  # the local engine's budget (bytes or "512M")
    workers: int | None = None
    engine: Any = "local"  # "local", "spark", "auto", a SparkSession or an engine
    spark_confs: Mapping[str, str] | None = None
    # How the restored checkpoint goes on (statectl/restoration/continuation.py): a new query
    # id (a fork beside the original) instead of the savepoint's, and the event-time
    # watermark its next batch starts from (epoch ms or ISO time; None: the savepoint's).
    new_query_id: bool = False
    watermark: str | int | None = None
    offset_log: int | None = None  # --offset-log 1 or 2; None: the savepoint's
    row_checksums: bool | None = None  # --row-checksums / --no-row-checksums; None: off

    @property
    def rocksdb_layout(self) -> str:
        """RocksDB target files: ``snapshot`` (zip) or ``changelog``."""
        return "changelog" if self.changelog else "snapshot"

    @property
    def state_formats(self) -> dict[str, int | None]:
        """--aggregation-state-format / --group-state-format by the conf they pin."""
        return {
            AGG_FORMAT_CONF: self.aggregation_state_format,
            GROUP_STATE_FORMAT_CONF: self.group_state_format,
        }


@dataclass(frozen=True)
class MigrateOptions:
    """``statectl migrate``'s choices: a savepoint of ``batch`` restored in one step."""

    backend: str | None = None
    partitions: int | None = None
    batch: int | None = None  # None: the latest committed batch
    keep_savepoint: Any = None  # a directory to keep the intermediate savepoint under
    changelog: bool = False
    overwrite: bool = False
    verify: bool = True
    join_state_format: int | None = None
    aggregation_state_format: int | None = None
    group_state_format: int | None = None
    memory: str | int | None = None
    workers: int | None = None
    engine: Any = "local"
    spark_confs: Mapping[str, str] | None = None
    # Operators whose bytes stay the same skip the savepoint (statectl/passthrough.py);
    # False takes the savepoint path for every operator (tests compare the two).
    passthrough: bool = True
    # As RestoreOptions' (restore_options passes them on).
    checkpoint_format: int | None = None
    new_query_id: bool = False
    watermark: str | int | None = None
    offset_log: int | None = None
    row_checksums: bool | None = None

    @property
    def state_formats(self) -> dict[str, int]:
        """The state formats asked for, by the conf they pin (unasked ones left out)."""
        asked = {
            AGG_FORMAT_CONF: self.aggregation_state_format,
            GROUP_STATE_FORMAT_CONF: self.group_state_format,
        }
        return {conf: n for conf, n in asked.items() if n is not None}

    def restore_options(self) -> RestoreOptions:
        """The restore migrate runs from its temporary savepoint."""
        return RestoreOptions(
            backend=self.backend,
            partitions=self.partitions,
            changelog=self.changelog,
            join_state_format=self.join_state_format,
            aggregation_state_format=self.aggregation_state_format,
            group_state_format=self.group_state_format,
            checkpoint_format=self.checkpoint_format,
            new_query_id=self.new_query_id,
            watermark=self.watermark,
            offset_log=self.offset_log,
            row_checksums=self.row_checksums,
        )

"""What a restore will do, kept in three parts: the decisions (where each uid goes, formats,
evolutions, source positions), the report (problems, conversions, evolved fields, sources:
what ``--json`` prints) and the execution handles (the open savepoint, the target's
filesystem, the engine; the unique ids the write records).

The planners (:mod:`statectl.restoration.planning`) fill decisions and report; once planned,
:func:`statectl.restoration.write.write_restore` reads the decisions and only writes to the
execution part. ``as_dict`` is the ``--json`` document.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from statectl.backends import DEFAULT, Backend, backend_names, get_backend
from statectl.checkpoint.model import PARTITIONS_CONF, Operator
from statectl.errors import StatectlError
from statectl.evolution import TableEvolution
from statectl.io import FileIO
from statectl.operators import AGG_FORMAT_CONF, GROUP_STATE_FORMAT_CONF
from statectl.savepoints.store import Savepoint
from statectl.sources import SourcePositions


@dataclass
class PlanReport:
    """What the plan tells the user; ``problems`` empty means the restore will be written."""

    problems: list[str] = field(default_factory=list)
    conversions: list[str] = field(default_factory=list)  # state formats converted or kept
    # Schema evolution: one line per evolved field.
    evolved: list[str] = field(default_factory=list)
    # Every source of the restored query: kept / new / given / dropped
    # (statectl/sources/positions.py).
    sources: list[dict[str, Any]] = field(default_factory=list)
    interrupted: dict[str, Any] | None = None  # what the interrupted restore's marker says
    # --watermark: from/to (ms and ISO) and the rows the next batch evicts, by uid (None:
    # not counted) (statectl/restoration/continuation.py)
    watermark: dict[str, Any] | None = None


@dataclass
class Execution:
    """What write_restore needs and records: the open savepoint, the target's filesystem and
    root, the engine, migrate's pass-through operators, and the unique ids written."""

    sp: Savepoint | None = None
    io: FileIO | None = None
    root: str = ""
    started: bool = False  # the in-progress marker is already written
    # The engine that writes the stores: local (memory, workers) or Spark's.
    engine: Any = None
    # migrate: uid -> (checkpoint, batch, operator) of the operators whose stores are written
    # from the source's bytes (statectl/passthrough.py), not from the savepoint.
    passthrough: dict[str, tuple[Any, int, Operator]] = field(default_factory=dict)
    # checkpoint format 2: operator id -> partition -> store index -> unique id (written)
    unique_ids: dict[int, list[list[str]]] = field(default_factory=dict)

    def record_unique_id(
        self, op_id: int, partition: int, partitions: int, uid: str | None
    ) -> None:
        """The unique id a store partition's files carry (checkpoint format 2), in order."""
        if uid is not None:
            parts = self.unique_ids.setdefault(op_id, [[] for _ in range(partitions)])
            parts[partition].append(uid)


@dataclass
class RestorePlan:
    """The decisions; ``report`` and ``run`` are the other two parts (see the module)."""

    savepoint: str
    target: str
    backend: str
    partitions: int
    batch: int
    restored: dict[str, int] = field(default_factory=dict)  # uid -> operator id
    dropped: list[str] = field(default_factory=list)
    started_empty: dict[int, str] = field(default_factory=dict)  # operator id -> name
    query: str | None = None
    rocksdb_layout: str = "snapshot"  # RocksDB target files: "snapshot" (zip) or "changelog"
    checkpoint_format: int = 1  # 2: file names carry unique ids, listed in commits/N
    scheme: str = ""  # the URL scheme the target was given with (s3a stays s3a for Spark)
    # The changed query's operators (from --query), by id: restored ones take their metadata
    # and schemas from the savepoint, new ones get empty state with these.
    query_operators: dict[int, Operator] = field(default_factory=dict)
    overwrite: bool = False  # the target is an interrupted statectl restore to replace
    # Stream-stream joins: the state format written (pinned as
    # spark.sql.streaming.join.stateFormatVersion), None without joins.
    join_state_format: int | None = None
    # --aggregation-state-format / --group-state-format: the kind's format conf -> the state
    # format written (and pinned) for every operator of that kind; unasked: kept.
    state_formats: dict[str, int] = field(default_factory=dict)
    # The offset log and source logs written for the sources (None: the savepoint's as they are).
    positions: SourcePositions | None = field(default=None, repr=False, compare=False)
    # Schema evolution (statectl/evolution.py): uid -> store name -> how its rows change.
    evolutions: dict[str, dict[str, TableEvolution]] = field(default_factory=dict)
    # uid -> store name -> the query's (key, value) schemas where they differ from the
    # savepoint's in names or nullability only (the same bytes): written to the schema file,
    # since Spark refuses a stored non-nullable field the query plans nullable.
    query_schemas: dict[str, dict[str, tuple[str, str]]] = field(default_factory=dict)
    transforms: dict[str, str] = field(default_factory=dict)  # uid -> FILE.py:FUNCTION
    # The id the target's ``metadata`` gets: the savepoint's (the same query continues) or,
    # with --new-query-id, a new one (``fork``) (statectl/restoration/continuation.py).
    query_id: str | None = None
    fork: bool = False
    # --watermark: offsets/N's batchWatermarkMs and commits/N's nextBatchWatermarkMs (None:
    # the savepoint's as they are).
    watermark_ms: int | None = None
    # --offset-log: the offset log version written (None: the savepoint's), and the commit
    # log version (3: sink evolution's, kept; None: the checkpoint format's).
    offset_log_version: int | None = None
    commit_log_version: int | None = None
    # --row-checksums: store rows carry Spark's row checksum (continuation.with_row_checksums).
    row_checksums: bool = False
    # Pinned confs the conversions set (offset log v1: source evolution off; row checksums).
    pinned_overrides: dict[str, str] = field(default_factory=dict)
    report: PlanReport = field(default_factory=PlanReport)
    run: Execution = field(default_factory=Execution, repr=False, compare=False)

    # The report and the handles, read where the plan was read before they were split off.
    @property
    def problems(self) -> list[str]:
        return self.report.problems

    @property
    def conversions(self) -> list[str]:
        return self.report.conversions

    @property
    def evolved(self) -> list[str]:
        return self.report.evolved

    @property
    def sources(self) -> list[dict[str, Any]]:
        return self.report.sources

    @property
    def interrupted(self) -> dict[str, Any] | None:
        return self.report.interrupted

    @property
    def passthrough(self) -> dict[str, tuple[Any, int, Operator]]:
        return self.run.passthrough

    @property
    def engine(self) -> Any:
        return self.run.engine

    @engine.setter
    def engine(self, engine: Any) -> None:
        self.run.engine = engine

    def watermarks(self, m: Any) -> tuple[int, int]:
        """offsets/N's ``batchWatermarkMs`` and commits/N's ``nextBatchWatermarkMs``."""
        if self.watermark_ms is None:
            return m.batch_watermark_ms, m.next_batch_watermark_ms
        return self.watermark_ms, self.watermark_ms

    @property
    def target_backend(self) -> Backend:
        return get_backend(self.backend)

    @property
    def layout(self) -> str:
        """The layout the target's stores are written in (the backend's default when it has
        not the one asked for: HDFS writes snapshots whatever ``--changelog`` says)."""
        return self.target_backend.capabilities.layout(self.rocksdb_layout)

    @property
    def snapshot_rocksdb(self) -> bool:
        """The target layout holds column families (RocksDB snapshots)."""
        return self.target_backend.capabilities.column_families_in(self.rocksdb_layout)

    def rewrites(self, uid: str) -> bool:
        """The restore writes ``uid``'s rows otherwise than the savepoint has them: evolved,
        under the query's schemas, or transformed (join format conversion: ``conversions``)."""
        return bool(self.evolutions.get(uid)) or uid in self.query_schemas or uid in self.transforms

    def target_schemas(self, uid: str, table: Any) -> tuple[str, str]:
        """The key and value schemas a restored store (a join's at any state format) is
        written with: the query's wherever the plan has them, evolved or the same bytes under
        other names or nullability (which Spark's schema check may refuse as stored), else the
        savepoint's. The one owner: the schema files, the column families and the encoders
        all ask here."""
        planned = self.query_schemas.get(uid, {}).get(table.name)
        if planned is not None:
            return planned
        evo = self.evolutions.get(uid, {}).get(table.name)
        key = evo.key.new_schema if evo and evo.key else table.key_schema
        value = evo.value.new_schema if evo and evo.value else table.value_schema
        return key, value

    def as_dict(self) -> dict[str, Any]:
        return {
            "savepoint": self.savepoint,
            "target": self.target,
            "backend": self.backend,
            "partitions": self.partitions,
            "resumes_at_batch": self.batch + 1,
            "checkpoint_format": self.checkpoint_format,
            "query": self.query,
            "restored": self.restored,
            "dropped": self.dropped,
            "started_empty": {str(k): v for k, v in self.started_empty.items()},
            "join_state_format": self.join_state_format,
            "aggregation_state_format": self.state_formats.get(AGG_FORMAT_CONF),
            "group_state_format": self.state_formats.get(GROUP_STATE_FORMAT_CONF),
            "conversions": self.conversions,
            "sources": self.sources,
            "engine": getattr(self.engine, "name", "local"),
            "evolved": self.evolved,
            "problems": self.problems,
            "ok": not self.problems,
            "query_id": self.query_id,
            "fork": self.fork,
            "watermark": self.report.watermark,
            "offset_log_version": self.offset_log_version,
            "row_checksums": self.row_checksums,
        }


def choose_target(sp: Savepoint, backend: str | None, partitions: int | None) -> tuple[str, int]:
    """The backend and partition count to restore to: the arguments, else the savepoint's."""
    m = sp.metadata
    chosen = backend or m.source_checkpoint.get("backend") or DEFAULT
    if chosen not in backend_names():
        raise StatectlError(f"--backend must be {' or '.join(backend_names())}, not {chosen!r}")
    if partitions is not None:
        if partitions < 1:
            raise StatectlError(f"--partitions must be at least 1, got {partitions}")
        return chosen, partitions
    try:
        n = int(m.pinned_confs.get(PARTITIONS_CONF, 0)) or int(
            m.source_checkpoint.get("partitions") or 0
        )
    except (TypeError, ValueError):
        n = 0
    if n < 1:
        raise StatectlError(
            f"the savepoint records no valid partition count ({PARTITIONS_CONF}); pass --partitions",
            sp.url(),
        )
    return chosen, n

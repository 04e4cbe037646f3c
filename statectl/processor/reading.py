"""The processor's reader: a savepoint or a checkpoint opened as one kind of handle.

``statectl.open(path)`` returns a :class:`SavepointHandle` or a :class:`CheckpointHandle`; both
describe their operators the same way and read one table partition at a time (a savepoint's
data file, a checkpoint's store partition), which is the unit everything above streams in:
``read`` concatenates it, ``batches`` yields it, the writer and ``diff`` process it. The old
entry points (``statectl.read_state``, ``export``) are this reader called in one step.
"""

from __future__ import annotations

import posixpath
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from statectl.errors import StatectlError
from statectl.operators import JOIN_STORES

if TYPE_CHECKING:
    import pandas as pd

    from statectl.checkpoint.model import Checkpoint, Operator
    from statectl.savepoints.format import StateTable
    from statectl.savepoints.store import Savepoint

TIMERS = "$timers"


@dataclass(frozen=True)
class TableInfo:
    """One store, join store, transformWithState variable or ``$timers`` of an operator."""

    name: str
    kind: str  # store | join-store | ValueState | ListState | MapState | timers
    schema: pa.Schema  # the columns ``read`` returns (Spark's ``statestore`` columns)
    key_schema: pa.DataType  # the ``key`` column (the grouping key for transformWithState)
    value_schema: pa.DataType  # ``value`` / ``list_element`` / ``user_map_value`` / timestamp
    spark_key_schema: str  # as recorded (Spark JSON)
    spark_value_schema: str
    rows: int | None  # known for canonical savepoints; None where counting means reading

    @property
    def value_column(self) -> str:
        return {"ListState": "list_element", "MapState": "user_map_value"}.get(
            self.kind, "expiration_timestamp_ms" if self.kind == "timers" else "value"
        )

    @property
    def key_columns(self) -> list[str]:
        """Columns that identify a row (``diff`` joins on them)."""
        if self.kind == "MapState":
            return ["key", "user_map_key"]
        if self.kind == "timers":
            return ["key", "expiration_timestamp_ms"]
        return ["key"]


@dataclass(frozen=True)
class OperatorInfo:
    """A stateful operator of a savepoint or checkpoint."""

    uid: str
    id: int
    name: str  # Spark's operator name (stateStoreSave, dedupe, symmetricHashJoin, ...)
    kind: str  # statectl's operator kind (statectl/operators.py)
    restorable: bool
    partitions: int
    tables: tuple[TableInfo, ...]

    @property
    def rows(self) -> int | None:
        counts = [t.rows for t in self.tables]
        return None if any(c is None for c in counts) else sum(c or 0 for c in counts)

    def table(self, name: str | None = None) -> TableInfo:
        """``name``, or the operator's only table, or its ``default`` store."""
        by_name = {t.name: t for t in self.tables}
        if name is None:
            if "default" in by_name:
                return by_name["default"]
            if len(self.tables) == 1:
                return self.tables[0]
        elif name in by_name:
            return by_name[name]
        raise StatectlError(
            f"operator {self.uid} (id {self.id}) has no store or state variable "
            f"{name or 'default'!r}; it has: {', '.join(by_name) or 'none'} (pass table=...)"
        )


def _table_schema(
    name: str, kind: str, key: str, value: str, user_key: str | None, rows: int | None
) -> TableInfo:
    from statectl.savepoints.format import StateTable
    from statectl.savepoints.store import Savepoint

    st = StateTable(name, kind, key, value, [], 0, [], user_key)
    schema = Savepoint.table_schema(st)
    value_at = 2 if kind == "MapState" else 1
    return TableInfo(
        name, kind, schema, schema.field(0).type, schema.field(value_at).type, key, value, rows
    )


class StateHandle:
    """What a savepoint and a checkpoint have in common for the processor.

    ``op`` arguments are a uid or an operator id; ``table`` a store or state variable name
    (default: the ``default`` store or the only table); ``join_side="left"|"right"`` reads a
    stream-stream join side the way Spark's ``joinSide`` option shows it.
    """

    kind: str = ""
    path: str = ""
    batch: int = -1
    operators: tuple[OperatorInfo, ...] = ()

    def __fspath__(self) -> str:
        """A handle stands for its path: pass it to statectl (or fsspec) wherever a path goes."""
        return self.path

    def __str__(self) -> str:
        return self.path

    # -- description -------------------------------------------------------------------
    def operator(self, ref: str | int | OperatorInfo) -> OperatorInfo:
        if isinstance(ref, OperatorInfo):
            return ref
        for op in self.operators:
            if op.uid == str(ref) or str(op.id) == str(ref):
                return op
        have = ", ".join(f"{o.uid} (id {o.id})" for o in self.operators) or "none"
        raise StatectlError(f"{self.kind} has no operator {ref!r}; it has: {have}", self.path)

    @property
    def offsets(self) -> dict[str, Any]:
        """The sources' offsets of the batch (parsed JSON where it is JSON)."""
        raise NotImplementedError

    def describe(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "path": self.path,
            "batch": self.batch,
            "operators": [
                {
                    "uid": op.uid,
                    "id": op.id,
                    "name": op.name,
                    "kind": op.kind,
                    "partitions": op.partitions,
                    "tables": {t.name: t.rows for t in op.tables},
                }
                for op in self.operators
            ],
        }

    def stats(self, operator: str | int | None = None, *, top: int = 10) -> dict[str, Any]:
        """``inspect --stats``: rows and bytes per partition, skew and the ``top`` largest keys
        per table (statectl/processor/stats.py)."""
        from statectl.processor.stats import state_stats

        return state_stats(self, operator=None if operator is None else str(operator), top=top)

    # -- reading -----------------------------------------------------------------------
    def _select(
        self, ref: str | int | OperatorInfo, table: str | None, join_side: str | None
    ) -> tuple[OperatorInfo, TableInfo]:
        op = self.operator(ref)
        if join_side is None:
            return op, op.table(table)
        if join_side not in ("left", "right"):
            raise StatectlError(f"join_side must be left or right, not {join_side!r}")
        if table is not None:
            raise StatectlError("give a table or a join side, not both")
        name = f"{join_side}-keyWithIndexToValue"
        if name not in {t.name for t in op.tables}:
            # A checkpoint's operator is named by id, a savepoint's also by its uid.
            who = f"{op.name}" if isinstance(self, CheckpointHandle) else f"{op.name}, uid {op.uid}"
            raise StatectlError(
                f"operator {op.id} ({who}) is not a stream-stream join; "
                "--join-side is for symmetricHashJoin operators",
                self.path,
            )
        return op, op.table(name)

    def _partitions(
        self, op: OperatorInfo, table: TableInfo, join_side: str | None
    ) -> Iterator[tuple[int, pa.Table]]:
        """``(partition, rows)`` of ``table``, or of one join side (which ``table`` then names)
        as Spark's ``joinSide`` option shows it."""
        for p in range(op.partitions):
            yield p, self._partition(op, table, p, join_side)

    def partitions(
        self,
        op: str | int | OperatorInfo,
        table: str | None = None,
        *,
        join_side: str | None = None,
    ) -> Iterator[tuple[int, pa.Table]]:
        """``(partition, rows)`` for every state partition, one at a time (bounded memory)."""
        info, t = self._select(op, table, join_side)
        yield from self._partitions(info, t, join_side)

    def partition(
        self,
        op: str | int | OperatorInfo,
        p: int,
        table: str | None = None,
        *,
        join_side: str | None = None,
    ) -> pa.Table:
        """State partition ``p``'s rows alone (what :meth:`partitions` yields for it): the unit
        of one export task on the Spark engine."""
        info, t = self._select(op, table, join_side)
        if not 0 <= p < info.partitions:
            raise StatectlError(f"operator {info.id} has no partition {p}", self.path)
        return self._partition(info, t, p, join_side)

    def _partition(
        self, op: OperatorInfo, table: TableInfo, p: int, join_side: str | None
    ) -> pa.Table:
        """Partition ``p`` of ``table``, or of one join side (see :meth:`_partitions`)."""
        raise NotImplementedError

    def chunks(
        self,
        op: str | int | OperatorInfo,
        table: str | None = None,
        *,
        join_side: str | None = None,
        budget: int,
        scratch: str,
    ) -> Iterator[pa.Table]:
        """The rows of :meth:`read` in order, in chunks that keep about ``budget`` bytes in
        memory (``scratch``: a private directory for spill files)."""
        info, t = self._select(op, table, join_side)
        yield from self._chunks(info, t, join_side, budget, scratch)

    def _chunks(
        self, op: OperatorInfo, table: TableInfo, join_side: str | None, budget: int, scratch: str
    ) -> Iterator[pa.Table]:
        """:meth:`chunks` of ``table`` or one join side (as :meth:`_partitions` shapes it)."""
        for _, part in self._partitions(op, table, join_side):
            yield part

    def schema(
        self,
        op: str | int | OperatorInfo,
        table: str | None = None,
        *,
        join_side: str | None = None,
    ) -> pa.Schema:
        return self._select(op, table, join_side)[1].schema

    def read(
        self,
        op: str | int | OperatorInfo = 0,
        table: str | None = None,
        *,
        join_side: str | None = None,
    ) -> pa.Table:
        """The whole table, as Spark's ``statestore`` reader returns it for the same options."""
        parts = [t for _, t in self.partitions(op, table, join_side=join_side)]
        if parts:
            return pa.concat_tables(parts)
        from statectl.state import join_side_view

        empty = self._select(op, table, join_side)[1].schema.empty_table()
        return join_side_view(empty) if join_side else empty

    def batches(
        self,
        op: str | int | OperatorInfo = 0,
        table: str | None = None,
        *,
        join_side: str | None = None,
        max_chunksize: int | None = None,
    ) -> Iterator[pa.RecordBatch]:
        """Record batches, one partition in memory at a time."""
        for _, part in self.partitions(op, table, join_side=join_side):
            yield from part.to_batches(max_chunksize=max_chunksize)

    def to_pandas(
        self,
        op: str | int | OperatorInfo = 0,
        table: str | None = None,
        *,
        join_side: str | None = None,
        flatten: bool = False,
    ) -> pd.DataFrame:
        """A pandas DataFrame (structs as dicts; ``flatten=True``: a column per field)."""
        t = self.read(op, table, join_side=join_side)
        return (t.flatten() if flatten else t).to_pandas()

    def to_spark(
        self,
        spark: Any,
        op: str | int | OperatorInfo = 0,
        table: str | None = None,
        *,
        join_side: str | None = None,
    ) -> Any:
        """A Spark DataFrame read in parallel on the cluster (see the subclasses for how)."""
        raise NotImplementedError


def spark_url(url: str) -> str:
    """fsspec's ``s3://`` is Hadoop's ``s3a://``."""
    return "s3a://" + url[len("s3://") :] if url.startswith("s3://") else url


class CheckpointHandle(StateHandle):
    """A Spark checkpoint at one committed batch. Operators have their default uids (the ones
    ``statectl savepoint`` gives) unless ``uids`` names them."""

    kind = "checkpoint"

    def __init__(
        self,
        ckpt: Checkpoint,
        batch: int | None = None,
        uids: dict[int, str] | None = None,
        *,
        kind: str = "checkpoint",
    ) -> None:
        from statectl.savepoints.create import assign_uids

        self.ckpt = ckpt
        self.kind = kind
        self.path = ckpt.url()
        self.batch = ckpt.resolve_batch(batch)
        self._ops = {op.operator_id: op for op in ckpt.operators(self.batch)}
        names = assign_uids(list(self._ops.values()), dict(uids or {}))
        self.operators = tuple(
            self._describe(op, names[op.operator_id]) for op in self._ops.values()
        )

    @staticmethod
    def _describe(op: Operator, uid: str) -> OperatorInfo:
        from statectl.savepoints.create import logical_stores, table_tasks

        # A join at state format 3/4 is presented as a savepoint holds it: format 2's four
        # stores (logical schemas), besides its own column families (below).
        logical = {s.name: s for s in logical_stores(op)[1]}
        tables = []
        for task in table_tasks(op):
            if task.kind == "timers":
                event = op.properties.get("timeMode") == "EventTime"
                desc = op.schema(
                    "$eventTimers_keyToTimestamp" if event else "$procTimers_keyToTimestamp"
                )
            else:
                desc = logical.get(task.name) or op.schema(task.name)
            tables.append(
                _table_schema(
                    task.name,
                    task.kind,
                    desc.key_schema,
                    desc.value_schema,
                    desc.user_key_schema,
                    None,
                )
            )
        if op.uses_column_families:
            # Column families no state variable declares (a join at state format 3/4 keeps its
            # four stores as families): readable by name, as Spark's storeName reads them.
            from statectl.state import state_variable_type

            named = {t.name for t in tables}
            for desc in op.schemas:
                if desc.name in named or desc.name.startswith("$"):
                    continue
                kind = (
                    "join-store"
                    if op.name == "symmetricHashJoin"
                    else state_variable_type(op, desc.name)
                )
                tables.append(
                    _table_schema(
                        desc.name,
                        kind,
                        desc.key_schema,
                        desc.value_schema,
                        desc.user_key_schema,
                        None,
                    )
                )
        kind = op.kind
        return OperatorInfo(
            uid,
            op.operator_id,
            op.name,
            kind.kind,
            kind.restorable,
            op.num_partitions,
            tuple(tables),
        )

    @property
    def offsets(self) -> dict[str, Any]:
        from statectl.inspection import maybe_json

        return {k: maybe_json(v) for k, v in self.ckpt.offsets(self.batch).offsets.items()}

    def _selection(self, op: OperatorInfo, table: TableInfo, join_side: str | None) -> Any:
        from statectl.state import Selection

        if join_side:
            # Spark's joinSide view at the join's own state format (at format 4 the key keeps
            # __event_time): the state reader owns it.
            return Selection(op.id, join_side=join_side, batch=self.batch)
        if table.kind == "timers":
            return Selection(op.id, registered_timers=True, batch=self.batch)
        if table.kind == "join-store" and table.name in JOIN_STORES:
            # format 2's store, whatever the join's state format (3/4 are converted)
            return Selection(op.id, join_store=table.name, batch=self.batch)
        if table.kind in ("store", "join-store"):
            return Selection(op.id, store=table.name, batch=self.batch)
        return Selection(op.id, state_var=table.name, batch=self.batch)

    def _chunks(
        self, op: OperatorInfo, table: TableInfo, join_side: str | None, budget: int, scratch: str
    ) -> Iterator[pa.Table]:
        from statectl.state import StoreEncoding, iter_partition

        operator = self._ops[op.id]
        enc = StoreEncoding.of(self.ckpt, self.batch)
        sel = self._selection(op, table, join_side)
        for p in range(operator.num_partitions):
            yield from iter_partition(
                self.ckpt, operator, sel, p, self.batch, enc, budget=budget, scratch=scratch
            )

    def _partition(
        self, op: OperatorInfo, table: TableInfo, p: int, join_side: str | None
    ) -> pa.Table:
        from statectl.state import StoreEncoding, read_partition

        sel = self._selection(op, table, join_side)
        enc = StoreEncoding.of(self.ckpt, self.batch)
        return read_partition(self.ckpt, self._ops[op.id], sel, p, self.batch, enc)

    def to_spark(
        self,
        spark: Any,
        op: str | int | OperatorInfo = 0,
        table: str | None = None,
        *,
        join_side: str | None = None,
    ) -> Any:
        """Spark's own ``statestore`` reader on the checkpoint, at this batch."""
        info, t = self._select(op, table, join_side)
        reader = (
            spark.read.format("statestore")
            .option("operatorId", info.id)
            .option("batchId", self.batch)
        )
        if join_side:
            reader = reader.option("joinSide", join_side)
        elif t.kind == "timers":
            reader = reader.option("readRegisteredTimers", "true")
        elif t.kind in ("store", "join-store"):
            reader = reader.option("storeName", t.name)
        else:
            reader = reader.option("stateVarName", t.name)
        return reader.load(spark_url(self.ckpt.url()))


class SavepointHandle(StateHandle):
    """A canonical savepoint: its Parquet data files, one per partition and table."""

    kind = "savepoint"

    def __init__(self, sp: Savepoint) -> None:
        self.sp = sp
        self.path = sp.url()
        self.batch = sp.metadata.batch_id
        self.operators = tuple(
            OperatorInfo(
                op.uid,
                op.operator_id,
                op.name,
                op.kind.kind,
                op.kind.restorable,
                op.partitions,
                tuple(
                    _table_schema(
                        t.name, t.kind, t.key_schema, t.value_schema, t.user_key_schema, t.rows
                    )
                    for t in op.tables
                ),
            )
            for op in sp.metadata.operators
        )

    @property
    def metadata(self) -> Any:
        return self.sp.metadata

    @property
    def offsets(self) -> dict[str, Any]:
        from statectl.inspection import maybe_json

        return {k: maybe_json(v) for k, v in self.sp.metadata.offsets.items()}

    def state_table(self, op: OperatorInfo, table: TableInfo) -> StateTable:
        for t in self.sp.metadata.operator(op.uid).tables:
            if t.name == table.name:
                return t
        raise AssertionError(table.name)  # _select found it

    def _partition(
        self, op: OperatorInfo, table: TableInfo, p: int, join_side: str | None
    ) -> pa.Table:
        from statectl.state import join_side_view

        st = self.state_table(op, table)
        part = self.sp.read_part(st, st.files[p])
        return join_side_view(part) if join_side else part

    def _chunks(
        self, op: OperatorInfo, table: TableInfo, join_side: str | None, budget: int, scratch: str
    ) -> Iterator[pa.Table]:
        from statectl.engine import batch_rows
        from statectl.state import join_side_view

        st = self.state_table(op, table)
        for f in st.files:
            for part in self.sp.iter_file(st, f, batch_rows(budget), scratch):
                yield join_side_view(part) if join_side else part

    def to_spark(
        self,
        spark: Any,
        op: str | int | OperatorInfo = 0,
        table: str | None = None,
        *,
        join_side: str | None = None,
    ) -> Any:
        """``spark.read.parquet`` on the table's data files (Spark reads them in parallel; their
        sizes are checked here, their sha256 only by statectl's own reader)."""
        info, t = self._select(op, table, join_side)
        st = self.state_table(info, t)
        urls = []
        for f in st.files:
            path = self.sp.io.inside(self.sp.root, f.path, self.path)
            if self.sp.io.size(path) != f.bytes:
                from statectl.errors import CorruptFileError

                raise CorruptFileError(
                    f"has {self.sp.io.size(path)} bytes, _metadata records {f.bytes}", path
                )
            urls.append(spark_url(self.sp.io.url(path)))
        df = spark.read.parquet(*urls)
        if join_side:
            df = _spark_join_side(df, t.schema)
        return df


def _spark_join_side(df: Any, schema: pa.Schema) -> Any:
    """Spark's ``joinSide`` view of a ``keyWithIndexToValue`` table: no ``index``, no
    ``matched``."""
    from pyspark.sql import functions as F

    key = schema.field("key").type
    value = schema.field("value").type
    keys = [key.field(i).name for i in range(key.num_fields - 1)]
    values = [value.field(i).name for i in range(value.num_fields)]
    if values and values[-1] == "matched":
        values = values[:-1]
    return df.select(
        F.struct(*[F.col("key")[k].alias(k) for k in keys]).alias("key"),
        F.struct(*[F.col("value")[v].alias(v) for v in values]).alias("value"),
        "partition_id",
    )


def open_handle(
    path: Any,
    *,
    batch: int | None = None,
    verify: bool = True,
    storage_options: dict[str, Any] | None = None,
) -> StateHandle:
    """A savepoint (canonical or native) or a checkpoint, at ``batch`` (default: the latest
    committed one; a savepoint holds one batch only)."""
    from statectl.io import storage_options as with_options
    from statectl.reader import open_source

    if storage_options:
        with with_options(storage_options):
            return handle_of(open_source(path, verify=verify), batch)
    return handle_of(open_source(path, verify=verify), batch)


def handle_of(source: Checkpoint | Savepoint, batch: int | None = None) -> StateHandle:
    from statectl.checkpoint.model import Checkpoint
    from statectl.savepoints.native import EMBEDDED

    if isinstance(source, Checkpoint):
        return CheckpointHandle(source, batch)
    m = source.metadata
    if batch is not None and batch != m.batch_id:
        raise StatectlError(f"a savepoint holds batch {m.batch_id} only", source.root)
    if m.savepoint_type == "native":
        source.verify_native()
        embedded = Checkpoint(source.io, posixpath.join(source.root, EMBEDDED))
        handle = CheckpointHandle(
            embedded, m.batch_id, {op.operator_id: op.uid for op in m.operators}, kind="savepoint"
        )
        handle.path = source.url()
        return handle
    return SavepointHandle(source)


# A function on record batches, as filter() and transform() take it.
BatchFunction = Callable[[pa.RecordBatch], Any]

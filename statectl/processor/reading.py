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
from typing import Any

import pyarrow as pa

from statectl.checkpoint.model import Checkpoint, Operator
from statectl.engine import batch_rows
from statectl.errors import CorruptFileError, StatectlError
from statectl.inspection import maybe_json
from statectl.io import storage_options as with_options
from statectl.operators import JOIN_STORES, OperatorKind
from statectl.processor.handle import StateHandle, spark_url
from statectl.processor.model import OperatorInfo, TableInfo, table_info
from statectl.reader import open_source
from statectl.savepoints.contents import (
    assign_uids,
    logical_stores,
    table_description,
    table_tasks,
)
from statectl.savepoints.format import StateTable
from statectl.savepoints.layout import EMBEDDED
from statectl.savepoints.store import Savepoint
from statectl.state import (
    Selection,
    StoreEncoding,
    iter_partition,
    join_side_view,
    read_partition,
    state_variable_type,
)

# Re-exported: the handle's types are named from here (statectl.processor.reading).
__all__ = [
    "BatchFunction",
    "CheckpointHandle",
    "OperatorInfo",
    "SavepointHandle",
    "StateHandle",
    "TableInfo",
    "handle_of",
    "open_handle",
    "spark_url",
]


class CheckpointHandle(StateHandle):
    """A Spark checkpoint at one committed batch. Operators have their default uids (the ones
    ``statectl savepoint`` gives) unless ``uids`` names them."""

    kind = "checkpoint"
    named_by_id = True

    def __init__(
        self,
        ckpt: Checkpoint,
        batch: int | None = None,
        uids: dict[int, str] | None = None,
        *,
        kind: str = "checkpoint",
    ) -> None:
        self.ckpt = ckpt
        self.kind = kind
        self.path = ckpt.url()
        self.batch = ckpt.resolve_batch(batch)
        self._ops = {op.operator_id: op for op in ckpt.operators(self.batch)}
        names = assign_uids(list(self._ops.values()), dict(uids or {}))
        self.operators = tuple(
            self.operator_info(op, names[op.operator_id]) for op in self._ops.values()
        )

    @staticmethod
    def operator_info(op: Operator, uid: str) -> OperatorInfo:
        """``op`` described as a savepoint holds it, under ``uid``."""
        # A join at state format 3/4 is presented as a savepoint holds it: format 2's four
        # stores (logical schemas), besides its own column families (below).
        logical = {s.name: s for s in logical_stores(op)[1]}
        tables = []
        for task in table_tasks(op):
            desc = table_description(op, task, logical)
            tables.append(
                table_info(
                    task.name,
                    task.kind,
                    desc.key_schema,
                    desc.value_schema,
                    desc.user_key_schema,
                    None,
                )
            )
        if op.uses_column_families:
            tables += _undeclared_families(op, {t.name for t in tables})
        spec = op.kind
        return OperatorInfo(
            uid,
            op.operator_id,
            op.name,
            spec.kind,
            spec.restorable,
            op.num_partitions,
            tuple(tables),
        )

    @property
    def offsets(self) -> dict[str, Any]:
        return {k: maybe_json(v) for k, v in self.ckpt.offsets(self.batch).offsets.items()}

    def recorded_offsets(self) -> dict[str, str | None]:
        return dict(self.ckpt.offsets(self.batch).offsets)

    def file_source_logs(self) -> dict[str, Any]:
        return {k: [1] for k in self.ckpt.source_log_dirs()}

    def operator_kind(self, op: OperatorInfo) -> OperatorKind:
        return self._ops[op.id].kind

    def on_local_disk(self) -> bool:
        return bool(self.ckpt.io.is_local)

    def partition_bytes(self, op: OperatorInfo, table: TableInfo) -> list[int]:
        """Bytes under each partition's store directory (every retained version: what the
        state costs on disk)."""
        out = []
        for p in range(op.partitions):
            d = self.ckpt.path("state", str(op.id), str(p))
            if table.kind in ("store", "join-store") and table.name != "default":
                d = posixpath.join(d, table.name)
            out.append(self.ckpt.io.du(d) if self.ckpt.io.exists(d) else 0)
        return out

    def _selection(self, op: OperatorInfo, table: TableInfo, join_side: str | None) -> Any:
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

    def _partition_chunks(
        self,
        op: OperatorInfo,
        table: TableInfo,
        p: int,
        join_side: str | None,
        budget: int,
        scratch: str,
    ) -> Iterator[pa.Table]:
        enc = StoreEncoding.of(self.ckpt, self.batch)
        sel = self._selection(op, table, join_side)
        yield from iter_partition(
            self.ckpt, self._ops[op.id], sel, p, self.batch, enc, budget=budget, scratch=scratch
        )

    def _partition(
        self, op: OperatorInfo, table: TableInfo, p: int, join_side: str | None
    ) -> pa.Table:
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


def _undeclared_families(op: Operator, named: set[str]) -> list[TableInfo]:
    """Column families no state variable declares (a join at state format 3/4 keeps its four
    stores as families): readable by name, as Spark's storeName reads them."""
    out = []
    for desc in op.schemas:
        if desc.name in named or desc.name.startswith("$"):
            continue
        kind = (
            "join-store" if op.name == "symmetricHashJoin" else state_variable_type(op, desc.name)
        )
        out.append(
            table_info(
                desc.name, kind, desc.key_schema, desc.value_schema, desc.user_key_schema, None
            )
        )
    return out


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
                    table_info(
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
        return {k: maybe_json(v) for k, v in self.sp.metadata.offsets.items()}

    def recorded_offsets(self) -> dict[str, str | None]:
        return dict(self.sp.metadata.offsets)

    def file_source_logs(self) -> dict[str, Any]:
        return dict(self.sp.metadata.source_logs or {})

    def operator_kind(self, op: OperatorInfo) -> OperatorKind:
        return self.sp.metadata.operator(op.uid).kind

    def on_local_disk(self) -> bool:
        return bool(self.sp.io.is_local)

    def partition_bytes(self, op: OperatorInfo, table: TableInfo) -> list[int]:
        """The data files' sizes."""
        return [f.bytes for f in self.state_table(op, table).files]

    def state_table(self, op: OperatorInfo, table: TableInfo) -> StateTable:
        for t in self.sp.metadata.operator(op.uid).tables:
            if t.name == table.name:
                return t
        raise AssertionError(table.name)  # _select found it

    def _partition(
        self, op: OperatorInfo, table: TableInfo, p: int, join_side: str | None
    ) -> pa.Table:
        st = self.state_table(op, table)
        part = self.sp.read_part(st, st.files[p])
        return join_side_view(part) if join_side else part

    def _partition_chunks(
        self,
        op: OperatorInfo,
        table: TableInfo,
        p: int,
        join_side: str | None,
        budget: int,
        scratch: str,
    ) -> Iterator[pa.Table]:
        st = self.state_table(op, table)
        for part in self.sp.iter_file(st, st.files[p], batch_rows(budget), scratch):
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
    from pyspark.sql import functions as F  # PySpark is optional: only to_spark needs it

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
    if storage_options:
        with with_options(storage_options):
            return handle_of(open_source(path, verify=verify), batch)
    return handle_of(open_source(path, verify=verify), batch)


def handle_of(source: Checkpoint | Savepoint, batch: int | None = None) -> StateHandle:
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

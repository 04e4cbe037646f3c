"""The processor's handle: what a savepoint and a checkpoint have in common.

``statectl.open(path)`` returns one (statectl/processor/reading.py has the two kinds); both
describe their operators the same way and read one table partition at a time, which is the
unit everything above streams in.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from statectl.errors import StatectlError
from statectl.operators import OperatorKind
from statectl.processor.model import OperatorInfo, TableInfo
from statectl.processor.stats import state_stats
from statectl.state import join_side_view

if TYPE_CHECKING:
    import pandas as pd


class StateHandle:
    """What a savepoint and a checkpoint have in common for the processor.

    ``op`` arguments are a uid or an operator id; ``table`` a store or state variable name
    (default: the ``default`` store or the only table); ``join_side="left"|"right"`` reads a
    stream-stream join side the way Spark's ``joinSide`` option shows it.
    """

    kind: str = ""
    named_by_id = False  # a checkpoint's operators are named by id (a savepoint's by uid too)
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

    def recorded_offsets(self) -> dict[str, str | None]:
        """The sources' offsets of the batch as recorded (Spark's JSON text)."""
        raise NotImplementedError

    def file_source_logs(self) -> dict[str, Any]:
        """The file sources that have a seen-files log (source -> its entries, or a marker)."""
        raise NotImplementedError

    def operator_kind(self, op: OperatorInfo) -> OperatorKind:
        """The operator kind spec (placement rule and all) of one of the operators."""
        raise NotImplementedError

    def partition_bytes(self, op: OperatorInfo, table: TableInfo) -> list[int]:
        """Bytes on disk per partition of ``table`` (``inspect --stats``; none known: [])."""
        return []

    def on_local_disk(self) -> bool:
        """Whether the state is on this machine's disks (fork workers may read it: s3fs and
        fork do not mix)."""
        return False

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
            who = f"{op.name}" if self.named_by_id else f"{op.name}, uid {op.uid}"
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
        for p in range(op.partitions):
            yield from self._partition_chunks(op, table, p, join_side, budget, scratch)

    def partition_chunks(
        self,
        op: str | int | OperatorInfo,
        p: int,
        table: str | None = None,
        *,
        join_side: str | None = None,
        budget: int,
        scratch: str,
    ) -> Iterator[pa.Table]:
        """State partition ``p``'s part of :meth:`chunks` (the same chunks): the unit of one
        export task on the local engine."""
        info, t = self._select(op, table, join_side)
        if not 0 <= p < info.partitions:
            raise StatectlError(f"operator {info.id} has no partition {p}", self.path)
        yield from self._partition_chunks(info, t, p, join_side, budget, scratch)

    def _partition_chunks(
        self,
        op: OperatorInfo,
        table: TableInfo,
        p: int,
        join_side: str | None,
        budget: int,
        scratch: str,
    ) -> Iterator[pa.Table]:
        """Partition ``p``'s chunks (default: the partition whole)."""
        yield self._partition(op, table, p, join_side)

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

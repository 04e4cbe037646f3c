"""The state processor's Python API: statectl.open (reader) and SavepointWriter (writer)."""

from __future__ import annotations

import pyarrow as pa
import pytest

import statectl
from statectl.checkpoint.model import Checkpoint
from statectl.errors import StatectlError
from statectl.processor.reading import CheckpointHandle, SavepointHandle
from statectl.state import Selection, read_state
from tests.conftest import FIXTURES, arrow_rows

ORDERS = FIXTURES / "multi-hdfs"  # op 0: count per k, op 1: dedupe (id, k)
UIDS = {0: "totals", 1: "dedup"}


@pytest.fixture(scope="module")
def orders_sp(tmp_path_factory):
    return statectl.savepoint(ORDERS, tmp_path_factory.mktemp("sp"), uids=UIDS)


def test_open_describes_a_checkpoint_and_a_savepoint_alike(orders_sp):
    ck = statectl.open(ORDERS)
    sp = statectl.open(orders_sp)
    assert isinstance(ck, CheckpointHandle) and isinstance(sp, SavepointHandle)
    assert (ck.kind, sp.kind) == ("checkpoint", "savepoint")
    assert ck.batch == sp.batch == 3
    assert [(o.id, o.name, o.kind, o.partitions) for o in ck.operators] == [
        (o.id, o.name, o.kind, o.partitions) for o in sp.operators
    ]
    assert [o.uid for o in sp.operators] == ["totals", "dedup"]
    # a checkpoint's operators carry the uids a savepoint without --uid would give them
    default = statectl.savepoint(ORDERS, orders_sp.path + "-default")
    assert [o.uid for o in ck.operators] == list(default.operators)
    totals = sp.operator("totals")
    assert totals.rows == 7 and ck.operator(0).rows is None  # a checkpoint counts by reading
    t = totals.table()
    assert (t.name, t.kind, t.key_columns, t.value_column) == ("default", "store", ["key"], "value")
    assert t.key_schema == pa.struct([("k", pa.string())])
    assert t.value_schema == pa.struct([("count", pa.int64())])
    assert sp.offsets == ck.offsets and sp.offsets
    with pytest.raises(StatectlError, match="no operator 'nope'"):
        sp.operator("nope")
    with pytest.raises(StatectlError, match="no store or state variable 'x'"):
        sp.read("totals", "x")
    with pytest.raises(StatectlError, match="holds batch 3 only"):
        statectl.open(orders_sp, batch=2)


def test_read_batches_and_pandas_are_the_statestore_table(orders_sp):
    ck = statectl.open(ORDERS)
    sp = statectl.open(orders_sp)
    expected = read_state(Checkpoint.open(str(ORDERS)), Selection(1))
    for handle, ref in ((ck, 1), (sp, "dedup"), (sp, 1), (ck, ck.operators[1].uid)):
        assert arrow_rows(handle.read(ref)) == arrow_rows(expected)
        batches = list(handle.batches(ref))
        assert arrow_rows(pa.Table.from_batches(batches)) == arrow_rows(expected)
        assert len(batches) >= handle.operator(ref).partitions - 1  # one partition at a time
        parts = list(handle.partitions(ref))
        assert [p for p, _ in parts] == list(range(handle.operator(ref).partitions))
        assert all(set(t.column("partition_id").to_pylist()) <= {p} for p, t in parts)
    pdf = sp.to_pandas("totals", flatten=True)
    assert list(pdf.columns) == ["key.k", "value.count", "partition_id"]
    assert sorted(pdf["value.count"]) == sorted(r["value"]["count"] for r in ck.read(0).to_pylist())
    # read_state is the same reader in one call
    assert arrow_rows(statectl.read_state(orders_sp, "totals")) == arrow_rows(sp.read("totals"))


def test_join_sides_state_variables_and_timers(tmp_path):
    join = statectl.open(FIXTURES / "join-hdfs")
    left = join.read(0, join_side="left")
    assert arrow_rows(left) == arrow_rows(
        read_state(Checkpoint.open(str(FIXTURES / "join-hdfs")), Selection(0, join_side="left"))
    )
    assert len(join.operator(0).tables) == 4
    with pytest.raises(StatectlError, match="not a stream-stream join"):
        statectl.open(ORDERS).read(0, join_side="left")
    sp = statectl.open(statectl.savepoint(FIXTURES / "join-hdfs", tmp_path / "j"))
    assert arrow_rows(sp.read(0, join_side="left")) == arrow_rows(left)
    tws = statectl.open(FIXTURES / "tws-rocksdb")
    op = tws.operators[0]
    assert {t.name: t.kind for t in op.tables} == {
        "mp": "MapState",
        "cnt": "ValueState",
        "lst": "ListState",
        "$timers": "timers",
    }
    assert op.table("mp").key_columns == ["key", "user_map_key"]
    assert tws.read(0, "$timers").column_names == ["key", "expiration_timestamp_ms", "partition_id"]
    with pytest.raises(StatectlError, match="pass table="):
        tws.read(0)


def test_a_native_savepoint_opens_like_a_canonical_one(tmp_path):
    native = statectl.savepoint(ORDERS, tmp_path / "n", uids=UIDS, kind="native")
    h = statectl.open(native)
    assert h.kind == "savepoint" and [o.uid for o in h.operators] == ["totals", "dedup"]
    assert arrow_rows(h.read("totals")) == arrow_rows(statectl.open(ORDERS).read(0))

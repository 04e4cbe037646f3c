"""Spark's Murmur3 partitioning, bit-exact: doc vectors, Spark's placement in every fixture, and
Spark's own hash() on Hypothesis-generated rows."""

from __future__ import annotations

import datetime as dt
import decimal

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from statectl.checkpoint.model import Checkpoint
from statectl.codecs.murmur3 import partition_ids, spark_hash
from statectl.state import Selection, read_state
from tests.conftest import FIXTURES, load_manifest

VECTORS = [
    ([pa.array(["a"])], 1485273170),
    ([pa.array([1], pa.int32())], -559580957),
    ([pa.array([1], pa.int64())], -1712319331),
    ([pa.array([1.5])], 1290763749),
    ([pa.array([-0.0])], -1670924195),
    ([pa.array([0.0])], -1670924195),
    ([pa.array([None], pa.int32())], 42),
    ([pa.array(["a"]), pa.array([1], pa.int32())], 532252686),
    (
        [pa.array([{"a": 1, "b": "x"}], pa.struct([("a", pa.int32()), ("b", pa.string())]))],
        -1305545736,
    ),
    ([pa.array([[1, 2]], pa.list_(pa.int32()))], -222940379),
    ([pa.array([decimal.Decimal("-12345678901234567890.123")], pa.decimal128(38, 3))], -769998348),
]


@pytest.mark.parametrize(("cols", "expected"), VECTORS)
def test_spark_vectors(cols, expected):
    assert spark_hash(cols).tolist() == [expected]


PLACEMENT = [
    (fx["name"], read)
    for fx in load_manifest()
    for read in fx.get("reads", [])
    if not read.get("options", {}).get("readRegisteredTimers")
    and "keyWithIndexToValue" not in str(read.get("options"))
]


@pytest.mark.parametrize(
    ("name", "read"), PLACEMENT, ids=[f"{n}-{r['options']}" for n, r in PLACEMENT]
)
def test_partition_of_every_fixture_key_matches_spark(name, read):
    """Every key sits in the partition Spark put it in: pmod(hash(key), partitions)."""
    opts = read.get("options", {})
    ckpt = Checkpoint.open(str(FIXTURES / name))
    sel = Selection(
        read["operatorId"], opts.get("storeName"), opts.get("joinSide"), opts.get("stateVarName")
    )
    table = read_state(ckpt, sel)
    if table.num_rows == 0:
        pytest.skip("no rows")
    key = table.column("key").combine_chunks()
    n = ckpt.num_partitions(ckpt.latest_committed_batch)
    got = partition_ids(key, n)
    assert got.tolist() == table.column("partition_id").to_pylist()


# -- against Spark's hash() on random rows ----------------------------------------------------
TYPES = {
    "int": (pa.int32(), st.integers(-(2**31), 2**31 - 1)),
    "bigint": (pa.int64(), st.integers(-(2**63), 2**63 - 1)),
    "smallint": (pa.int16(), st.integers(-(2**15), 2**15 - 1)),
    "tinyint": (pa.int8(), st.integers(-128, 127)),
    "boolean": (pa.bool_(), st.booleans()),
    "double": (pa.float64(), st.floats(allow_nan=False)),
    "float": (pa.float32(), st.floats(width=32, allow_nan=False)),
    "string": (pa.string(), st.text(max_size=30)),
    "binary": (pa.binary(), st.binary(max_size=30)),
    "date": (pa.date32(), st.dates(dt.date(1900, 1, 1), dt.date(2200, 1, 1))),
    "timestamp_ntz": (
        pa.timestamp("us"),
        st.datetimes(dt.datetime(1900, 1, 1), dt.datetime(2200, 1, 1)),
    ),
    "decimal(10,2)": (pa.decimal128(10, 2), st.decimals(-(10**8) + 1, 10**8 - 1, places=2)),
    "decimal(38,3)": (pa.decimal128(38, 3), st.decimals(-(10**35) + 1, 10**35 - 1, places=3)),
    "array<int>": (
        pa.list_(pa.int32()),
        st.lists(st.one_of(st.none(), st.integers(-5, 5)), max_size=4),
    ),
    "struct<a:int,b:string>": (
        pa.struct([("a", pa.int32()), ("b", pa.string())]),
        st.fixed_dictionaries(
            {"a": st.one_of(st.none(), st.integers(-9, 9)), "b": st.text(max_size=5)}
        ),
    ),
}


@pytest.mark.spark
@given(
    st.lists(st.sampled_from(sorted(TYPES)), min_size=1, max_size=3).flatmap(
        lambda names: st.tuples(
            st.just(names),
            st.lists(
                st.tuples(*[st.one_of(st.none(), TYPES[n][1]) for n in names]),
                min_size=1,
                max_size=30,
            ),
        )
    )
)
@settings(max_examples=30, deadline=None)
def test_equals_spark_hash(spark, case):
    names, rows = case
    cols = [pa.array([r[i] for r in rows], TYPES[n][0]) for i, n in enumerate(names)]
    table = pa.table({f"c{i}": c for i, c in enumerate(cols)})
    df = spark.createDataFrame(table.to_pandas(types_mapper=None) if False else table)
    casted = [
        f"cast(c{i} as {n}) as c{i}" if not n.startswith(("array", "struct")) else f"c{i}"
        for i, n in enumerate(names)
    ]
    expected = [
        r[0]
        for r in df.selectExpr(*casted)
        .selectExpr(f"hash({', '.join(f'c{i}' for i in range(len(names)))})")
        .collect()
    ]
    assert spark_hash(cols).tolist() == expected

"""The edit expression language: a SQL WHERE subset translated to pyarrow.compute, and the
constructs it refuses."""

from __future__ import annotations

import pyarrow as pa
import pytest

from statectl.expressions import ExpressionError, delete_where, keep_where, parse

TABLE = pa.table(
    {
        "key": [{"k": "k1", "n": 1}, {"k": "k2", "n": 2}, {"k": None, "n": 3}, {"k": "x", "n": 4}],
        "value": [{"count": 1}, {"count": 5}, {"count": None}, {"count": 8}],
        "partition_id": pa.array([0, 1, 1, 0], pa.int32()),
    }
)


def kept(text: str) -> list:
    return TABLE.filter(keep_where(text, TABLE.schema)).column("key").to_pylist()


def ks(text: str, *, delete: bool = False) -> list:
    f = delete_where if delete else keep_where
    return [r["k"] for r in TABLE.filter(f(text, TABLE.schema)).column("key").to_pylist()]


@pytest.mark.parametrize(
    ("text", "keep"),
    [
        ("key.k = 'k1'", ["k1"]),
        ("k = 'k1'", ["k1"]),  # a unique field name stands for its path
        ("`key`.`k` = 'k2'", ["k2"]),
        ("key.k <> 'k1'", ["k2", "x"]),  # NULL <> 'k1' is NULL: not kept
        ("value.count * 2 + 1 >= 3", ["k1", "k2", "x"]),
        ("value.count / 2 = 0.5", ["k1"]),  # SQL's / is fractional
        ("value.count - key.n > 0", ["k2", "x"]),
        ("value.count > -1 AND key.n < 4", ["k1", "k2"]),
        ("key.k IN ('k1', 'x')", ["k1", "x"]),
        ("key.k NOT IN ('k1')", ["k2", "x"]),
        ("key.k IN ('k1', NULL)", ["k1"]),
        ("key.k IS NULL", [None]),
        ("key.k IS NOT NULL AND NOT (value.count > 4)", ["k1"]),
        ("key.k LIKE 'k%'", ["k1", "k2"]),
        ("key.k NOT LIKE '%2'", ["k1", "x"]),
        ("value.count BETWEEN 2 AND 8", ["k2", "x"]),
        ("key.k = 'k1' OR value.count IS NULL", ["k1", None]),
        ("partition_id = 1", ["k2", None]),
    ],
)
def test_keep_where_is_sql_where(text, keep):
    assert ks(text) == keep


def test_delete_where_keeps_what_is_not_true():
    # rows where the condition is NULL are not deleted (SQL: only TRUE matches)
    assert ks("key.k <> 'k1'", delete=True) == ["k1", None]
    assert ks("key.k = 'k1'", delete=True) == ["k2", None, "x"]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("upper(key.k) = 'K1'", r"unsupported in an edit expression: Upper"),
        ("read_files('/etc/passwd') IS NULL", r"unsupported in an edit expression: Anonymous"),
        ("key.k IN (SELECT 1)", r"In .*query is not supported"),
        ("key.k = 'a'; DROP TABLE t", r"unsupported in an edit expression: Block"),
        ("CAST(key.n AS STRING) = '1'", r"unsupported in an edit expression: \w*Cast"),
        ("key.k = (SELECT max(k) FROM t)", r"unsupported in an edit expression"),
        ("key.k LIKE key.k", r"Column \(key.k\): a literal is expected here"),
        ("key.k IS TRUE", r"only IS NULL"),
        ("nope = 1", r"no column 'nope'; the table has key.k, key.n, value.count, partition_id"),
        ("key.nope = 1", r"no column 'key.nope'"),
        ("key.k = ", r"cannot parse expression"),
        ("   ", r"the expression is empty"),
    ],
)
def test_refusals_name_the_construct(text, message):
    with pytest.raises(ExpressionError, match=message):
        parse(text, TABLE.schema)


def test_ambiguous_field_names_ask_for_the_path():
    schema = pa.schema(
        [("key", pa.struct([("k", pa.string())])), ("value", pa.struct([("k", pa.int64())]))]
    )
    with pytest.raises(ExpressionError, match=r"'k' is ambiguous \(key.k, value.k\)"):
        parse("k = 1", schema)

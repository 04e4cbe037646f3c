"""The edit expression language: a SQL WHERE subset translated to pyarrow.compute, and the
constructs it refuses."""

from __future__ import annotations

import datetime as dt
import decimal

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


# -- typed comparisons: timestamps, dates, decimals (issue 25: purging old windows) ----------
UTC = dt.timezone.utc
WINDOWS = pa.table(
    {
        "key": pa.array(
            [
                {
                    "window": {
                        "start": dt.datetime(2024, 1, 1, 0, m, tzinfo=UTC),
                        "end": dt.datetime(2024, 1, 1, 0, m + 10, tzinfo=UTC),
                    },
                    "day": dt.date(2024, 1, 1 + m // 10),
                    "k": f"k{m}",
                }
                for m in (0, 10, 20, 30)
            ],
            pa.struct(
                [
                    (
                        "window",
                        pa.struct(
                            [
                                ("start", pa.timestamp("us", "UTC")),
                                ("end", pa.timestamp("us", "UTC")),
                            ]
                        ),
                    ),
                    ("day", pa.date32()),
                    ("k", pa.string()),
                ]
            ),
        ),
        "value": pa.array(
            [
                {"total": decimal.Decimal(x), "seen": dt.datetime(2024, 1, 1, 0, 5 * i)}
                for i, x in enumerate(("1.50", "2.25", "3.00", "10.75"))
            ],
            pa.struct([("total", pa.decimal128(10, 2)), ("seen", pa.timestamp("us"))]),
        ),
    }
)


def window_keys(text: str, *, delete: bool = True) -> list[str]:
    f = delete_where if delete else keep_where
    return [r["k"] for r in WINDOWS.filter(f(text, WINDOWS.schema)).column("key").to_pylist()]


@pytest.mark.parametrize(
    ("text", "kept"),
    [
        # a string literal facing a timestamp column is a timestamp (UTC unless it says a zone)
        ("key.window.end <= '2024-01-01 00:20:00'", ["k20", "k30"]),
        ("key.window.end <= '2024-01-01T00:20:00Z'", ["k20", "k30"]),
        ("key.window.end <= '2024-01-01 01:20:00+01:00'", ["k20", "k30"]),
        ("key.window.end < '2024-01-01 00:20:00.000001'", ["k20", "k30"]),
        ("'2024-01-01 00:20' >= key.window.end", ["k20", "k30"]),  # literal on the left
        ("key.window.end <= TIMESTAMP '2024-01-01 00:20:00'", ["k20", "k30"]),
        ("key.window.end <= CAST('2024-01-01 00:20:00' AS TIMESTAMP)", ["k20", "k30"]),
        ("key.window.end < DATE '2024-01-02'", []),  # every window ends on Jan 1
        ("key.window.end < '2024'", ["k0", "k10", "k20", "k30"]),  # 2024 = 2024-01-01 00:00
        # a unique trailing path names a nested field, as export shows it
        ("window.end <= '2024-01-01 00:20:00'", ["k20", "k30"]),
        ("window.start BETWEEN '2024-01-01 00:10' AND '2024-01-01 00:20'", ["k0", "k30"]),
        ("window.start IN ('2024-01-01 00:00', TIMESTAMP '2024-01-01 00:30')", ["k10", "k20"]),
        ("key.day <= '2024-01-02'", ["k20", "k30"]),
        ("key.day = DATE '2024-01-04'", ["k0", "k10", "k20"]),
        ("value.total > 2.5", ["k0", "k10"]),
        ("value.total = '2.25'", ["k0", "k20", "k30"]),
        ("value.total >= CAST('3' AS DECIMAL(10, 2))", ["k0", "k10"]),
        ("value.seen >= '2024-01-01 00:10:00'", ["k0", "k10"]),  # timestamp_ntz: wall time
    ],
)
def test_literals_take_the_type_of_the_column_they_face(text, kept):
    assert window_keys(text) == kept


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            "key.window.end < 5",
            r"cannot compare key.window.end \(timestamp\) with 5; write a "
            r"timestamp, e.g. TIMESTAMP '2024-01-01 00:10:00'",
        ),
        (
            "key.window.end < 'yesterday'",
            r"cannot compare key.window.end \(timestamp\) with "
            r"'yesterday'",
        ),
        ("key.day = '2024-01-01 10:00'", r"cannot compare key.day \(date\)"),
        ("key.k < 3", r"cannot compare key.k \(string\) with 3; write a string in quotes"),
        ("key.window.end < DATE 'x'", r"CAST\('x' AS DATE\): 'x' is not a date"),
        ("key.window.end < TIMESTAMP '2024-13-01'", r"'2024-13-01' is not a timestamp"),
        ("value.total + 'a' > 1", r"the types in .* do not match \(it combines decimal"),
        (
            "CAST(key.k AS TIMESTAMP) IS NULL",
            r"unsupported in an edit expression: \w*Cast.*literal",
        ),
        ("key.window.end < CAST('1' AS BINARY)", r"a cast to binary"),
        ("window.nope = 1", r"no column 'window.nope'"),
    ],
)
def test_type_mismatches_are_one_line_in_the_expressions_terms(text, message):
    with pytest.raises(ExpressionError, match=message) as e:
        parse(text, WINDOWS.schema)
    assert "\n" not in str(e.value) and "kernel" not in str(e.value)

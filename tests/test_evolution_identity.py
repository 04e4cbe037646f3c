"""Aggregate evolution by identity (issue 25): ``restore --from-query OLD`` matches a changed
aggregation's buffers by the aggregate that owns them (``max(v)`` is not ``max(v + id)``),
where Spark's buffer names (``count``, ``max``) repeat and matching by name is ambiguous."""

from __future__ import annotations

import decimal
import importlib.util
import json
import os
import time

import pytest

from statectl.evolution import Refused
from statectl.evolution_kinds import AggregateBuffer, aggregation_values
from statectl.restoration import restore
from statectl.savepoints.create import take_savepoint
from tests.helpers.cli import cli_json
from tests.helpers.spark import QUERY_SOURCE, run, write_input


def struct(*fields: tuple) -> str:
    return json.dumps(
        {
            "type": "struct",
            "fields": [{"name": n, "type": t, "nullable": True, "metadata": {}} for n, t in fields],
        }
    )


def buffer(expression: str, name: str, type_: str, initial=None) -> AggregateBuffer:
    return AggregateBuffer(expression, json.loads(struct((name, type_)))["fields"], [initial])


COUNT = buffer("count(1)", "count", "long", 0)
MAX_V = buffer("max(v)", "max", "long")
MAX_VID = buffer("max((v + id))", "max", "long")
MAX_DEC = buffer("max(CAST(v AS DECIMAL(30,4)))", "max", "decimal(30,4)")
OLD = [COUNT, MAX_V, MAX_VID]
STORED = struct(("count", "long"), ("max", "long"), ("max", "long"))


def test_without_the_savepoints_query_repeated_buffer_names_are_ambiguous():
    new = struct(("count", "long"), ("max", "long"), ("max", "decimal(30,4)"))
    with pytest.raises(Refused, match=r"matches stored buffers at fields 1, 2.*--from-query"):
        aggregation_values(STORED, new, [COUNT, MAX_VID, MAX_DEC])


def test_the_savepoints_query_says_which_buffer_is_whose():
    new = struct(("count", "long"), ("max", "long"), ("max", "decimal(30,4)"))
    evo, notes = aggregation_values(STORED, new, [COUNT, MAX_VID, MAX_DEC], savepoint_buffers=OLD)
    assert evo is not None
    assert [(s.index, s.value) for s in evo.sources] == [(0, None), (2, None), (None, None)]
    assert "value: max((v + id)) kept, moved from field 2" in notes
    assert "value: max(CAST(v AS DECIMAL(30,4))) added, starts at null (Spark's initial value)" in (
        notes
    )
    assert "value: stored buffer field 1 (max) dropped (no aggregate of the query owns it)" in (
        notes
    )
    # Same names and types, swapped owners: matching by name would silently keep the order.
    swapped, notes = aggregation_values(
        STORED, STORED, [COUNT, MAX_VID, MAX_V], savepoint_buffers=OLD
    )
    assert swapped is not None and [s.index for s in swapped.sources] == [0, 2, 1]
    # Unchanged: nothing to convert.
    assert aggregation_values(STORED, STORED, OLD, savepoint_buffers=OLD) == (None, [])


def test_refusals_name_the_choices():
    twice = [COUNT, MAX_V, MAX_V]
    with pytest.raises(Refused, match=r"max\(v\) is computed 2 times .* fields 1, 2"):
        aggregation_values(STORED, STORED, OLD, savepoint_buffers=twice)
    with pytest.raises(Refused, match=r"--from-query's aggregates have the buffers \(count: "):
        aggregation_values(STORED, STORED, OLD, savepoint_buffers=[COUNT, MAX_V])
    narrowed = buffer("max((v + id))", "max", "integer")
    with pytest.raises(
        Refused, match=r"max\(\(v \+ id\)\)'s buffer \(max: integer\) cannot continue"
    ):
        aggregation_values(
            STORED,
            struct(("count", "long"), ("max", "integer")),
            [COUNT, narrowed],
            savepoint_buffers=OLD,
        )


QUERIES = (
    """
import pyspark.sql.functions as F

"""
    + QUERY_SOURCE
    + '''

def before(spark):
    return src(spark).groupBy("id").agg(
        F.count("*").alias("cnt"), F.max("v").alias("top"), F.max(F.col("v") + F.col("id")).alias("top_id")
    )


def after(spark):
    """max(v) removed from the middle, a decimal max added at the end."""
    return src(spark).groupBy("id").agg(
        F.count("*").alias("cnt"),
        F.max(F.col("v") + F.col("id")).alias("top_id"),
        F.max(F.col("v").cast("decimal(30,4)")).alias("top_dec"),
    )
'''
)


def _rows(d, batches):
    out = []
    for b in batches:
        out += [json.loads(line) for line in (d / f"part-{b:03d}.json").read_text().splitlines()]
    return out


@pytest.mark.spark
def test_an_aggregate_removed_from_the_middle_and_one_added_continues(spark, tmp_path):
    """The acceptance case: a real Spark continuation equal to a reference computed from the
    inputs alone (the kept aggregates over all data, the added one over the data after the
    restore)."""
    d = tmp_path / "input"
    write_input(d, 0, 3)
    queries = tmp_path / "identity_queries.py"
    queries.write_text(QUERIES.format(input=str(d)))
    spec = importlib.util.spec_from_file_location("identity_queries", queries)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    run(spark, lambda s, _d: (mod.before(s), "update"), d, tmp_path / "ck1")
    sp_url, meta = take_savepoint(str(tmp_path / "ck1"), str(tmp_path / "sp"))

    refused = restore(sp_url, str(tmp_path / "x"), query=f"{queries}:after", spark=spark,
                      dry_run=True)  # fmt: skip
    assert any("--from-query" in p and "ambiguous" in p for p in refused.problems), refused
    # The user-level check: the CLI in a subprocess, a dry run that plans both queries.
    doc = cli_json("restore", "-s", sp_url, str(tmp_path / "ck2"), "--query",
                   f"{queries}:after", "--from-query", f"{queries}:before", "--partitions", "3",
                   "--dry-run")  # fmt: skip
    assert doc["ok"], doc["problems"]
    assert any("max((v + id)) kept, moved from field 2" in n for n in doc["evolved"]), doc
    assert not (tmp_path / "ck2").exists()
    plan = restore(sp_url, str(tmp_path / "ck2"), query=f"{queries}:after",
                   from_query=f"{queries}:before", partitions=3, spark=spark)  # fmt: skip
    assert not plan.problems, plan.problems

    now = time.time()
    for b in range(3, 5):  # new data, small values: a max over the old data too would differ
        rows = [{"id": j % 4, "k": "x", "v": (j + b) % 3, "ts": "2024-01-01T00:10:00"}
                for j in range(6)]  # fmt: skip
        (d / f"part-{b:03d}.json").write_text("\n".join(json.dumps(r) for r in rows))
        os.utime(d / f"part-{b:03d}.json", (now + b, now + b))
    continued = run(spark, lambda s, _d: (mod.after(s), "update"), d, tmp_path / "ck2")
    assert continued and min(continued) > meta.batch_id
    last: dict[int, tuple] = {}
    for b in sorted(continued):
        for id_, cnt, top_id, top_dec in continued[b]:
            last[id_] = (cnt, top_id, decimal.Decimal(top_dec))
    old, new = _rows(d, range(3)), _rows(d, range(3, 5))
    want = {
        i: (
            sum(r["id"] == i for r in old + new),
            max(r["v"] + r["id"] for r in old + new if r["id"] == i),
            decimal.Decimal(max(r["v"] for r in new if r["id"] == i)),
        )
        for i in {r["id"] for r in new}
    }
    assert last == want

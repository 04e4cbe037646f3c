"""Schema evolution on restore (statectl/evolution.py): the matching and refusal rules, and a
changed aggregation that restores with --query and continues on Spark."""

from __future__ import annotations

import dataclasses
import datetime as dt
import importlib.util
import json
import os
import subprocess
import sys
import time

import pyarrow as pa
import pytest

from statectl.api import read_state
from statectl.checkpoint.model import ENCODING_CONF, Checkpoint
from statectl.codecs.avro import encode_avro_rows
from statectl.codecs.murmur3 import partition_ids
from statectl.errors import StatectlError
from statectl.evolution import PartEvolution, Refused, TableEvolution, added_fields
from statectl.evolution_kinds import (
    AggregateBuffer,
    aggregation_values,
    evolve_table,
    grouping_key,
    state_variable_value,
)
from statectl.join_state import FORMAT_CONF
from statectl.operators import AGG_FORMAT_CONF
from statectl.query_plan import PlannedQuery, PlannedSource
from statectl.restoration import RestoreOptions, plan_restore, restore
from statectl.savepoints.create import take_savepoint
from statectl.savepoints.store import Savepoint
from statectl.spark_engine import SparkEngine
from statectl.transforms import apply_transform
from tests.helpers.cli import cli
from tests.helpers.fixtures import FIXTURES
from tests.helpers.restore import (
    assert_exactly_once,
    entries_by_family,
    session_merged_across_restore,
)
from tests.helpers.rows import arrow_rows, spark_rows
from tests.helpers.spark import PROVIDERS, QUERY_SOURCE, run, write_input


def struct(*fields: tuple[str, str] | tuple[str, str, bool]) -> str:
    return json.dumps(
        {
            "type": "struct",
            "fields": [
                {
                    "name": f[0],
                    "type": f[1],
                    "nullable": f[2] if len(f) > 2 else True,
                    "metadata": {},
                }
                for f in fields
            ],
        }
    )


def fields(schema: str) -> list[dict]:
    return json.loads(schema)["fields"]


COUNT = AggregateBuffer("count(1)", fields(struct(("count", "long", False))), [0])
MAX = AggregateBuffer("max(v)", fields(struct(("max", "long"))), [None])
SUM = AggregateBuffer("sum(v)", fields(struct(("sum", "long"))), [None])
AVG = AggregateBuffer("avg(v)", fields(struct(("sum", "double"), ("count", "long"))), [0.0, 0])


def test_aggregates_match_by_owner_drop_removed_and_start_added_at_sparks_initial_value():
    stored = struct(("count", "long", False), ("sum", "long"))
    new = struct(("max", "long"), ("count", "long", False))
    evo, notes = aggregation_values(stored, new, [MAX, COUNT])
    value = pa.StructArray.from_arrays(
        [pa.array([3, 5]), pa.array([10, None])],
        fields=[pa.field("count", pa.int64()), pa.field("sum", pa.int64())],
    )
    out = evo.convert(value)
    assert out.field("max").to_pylist() == [None, None]
    assert out.field("count").to_pylist() == [3, 5]
    assert any("max(v) added, starts at null" in n for n in notes)
    assert any("1 (sum) dropped" in n for n in notes)


def test_grouped_values_widen_the_grouping_columns_and_match_the_buffers_after_them():
    """A session window's value (session_window, key columns, buffers): the head by position,
    the buffers by owner, fields numbered in the whole value."""
    window = json.loads(struct(("start", "timestamp"), ("end", "timestamp")))
    key = struct(("kk", "integer"), ("sessionStartTime", "timestamp"))
    new_key = struct(("kk", "long"), ("sessionStartTime", "timestamp"))
    stored = struct(("session_window", window), ("kk", "integer"), ("count", "long", False))
    new = struct(
        ("session_window", window), ("kk", "long"), ("max", "long"), ("count", "long", False)
    )
    evo = evolve_table(key, stored, new_key, new, [MAX, COUNT], grouped=True)
    assert evo.notes == [
        "key field 0 (kk): widened integer -> long",
        "value field 1 (kk): widened integer -> long",
        "value: max(v) added, starts at null (Spark's initial value)",
        "value: count(1) kept, moved from field 2",
    ]
    value = pa.StructArray.from_arrays(
        [
            pa.array([None, None], pa.struct([("start", pa.int64()), ("end", pa.int64())])),
            pa.array([7, 8], pa.int32()),
            pa.array([3, 5], pa.int64()),
        ],
        names=["session_window", "kk", "count"],
    )
    out = evo.value.convert(value)
    assert out.field("kk").type == pa.int64() and out.field("kk").to_pylist() == [7, 8]
    assert out.field("max").to_pylist() == [None, None]
    assert out.field("count").to_pylist() == [3, 5]
    with pytest.raises(Refused, match=r"stored field 2 \(count\) matches both count\(1\)"):
        count_v = dataclasses.replace(COUNT, expression="count(v)")
        # Two aggregates whose buffers are both "count" (Spark's names), over one stored count.
        two = struct(
            ("session_window", window), ("kk", "integer"), ("count", "long"), ("count", "long")
        )
        evolve_table(key, stored, key, two, [COUNT, count_v], grouped=True)


def test_ambiguous_buffers_are_refused_with_the_field():
    stored = struct(("count", "long", False), ("count", "long", False))
    with pytest.raises(Refused, match=r"count\(1\) matches stored buffers at fields 0, 1"):
        aggregation_values(stored, struct(("count", "long", False)), [COUNT])
    # avg's (sum, count) and count's (count) overlap in the stored value: refused, not guessed.
    stored = struct(("sum", "double"), ("count", "long", False))
    new = struct(("sum", "double"), ("count", "long"), ("count", "long", False))
    with pytest.raises(Refused, match=r"field 1 \(count\) matches both avg\(v\) and count\(1\)"):
        aggregation_values(stored, new, [AVG, COUNT])
    with pytest.raises(Refused, match="no declarative initial value"):
        aggregation_values(
            struct(("count", "long", False)),
            struct(("count", "long", False), ("buf", "binary")),
            [COUNT, AggregateBuffer("percentile(v)", fields(struct(("buf", "binary"))), None)],
        )
    with pytest.raises(Refused, match="did not say which aggregate"):
        aggregation_values(stored, struct(("count", "long")), None)


def test_widening_renaming_and_refusals_in_keys_and_values():
    evo = evolve_table(
        struct(("k", "integer", False), ("d", "decimal(5,2)")),
        struct(("n", "float")),
        struct(("key", "long", True), ("d", "decimal(10,2)")),
        struct(("n", "double")),
    )
    assert evo.key is not None and evo.value is not None
    notes = " | ".join(evo.notes)
    assert "key field 0 (key): widened integer -> long" in notes
    assert "renamed k -> key, matched by position" in notes
    assert "key field 1 (d): widened decimal(5,2) -> decimal(10,2)" in notes
    key = pa.StructArray.from_arrays(
        [pa.array([1, -2], pa.int32()), pa.array([1, 2], pa.decimal128(5, 2))], names=["k", "d"]
    )
    out = evo.key.convert(key)
    assert out.type.field(0).type == pa.int64() and out.field(0).to_pylist() == [1, -2]
    # Renamed only: Spark reads the same bytes, nothing is re-encoded.
    same = evolve_table(
        struct(("a", "long")), struct(("v", "long")), struct(("b", "long")), struct(("v", "long"))
    )
    assert same.key is None and "renamed a -> b" in same.notes[0]
    for old, new, reason in [
        ("long", "integer", "not a widening"),
        ("double", "float", "not a widening"),
        ("string", "long", "not a widening"),
        ("decimal(10,2)", "decimal(10,3)", "not a widening"),
    ]:
        with pytest.raises(Refused, match=reason):
            evolve_table(struct(("k", old)), struct(), struct(("k", new)), struct())
    with pytest.raises(Refused, match="was nullable and is not nullable"):
        evolve_table(struct(("k", "integer")), struct(), struct(("k", "long", False)), struct())
    with pytest.raises(Refused, match="only aggregation buffers may be added"):
        evolve_table(
            struct(("k", "long")), struct(), struct(("k", "long"), ("j", "long")), struct()
        )


def test_a_nested_user_state_struct_gains_fields_as_nulls():
    """applyInPandasWithState keeps the user state inside ``groupState``: fields added at its
    end start null, the stored ones keep their values (widened where the query widened them)."""
    stored = json.loads(struct(("count", "integer"), ("last", "string")))
    grown = json.loads(struct(("count", "long"), ("last", "string"), ("tag", "string")))
    evo = evolve_table(
        struct(("k", "string")),
        json.dumps(
            {
                "type": "struct",
                "fields": [
                    {"name": "groupState", "type": stored, "nullable": True, "metadata": {}}
                ],
            }
        ),
        struct(("k", "string")),
        json.dumps(
            {
                "type": "struct",
                "fields": [{"name": "groupState", "type": grown, "nullable": True, "metadata": {}}],
            }
        ),
    )
    assert evo.key is None and evo.value is not None
    assert "value field 0 (groupState) field 2 (tag): added, starts null" in evo.notes
    assert "value field 0 (groupState) field 0 (count): widened integer -> long" in evo.notes
    inner = pa.StructArray.from_arrays(
        [pa.array([3, None], pa.int32()), pa.array(["a", "b"])], names=["count", "last"]
    )
    value = pa.StructArray.from_arrays([inner], names=["groupState"])
    out = evo.value.convert(value).to_pylist()
    assert out == [
        {"groupState": {"count": 3, "last": "a", "tag": None}},
        {"groupState": {"count": None, "last": "b", "tag": None}},
    ]
    not_null = json.loads(
        struct(("count", "integer"), ("last", "string"), ("tag", "string", False))
    )
    with pytest.raises(Refused, match="is added and not nullable"):
        evolve_table(
            struct(("k", "string")),
            json.dumps(
                {
                    "type": "struct",
                    "fields": [{"name": "g", "type": stored, "nullable": True, "metadata": {}}],
                }
            ),
            struct(("k", "string")),
            json.dumps(
                {
                    "type": "struct",
                    "fields": [{"name": "g", "type": not_null, "nullable": True, "metadata": {}}],
                }
            ),
        )


def test_a_field_inserted_in_the_middle_is_matched_by_name():
    """value struct<count, total> -> struct<count, last, total>: total keeps its value."""
    stored = struct(("count", "long"), ("total", "long"))
    evo, notes = added_fields(
        stored, struct(("count", "long"), ("last", "string"), ("total", "long")), "value"
    )
    assert evo is not None
    assert "value field 1 (last): added, starts null" in notes
    assert "value field 2 (total): stored field 1, matched by name" in notes
    value = pa.StructArray.from_arrays(
        [pa.array([1, None]), pa.array([10, 20])], names=["count", "total"]
    )
    assert evo.convert(value).to_pylist() == [
        {"count": 1, "last": None, "total": 10},
        {"count": None, "last": None, "total": 20},
    ]


def test_inserted_fields_by_name_are_widened_by_the_positional_rules():
    stored = struct(("count", "integer"), ("total", "decimal(5,2)"))
    new = struct(
        ("first", "string"), ("count", "long"), ("last", "string"), ("total", "decimal(7,2)")
    )
    evo, notes = added_fields(stored, new, "value")
    assert evo is not None
    assert "value field 1 (count): widened integer -> long" in notes
    assert "value field 3 (total): widened decimal(5,2) -> decimal(7,2)" in notes
    assert "value field 0 (first): added, starts null" in notes
    assert "value field 2 (last): added, starts null" in notes
    value = pa.StructArray.from_arrays(
        [pa.array([3], pa.int32()), pa.array([1], pa.decimal128(5, 2))], names=["count", "total"]
    )
    out = evo.convert(value)
    assert out.type.field("count").type == pa.int64()
    assert out.type.field("total").type == pa.decimal128(7, 2)
    assert out.to_pylist() == [{"first": None, "count": 3, "last": None, "total": 1}]
    # Not a widening, matched by name: refused with the field.
    with pytest.raises(Refused, match=r"value field 2 \(total\): long .* not a widening"):
        added_fields(
            struct(("count", "long"), ("total", "long")),
            struct(("count", "long"), ("last", "string"), ("total", "integer")),
            "value",
        )


def test_reordered_or_non_nullable_inserted_fields_are_refused():
    stored = struct(("count", "long"), ("total", "long"))
    with pytest.raises(Refused, match=r"in another order .*reordered struct is ambiguous"):
        added_fields(
            stored, struct(("total", "long"), ("last", "string"), ("count", "long")), "value"
        )
    with pytest.raises(Refused, match=r"value field 1 \(last\) is added and not nullable"):
        added_fields(
            stored, struct(("count", "long"), ("last", "string", False), ("total", "long")), "value"
        )


def test_renamed_fields_stay_matched_by_position():
    """Not every stored name is in the query: today's rule, by position, new fields last."""
    evo, notes = added_fields(
        struct(("count", "long"), ("total", "long")),
        struct(("n", "long"), ("sum", "long"), ("last", "string")),
        "value",
    )
    assert evo is not None
    assert "value field 0 (n): renamed count -> n, matched by position" in notes
    assert "value field 1 (sum): renamed total -> sum, matched by position" in notes
    assert "value field 2 (last): added, starts null" in notes
    value = pa.StructArray.from_arrays([pa.array([1]), pa.array([10])], names=["count", "total"])
    assert evo.convert(value).to_pylist() == [{"n": 1, "sum": 10, "last": None}]
    # One name kept, one renamed: still by position (the rename is what Spark would read).
    _, notes = added_fields(
        struct(("count", "long"), ("total", "long")),
        struct(("count", "long"), ("sum", "long"), ("last", "string")),
        "value",
    )
    assert "value field 1 (sum): renamed total -> sum, matched by position" in notes


def _tws_keys(grouping: str, user_key: str = struct(("mk", "string"))) -> dict[str, str]:
    """The key schemas of a transformWithState operator's column families (value, list and
    map state, a list's row counter, event-time timers) for a grouping key struct."""
    g = json.loads(grouping)

    def with_key(*fields: dict) -> str:
        return json.dumps({"type": "struct", "fields": list(fields)})

    key = {"name": "key", "type": g, "nullable": True, "metadata": {}}
    expiry = {"name": "expiryTimestampMs", "type": "long", "nullable": False, "metadata": {}}
    user = {"name": "userKey", "type": json.loads(user_key), "nullable": True, "metadata": {}}
    return {
        "cnt": grouping,
        "lst": grouping,
        "$rowCounter_lst": grouping,
        "mp": with_key(key, user),
        "$eventTimers_keyToTimestamp": with_key(key, expiry),
        "$eventTimers_timestampToKey": with_key(expiry, key),
    }


TWS_KINDS = {"cnt": "ValueState", "lst": "ListState", "mp": "MapState", "$timers": "timers"}


def test_transform_with_state_grouping_key_widens_and_renames_for_every_column_family():
    stored = _tws_keys(struct(("g", "integer"), ("d", "decimal(5,2)")))
    evo, notes = grouping_key(
        stored, _tws_keys(struct(("v", "long"), ("d", "decimal(7,2)"))), TWS_KINDS
    )
    assert evo is not None
    assert notes == [
        "grouping key field 0 (v): widened integer -> long",
        "grouping key field 0 (v): renamed g -> v, matched by position",
        "grouping key field 1 (d): widened decimal(5,2) -> decimal(7,2)",
    ]
    key = pa.StructArray.from_arrays(
        [pa.array([7, None], pa.int32()), pa.array([1, 2], pa.decimal128(5, 2))], names=["g", "d"]
    )
    out = evo.convert(key)
    assert [f.name for f in out.type] == ["v", "d"] and out.type.field(0).type == pa.int64()
    assert out.field(0).to_pylist() == [7, None]
    # Renamed only: the same bytes, so nothing is converted, and the plan says so.
    evo, notes = grouping_key(
        stored, _tws_keys(struct(("v", "integer"), ("d", "decimal(5,2)"))), TWS_KINDS
    )
    assert evo is None and notes == [
        "grouping key field 0 (v): renamed g -> v, matched by position"
    ]
    assert grouping_key(stored, stored, TWS_KINDS) == (None, [])
    # Refused, with the field: narrowed or retyped keys, and a map user key that changed.
    with pytest.raises(
        Refused, match=r"grouping key field 0 \(g\): long in the savepoint, integer"
    ):
        grouping_key(
            _tws_keys(struct(("g", "long"))), _tws_keys(struct(("g", "integer"))), TWS_KINDS
        )
    with pytest.raises(Refused, match=r"grouping key has 1 fields in the savepoint"):
        grouping_key(
            _tws_keys(struct(("g", "long"))),
            _tws_keys(struct(("g", "long"), ("h", "long"))),
            TWS_KINDS,
        )
    with pytest.raises(Refused, match=r"column family mp: key field 1 \(userKey\)\.mk: string"):
        grouping_key(
            _tws_keys(struct(("g", "integer"))),
            _tws_keys(struct(("g", "long")), struct(("mk", "integer"))),
            TWS_KINDS,
        )
    with pytest.raises(Refused, match=r"column family mp: key field 1 \(userKey\)\.mk"):
        grouping_key(  # the grouping key unchanged: the user key is still checked
            _tws_keys(struct(("g", "long"))),
            _tws_keys(struct(("g", "long")), struct(("mk", "integer"))),
            TWS_KINDS,
        )

    # TTL indexes nest the grouping key in their element key (a map's in (key, userKey)):
    # re-keyed alike; a family restore cannot place the grouping key in is refused.
    def ttl(grouping: str, element: str | None = None) -> str:
        return with_fields(
            ("expirationMs", "long"),
            ("elementKey", json.loads(element or grouping)),
        )

    def with_fields(*pairs: tuple[str, object]) -> str:
        fields = [{"name": n, "type": t, "nullable": True, "metadata": {}} for n, t in pairs]
        return json.dumps({"type": "struct", "fields": fields})

    def with_ttl(grouping: str) -> dict[str, str]:
        map_key = _tws_keys(grouping)["mp"]
        return {
            **_tws_keys(grouping),
            "$ttl_cnt": ttl(grouping),
            "$ttl_lst": ttl(grouping),
            "$min_lst": grouping,
            "$ttl_mp": ttl(grouping, map_key),
        }

    evo, notes = grouping_key(
        with_ttl(struct(("g", "integer"))), with_ttl(struct(("g", "long"))), TWS_KINDS
    )
    assert evo is not None and notes == ["grouping key field 0 (g): widened integer -> long"]
    with pytest.raises(Refused, match=r"\$ttl_other: restore does not know where its key"):
        grouping_key(
            {**with_ttl(struct(("g", "integer"))), "$ttl_other": ttl(struct(("g", "integer")))},
            {**with_ttl(struct(("g", "long"))), "$ttl_other": ttl(struct(("g", "long")))},
            TWS_KINDS,
        )


def _retyped_k(schema: str, type_: str, name: str = "k") -> str:
    """A tws fixture schema with its grouping key field k (a string) as ``name type_``."""
    return schema.replace('{"name":"k","type":"string"', f'{{"name":"{name}","type":"{type_}"')


def _tws_plan(tmp_path, fixture: str, stored: str, planned: str, name: str = "k"):
    """Plan restoring the fixture's transformWithState state, its grouping key k read as
    ``stored``, into the same operator planned with the key ``name planned``."""
    sp_url, meta = take_savepoint(str(FIXTURES / fixture), str(tmp_path / fixture))
    sp = Savepoint.open(sp_url)
    (op,) = sp.metadata.operators
    op.tables = [
        dataclasses.replace(t, key_schema=_retyped_k(t.key_schema, stored)) for t in op.tables
    ]
    op.column_families = [
        {**cf, "key_schema": _retyped_k(cf["key_schema"], stored)} for cf in op.column_families
    ]
    (qop,) = Checkpoint.open(str(FIXTURES / fixture)).operators(meta.batch_id)
    qop.schemas = [
        dataclasses.replace(s, key_schema=_retyped_k(s.key_schema, planned, name))
        for s in qop.schemas
    ]
    # One file source, as the fixture's query has: matched by its index.
    query = PlannedQuery(
        "queries.py:after", "update", [qop], sources=[PlannedSource(0, "FileSource[in]", "/in")]
    )
    return op.uid, plan_restore(
        sp, str(tmp_path / "ck"), RestoreOptions(backend="rocksdb", partitions=3), query=query
    )


def test_transform_with_state_key_evolution_is_planned_or_refused_with_the_reason(tmp_path):
    uid, plan = _tws_plan(tmp_path, "tws-rocksdb", "integer", "long", "key")
    assert not plan.problems, plan.problems
    assert plan.restored == {uid: 0}
    assert plan.evolved == [
        f"uid {uid}: grouping key field 0 (key): widened integer -> long",
        f"uid {uid}: grouping key field 0 (key): renamed k -> key, matched by position",
    ]
    # Every state variable and the timers get the same converted key.
    evolutions = plan.evolutions[uid]
    assert sorted(evolutions) == ["$timers", "cnt", "lst", "mp"]
    assert len({id(e.key) for e in evolutions.values()}) == 1
    _, plan = _tws_plan(tmp_path / "narrowed", "tws-rocksdb", "long", "integer")
    # Spark's reason for each column family (the timers' too), the first with restore's.
    problem = plan.problems[0]
    assert "restore cannot evolve it: grouping key: grouping key field 0 (k): long in the " in (
        problem
    )
    assert "integer in the query, which is not a widening" in problem
    assert sorted(p.split("'")[1] for p in plan.problems) == ["$timers", "cnt", "lst", "mp"]
    assert all("--drop" in p for p in plan.problems) and not plan.evolutions
    # Avro rows are re-keyed too (the key encoded with the family's schema id, the schema file
    # carrying the query's key schema under it).
    uid, plan = _tws_plan(tmp_path / "avro", "tws-avro-rocksdb", "integer", "long")
    assert not plan.problems, plan.problems
    assert plan.evolved == [f"uid {uid}: grouping key field 0 (k): widened integer -> long"]
    # TTL indexes nest the grouping key in their element key: re-keyed with the values.
    uid, plan = _tws_plan(tmp_path / "ttl", "tws-ttl-rocksdb", "integer", "long")
    assert not plan.problems, plan.problems
    assert plan.evolved == [f"uid {uid}: grouping key field 0 (k): widened integer -> long"]
    _, plan = _tws_plan(tmp_path / "ttl-narrowed", "tws-ttl-rocksdb", "long", "integer")
    narrowed = "grouping key field 0 (k): long in the savepoint, integer in the query"
    assert f"{narrowed}, which is not a widening" in plan.problems[0], plan.problems


def _ttl_wrapped(inner: str) -> str:
    """Spark's TTL'd value struct around ``inner``: struct<value, ttlExpirationMs>."""
    fields = [("value", json.loads(inner)), ("ttlExpirationMs", "long")]
    return json.dumps(
        {
            "type": "struct",
            "fields": [{"name": n, "type": t, "nullable": True, "metadata": {}} for n, t in fields],
        }
    )


def test_a_ttl_value_gains_fields_inside_sparks_wrapper_and_keeps_its_expiry():
    stored = _ttl_wrapped(struct(("c", "long"), ("s", "long")))
    new = _ttl_wrapped(struct(("c", "long"), ("tag", "string"), ("s", "long")))
    evo, notes = state_variable_value(stored, new, stored_ttl=True, query_ttl=True)
    # The notes name the user's fields, as for a value without TTL.
    assert notes == [
        "value field 2 (s): stored field 1, matched by name",
        "value field 1 (tag): added, starts null",
    ]
    user = pa.StructArray.from_arrays([pa.array([3, 4]), pa.array([30, None])], ["c", "s"])
    rows = pa.StructArray.from_arrays(
        [user, pa.array([1_000, 2_000])], ["value", "ttlExpirationMs"]
    )
    assert evo.convert(rows).to_pylist() == [
        {"value": {"c": 3, "tag": None, "s": 30}, "ttlExpirationMs": 1_000},
        {"value": {"c": 4, "tag": None, "s": None}, "ttlExpirationMs": 2_000},
    ]
    assert state_variable_value(stored, stored, stored_ttl=True, query_ttl=True) == (None, [])
    plain = struct(("c", "long"), ("s", "long"))
    with pytest.raises(
        Refused, match=r"value: the savepoint keeps it with TTL .* the query without"
    ):
        state_variable_value(stored, plain, stored_ttl=True, query_ttl=False)
    with pytest.raises(Refused, match=r"value: the query adds TTL to it, .* no expiry to keep"):
        state_variable_value(plain, stored, stored_ttl=False, query_ttl=True)
    reordered = _ttl_wrapped(struct(("s", "long"), ("c", "long"), ("tag", "string")))
    with pytest.raises(Refused, match=r"value: the savepoint's fields \(c, s\) are in the query"):
        state_variable_value(stored, reordered, stored_ttl=True, query_ttl=True)
    with pytest.raises(Refused, match=r"struct<c:long,s:long> in the savepoint is not Spark's"):
        state_variable_value(plain, new, stored_ttl=True, query_ttl=True)


def _tagged(value_schema: str) -> str:
    """A state variable's value schema with a string ``tag`` added to the user's struct
    (inside Spark's TTL wrapper when it has one)."""
    s = json.loads(value_schema)
    ttl = [f["name"] for f in s["fields"]] == ["value", "ttlExpirationMs"]
    inner = s["fields"][0]["type"] if ttl else s
    inner["fields"].append({"name": "tag", "type": "string", "nullable": True, "metadata": {}})
    return json.dumps(s)


def _planned_values(fixture: str, values: dict[str, str | None]) -> PlannedQuery:
    """The fixture's own operator as the planned query, the column families named in
    ``values`` with that value schema (None: the query has no such family)."""
    ck = Checkpoint.open(str(FIXTURES / fixture))
    (qop,) = ck.operators(ck.latest_committed_batch)
    qop.schemas = [
        dataclasses.replace(s, value_schema=values.get(s.name) or s.value_schema)
        for s in qop.schemas
        if s.name not in values or values[s.name] is not None
    ]
    source = PlannedSource(0, "FileSource[in]", "/in")  # the fixture's one file source
    return PlannedQuery("queries.py:after", "update", [qop], sources=[source])


def _restored_values(url: str, uid: str, target, var: str) -> tuple[list, list]:
    """A state variable's rows in the savepoint and in the restored target (statectl reads
    both; Spark's own reading of an evolved restore is the continuation tests')."""
    column = {"lst": "list_element", "mp": "user_map_value"}.get(var, "value")
    rows = [
        sorted(arrow_rows(read_state(src, op, state_var=var).drop_columns(["partition_id"])))
        for src, op in ((url, uid), (str(target), 0))
    ]
    assert column in read_state(str(target), 0, state_var=var).schema.names
    return rows[0], rows[1]


@pytest.mark.parametrize("fixture", ["tws-ttl-rocksdb", "tws-avro-rocksdb"])
def test_ttl_and_avro_values_gain_a_field_with_their_bytes_and_expiry_kept(tmp_path, fixture):
    """Without a JVM: each value, list element and map value gains a null tag; every other
    byte Spark wrote stays (the TTL indexes, so each value's expiry; Avro's schema id and
    the stored fields' encoding, the null tag appended), and the schema file carries the
    query's value schema under the stored schema id, so Spark evolves nothing itself."""
    url, meta = take_savepoint(str(FIXTURES / fixture), str(tmp_path / "sp"))
    (op,) = meta.operators
    grown = {t.name: _tagged(t.value_schema) for t in op.tables if t.kind != "timers"}
    n = op.partitions
    plan = restore(
        url, str(tmp_path / "evolved"), query=_planned_values(fixture, grown), partitions=n
    )
    assert not plan.problems, plan.problems
    assert sorted(plan.evolved) == [
        f"uid {op.uid} state variable {var!r}: value field 1 (tag): added, starts null"
        for var in sorted(grown)
    ]
    assert not restore(url, str(tmp_path / "plain"), partitions=n).problems
    evolved, plain = (
        entries_by_family(Checkpoint.open(str(tmp_path / name))) for name in ("evolved", "plain")
    )

    def others(entries: list[set]) -> list[set]:
        return [{e for e in p if e[0] not in grown} for p in entries]

    assert others(evolved) == others(plain)
    kept = {e[0] for p in others(plain) for e in p}
    assert kept >= (
        {"$ttl_cnt", "$ttl_lst", "$min_lst", "$count_lst"}
        if "ttl" in fixture
        else {"$rowCounter_lst"}
    )
    if fixture == "tws-avro-rocksdb":
        # A record is its fields' encodings in order: the stored ones, then the null tag.
        tag = struct(("tag", "string"))
        null_tag = encode_avro_rows(
            pa.StructArray.from_arrays([pa.nulls(1, pa.string())], ["tag"]), tag
        )[0].as_py()
        for p_evolved, p_plain in zip(evolved, plain, strict=True):
            for var in ("cnt", "mp"):
                want = {(f, k, v + null_tag) for f, k, v in p_plain if f == var}
                assert want and {e for e in p_evolved if e[0] == var} == want, var
    for var in grown:
        stored, restored = _restored_values(url, op.uid, tmp_path / "evolved", var)
        ttl = "$ttl_" + var in {cf["name"] for cf in op.column_families}
        tagged = [
            (*r[:-1], ((r[-1][0] + (None,)), r[-1][1]) if ttl else r[-1] + (None,)) for r in stored
        ]
        assert restored == sorted(tagged), var
    # The schema file: the query's value schemas, under the ids the values carry.
    ck = Checkpoint.open(str(tmp_path / "evolved"))
    (schemas,) = [o.schemas for o in ck.operators(ck.latest_committed_batch)]
    for s in schemas:
        if s.name in grown:
            assert (s.value_schema, s.value_schema_id) == (grown[s.name], 0), s.name


def test_ttl_added_or_dropped_by_the_query_is_refused_with_the_reason(tmp_path):
    """A query that drops a variable's TTL would keep its values past their expiry; one
    that adds TTL has no expiry for them: refused at plan time, the variable named, nothing
    written."""
    url, meta = take_savepoint(str(FIXTURES / "tws-ttl-rocksdb"), str(tmp_path / "sp"))
    (op,) = meta.operators
    cnt = next(t for t in op.tables if t.name == "cnt")
    unwrapped = json.dumps(json.loads(cnt.value_schema)["fields"][0]["type"])
    query = _planned_values("tws-ttl-rocksdb", {"cnt": unwrapped, "$ttl_cnt": None})
    plan = restore(url, str(tmp_path / "dropped"), query=query, partitions=2)
    assert len(plan.problems) == 1, plan.problems
    assert (
        "restore cannot evolve it: state variable 'cnt': value: the savepoint keeps it "
        in (plan.problems[0])
    )
    assert not (tmp_path / "dropped").exists()
    url, meta = take_savepoint(str(FIXTURES / "tws-rocksdb"), str(tmp_path / "sp-plain"))
    cnt = next(t for t in meta.operators[0].tables if t.name == "cnt")
    query = _planned_values("tws-rocksdb", {"cnt": _ttl_wrapped(cnt.value_schema)})
    # The TTL index Spark would plan for it.
    ck = Checkpoint.open(str(FIXTURES / "tws-ttl-rocksdb"))
    (ttl_op,) = ck.operators(ck.latest_committed_batch)
    query.operators[0].schemas.append(next(s for s in ttl_op.schemas if s.name == "$ttl_cnt"))
    plan = restore(url, str(tmp_path / "added"), query=query, partitions=2)
    assert any(
        "state variable 'cnt': value: the query adds TTL to it" in p for p in plan.problems
    ), plan.problems
    assert not (tmp_path / "added").exists()


def test_a_refused_variable_is_reported_without_the_ones_that_would_evolve(tmp_path):
    """The query drops ``cnt``'s TTL (refused) and adds a field to ``lst``'s elements (which
    evolves): the one problem names ``cnt`` and not Spark's complaint about ``lst``."""
    url, meta = take_savepoint(str(FIXTURES / "tws-ttl-rocksdb"), str(tmp_path / "sp"))
    tables = {t.name: t for t in meta.operators[0].tables}
    unwrapped = json.dumps(json.loads(tables["cnt"].value_schema)["fields"][0]["type"])
    lst = json.loads(tables["lst"].value_schema)
    lst["fields"][0]["type"]["fields"].append({"name": "x", "type": "string", "nullable": True})
    query = _planned_values(
        "tws-ttl-rocksdb", {"cnt": unwrapped, "$ttl_cnt": None, "lst": json.dumps(lst)}
    )
    plan = restore(url, str(tmp_path / "t"), query=query, partitions=2)
    assert len(plan.problems) == 1, plan.problems
    assert "state variable 'cnt'" in plan.problems[0]
    assert "'lst'" not in plan.problems[0]


def test_transform_output_is_checked_against_the_planned_schema(tmp_path):
    (tmp_path / "t.py").write_text(
        "import pyarrow as pa\n"
        "def same(batch, store):\n    return batch\n"
        "def bad(batch, store):\n    return {'key': 1}\n"
    )
    rows = pa.table(
        {
            "key": pa.StructArray.from_arrays([pa.array([1], pa.int32())], ["k"]),
            "value": pa.StructArray.from_arrays([pa.array(["x"])], ["s"]),
        }
    )
    evo = TableEvolution(
        PartEvolution(struct(("k", "long")), []),
        PartEvolution(struct(("s", "string")), []),
        transform=f"{tmp_path / 't.py'}:same",
    )
    out = apply_transform(evo, "default", rows)  # int -> long: a safe cast
    assert out.column("key").type.field(0).type == pa.int64()
    evo.value = PartEvolution(struct(("n", "long")), [])
    with pytest.raises(StatectlError, match="returned value"):
        apply_transform(evo, "default", rows)
    evo.transform = f"{tmp_path / 't.py'}:bad"
    with pytest.raises(StatectlError, match="must return a pyarrow RecordBatch"):
        apply_transform(evo, "default", rows)


EVOLVING_QUERIES = (
    """
import pyspark.sql.functions as F

"""
    + QUERY_SOURCE
    + '''

def before(spark):
    return src(spark).groupBy(F.col("id").cast("int").alias("id")).agg(
        F.count("*").alias("cnt"), F.sum("v").alias("total")
    )


def after(spark):
    """sum removed, max added, the key widened from int to bigint."""
    return src(spark).groupBy("id").agg(F.max("v").alias("top"), F.count("*").alias("cnt"))
'''
)


def _write_in_order(d, start: int, count: int, now: float | None = None) -> None:
    """:func:`write_input`'s files ``start`` .. ``start + count - 1``, modified in batch order:
    the file source takes files by modification time, and an event-time query drops a batch
    read after a later one as late."""
    write_input(d, start, count)
    now = time.time() if now is None else now
    for b in range(start, start + count):
        os.utime(d / f"part-{b:03d}.json", (now + b, now + b))


def _placed_elsewhere_when_widened(keys: list[int], partitions: int) -> int:
    """How many of ``keys`` an int and a bigint key place in different partitions (Murmur3
    hashes 4 or 8 bytes): restored keys placed by the savepoint's int would not be found."""
    as_int = pa.StructArray.from_arrays([pa.array(keys, pa.int32())], ["k"])
    as_long = pa.StructArray.from_arrays([pa.array(keys, pa.int64())], ["k"])
    return int((partition_ids(as_int, partitions) != partition_ids(as_long, partitions)).sum())


def _rows(d, batches):
    out = []
    for b in batches:
        out += [json.loads(line) for line in (d / f"part-{b:03d}.json").read_text().splitlines()]
    return out


def _load(path):
    spec = importlib.util.spec_from_file_location("evolving_queries", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.spark
@pytest.mark.parametrize(("backend", "agg_format"), [("hdfs", 2), ("rocksdb", 2), ("rocksdb", 1)])
def test_changed_aggregation_restores_and_continues(spark, tmp_path, backend, agg_format):
    """At state format 1 the value repeats the grouping key before the buffers: widened with
    the key, the buffers matched as at format 2."""
    d = tmp_path / "input"
    write_input(d, 0, 3)
    queries = tmp_path / "evolving_queries.py"
    queries.write_text(EVOLVING_QUERIES.format(input=str(d)))
    mod = _load(queries)
    confs = {AGG_FORMAT_CONF: str(agg_format)}
    run(spark, lambda s, _d: (mod.before(s), "update"), d, tmp_path / "ck1", confs=confs)
    sp_url, meta = take_savepoint(str(tmp_path / "ck1"), str(tmp_path / "sp"))
    (uid,) = [op.uid for op in meta.operators]
    assert meta.pinned_confs[AGG_FORMAT_CONF] == str(agg_format)

    plan = restore(
        sp_url,
        str(tmp_path / "ck2"),
        query=f"{queries}:after",
        spark=spark,
        backend=backend,
        partitions=3,
        dry_run=True,
    )
    assert not plan.problems, plan.problems
    assert plan.restored == {uid: 0}
    text = " | ".join(plan.evolved)
    assert "key field 0 (id): widened integer -> long" in text
    assert "max(v) added, starts at null" in text and "(sum) dropped" in text
    assert ("value field 0 (id): widened integer -> long" in text) == (agg_format == 1), text
    assert plan.as_dict()["evolved"] == plan.evolved
    plan = restore(
        sp_url,
        str(tmp_path / "ck2"),
        query=f"{queries}:after",
        spark=spark,
        backend=backend,
        partitions=3,
    )
    assert not plan.problems, plan.problems
    if backend == "rocksdb":
        # The Spark engine converts before it places, as the local engine does (it used to
        # place and encode the savepoint's int keys: null keys, rows lost).
        restore(
            sp_url,
            str(tmp_path / "ck4"),
            query=f"{queries}:after",
            spark=spark,
            backend=backend,
            partitions=3,
            engine=SparkEngine(spark),
        )
        reader = spark.read.format("statestore")
        assert spark_rows(reader.load(str(tmp_path / "ck4"))) == spark_rows(
            reader.load(str(tmp_path / "ck2"))
        )

    # New data with small values: a max that covered the old data too would be 8.
    for b in range(3, 6):
        rows = [
            {"id": j % 4, "k": "x", "v": (j + b) % 3, "ts": "2024-01-01T00:10:00"} for j in range(6)
        ]
        (d / f"part-{b:03d}.json").write_text("\n".join(json.dumps(r) for r in rows))
    now = time.time()
    for b in range(3, 6):  # the file source takes files in modification time order
        os.utime(d / f"part-{b:03d}.json", (now + b, now + b))
    want = _reference(d)
    assert _continue(spark, mod, d, tmp_path / "ck2", meta.batch_id) == want
    assert max(r["v"] for r in _rows(d, range(3))) > max(top for top, _ in want.values())
    if backend != "hdfs":
        return
    # --transform, once end to end through the CLI: the user's function does the same by hand.
    (tmp_path / "fix.py").write_text(TRANSFORM)
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "statectl.cli",
            "restore",
            "-s",
            sp_url,
            str(tmp_path / "ck3"),
            "--query",
            f"{queries}:after",
            "--partitions",
            "3",
            "--transform",
            f"{uid}={tmp_path / 'fix.py'}:fix",
            "--json",
        ],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": os.getcwd()},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert any("rows transformed by" in n for n in json.loads(proc.stdout)["evolved"])
    assert _continue(spark, mod, d, tmp_path / "ck3", meta.batch_id) == want


TRANSFORM = """
import pyarrow as pa


def fix(batch, store):
    key = pa.StructArray.from_arrays([batch.column("key").field(0).cast(pa.int64())], ["id"])
    count = batch.column("value").field("count")
    value = pa.StructArray.from_arrays([pa.nulls(len(batch), pa.int64()), count], ["max", "count"])
    return pa.RecordBatch.from_arrays([key, value], ["key", "value"])
"""


def _continue(spark, mod, d, ckpt, last_batch):
    """Run the changed query on to the end; each id's last emitted (top, cnt)."""
    continued = run(spark, lambda s, _d: (mod.after(s), "update"), d, ckpt)
    assert continued and all(b > last_batch for b in continued)
    last: dict[int, tuple] = {}
    for b in sorted(continued):
        for id_, top, cnt in continued[b]:
            last[id_] = (top, cnt)
    return last


def _reference(d):
    """From the inputs alone: counts over all the data, max over the new data only."""
    old, new = _rows(d, range(3)), _rows(d, range(3, 6))
    return {
        id_: (
            max(r["v"] for r in new if r["id"] == id_),
            sum(1 for r in old + new if r["id"] == id_),
        )
        for id_ in {r["id"] for r in new}
    }


TWS_QUERIES = (
    """
import pandas as pd
from pyspark.sql.streaming import StatefulProcessor

"""
    + QUERY_SOURCE
    + '''

class Counter(StatefulProcessor):
    SCHEMA = "c long"

    def init(self, handle):
        self.cnt = handle.getValueState("cnt", self.SCHEMA)

    def handleInputRows(self, key, rows, timerValues):
        n = sum(len(pdf) for pdf in rows)
        old = self.cnt.get() if self.cnt.exists() else None
        c = (old[0] if old else 0) + n
        tag = old[1] if old is not None and len(old) > 1 else None
        self.cnt.update((c, "new") if len(self.SCHEMA.split(",")) > 1 else (c,))
        yield pd.DataFrame({{"k": [key[0]], "c": [c], "tag": [tag]}})

    def close(self):
        pass


class TaggedCounter(Counter):
    SCHEMA = "c long, tag string"


def build(spark, processor):
    return src(spark).groupBy("k").transformWithStateInPandas(
        processor(), outputStructType="k string, c long, tag string", outputMode="Update",
        timeMode="None",
    )


def before(spark):
    return build(spark, Counter)


def after(spark):
    """The value state gains a field: old keys read it as null, then write "new"."""
    return build(spark, TaggedCounter)
'''
)


@dataclasses.dataclass
class Continued:
    """A changed query restored from its ``before`` run and continued: the plan, the
    savepoint's metadata, both runs' output by batch id, the input and the queries module."""

    plan: object
    meta: object
    first: dict
    continued: dict
    d: object
    mod: object

    @property
    def rows(self) -> list:
        return [r for b in sorted(self.continued) for r in self.continued[b]]


def _restore_changed_and_continue(
    spark,
    tmp_path,
    queries_text: str,
    *,
    mode: str = "update",
    confs: dict | None = None,
    backend: str | None = None,
    before_fn: str = "before",
    after_fn: str = "after",
    **fields: object,
) -> Continued:
    """The module's ``before_fn`` query (a function's name) runs over 3 input files (RocksDB
    unless ``confs`` say otherwise); its savepoint is restored with ``--query`` into
    ``after_fn`` at 3 partitions (on
    ``backend``, else the savepoint's), which continues over 2 new files. ``fields``: the
    module text's format fields besides ``input``."""
    d = tmp_path / "input"
    _write_in_order(d, 0, 3, time.time() - 10)
    queries = tmp_path / "queries.py"
    queries.write_text(queries_text.format(input=str(d), **fields))
    mod = _load(queries)
    confs = confs or {"spark.sql.streaming.stateStore.providerClass": PROVIDERS["rocksdb"]}
    first = run(
        spark, lambda s, _d: (getattr(mod, before_fn)(s), mode), d, tmp_path / "ck1", confs=confs
    )
    sp_url, meta = take_savepoint(str(tmp_path / "ck1"), str(tmp_path / "sp"))
    plan = restore(
        sp_url,
        str(tmp_path / "ck2"),
        query=f"{queries}:{after_fn}",
        spark=spark,
        partitions=3,
        backend=backend,
    )
    assert not plan.problems, plan.problems
    _write_in_order(d, 3, 2)
    continued = run(spark, lambda s, _d: (getattr(mod, after_fn)(s), mode), d, tmp_path / "ck2")
    assert continued and all(b > meta.batch_id for b in continued)
    return Continued(plan, meta, first, continued, d, mod)


@pytest.mark.spark
def test_transform_with_state_value_gains_a_field_and_continues(spark, tmp_path):
    c = _restore_changed_and_continue(spark, tmp_path, TWS_QUERIES)
    plan, rows, d = c.plan, c.rows, c.d
    assert any("value field 1 (tag): added, starts null" in n for n in plan.evolved)
    firsts: dict[str, tuple] = {}
    lasts: dict[str, tuple] = {}
    for k, c, tag in rows:
        firsts.setdefault(k, (c, tag))
        lasts[k] = (c, tag)
    old, all_rows = _rows(d, range(3)), _rows(d, range(5))
    for k, (c, _tag) in lasts.items():
        assert c == sum(1 for r in all_rows if r["k"] == k), k  # the old counts continued
    old_keys = {r["k"] for r in old}
    # A key's first update after the restore reads the added field as null.
    assert all(tag is None for k, (c, tag) in firsts.items() if k in old_keys)


TWS_MID_QUERIES = (
    """
import pandas as pd
from pyspark.sql.streaming import StatefulProcessor

"""
    + QUERY_SOURCE
    + '''

class Totals(StatefulProcessor):
    def init(self, handle):
        self.st = handle.getValueState("st", "c long, s long")

    def handleInputRows(self, key, rows, timerValues):
        pdfs = list(rows)
        n, v = sum(len(p) for p in pdfs), sum(int(p["v"].sum()) for p in pdfs)
        c, s = self.st.get() if self.st.exists() else (0, 0)
        self.st.update((c + n, s + v))
        yield pd.DataFrame({{"k": [key[0]], "c": [c + n], "s": [s + v], "tag": [None]}})

    def close(self):
        pass


class TaggedTotals(Totals):
    def init(self, handle):
        self.st = handle.getValueState("st", "c long, tag string, s long")

    def handleInputRows(self, key, rows, timerValues):
        pdfs = list(rows)
        n, v = sum(len(p) for p in pdfs), sum(int(p["v"].sum()) for p in pdfs)
        c, tag, s = self.st.get() if self.st.exists() else (0, "fresh", 0)
        self.st.update((c + n, "seen", s + v))
        yield pd.DataFrame({{"k": [key[0]], "c": [c + n], "s": [s + v], "tag": [tag]}})


def build(spark, processor):
    return src(spark).groupBy("k").transformWithStateInPandas(
        processor(), outputStructType="k string, c long, s long, tag string",
        outputMode="Update", timeMode="None",
    )


def before(spark):
    return build(spark, Totals)


def after(spark):
    """The value state gains a field in the middle: (c, s) -> (c, tag, s)."""
    return build(spark, TaggedTotals)
'''
)


@pytest.mark.spark
def test_transform_with_state_value_gains_a_middle_field_and_continues(spark, tmp_path):
    """(c, s) -> (c, tag, s): s is matched by name (not read as tag), tag starts null."""
    c = _restore_changed_and_continue(spark, tmp_path, TWS_MID_QUERIES)
    plan, rows, d = c.plan, c.rows, c.d
    assert any("value field 1 (tag): added, starts null" in n for n in plan.evolved)
    assert any("value field 2 (s): stored field 1, matched by name" in n for n in plan.evolved)
    firsts: dict[str, str | None] = {}
    lasts: dict[str, tuple] = {}
    for k, c, s, tag in rows:
        firsts.setdefault(k, tag)
        lasts[k] = (c, s)
    old, all_rows = _rows(d, range(3)), _rows(d, range(5))
    for k, (c, s) in lasts.items():
        mine = [r for r in all_rows if r["k"] == k]
        assert (c, s) == (len(mine), sum(r["v"] for r in mine)), k  # count and total continued
    old_keys = {r["k"] for r in old}
    assert old_keys & set(firsts)
    # An old key's first update reads the inserted field as null; a new key has no state.
    assert all(firsts[k] is None for k in firsts if k in old_keys)
    assert all(firsts[k] == "fresh" for k in firsts if k not in old_keys)


TWS_KEY_QUERIES = (
    """
import pandas as pd
import pyspark.sql.functions as F
from pyspark.sql.streaming import StatefulProcessor
from pyspark.sql.types import LongType, StringType, StructField, StructType

"""
    + QUERY_SOURCE
    + '''

class Processor(StatefulProcessor):
    """Value, list and map state and event-time timers (tests/helpers/spark.py's tws processor):
    the output depends on every kind of restored state."""

    def init(self, handle):
        self.handle = handle
        self.cnt = handle.getValueState("cnt", StructType([StructField("c", LongType())]))
        self.lst = handle.getListState("lst", StructType([StructField("v", LongType())]))
        self.mp = handle.getMapState(
            "mp",
            StructType([StructField("mk", StringType())]),
            StructType([StructField("mv", LongType())]),
        )

    def handleInputRows(self, key, rows, timerValues):
        n, latest = 0, 0
        for pdf in rows:
            for v, ts in zip(pdf["v"], pdf["ts"]):
                self.lst.appendValue((int(v),))
                self.mp.updateValue((str(int(v) % 3),), (int(v),))
                latest = max(latest, int(pd.Timestamp(ts).timestamp() * 1000))
                n += 1
        total = sum(1 for _ in self.lst.get())
        first = self.mp.getValue(("1",))[0] if self.mp.containsKey(("1",)) else -2
        c = (self.cnt.get()[0] if self.cnt.exists() else 0) + n
        self.cnt.update((c,))
        self.handle.registerTimer(latest + 10_000)
        yield pd.DataFrame({{"g": [int(key[0])], "c": [c * 1_000_000 + total * 100 + first]}})

    def handleExpiredTimer(self, key, timerValues, expiredTimerInfo):
        if self.mp.containsKey(("0",)):
            self.mp.removeKey(("0",))
        yield pd.DataFrame({{"g": [int(key[0])], "c": [-1]}})

    def close(self):
        pass


def build(df, key):
    return (
        df.withWatermark("ts", "5 seconds")
        .groupBy(key)
        .transformWithStateInPandas(
            Processor(), outputStructType="g long, c long", outputMode="Update",
            timeMode="EventTime",
        )
    )


def before(spark):
    return build(src(spark).withColumn("g", F.col("v").cast("int")), "g")


def after(spark):
    """The grouping key widened (int -> bigint) and renamed (g -> v)."""
    return build(src(spark), "v")
'''
)


@pytest.mark.spark
@pytest.mark.parametrize("encoding", ["unsaferow", "avro"])
def test_transform_with_state_grouping_key_widens_and_continues(spark, tmp_path, encoding):
    d = tmp_path / "input"
    _write_in_order(d, 0, 3, time.time() - 10)
    queries = tmp_path / "tws_key_queries.py"
    queries.write_text(TWS_KEY_QUERIES.format(input=str(d)))
    mod = _load(queries)
    assert _placed_elsewhere_when_widened(list(range(9)), 3) >= 3
    rocksdb = {
        "spark.sql.streaming.stateStore.providerClass": PROVIDERS["rocksdb"],
        ENCODING_CONF: encoding,
    }
    first = run(spark, lambda s, _d: (mod.before(s), "update"), d, tmp_path / "ck1", confs=rocksdb)
    sp_url, meta = take_savepoint(str(tmp_path / "ck1"), str(tmp_path / "sp"))
    (uid,) = [op.uid for op in meta.operators]
    assert meta.operators[0].partitions == 2  # restored to 3
    assert meta.pinned_confs.get(ENCODING_CONF, "unsaferow") == encoding
    plan = restore(
        sp_url, str(tmp_path / "ck2"), query=f"{queries}:after", spark=spark, partitions=3
    )
    assert not plan.problems, plan.problems
    assert plan.evolved == [
        f"uid {uid}: grouping key field 0 (v): widened integer -> long",
        f"uid {uid}: grouping key field 0 (v): renamed g -> v, matched by position",
    ]
    # The Spark engine converts before its shuffle as the local engine does before spilling.
    restore(
        sp_url,
        str(tmp_path / "ck4"),
        query=f"{queries}:after",
        spark=spark,
        partitions=3,
        engine=SparkEngine(spark),
    )
    # Spark's own reader sees the restored state under the query's key, every row of it.
    for var in ("cnt", "lst", "mp"):

        def read(ckpt, var=var):
            return (
                spark.read.format("statestore")
                .option("operatorId", 0)
                .option("stateVarName", var)
                .load(str(ckpt))
            )

        df = read(tmp_path / "ck2")
        assert df.schema["key"].dataType.simpleString() == "struct<v:bigint>", var
        stored = Savepoint.open(sp_url).read_table(
            next(t for t in meta.operators[0].tables if t.name == var)
        )
        assert df.count() == stored.num_rows, var
        assert spark_rows(df) == spark_rows(read(tmp_path / "ck4")), var

    _write_in_order(d, 3, 2)
    continued = run(spark, lambda s, _d: (mod.after(s), "update"), d, tmp_path / "ck2")
    assert continued and all(b > meta.batch_id for b in continued)
    # Old state intact, new events added: each key's last count, list length and map value
    # are those of all five batches (computed from the input alone).
    events = _rows(d, range(5))
    last: dict[int, int] = {}
    for b in sorted(continued):
        for g, c in continued[b]:
            if c >= 0:
                last[g] = c
    assert last
    for g, c in last.items():
        mine = [r["v"] for r in events if r["v"] == g]
        ones = [v for v in mine if v % 3 == 1]
        assert c == len(mine) * 1_000_000 + len(mine) * 100 + (ones[-1] if ones else -2), g
    # And exactly once: the split run emitted what one run of the widened query emits.
    full = run(spark, lambda s, _d: (mod.after(s), "update"), d, tmp_path / "ck3", confs=rocksdb)
    assert_exactly_once(first, continued, full)


FMGWS_QUERIES = (
    """
import pandas as pd
from pyspark.sql.streaming.state import GroupStateTimeout

"""
    + QUERY_SOURCE
    + '''

def out(key, n, tag, total):
    return pd.DataFrame({{"k": [key[0]], "n": [n], "tag": [tag], "total": [total]}})


def count_per_key(key, pdfs, state):
    n = state.get[0] if state.exists else 0
    for pdf in pdfs:
        n += len(pdf)
    state.update((n,))
    yield out(key, n, None, None)


def tagged_count_per_key(key, pdfs, state):
    """The user state gains a field: an old key reads it as null, then writes "new"."""
    old = state.get if state.exists else None
    n = old[0] if old else 0
    for pdf in pdfs:
        n += len(pdf)
    state.update((n, "new"))
    yield out(key, n, old[1] if old else "fresh", None)


def count_and_total(key, pdfs, state):
    n, total = state.get if state.exists else (0, 0)
    for pdf in pdfs:
        n, total = n + len(pdf), total + int(pdf["v"].sum())
    state.update((n, total))
    yield out(key, n, None, total)


def tagged_count_and_total(key, pdfs, state):
    """A field inserted between the stored two: matched by name, the stored total kept."""
    old = state.get if state.exists else None
    n, tag, total = old if old else (0, "fresh", 0)
    for pdf in pdfs:
        n, total = n + len(pdf), total + int(pdf["v"].sum())
    state.update((n, "new", total))
    yield out(key, n, tag, total)


def build(spark, fn, state_schema):
    return src(spark).groupBy("k").applyInPandasWithState(
        fn, "k string, n long, tag string, total long", state_schema, "update",
        GroupStateTimeout.NoTimeout,
    )


def before(spark):
    return build(spark, count_per_key, "n long")


def after(spark):
    return build(spark, tagged_count_per_key, "n long, tag string")


def before_total(spark):
    return build(spark, count_and_total, "n long, total long")


def after_mid(spark):
    return build(spark, tagged_count_and_total, "n long, tag string, total long")
'''
)


@pytest.mark.spark
@pytest.mark.parametrize(
    ("before", "after"),
    [("before", "after"), ("before_total", "after_mid")],
    ids=["field-at-the-end", "field-in-the-middle"],
)
def test_apply_in_pandas_with_state_user_state_gains_a_field_and_continues(
    spark, tmp_path, before, after
):
    """``struct<n>`` gains ``tag`` at the end; ``struct<n, total>`` gains it in the middle,
    where the stored ``total`` is matched by name and keeps summing."""
    hdfs = {"spark.sql.streaming.stateStore.providerClass": PROVIDERS["hdfs"]}
    c = _restore_changed_and_continue(
        spark,
        tmp_path,
        FMGWS_QUERIES,
        confs=hdfs,
        backend="rocksdb",
        before_fn=before,
        after_fn=after,
    )
    plan, rows, d = c.plan, c.rows, c.d
    assert any("(tag): added, starts null" in n for n in plan.evolved), plan.evolved
    firsts: dict[str, tuple] = {}
    lasts: dict[str, tuple[int, int | None]] = {}
    for k, n, tag, total in rows:
        firsts.setdefault(k, (n, tag))
        lasts[k] = (n, total)
    old, all_rows = _rows(d, range(3)), _rows(d, range(5))
    old_keys = {r["k"] for r in old}
    for k, (n, total) in lasts.items():
        mine = [r for r in all_rows if r["k"] == k]
        assert n == len(mine), k  # the old counts continued
        if after == "after_mid":  # the stored total, read by name past the inserted field
            assert total == sum(r["v"] for r in mine), k
    # An old key's first update reads the added field as null (None); a new key has no state.
    assert all(tag is None for k, (_n, tag) in firsts.items() if k in old_keys)
    assert all(tag == "fresh" for k, (_n, tag) in firsts.items() if k not in old_keys)


@pytest.mark.parametrize(
    ("stored", "query", "moved"),
    [
        # groupBy("a", "b") restored into groupBy("b", "a"): a pure reorder.
        ((("a", "string"), ("b", "string")), (("b", "string"), ("a", "string")), r"field 0 \(b\)"),
        # One stored name moved, another renamed: still not clear which value is which.
        (
            (("k", "integer"), ("n", "long"), ("m", "long")),
            (("k", "integer"), ("total", "long"), ("n", "long")),
            r"field 2 \(n\) is stored field 1",
        ),
    ],
)
def test_a_stored_field_moved_to_another_position_is_refused(stored, query, moved):
    """By position (Spark's rule) the moved field would take its neighbour's value."""
    for part in ("key", "value"):
        with pytest.raises(Refused, match=rf"{part} {moved}.*reordered struct is ambiguous"):
            evolve_table(
                struct(*stored) if part == "key" else struct(("k", "integer")),
                struct(*stored) if part == "value" else struct(("v", "long")),
                struct(*query) if part == "key" else struct(("k", "integer")),
                struct(*query) if part == "value" else struct(("v", "long")),
            )


def test_repeated_names_stay_matched_by_position():
    """Aggregation buffers repeat names (count(*), sum(v), avg(v): count, sum, sum, count);
    a repeated name says nothing about which field is which."""
    buffers = struct(("count", "long"), ("sum", "long"), ("sum", "double"), ("count", "long"))
    evo = evolve_table(struct(("k", "string")), buffers, struct(("k", "string")), buffers)
    assert evo.key is None and evo.value is None and evo.notes == []


def test_renamed_fields_in_place_stay_matched_by_position():
    evo = evolve_table(
        struct(("a", "string"), ("b", "long")),
        struct(("v", "long")),
        struct(("x", "string"), ("b", "long")),
        struct(("v", "long")),
    )
    assert evo.notes == ["key field 0 (x): renamed a -> x, matched by position"]


KEY_WIDENING_QUERIES = '''
import pyspark.sql.functions as F

INPUT = {input!r}


def src(spark, key_type, delay="10 seconds"):
    """The events with the key kk = v (0..8) as key_type: int before, bigint after."""
    return (
        spark.readStream.schema("id long, k string, v long, ts timestamp")
        .option("maxFilesPerTrigger", 1)
        .json(INPUT)
        .withColumn("kk", F.col("v").cast(key_type))
        .withWatermark("ts", delay)
    )


def sessions(spark, key_type):
    # Batches are 8 s apart, 0..4 s within one: with a 7 s gap kk 8's events at 19 s (batch 2)
    # and 25 s (batch 3) are one session across the savepoint, closed by the last watermark.
    return src(spark, key_type, "2 seconds").groupBy(F.session_window("ts", "7 seconds"), "kk")


def session(spark, key_type):
    return sessions(spark, key_type).agg(F.count("*").alias("count"), F.sum("v").alias("total"))


def session_top(spark, key_type):
    """The count kept (moved), the total removed, max(v) added."""
    return sessions(spark, key_type).agg(F.max("v").alias("top"), F.count("*").alias("count"))


def window(spark, key_type):
    # Window [20 s, 30 s) of kk 4 counts events of batches 2 and 3; the last watermark closes it.
    return src(spark, key_type, "2 seconds").groupBy(F.window("ts", "10 seconds"), "kk").count()


def join(spark, key_type):
    # Right events up to 10 s after a left one: batch b's right rows meet batch b - 1's left.
    left = src(spark, key_type).selectExpr("kk as lk", "id as lid", "ts as lts")
    right = src(spark, key_type).selectExpr("kk as rk", "k as rv", "ts as rts")
    return left.join(right, F.expr("lk = rk AND rts BETWEEN lts AND lts + interval 10 seconds"))


def dedup(spark, key_type):
    # 12 of the 20 (kk, id) pairs of batches 3 and 4 were seen before the savepoint.
    return src(spark, key_type).dropDuplicates(["kk", "id"])


def dedupwm(spark, key_type):
    return src(spark, key_type).dropDuplicatesWithinWatermark(["kk", "id"])


def before(spark):
    return {kind}(spark, "int")


def after(spark):
    """The key widened from int to bigint (and the aggregates changed: {after})."""
    return {after}(spark, "bigint")
'''

# (kind, source backend, target backend, join state format): the source runs at 2 partitions,
# the restore writes 3.
KEY_WIDENING = [
    ("session", "hdfs", "rocksdb", None),
    ("session", "rocksdb", "hdfs", None),
    ("window", "rocksdb", "hdfs", None),
    ("dedup", "hdfs", "rocksdb", None),
    ("dedupwm", "rocksdb", "hdfs", None),
    ("join", "hdfs", "hdfs", 2),
    ("join", "rocksdb", "rocksdb", 3),
    ("join", "rocksdb", "rocksdb", 4),
]


def _join_reference(events: list[dict]) -> list[tuple]:
    """Every pair the join emits over all the input, from the input alone."""
    pairs = []
    for left in events:
        for right in events:
            lts, rts = dt.datetime.fromisoformat(left["ts"]), dt.datetime.fromisoformat(right["ts"])
            if left["v"] == right["v"] and lts <= rts <= lts + dt.timedelta(seconds=10):
                pairs.append(
                    (left["v"], left["id"], left["ts"], right["v"], right["k"], right["ts"])
                )
    return sorted(pairs)


@pytest.mark.spark
@pytest.mark.parametrize(("kind", "src_backend", "dst_backend", "join_format"), KEY_WIDENING)
def test_a_widened_key_is_placed_by_the_new_key_and_continues(
    spark, tmp_path, kind, src_backend, dst_backend, join_format
):
    """A key widened int -> bigint: every store's keys (a session's grouping columns and start,
    a join's keyToNumValues and keyWithIndexToValue on both sides, at state formats 2, 3 and 4)
    converted, and placed by the bigint key at another partition count; the continued query
    emits what one uninterrupted run of the changed query emits."""
    assert _placed_elsewhere_when_widened(list(range(9)), 3) >= 3
    confs = {"spark.sql.streaming.stateStore.providerClass": PROVIDERS[src_backend]}
    if join_format:
        confs[FORMAT_CONF] = str(join_format)
    c = _restore_changed_and_continue(
        spark,
        tmp_path,
        KEY_WIDENING_QUERIES,
        mode="append",
        confs=confs,
        backend=dst_backend,
        kind=kind,
        after=kind,
    )
    (op,) = c.meta.operators
    assert op.partitions == 2
    plan, first, continued, d, mod = c.plan, c.first, c.continued, c.d, c.mod
    assert plan.restored == {op.uid: 0} and plan.join_state_format == join_format
    widened = [n for n in plan.evolved if n.endswith("widened integer -> long")]
    # Every store's key, and the value rows that repeat it (a session's, a join side's).
    assert len(widened) == {"join": 6, "session": 2}.get(kind, 1), plan.evolved
    assert any(continued.values())
    full = run(spark, lambda s, _d: (mod.after(s), "append"), d, tmp_path / "ck3", confs=confs)
    assert_exactly_once(first, continued, full)
    emitted = [r for part in (first, continued) for rows in part.values() for r in rows]
    events = _rows(d, range(5))
    if kind == "join":
        # Restored left rows met new right rows: the pairs across the savepoint are there.
        assert sorted(emitted) == _join_reference(events)
    elif kind == "dedup":  # (id, k, v, ts, kk): each (kk, id) once, old ones not again
        assert sorted((r[4], r[0]) for r in emitted) == sorted({(e["v"], e["id"]) for e in events})
    elif kind == "session":
        assert session_merged_across_restore([r for rows in continued.values() for r in rows])


@pytest.mark.spark
def test_a_session_window_gains_and_loses_aggregates_and_continues(spark, tmp_path):
    """A session window's value holds its grouping columns and the buffers: the key widened,
    count kept (moved), sum dropped, max added. Restored sessions keep their counts, and the
    added max covers only the events after the savepoint (computed from the input alone)."""
    hdfs = {"spark.sql.streaming.stateStore.providerClass": PROVIDERS["hdfs"]}
    c = _restore_changed_and_continue(
        spark,
        tmp_path,
        KEY_WIDENING_QUERIES,
        mode="append",
        confs=hdfs,
        backend="rocksdb",
        kind="session",
        after="session_top",
    )
    (uid,) = [op.uid for op in c.meta.operators]
    assert c.plan.evolved == [
        f"uid {uid}: key field 0 (kk): widened integer -> long",
        f"uid {uid}: value field 1 (kk): widened integer -> long",
        f"uid {uid}: value: max(v) added, starts at null (Spark's initial value)",
        f"uid {uid}: value: count(1) kept, moved from field 2",
        f"uid {uid}: value: stored buffer field 3 (sum) dropped (no aggregate of the query "
        "owns it)",
    ]
    d, continued = c.d, c.continued
    rows = [r for part in continued.values() for r in part]
    assert session_merged_across_restore(rows)
    events = _rows(d, range(5))
    new = _rows(d, range(3, 5))
    for (start, end), kk, top, count in rows:

        def within(e, start=start, end=end, kk=kk):
            return e["v"] == kk and start <= e["ts"] < end

        assert count == sum(1 for e in events if within(e)), (start, kk)
        assert top == max((e["v"] for e in new if within(e)), default=None), (start, kk)


AMBIGUOUS_SESSION_QUERY = '''
import pyspark.sql.functions as F

from fixtures.generate import events


def two_counts(spark):
    """fixtures/generate.py's q_session counting rows and values: two buffers named count."""
    df = events(spark, {input!r}).withWatermark("ts", "15 seconds")
    return df.groupBy(F.session_window("ts", "5 seconds"), "k").agg(
        F.count("*").alias("count"), F.count("v").alias("values")
    )
'''


@pytest.mark.spark
def test_an_ambiguous_session_window_buffer_is_refused_with_the_field(tmp_path):
    """Which of two count aggregates owns the stored count is a guess: refused at plan time,
    exit 2, one line naming the field and both aggregates; nothing written."""
    q = tmp_path / "ambiguous.py"
    q.write_text(AMBIGUOUS_SESSION_QUERY.format(input=str(tmp_path / "no-input")))
    sp_url, _ = take_savepoint(str(FIXTURES / "session-hdfs"), str(tmp_path / "sp"))
    target = tmp_path / "ck"
    proc = cli("restore", "-s", sp_url, str(target), "--query", f"{q}:two_counts", "--dry-run")
    assert proc.returncode == 2, proc.stderr
    errors = [ln for ln in proc.stderr.splitlines() if ln.startswith("statectl: error:")]
    assert len(errors) == 1, proc.stderr
    assert (
        "stored field 2 (count) matches both count(1) and count(v); which one owns it is "
        "ambiguous" in errors[0]
    ), errors[0]
    assert not target.exists()


TWS_TTL_KEY_QUERIES = '''
import pandas as pd
import pyspark.sql.functions as F
from pyspark.sql.streaming import StatefulProcessor
from pyspark.sql.types import LongType, StringType, StructField, StructType

INPUT = {input!r}
HOUR = 3_600_000


class Processor(StatefulProcessor):
    """Value, list and map state, each with TTL (an hour: nothing expires in the test), so
    $ttl_cnt, $ttl_lst (with $min_lst, $count_lst) and $ttl_mp all hold the grouping key."""

    def init(self, handle):
        long_ = StructType([StructField("n", LongType())])
        self.cnt = handle.getValueState("cnt", long_, ttlDurationMs=HOUR)
        self.lst = handle.getListState("lst", long_, ttlDurationMs=HOUR)
        self.mp = handle.getMapState(
            "mp", StructType([StructField("mk", StringType())]), long_, ttlDurationMs=HOUR
        )

    def handleInputRows(self, key, rows, timerValues):
        n = 0
        for pdf in rows:
            for id_ in pdf["id"]:
                self.lst.appendValue((int(id_),))
                self.mp.updateValue((str(id_),), (int(id_),))
                n += 1
        c = (self.cnt.get()[0] if self.cnt.exists() else 0) + n
        self.cnt.update((c,))
        live = sum(1 for _ in self.lst.get())
        ids = sum(1 for _ in self.mp.keys())
        yield pd.DataFrame({{"g": [int(key[0])], "c": [c * 1_000_000 + live * 1000 + ids]}})

    def close(self):
        pass


def build(key_type):
    def query(spark):
        return (
            spark.readStream.schema("id long, k string, v long, ts timestamp")
            .option("maxFilesPerTrigger", 1)
            .json(INPUT)
            .withColumn("g", F.col("v").cast(key_type))
            .groupBy("g")
            .transformWithStateInPandas(
                Processor(), outputStructType="g long, c long", outputMode="Update",
                timeMode="ProcessingTime",
            )
        )

    return query


before = build("int")
after = build("bigint")  # the grouping key widened
'''


def _once_per_file(spark, query, d, ckpt, batches: range, confs: dict | None = None) -> dict:
    """One trigger(once) run per input file of ``batches``, each file added just before (trigger
    once reads all there is). TTL needs ProcessingTime mode, which always has another batch to
    run: availableNow would not end. The query's output by batch id."""
    staged = d.parent / f"{d.name}-staged"
    staged.mkdir(exist_ok=True)
    names = [f"part-{b:03d}.json" for b in batches]
    for name in names:
        (d / name).rename(staged / name)  # rename keeps the modification time
    out: dict[int, list] = {}
    for name in names:
        (staged / name).rename(d / name)
        out |= run(spark, lambda s, _d: (query(s), "update"), d, ckpt, confs=confs, once=True)
    return out


@pytest.mark.spark
def test_transform_with_state_ttl_grouping_key_widens_and_continues(spark, tmp_path):
    """The TTL indexes ($ttl_ of a value, a list and a map, a list's $min_ and $count_) are
    re-keyed with the state: the widened query continues at 3 partitions like one run of it."""
    d = tmp_path / "input"
    _write_in_order(d, 0, 3, time.time() - 10)
    queries = tmp_path / "tws_ttl_queries.py"
    queries.write_text(TWS_TTL_KEY_QUERIES.format(input=str(d)))
    mod = _load(queries)
    rocksdb = {"spark.sql.streaming.stateStore.providerClass": PROVIDERS["rocksdb"]}
    first = _once_per_file(spark, mod.before, d, tmp_path / "ck1", range(3), rocksdb)
    sp_url, meta = take_savepoint(str(tmp_path / "ck1"), str(tmp_path / "sp"))
    (op,) = meta.operators
    assert {"$ttl_cnt", "$ttl_lst", "$ttl_mp", "$min_lst", "$count_lst"} <= {
        cf["name"] for cf in op.column_families
    }
    plan = restore(
        sp_url, str(tmp_path / "ck2"), query=f"{queries}:after", spark=spark, partitions=3
    )
    assert not plan.problems, plan.problems
    assert plan.evolved == [f"uid {op.uid}: grouping key field 0 (g): widened integer -> long"]
    _write_in_order(d, 3, 2)
    continued = _once_per_file(spark, mod.after, d, tmp_path / "ck2", range(3, 5))
    assert continued and all(b > meta.batch_id for b in continued)
    full = _once_per_file(spark, mod.after, d, tmp_path / "ck3", range(5), rocksdb)
    assert_exactly_once(first, continued, full)
    # From the input alone: each key's count, live list length and distinct ids over all five.
    events = _rows(d, range(5))
    last = {g: c for b in sorted(continued) for g, c in continued[b]}
    for g, c in last.items():
        mine = [e["id"] for e in events if e["v"] == g]
        assert c == len(mine) * 1_000_000 + len(mine) * 1000 + len(set(mine)), g


TWS_TTL_VALUE_QUERIES = '''
import pandas as pd
from pyspark.sql.streaming import StatefulProcessor
from pyspark.sql.types import LongType, StringType, StructField, StructType

INPUT = {input!r}
HOUR = 3_600_000
BRIEF = 1_000  # long expired when the restored query's first batch runs


def schema(name, tagged):
    fields = [StructField(name, LongType())]
    return StructType(fields + [StructField("tag", StringType())] if tagged else fields)


class Processor(StatefulProcessor):
    """Value, list and map state with TTL (an hour), a value with a brief TTL and one
    without TTL. ``TAGGED`` (the changed query): each of their structs gains a string tag,
    which the restored values read as null and the changed query writes as "new"."""

    TAGGED = False
    CNT_TTL = HOUR

    def init(self, handle):
        t = self.TAGGED
        self.cnt = handle.getValueState("cnt", schema("c", t), ttlDurationMs=self.CNT_TTL)
        self.lst = handle.getListState("lst", schema("v", t), ttlDurationMs=HOUR)
        self.mp = handle.getMapState(
            "mp", StructType([StructField("ts", StringType())]), schema("v", t),
            ttlDurationMs=HOUR,
        )
        self.brief = handle.getValueState("brief", schema("b", t), ttlDurationMs=BRIEF)
        self.plain = handle.getValueState("plain", schema("n", t))

    def _row(self, value):
        return (value, "new") if self.TAGGED else (value,)

    def _count(self, state, n):
        old = state.get() if state.exists() else None
        return (old[0] if old else 0) + n, (old[1] if self.TAGGED and old else None)

    def handleInputRows(self, key, rows, timerValues):
        pdf = pd.concat(list(rows))
        c, tag = self._count(self.cnt, len(pdf))
        pn, ptag = self._count(self.plain, len(pdf))
        untagged = 1000 * sum(1 for e in self.lst.get() if len(e) == 1 or e[1] is None)
        untagged += sum(1 for e in self.mp.values() if len(e) == 1 or e[1] is None)
        brief = int(self.brief.exists())
        for v, ts in zip(pdf["v"], pdf["ts"]):
            self.lst.appendValue(self._row(int(v)))
            self.mp.updateValue((str(ts),), self._row(int(v)))
        self.cnt.update(self._row(c))
        self.plain.update(self._row(pn))
        self.brief.update(self._row(1))
        yield pd.DataFrame({{
            "k": [key[0]], "c": [c], "tag": [tag], "pn": [pn], "ptag": [ptag],
            "untagged": [untagged], "brief": [brief],
        }})

    def close(self):
        pass


class Tagged(Processor):
    TAGGED = True


class Untimed(Tagged):
    CNT_TTL = None  # cnt's TTL dropped: refused


def build(processor):
    def query(spark):
        return (
            spark.readStream.schema("id long, k string, v long, ts timestamp")
            .json(INPUT)
            .groupBy("k")
            .transformWithStateInPandas(
                processor(),
                outputStructType=(
                    "k string, c long, tag string, pn long, ptag string, untagged long, "
                    "brief long"
                ),
                outputMode="Update", timeMode="ProcessingTime",
            )
        )

    return query


before, after, untimed = build(Processor), build(Tagged), build(Untimed)
'''


def _ttl_value_reference(d, batch_ms: dict[int, int], before_ms: int) -> dict[int, list]:
    """The changed query's output per continued batch (one input file each, 3 and 4), from
    the input and the batch times alone: counts over every file; the tags the restored values
    read (null) and the changed query wrote ("new"); the restored list elements and map
    entries (untagged: an hour's TTL, none expired); the brief value live only before its
    expiry, the batch time it was written + 1 s (Spark's StateTTL.isExpired: expired once the
    batch time reaches it), the restored ones at their original expiry."""
    restored = _rows(d, range(3))
    written = {r["k"]: before_ms for r in restored}
    out = {}
    for batch, f in zip(sorted(batch_ms), (3, 4), strict=True):
        now, rows = batch_ms[batch], []
        for k in sorted({r["k"] for r in _rows(d, [f])}):
            c = sum(1 for r in _rows(d, range(f + 1)) if r["k"] == k)
            tag = "new" if any(r["k"] == k for r in _rows(d, range(3, f))) else None
            mine = [r for r in restored if r["k"] == k]
            untagged = 1000 * len(mine) + len({r["ts"] for r in mine})
            brief = int(k in written and now < written[k] + 1_000)
            rows.append((k, c, tag, c, tag, untagged, brief))
            written[k] = now
        out[batch] = rows
    return out


@pytest.mark.spark
@pytest.mark.parametrize("encoding", ["unsaferow", "avro"])
def test_transform_with_state_ttl_value_gains_a_field_and_continues(spark, tmp_path, encoding):
    """Value, list and map state with TTL, a brief TTL and no TTL gain a field: restored with
    --query, every value keeps its meaning and its original expiry and reads the new field as
    null, under either encoding (Avro: re-encoded in the query's schema)."""
    d = tmp_path / "input"
    _write_in_order(d, 0, 3, time.time() - 10)
    queries = tmp_path / "tws_ttl_value_queries.py"
    queries.write_text(TWS_TTL_VALUE_QUERIES.format(input=str(d)))
    mod = _load(queries)
    confs = {"spark.sql.streaming.stateStore.providerClass": PROVIDERS["rocksdb"]}
    confs[ENCODING_CONF] = encoding
    # ProcessingTime mode (TTL) never ends availableNow: trigger once reads the 3 files at once.
    run(spark, lambda s, _d: (mod.before(s), "update"), d, tmp_path / "ck1", confs=confs, once=True)
    before_ms = Checkpoint.open(str(tmp_path / "ck1")).offsets(0).batch_timestamp_ms
    sp_url, meta = take_savepoint(str(tmp_path / "ck1"), str(tmp_path / "sp"))
    (uid,) = [op.uid for op in meta.operators]
    plan = restore(
        sp_url, str(tmp_path / "ck2"), query=f"{queries}:after", spark=spark, partitions=3
    )
    assert not plan.problems, plan.problems
    assert sorted(plan.evolved) == [
        f"uid {uid} state variable {var!r}: value field 1 (tag): added, starts null"
        for var in sorted(("cnt", "lst", "mp", "brief", "plain"))
    ]
    assert meta.pinned_confs.get(ENCODING_CONF, "unsaferow") == encoding
    if encoding == "unsaferow":  # (the reason does not depend on the encoding)
        refused = restore(
            sp_url,
            str(tmp_path / "ck-untimed"),
            query=f"{queries}:untimed",
            spark=spark,
            partitions=3,
            dry_run=True,
        )
        assert any(
            "restore cannot evolve it: state variable 'cnt': value: the savepoint keeps it with "
            "TTL (each value has its ttlExpirationMs), the query without" in p
            for p in refused.problems
        ), refused.problems
    else:  # The Spark engine converts the values before its shuffle: the same entries.
        restore(
            sp_url,
            str(tmp_path / "ck-engine"),
            query=f"{queries}:after",
            spark=spark,
            partitions=3,
            engine=SparkEngine(spark),
        )
        assert entries_by_family(Checkpoint.open(str(tmp_path / "ck-engine"))) == (
            entries_by_family(Checkpoint.open(str(tmp_path / "ck2")))
        )
    # Spark's reader sees each restored value as the query keeps it: the tag null, the expiry
    # the one Spark gave it in the first run (its batch time + the TTL).
    counts: dict[str, int] = {}
    for r in _rows(d, range(3)):
        counts[r["k"]] = counts.get(r["k"], 0) + 1
    for var, ttl, value in (("cnt", 3_600_000, counts.get), ("brief", 1_000, lambda _k: 1)):
        df = (
            spark.read.format("statestore")
            .option("operatorId", 0)
            .option("stateVarName", var)
            .load(str(tmp_path / "ck2"))
        )
        assert sorted(spark_rows(df.select("key.k", "value"))) == sorted(
            (k, ((value(k), None), before_ms + ttl)) for k in counts
        ), var
    batches = {}
    for f in (3, 4):
        _write_in_order(d, f, 1)
        batches |= run(
            spark, lambda s, _d: (mod.after(s), "update"), d, tmp_path / "ck2", once=True
        )
    assert sorted(batches) == [meta.batch_id + 1, meta.batch_id + 2]
    ck2 = Checkpoint.open(str(tmp_path / "ck2"))
    batch_ms = {b: ck2.offsets(b).batch_timestamp_ms for b in batches}
    assert batches == _ttl_value_reference(d, batch_ms, before_ms)

"""State formats 1 and 2 of streaming aggregations
(``spark.sql.streaming.aggregation.stateFormatVersion``) and of flatMapGroupsWithState /
applyInPandasWithState (``spark.sql.streaming.flatMapGroupsWithState.stateFormatVersion``).

An aggregation's format 1 value is the grouping columns then the buffers, format 2's the
buffers alone; a group state's format 1 value is the state's fields, format 2's
``struct<groupState: struct<the fields>>``. Spark pins the format in the checkpoint and never
converts it; ``restore`` / ``migrate --aggregation-state-format`` / ``--group-state-format``
do, and (Spark tier) the query continues from the converted state with the output of an
uninterrupted run.
"""

from __future__ import annotations

import json

import pytest

from statectl.checkpoint.model import Checkpoint
from statectl.evolution import Refused
from statectl.operators import AGG_FORMAT_CONF, GROUP_STATE_FORMAT_CONF
from statectl.restoration import migrate, restore
from statectl.savepoints.create import take_savepoint
from statectl.state import Selection, read_state
from statectl.state_formats import aggregation_format_conversion, group_state_format_conversion
from tests.helpers.fixtures import FIXTURES
from tests.helpers.restore import assert_exactly_once
from tests.helpers.rows import arrow_rows
from tests.helpers.spark import run, write_input

KEY = json.dumps({"type": "struct", "fields": [{"name": "k", "type": "string", "nullable": True}]})
BUFFERS = [
    {"name": "count", "type": "long", "nullable": False},
    {"name": "sum", "type": "double", "nullable": True},
]
V2 = json.dumps({"type": "struct", "fields": BUFFERS})
V1 = json.dumps({"type": "struct", "fields": [json.loads(KEY)["fields"][0], *BUFFERS]})


def test_conversion_moves_the_grouping_columns_in_and_out_of_the_value():
    to_2 = aggregation_format_conversion(KEY, V1, 1, 2)
    assert json.loads(to_2.new_schema)["fields"] == BUFFERS
    to_1 = aggregation_format_conversion(KEY, V2, 2, 1)
    assert json.loads(to_1.new_schema) == json.loads(V1)
    with pytest.raises(Refused, match="does not start with the grouping columns"):
        aggregation_format_conversion(KEY, V2, 1, 2)


def test_group_state_conversion_nests_and_flattens_the_state():
    state = [{"name": "n", "type": "long", "nullable": True, "metadata": {}}]
    v1 = json.dumps({"type": "struct", "fields": state})
    to_2 = group_state_format_conversion(v1, 1, 2)
    (group,) = json.loads(to_2.new_schema)["fields"]
    assert group["name"] == "groupState" and group["type"]["fields"] == state
    assert json.loads(group_state_format_conversion(to_2.new_schema, 2, 1).new_schema) == {
        "type": "struct",
        "fields": state,
    }
    timed = json.dumps(
        {"type": "struct", "fields": [*state, {"name": "timeoutTimestamp", "type": "integer"}]}
    )
    with pytest.raises(Refused, match="timeout"):
        group_state_format_conversion(timed, 1, 2)


def _state(path) -> list:
    ckpt = Checkpoint.open(str(path))
    return sorted(arrow_rows(read_state(ckpt, Selection(0)).drop_columns(["partition_id"])))


@pytest.mark.parametrize("backend", ["hdfs", "rocksdb"])
def test_format_1_to_2_and_back_restores_the_same_rows(tmp_path, backend):
    """agg-v1 -> format 2 (the value loses ``k``) -> format 1 again: the round trip gives the
    fixture's rows back, each restore pins the format it wrote and says what it converted."""
    url, _ = take_savepoint(str(FIXTURES / "agg-v1-hdfs"), str(tmp_path / "sp1"))
    plan = restore(
        url, str(tmp_path / "v2"), backend=backend, partitions=3, aggregation_state_format=2
    )
    assert not plan.problems
    assert plan.conversions == [
        "uid stateStoreSave-0f37fbbc (stateStoreSave): streaming aggregation state format 1 -> 2 "
        "(the grouping columns leave the value)"
    ]
    v2 = Checkpoint.open(str(tmp_path / "v2"))
    assert v2.offsets(v2.latest_committed_batch).conf[AGG_FORMAT_CONF] == "2"
    original = _state(FIXTURES / "agg-v1-hdfs")
    assert [(k, v[1:]) for k, v in original] == _state(tmp_path / "v2")
    url2, _ = take_savepoint(str(tmp_path / "v2"), str(tmp_path / "sp2"))
    plan = restore(url2, str(tmp_path / "v1"), partitions=2, aggregation_state_format=1)
    assert not plan.problems and _state(tmp_path / "v1") == original


def test_group_state_format_1_to_2_and_back_restores_the_same_rows(tmp_path):
    """fmgws-v1 (applyInPandasWithState at format 1) -> format 2 (nested in groupState) ->
    format 1: the fixture's rows come back; each restore pins what it wrote."""
    url, _ = take_savepoint(str(FIXTURES / "fmgws-v1-rocksdb"), str(tmp_path / "sp1"))
    plan = restore(url, str(tmp_path / "v2"), backend="hdfs", partitions=3, group_state_format=2)
    assert not plan.problems and plan.conversions == [
        "uid applyInPandasWithState-b5115c06 (applyInPandasWithState): flatMapGroupsWithState / "
        "applyInPandasWithState state format 1 -> 2 (the state's fields nest in groupState)"
    ]
    v2 = Checkpoint.open(str(tmp_path / "v2"))
    assert v2.offsets(v2.latest_committed_batch).conf[GROUP_STATE_FORMAT_CONF] == "2"
    original = _state(FIXTURES / "fmgws-v1-rocksdb")
    assert [(k, (v,)) for k, v in original] == _state(tmp_path / "v2")
    url2, _ = take_savepoint(str(tmp_path / "v2"), str(tmp_path / "sp2"))
    plan = restore(url2, str(tmp_path / "v1"), backend="rocksdb", group_state_format=1)
    assert not plan.problems and _state(tmp_path / "v1") == original


def test_conversion_is_refused_where_it_cannot_apply(tmp_path):
    """Not an aggregation, together with --query's changes, or an unknown format: refused
    at plan time with the reason; the format a savepoint already has is no conversion."""
    url, _ = take_savepoint(str(FIXTURES / "dedup-hdfs"), str(tmp_path / "sp"))
    plan = restore(url, str(tmp_path / "t"), aggregation_state_format=1, dry_run=True)
    assert plan.problems == [
        "--aggregation-state-format: the restore has no streaming aggregation operator to convert"
    ]
    url, _ = take_savepoint(str(FIXTURES / "agg-hdfs"), str(tmp_path / "sp2"))
    plan = restore(url, str(tmp_path / "t"), aggregation_state_format=2, dry_run=True)
    assert not plan.problems and plan.conversions == []
    with pytest.raises(Exception, match="must be 1 or 2"):
        restore(url, str(tmp_path / "t"), aggregation_state_format=3, dry_run=True)
    plan = restore(url, str(tmp_path / "t"), group_state_format=1, dry_run=True)
    assert plan.problems == [
        "--group-state-format: the restore has no flatMapGroupsWithState / "
        "applyInPandasWithState operator to convert"
    ]


def test_migrate_converts_on_the_savepoint_path(tmp_path):
    """migrate's pass-through carries bytes unchanged, so a converted aggregation takes the
    savepoint path, and the target equals restore's."""
    plan, _ = migrate(
        str(FIXTURES / "agg-hdfs"), str(tmp_path / "m"), partitions=3, aggregation_state_format=1
    )
    assert not plan.passthrough and plan.conversions
    url, _ = take_savepoint(str(FIXTURES / "agg-hdfs"), str(tmp_path / "sp"))
    restore(url, str(tmp_path / "r"), partitions=3, aggregation_state_format=1)
    assert _state(tmp_path / "m") == _state(tmp_path / "r")
    assert [len(v) for _, v in _state(tmp_path / "m")][:1] == [5]  # k + 4 buffers


@pytest.mark.spark
@pytest.mark.parametrize(
    ("case", "conf", "source", "target", "src_backend", "dst_backend"),
    [
        ("agg", AGG_FORMAT_CONF, 1, 2, "hdfs", "rocksdb"),
        ("agg", AGG_FORMAT_CONF, 2, 1, "rocksdb", "hdfs"),
        ("fmgws", GROUP_STATE_FORMAT_CONF, 1, 2, "rocksdb", "hdfs"),
        ("fmgws", GROUP_STATE_FORMAT_CONF, 2, 1, "hdfs", "rocksdb"),
    ],
    ids=["agg-1-to-2", "agg-2-to-1", "fmgws-1-to-2", "fmgws-2-to-1"],
)
def test_converted_state_continues_like_an_uninterrupted_run(
    spark, tmp_path, case, conf, source, target, src_backend, dst_backend
):
    """Written at one format, restored at the other (another backend, 3 partitions), the
    query continues on Spark 4.3 at the restored pin: what the first and the restored run
    emitted together is what one uninterrupted run at the source's format emitted. A value
    at the wrong format would misread every buffer (or the user's state)."""
    d = tmp_path / "input"
    write_input(d, 0, 3)
    confs = {conf: str(source)}
    first = run(spark, case, d, tmp_path / "ck1", src_backend, confs)
    url, meta = take_savepoint(str(tmp_path / "ck1"), str(tmp_path / "sp"))
    flag = "aggregation_state_format" if conf == AGG_FORMAT_CONF else "group_state_format"
    plan = restore(url, str(tmp_path / "ck2"), backend=dst_backend, partitions=3, **{flag: target})
    assert not plan.problems and plan.conversions
    write_input(d, 3, 2)
    continued = run(spark, case, d, tmp_path / "ck2")
    full = run(spark, case, d, tmp_path / "ck3", src_backend, confs)
    assert all(b > meta.batch_id for b in continued) and any(continued.values())
    assert_exactly_once(first, continued, full)
    restored = Checkpoint.open(str(tmp_path / "ck2"))
    last = restored.latest_committed_batch
    assert restored.offsets(last).conf[conf] == str(target)
    assert restored.backend(last) == dst_backend and restored.num_partitions(last) == 3

"""The operator-kind registry: every bundled fixture has a spec; what has none is refused."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from statectl.checkpoint.model import Checkpoint
from statectl.errors import UnsupportedError
from statectl.operators import JOIN_STORES, classify, join_key
from statectl.savepoints.format import seal
from tests.helpers.cli import run_cli
from tests.helpers.fixtures import FIXTURES, load_manifest

EXPECTED = {
    "agg": "aggregation",
    "window": "aggregation",
    "multi": None,  # two operators, checked below
    "dedup": "deduplicate",
    "dedupwm": "deduplicate within watermark",
    "join": "stream-stream join",
    "join3": "stream-stream join (state format 3)",
    "join4": "stream-stream join (state format 4)",
    "fmgws": "flatMapGroupsWithState",
    "tws": "transformWithState",
    "limit": "streaming limit",
    "session": "session window aggregation",
    # the agg query over sources other than files (issue 22): rate, ratev1, pysource
    "rate": "aggregation",
    "pysource": "aggregation",
}


def _case(name: str) -> str:
    base = re.sub(r"^spark\d\d-", "", name)  # older release lines: spark35-, spark40-, ...
    return next(k for k in sorted(EXPECTED, key=len, reverse=True) if base.startswith(k))


@pytest.mark.parametrize("name", sorted({fx["name"] for fx in load_manifest()}))
def test_every_fixture_operator_has_a_restorable_spec(name):
    ckpt = Checkpoint.open(str(FIXTURES / name))
    ops = ckpt.operators(ckpt.latest_committed_batch)
    kinds = {op.operator_id: op.kind for op in ops}
    assert all(k.restorable for k in kinds.values()), kinds
    expected = EXPECTED[_case(name)]
    if expected is None:
        assert [kinds[i].kind for i in sorted(kinds)] == ["aggregation", "deduplicate"]
    elif name.startswith("spark35-") and expected not in ("stream-stream join", "streaming limit"):
        # Spark 3.5 records no operator name; its joins and limits are known by their stores
        # and key schema.
        assert kinds[0].kind.startswith("unknown")
    else:
        assert kinds[0].kind == expected


def test_inspect_shows_the_kind():
    from statectl.inspection import inspect_path

    info = inspect_path(str(FIXTURES / "join-hdfs"), None, rows=False)
    assert info["operators"][0]["kind"] == "stream-stream join"
    assert info["operators"][0]["restorable"] is True
    assert info["operators"][0]["refusal"] is None


def test_inspect_says_why_restore_refuses_an_operator():
    """Spark 3.5's session window: inspect says what restore needs (``--query``)."""
    from statectl.inspection import inspect_path

    (op,) = inspect_path(str(FIXTURES / "spark35-session-hdfs"), None, rows=False)["operators"]
    assert op["restorable"] is False
    assert "restore with --query" in op["refusal"]


KEY = json.dumps({"type": "struct", "fields": [{"name": "k", "type": "string"}]})
SESSION_KEY = json.dumps(
    {
        "type": "struct",
        "fields": [
            {"name": "k", "type": "string"},
            {"name": "session_window", "type": {"type": "struct", "fields": []}},
        ],
    }
)


# What Spark 4 records for session_window(ts, ...) grouped by k: numColsPrefixKey 1.
SESSION_KEY_43 = json.dumps(
    {
        "type": "struct",
        "fields": [
            {"name": "k", "type": "string"},
            {"name": "sessionStartTime", "type": "timestamp"},
        ],
    }
)


@pytest.mark.parametrize(
    ("name", "stores", "kw", "reason"),
    [
        ("notAnOperatorSparkHas", ["default"], {}, "no spec"),
        ("sessionWindowStateStoreSaveExec", ["default"], {}, "must end with sessionStartTime"),
        (
            "sessionWindowStateStoreSaveExec",
            ["default"],
            {"key_schemas": [SESSION_KEY_43], "prefix_columns": [0]},
            "not the number of grouping keys",
        ),
        ("globalLimit", ["default", "other"], {}, "unexpected stores"),
        ("symmetricHashJoin", ["default"], {"column_families": True}, "column families"),
        ("stateStoreSave", ["default"], {"prefix_columns": [1]}, "prefix key"),
        ("stateStoreSave", ["default", "other"], {}, "unexpected stores"),
        ("unknown", ["default"], {"key_schemas": [SESSION_KEY]}, "grouping keys"),
        ("transformWithStateExec", ["default"], {}, "column families"),
    ],
)
def test_unmodelled_kinds_are_refused(name, stores, kw, reason):
    kw.setdefault("column_families", False)
    kind = classify(name, stores, **kw)
    assert not kind.restorable
    with pytest.raises(UnsupportedError, match=reason):
        kind.require_restorable("operator 0")


def test_session_windows_and_limit_have_specs():
    session = classify(
        "sessionWindowStateStoreSaveExec",
        ["default"],
        column_families=False,
        prefix_columns=[1],
        key_schemas=[SESSION_KEY_43],
    )
    assert session.restorable and session.prefix_columns(SESSION_KEY_43) == 1
    limit = classify("globalLimit", ["default"], column_families=False)
    assert limit.restorable and limit.single_partition
    import pyarrow as pa

    key = pa.StructArray.from_arrays([pa.array([None, None], pa.null())], names=["key"])
    # Partition 0 at any count (a whole-key hash of null would give 42 % n).
    assert limit.partitions_of("default", key, 5).tolist() == [0, 0]


def test_modelled_kinds_restore():
    assert classify(
        "stateStoreSave", ["default"], column_families=False, key_schemas=[KEY]
    ).restorable
    assert (
        classify("unknown", list(JOIN_STORES), column_families=False).kind == "stream-stream join"
    )
    assert classify("transformWithStateInPySparkExec", ["default"], column_families=True).restorable


def test_join_placement_drops_the_value_index():
    import pyarrow as pa

    key = pa.StructArray.from_arrays(
        [pa.array(["a"]), pa.array([3], pa.int64())], names=["k", "index"]
    )
    assert join_key("left-keyWithIndexToValue", key).type.names == ["k"]
    assert join_key("left-keyToNumValues", key).type.names == ["k", "index"]


@pytest.mark.parametrize("name", ["notAnOperatorSparkHas", "sessionWindowStateStoreSaveExec"])
def test_restore_refuses_an_unmodelled_kind_at_plan_time(tmp_path, name):
    """A savepoint operator whose kind has no spec fails the plan (dry run and real run alike),
    and nothing is written."""
    from statectl.savepoints.create import take_savepoint

    url, _ = take_savepoint(str(FIXTURES / "agg-hdfs"), str(tmp_path / "sps"))
    sp = url.removeprefix("file://")
    meta_file = Path(sp) / "_metadata"
    meta = json.loads(meta_file.read_text())
    meta["operators"][0]["name"] = name
    meta_file.write_text(json.dumps(seal(meta)))
    for extra in (["--dry-run"], []):
        proc = run_cli("restore", "-s", sp, str(tmp_path / "new"), "--partitions", "3", *extra)
        assert proc.returncode == 2, proc.stdout + proc.stderr
        assert "cannot restore yet" in proc.stderr
        assert not (tmp_path / "new").exists() or not any((tmp_path / "new").iterdir())
    proc = run_cli(
        "restore", "-s", sp, str(tmp_path / "new2"), "-n", "--drop", meta["operators"][0]["uid"]
    )
    assert proc.returncode == 0, proc.stderr

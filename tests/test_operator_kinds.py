"""What statectl does TODAY with the operator kinds it does not model yet (issue 10).

Every fixture marked ``pending`` in fixtures/manifest.json is a kind or state format that Spark
writes and statectl has no spec for. None is left today: streaming limit and session windows
have specs (their placement is pinned below), and join state formats 3 and 4 left this list
with theirs (tests/test_join_formats.py). The generic tests skip pending fixtures
(tests/helpers/fixtures.py ``load_manifest``). This file pins the current behaviour, so that a change
to it is noticed:

* ``statectl inspect --json`` exits 0, or exits 2 with one ``statectl: error:`` line; never a
  traceback;
* for every ``statestore`` read Spark could do when the fixture was written, ``statectl export``
  either equals Spark's rows (recorded by fixtures/generate.py in fixtures/spark-rows/, so no JVM
  is needed here), differs from them, or is refused with a StatectlError: TODAY says which.

When a spec lands and a read starts to equal Spark's rows, this test fails on purpose: update
TODAY, and drop the fixture's ``pending`` mark in fixtures/generate.py (PENDING) and the manifest
once every read and a restore are right. fixtures/README.md explains each layout.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import subprocess
import sys
from typing import Any

import pyarrow as pa
import pytest

from statectl.checkpoint.model import Checkpoint
from statectl.codecs.murmur3 import partition_ids
from statectl.errors import StatectlError
from statectl.operators import GLOBAL_LIMIT, SESSION_WINDOW
from statectl.state import read_state
from tests.helpers.fixtures import FIXTURES, ROOT, load_manifest, recorded_read
from tests.helpers.reads import export_rows, selection
from tests.helpers.rows import arrow_names

PENDING = [fx for fx in load_manifest(include_pending=True) if fx.get("pending")]
KIND_FIXTURES = [fx for fx in load_manifest(include_pending=True) if fx.get("spark_rows")]

EQUAL, DIFFERS, REFUSED = "equal", "differs", "refused"


# What statectl does today, per pending fixture: inspect's exit status, then per read whether
# export equals Spark's rows (EQUAL), differs (DIFFERS) or is refused with a one-line
# StatectlError (REFUSED). Why, and what a spec needs: fixtures/README.md.
TODAY: dict[str, dict[str, Any]] = {
    # Spark 3.5 session windows: no operator metadata, so nothing confirms the kind and its
    # grouping columns. Read (the RocksDB keys prefix-encoded by the grouping columns, as 3.5
    # always writes them) and savepointed; restore without --query refused at plan time, exit
    # 2 (with it: tests/test_releases.py).
    "spark35-session-hdfs": {"inspect": 0, "savepoint": 0, "restore": 2, "reads": {"op0": EQUAL}},
    "spark35-session-rocksdb": {"inspect": 0, "savepoint": 0, "restore": 2, "reads": {}},
}


def read_id(read: dict[str, Any]) -> str:
    opts = read.get("options", {})
    return f"op{read['operatorId']}" + "".join(f"-{v}" for _, v in sorted(opts.items()))


def spark_reads(fx: dict[str, Any]) -> dict[str, dict[str, Any]]:
    data = json.loads((ROOT / "fixtures" / fx["spark_rows"]).read_text())
    return {read_id(r): r for r in data["reads"]}


def export_outcome(fx: dict[str, Any], read: dict[str, Any], tmp_path) -> tuple[str, str]:
    """(EQUAL | DIFFERS | REFUSED, detail) for one read of one fixture."""
    theirs = recorded_read(fx, read)
    path = str(FIXTURES / fx["name"])
    try:
        ours = json.loads(json.dumps(export_rows(path, read, tmp_path)))
    except StatectlError as e:
        return REFUSED, str(e)
    # Names as read, before Parquet's renaming of duplicates (an aggregation at state format 1
    # has count, sum, sum, count), as tests/test_export_vs_spark.py compares them.
    names = json.loads(
        json.dumps(arrow_names(read_state(Checkpoint.open(path), selection(read)).schema))
    )
    if names != theirs["names"]:
        return DIFFERS, f"columns {names} != Spark's {theirs['names']}"
    if ours != theirs["rows"]:
        return DIFFERS, f"{len(ours)} rows != Spark's {len(theirs['rows'])}, first {ours[:1]}"
    return EQUAL, ""


def run_inspect(name: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "statectl.cli", "inspect", str(FIXTURES / name), "--json"],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )


def test_every_kind_fixture_has_spark_rows_and_a_record():
    assert KIND_FIXTURES, "no fixtures with recorded Spark rows"
    for fx in KIND_FIXTURES:
        reads = spark_reads(fx)
        assert [read_id(r) for r in fx["reads"]] == list(reads)
        for r in fx["reads"]:
            assert len(reads[read_id(r)]["rows"]) == r["rows"]
    assert sorted(TODAY) == sorted(fx["name"] for fx in PENDING)


@pytest.mark.parametrize("fx", PENDING, ids=[fx["name"] for fx in PENDING])
def test_inspect_today(fx):
    proc = run_inspect(fx["name"])
    assert "Traceback" not in proc.stderr
    assert proc.returncode == TODAY[fx["name"]]["inspect"], proc.stderr
    if proc.returncode == 0:
        info = json.loads(proc.stdout)
        kinds = [(o["id"], o["name"]) for o in info["operators"]]
        # Spark 3.5 records no operator names: the manifest's kind is the query's.
        assert kinds == [
            (o["id"], "unknown" if "no operator metadata" in o.get("source", "") else o["kind"])
            for o in fx["operators"]
        ]
    else:  # under --json an error is one JSON object on stdout, nothing on stderr
        assert not proc.stderr.strip(), proc.stderr
        error = json.loads(proc.stdout)
        assert error["exit_code"] == 2 and "\n" not in error["error"], error


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "statectl.cli", *args],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )


def one_line_error(proc: subprocess.CompletedProcess) -> bool:
    """One ``statectl: error:`` line, or under ``--json`` one JSON error object on stdout."""
    if not proc.stderr.strip() and proc.stdout.lstrip().startswith("{"):
        error = json.loads(proc.stdout)
        return error.get("exit_code") == 2 and "\n" not in error.get("error", "")
    lines = proc.stderr.strip().splitlines()
    return len(lines) == 1 and lines[0].startswith("statectl: error: ")


@pytest.mark.parametrize("fx", PENDING, ids=[fx["name"] for fx in PENDING])
def test_savepoint_and_restore_plan_today(fx, tmp_path):
    """`savepoint`, then `restore --dry-run` at 3 partitions (the fixtures have 2)."""
    today = TODAY[fx["name"]]
    proc = run_cli("savepoint", str(FIXTURES / fx["name"]), str(tmp_path / "sp"), "--json")
    assert "Traceback" not in proc.stderr
    assert proc.returncode == today["savepoint"], proc.stderr
    if proc.returncode:
        assert one_line_error(proc), proc.stderr
        return
    (sp,) = (tmp_path / "sp").iterdir()
    proc = run_cli("restore", str(tmp_path / "rt"), "-s", str(sp), "--partitions", "3", "--dry-run")
    assert "Traceback" not in proc.stderr
    assert proc.returncode == today["restore"], proc.stderr + proc.stdout


PENDING_READS = [
    pytest.param(fx, read, id=f"{fx['name']}-{read_id(read)}")
    for fx in PENDING
    for read in fx["reads"]
]


@pytest.mark.parametrize(("fx", "read"), PENDING_READS)
def test_export_today(fx, read, tmp_path):
    got, detail = export_outcome(fx, read, tmp_path)
    want = TODAY[fx["name"]]["reads"][read_id(read)]
    assert got == want, f"statectl export now {got} ({detail}); TODAY says {want}"


def test_spark35_rocksdb_session_state_reads_like_its_hdfs_twin(tmp_path):
    """Spark 4.3's own reader fails on Spark 3.5's RocksDB session window state
    (STATE_STORE_KEY_ROW_FORMAT_VALIDATION_FAILURE: with no operator metadata it reads the
    prefix-encoded keys as plain rows). statectl reads them by the grouping-column prefix
    3.5 always writes, and gets the rows Spark 4.3 read from the HDFS twin (same query, same
    input), each in the same partition."""
    fx = next(f for f in PENDING if f["name"] == "spark35-session-hdfs")
    (read,) = fx["reads"]
    theirs = spark_reads(fx)[read_id(read)]
    assert len(theirs["rows"]) == 14
    twin = dict(fx, name="spark35-session-rocksdb")
    assert export_outcome(twin, read, tmp_path) == (EQUAL, "")
    assert TODAY["spark35-session-rocksdb"]["reads"] == {}  # Spark could not read it


# -- where Spark put the keys of the kinds whose key is not the partitioning key ----------------
def _spark_partitions(name: str, store: str | None = None) -> list[tuple[Any, int]]:
    fx = next(f for f in KIND_FIXTURES if f["name"] == name)
    reads = json.loads((ROOT / "fixtures" / fx["spark_rows"]).read_text())["reads"]
    (read,) = [r for r in reads if r["options"].get("storeName") == store]
    return [(row[0], row[-1]) for row in read["rows"]]


@pytest.mark.parametrize(
    "name", ["session-hdfs", "session-rocksdb", "session-dynamic-hdfs", "session-dynamic-rocksdb"]
)
def test_session_keys_are_placed_by_the_grouping_columns_only(name):
    """Session state key (k, sessionStartTime), numColsPrefixKey 1: Spark places every session
    by hash(k) alone, so all sessions of a key share a partition; the session spec does the
    same (hashing the whole key would put them elsewhere)."""
    rows = _spark_partitions(name)
    keys = pa.array([key[0] for key, _ in rows], pa.string())
    assert partition_ids(pa.table({"k": keys}), 2).tolist() == [p for _, p in rows]
    ckpt = Checkpoint.open(str(FIXTURES / name))
    (op,) = ckpt.operators(ckpt.latest_committed_batch)
    assert [s.num_cols_prefix_key for s in op.schemas] == [1]
    assert op.kind is SESSION_WINDOW
    assert op.kind.prefix_columns(op.schemas[0].key_schema) == 1
    starts = pa.array([dt.datetime.fromisoformat(key[1]) for key, _ in rows], pa.timestamp("us"))
    key = pa.StructArray.from_arrays([keys, starts], names=["k", "sessionStartTime"])
    assert op.kind.partitions_of("default", key, 2).tolist() == [p for _, p in rows]
    assert partition_ids(key, 2).tolist() != [p for _, p in rows]


@pytest.mark.parametrize(
    ("name", "store"),
    [
        ("join4-rocksdb", "left-keyWithTsToValues"),
        ("join4-rocksdb", "right-tsWithKey"),
        ("join4-leftsemi-rocksdb", "left-keyWithTsToValues"),
    ],
)
def test_join4_keys_are_placed_by_the_join_key_only(name, store):
    """Format 4 keys are (join key..., __event_time micros): the event time is not hashed."""
    rows = _spark_partitions(name, store)
    keys = pa.array([key[0] for key, _ in rows], pa.string())
    assert partition_ids(pa.table({"field0": keys}), 2).tolist() == [p for _, p in rows]
    assert all(isinstance(key[1], int) for key, _ in rows)


@pytest.mark.parametrize("name", ["limit-hdfs", "limit-rocksdb"])
def test_limit_state_is_one_row_in_partition_0(name):
    """globalLimit: key struct<key: void> (null), value struct<value: long> = rows emitted so
    far; only state/0/0 exists although the operator metadata says 2 partitions."""
    assert _spark_partitions(name) == [([None], 0)]
    fx = next(f for f in KIND_FIXTURES if f["name"] == name)
    assert fx["reads"][0]["rows"] == 1 and fx["operators"][0]["numPartitions"] == 2
    parts = sorted(p.name for p in (FIXTURES / name / "state" / "0").iterdir() if p.name.isdigit())
    assert parts == ["0"]
    ckpt = Checkpoint.open(str(FIXTURES / name))
    (op,) = ckpt.operators(ckpt.latest_committed_batch)
    assert op.kind is GLOBAL_LIMIT and op.num_partitions == 2
    assert op.kind.partition_may_be_absent(1) and not op.kind.partition_may_be_absent(0)

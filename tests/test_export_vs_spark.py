"""`statectl export` equals Spark's own `statestore` reader, for every fixture, operator and store.

The reads to compare are listed in fixtures/manifest.json (written by fixtures/generate.py from
what Spark itself could read), and every row and column Spark 4.3.0's reader returned for each
is in fixtures/spark-rows/. The fast tier compares every read with those rows; the Spark tier
compares a sample (one fixture per query and backend) with a live read of the same Spark,
which proves the recorded rows are what Spark returns.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from statectl.checkpoint.model import Checkpoint
from statectl.state import read_state
from tests.helpers.fixtures import FIXTURES, fixture_generator, load_manifest, recorded_read
from tests.helpers.reads import export_rows, selection
from tests.helpers.rows import arrow_names, spark_names, spark_rows

READS = [
    pytest.param(
        fx,
        read,
        id=f"{fx['name']}-op{read['operatorId']}-"
        + "-".join(f"{v}" for k, v in sorted(read.get("options", {}).items()) if k != "operatorId"),
    )
    for fx in load_manifest()
    for read in fx.get("reads", [])
]


def _without_event_time(rows: list) -> list:
    """Spark 4.3's joinSide read of join state format 4 shows ``__event_time`` wrong (the
    key's string bytes read as a long); statectl shows the real one (test_join_formats.py)."""
    return sorted(([k[:-1], *rest] for k, *rest in rows), key=repr)


@pytest.mark.parametrize(("fx", "read"), READS)
def test_export_equals_the_rows_spark_returned(tmp_path, fx, read):
    """Every row and column of every read equals what Spark 4.3's statestore reader returned
    for it (fixtures/spark-rows/), names included (before Parquet renames duplicates)."""
    theirs = recorded_read(fx, read)
    path = str(FIXTURES / fx["name"])
    table = read_state(Checkpoint.open(path), selection(read))
    assert json.loads(json.dumps(arrow_names(table.schema))) == theirs["names"]
    ours = json.loads(json.dumps(export_rows(path, read, tmp_path)))
    assert len(ours) == len(theirs["rows"]) == read["rows"]
    if "joinSide" in read.get("options", {}) and "join4" in fx["name"]:
        assert _without_event_time(ours) == _without_event_time(theirs["rows"])
    else:
        assert ours == theirs["rows"]


def spark_readable_copy(name: str, tmp_path) -> str:
    """The fixture as Spark can read it from here (fixtures/generate.py
    ``spark_readable_copy``: transformWithState metadata names its schema files by absolute
    path)."""
    src = FIXTURES / name
    if not list(src.glob("state/*/_metadata/v2/*")):
        return str(src)
    return str(fixture_generator().spark_readable_copy(src, tmp_path / name))


def _live_sample() -> list[Any]:
    """Spark 4.3's fixtures, every read of the first fixture of each query and backend."""
    seen: set[tuple[str, str]] = set()
    sample = []
    for p in READS:
        fx = p.values[0]
        group = (fx["query"], fx["backend"])
        if fx["name"].startswith("spark") and fx["name"][5:7].isdigit():
            continue  # older writers: their recorded rows are 4.3's reads as well
        if group in seen and sample[-1].values[0] is not fx:
            continue
        seen.add(group)
        sample.append(p)
    return sample


@pytest.mark.spark
@pytest.mark.parametrize(("fx", "read"), _live_sample())
def test_export_equals_statestore_reader(spark, tmp_path, fx, read):
    path = spark_readable_copy(fx["name"], tmp_path)
    ours = export_rows(path, read, tmp_path)
    table = read_state(Checkpoint.open(path), selection(read))

    reader = spark.read.format("statestore").option("operatorId", read["operatorId"])
    for k, v in read.get("options", {}).items():
        if k != "operatorId":
            reader = reader.option(k, v)
    v2 = fx.get("checkpointFormatVersion", 1) == 2 or "ckptv2" in fx["name"]
    key = "spark.sql.streaming.stateStore.checkpointFormatVersion"
    spark.conf.set(key, "2" if v2 else "1")
    try:
        df = reader.load(path)
        theirs = spark_rows(df)
    finally:
        spark.conf.unset(key)
    # Same columns, same nested field names (before Parquet's renaming of duplicates).
    assert arrow_names(table.schema) == spark_names(df.schema)
    assert len(ours) == len(theirs) == read["rows"]
    if "joinSide" in read.get("options", {}) and "join4" in fx["name"]:
        ours, theirs = _without_event_time(ours), _without_event_time(theirs)
    assert ours == theirs
    # The rows the fast tier compares with are these.
    assert json.loads(json.dumps(theirs)) == json.loads(json.dumps(recorded_read(fx, read)["rows"]))

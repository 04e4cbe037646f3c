"""Shared fixtures: the bundled checkpoints, one session-scoped SparkSession, and comparisons."""

from __future__ import annotations

import datetime as dt
import decimal
import functools
import importlib.util
import json
import os
import pathlib
import shutil
from typing import Any

import pyarrow as pa
import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "fixtures" / "checkpoints"
MANIFEST = ROOT / "fixtures" / "manifest.json"


# The file source of the query modules the Spark tests write (``{input!r}``: its directory,
# filled by ``str.format``): one JSON file per micro-batch.
QUERY_SOURCE = """INPUT = {input!r}


def src(spark):
    return (
        spark.readStream.schema("id long, k string, v long, ts timestamp")
        .option("maxFilesPerTrigger", 1)
        .json(INPUT)
    )
"""


def load_manifest(include_pending: bool = False) -> list[dict[str, Any]]:
    """The fixtures of fixtures/manifest.json.

    Entries marked ``pending`` are operator kinds / state formats statectl does not model yet
    (issue 10); the generic parametrized tests skip them and tests/test_operator_kinds.py
    records what statectl does with them today.
    """
    if not MANIFEST.exists():
        return []
    data = json.loads(MANIFEST.read_text())
    fixtures = data["fixtures"] if isinstance(data, dict) else data
    return [f for f in fixtures if include_pending or not f.get("pending")]


@functools.cache
def fixture_generator() -> Any:
    """fixtures/generate.py as a module: its queries, specs and helpers (no Spark started)."""
    spec = importlib.util.spec_from_file_location("fixture_generate", ROOT / "fixtures/generate.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def restore_target(fx: dict[str, Any]) -> tuple[str, int]:
    """Where a fixture is restored by the tests that restore every fixture: another partition
    count always; the other backend where Spark allows it (transformWithState and join formats
    3/4 are RocksDB only), else the same backend; a changelog source becomes zip snapshots."""
    join_format = fx["confs"].get("spark.sql.streaming.join.stateFormatVersion")
    if fx["query"].startswith("tws") or join_format in ("3", "4"):
        return "rocksdb", 3
    return ("rocksdb" if fx["backend"] in ("hdfs", "rocksdb-changelog") else "hdfs"), 3


# Test modules that fork worker processes from the test process: they run on each xdist
# worker before any Spark test starts a JVM gateway there.
FORK_FIRST = {"test_adversarial.py"}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The forking tests, then longest first: the two xdist workers start the long tests early
    and the short ones fill in around them, instead of one worker finishing a long one alone
    at the end. Longest: the ``slow`` ones (memory budgets, the base-dependency venv, the TTL
    test that waits 3 minutes), those that run Spark first, then the other Spark tests, then
    the fast tier."""

    def rank(item: pytest.Item) -> tuple[bool, bool, bool]:
        # Before all of them, the tests that fork (bench/fuzz.py refuses to fork a process
        # with threads running, and a worker's SparkSession leaves py4j threads behind).
        forks = item.path.name in FORK_FIRST
        slow, spark = item.get_closest_marker("slow"), item.get_closest_marker("spark")
        return not forks, slow is None, spark is None

    items.sort(key=rank)  # stable: the collection order within a rank


@pytest.fixture(scope="session")
def spark():
    """A local[2] SparkSession shared by every Spark test (JVM start is ~10 s)."""
    pyspark = pytest.importorskip("pyspark")
    del pyspark
    from pyspark.sql import SparkSession

    os.environ.setdefault("PYSPARK_PYTHON", shutil.which("python") or "python")
    session = (
        SparkSession.builder.master("local[2]")
        .appName("statectl-tests")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.driver.memory", "2g")
        # transformWithState's Python workers connect back within this (default 15 s): too
        # short when the machine is busy.
        .config("spark.python.authenticate.socketTimeout", "300s")
        .config("spark.sql.timeType.enabled", "true")  # the codec tests cover TIME
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()


@pytest.fixture
def fixture_copy(tmp_path):
    """Copy a bundled checkpoint into a temp dir (tests never touch the committed files)."""

    def copy(name: str) -> pathlib.Path:
        dst = tmp_path / name
        shutil.copytree(FIXTURES / name, dst)
        return dst

    return copy


def drop_crc(path: pathlib.Path) -> None:
    """Remove a file's Hadoop ``.crc`` sidecar, as a writer that edits the file should: tests
    that damage a file on purpose reach the check they test, not the sidecar check."""
    (path.parent / f".{path.name}.crc").unlink(missing_ok=True)


# -- comparing our Arrow tables with Spark rows, by position (duplicate field names exist) ----
def normalize(v: Any) -> Any:
    if isinstance(v, float) and v != v:
        return "NaN"
    if isinstance(v, dt.datetime):
        if v.tzinfo is not None:
            v = v.astimezone(dt.timezone.utc).replace(tzinfo=None)
        return v.isoformat()
    if isinstance(v, (dt.date, decimal.Decimal)):
        return str(v)
    if isinstance(v, (bytes, bytearray, memoryview)):
        return bytes(v).hex()
    if isinstance(v, dict):
        return tuple(sorted((normalize(k), normalize(x)) for k, x in v.items()))
    if isinstance(v, (list, tuple)):
        return tuple(normalize(x) for x in v)
    return v


def arrow_rows(table: pa.Table) -> list[tuple]:
    """Rows as nested tuples by field position, so duplicate struct field names survive."""

    def column_values(arr: pa.Array) -> list[Any]:
        if pa.types.is_struct(arr.type):
            children = [column_values(arr.field(i)) for i in range(arr.type.num_fields)]
            valid = arr.is_valid().to_pylist()
            return [tuple(c[i] for c in children) if valid[i] else None for i in range(len(arr))]
        if pa.types.is_map(arr.type):
            return [None if m is None else dict(m) for m in arr.to_pylist()]
        return arr.to_pylist()

    cols = [column_values(c.combine_chunks()) for c in table.columns]
    return sorted((normalize(tuple(r)) for r in zip(*cols, strict=True)), key=repr)


def spark_rows(df) -> list[tuple]:
    def conv(v: Any) -> Any:
        from pyspark.sql import Row

        if isinstance(v, Row):
            return tuple(conv(x) for x in v)
        if isinstance(v, list):
            return [conv(x) for x in v]
        if isinstance(v, dict):
            return {conv(k): conv(x) for k, x in v.items()}
        return v

    return sorted((normalize(conv(r)) for r in df.collect()), key=repr)


def arrow_names(t) -> object:
    """Field names, nested, of an Arrow type or schema."""
    if isinstance(t, pa.Schema):
        return [(f.name, arrow_names(f.type)) for f in t]
    if pa.types.is_struct(t):
        return [(t.field(i).name, arrow_names(t.field(i).type)) for i in range(t.num_fields)]
    if pa.types.is_list(t):
        return arrow_names(t.value_type)
    if pa.types.is_map(t):
        return (arrow_names(t.key_type), arrow_names(t.item_type))
    return None


def spark_names(t) -> object:
    from pyspark.sql.types import ArrayType, MapType, StructType

    if isinstance(t, StructType):
        return [(f.name, spark_names(f.dataType)) for f in t.fields]
    if isinstance(t, ArrayType):
        return spark_names(t.elementType)
    if isinstance(t, MapType):
        return (spark_names(t.keyType), spark_names(t.valueType))
    return None

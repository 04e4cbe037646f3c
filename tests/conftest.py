"""Shared fixtures and collection order: one session-scoped SparkSession, copies of the bundled
checkpoints, a moto S3 endpoint. Plain helpers live in tests/helpers/."""

from __future__ import annotations

import os
import pathlib
import shutil
import tempfile

import pytest

from tests.helpers.fixtures import FIXTURES

# Test modules that fork worker processes from the test process: they run on each xdist
# worker before any Spark test starts a JVM gateway there.
FORK_FIRST = {"test_adversarial.py"}


# Every JVM the tests start (the session below, ``statectl --engine spark`` in a subprocess, the
# executors of a local-cluster master) reads these through SPARK_CONF_DIR. The tests run tiny
# batches, so the JVM's time goes to compiling code it runs a few times: C1 alone (no C2) and
# the serial collector halve its CPU time. Neither changes what Spark computes, writes or
# plans. (SQL confs stay Spark's defaults: statectl walks physical plans, whole-stage code
# generation included. The "default" Java options, so that a session's own
# extraJavaOptions, as statectl's quiet_session sets, add to them instead of replacing them.)
JVM_FLAGS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"
SPARK_DEFAULTS = {
    "spark.driver.defaultJavaOptions": JVM_FLAGS,
    "spark.executor.defaultJavaOptions": JVM_FLAGS,
    "spark.ui.showConsoleProgress": "false",
}
_CONF_DIR = pytest.StashKey[str]()


def pytest_configure(config: pytest.Config) -> None:
    conf_dir = tempfile.mkdtemp(prefix="statectl-test-spark-conf-")
    with open(os.path.join(conf_dir, "spark-defaults.conf"), "w") as f:
        f.writelines(f"{k} {v}\n" for k, v in SPARK_DEFAULTS.items())
    config.stash[_CONF_DIR] = conf_dir
    os.environ["SPARK_CONF_DIR"] = conf_dir
    # Every CLI test starts a Python subprocess; without cached bytecode (machines that set
    # PYTHONDONTWRITEBYTECODE) each one recompiles statectl, ~0.15 s a run over ~1,000 runs.
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)


def pytest_unconfigure(config: pytest.Config) -> None:
    shutil.rmtree(config.stash.get(_CONF_DIR, ""), ignore_errors=True)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The forking tests, then longest first: the two xdist workers start the long tests early
    and the short ones fill in around them, instead of one worker finishing a long one alone
    at the end. Longest: the ``slow`` ones (memory budgets, the base-dependency venv, the TTL
    test that waits its TTL), those that run Spark first, then the other Spark tests, then
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


@pytest.fixture(scope="module")
def s3_endpoint():
    """A moto S3 server on loopback for one test module; yields the AWS environment (also set
    in ``os.environ`` meanwhile) that reaches it."""
    pytest.importorskip("moto.server")
    from tests.helpers.s3 import moto_endpoint  # moto is a test extra: import it only here

    with moto_endpoint() as env:
        yield env

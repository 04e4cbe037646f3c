"""The Spark engine: partition tasks as Spark tasks on a cluster, through PySpark.

A use case builds a list of independent, picklable tasks (zero-argument callables: one per
operator, table and partition) and hands them to an engine's ``run``, which yields their results
in order. The local engine (:class:`statectl.engine.Engine`) runs them here, in a fork pool or
in threads; this one runs each task as one Spark task, so executors read and write the state
files on the checkpoint's own filesystem while the driver keeps the last word (``_metadata`` and
logs are written by the caller, after ``run`` returned every result).

Errors a task raises on purpose (a ``StatectlError``: a damaged file, a missing one) come back to
the driver as the same error class and message, so a Spark run fails exactly like a local one.
"""

from __future__ import annotations

import os
import sys
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from statectl.engine import Engine
from statectl.errors import StatectlError

ENGINES = ("local", "spark")

# How executors get statectl: printed when they cannot import it.
SHIP_HINT = (
    "install statectl on every executor, or ship a packed virtualenv with "
    "spark.archives (see docs/guide.md, 'Running on Spark')"
)


@dataclass
class SparkEngine:
    """Tasks as Spark tasks, one partition each (results come back in order)."""

    spark: Any  # pyspark.sql.SparkSession
    name: str = "spark"
    checked: bool = False

    def run(self, jobs: list[Callable[[], Any]], *, threads: bool = False) -> Iterator[Any]:
        del threads  # each job is a Spark task; executors do their own transfers
        if not jobs:
            return iter(())
        self.check_executors()
        sc = self.spark.sparkContext
        outcomes = (
            sc.parallelize(list(enumerate(jobs)), numSlices=len(jobs))
            .map(_guarded(_call))
            .collect()
        )
        return (_unwrap(o) for o in sorted(outcomes, key=lambda o: o[0]))

    def check_executors(self) -> None:
        """Fail fast, with one line, when an executor cannot import statectl."""
        if self.checked:
            return
        sc = self.spark.sparkContext
        n = max(1, sc.defaultParallelism)

        def probe(_: int) -> str:
            # Defined here so that cloudpickle ships it by value: unpickling it must not need
            # statectl, or a missing statectl would fail before it could be reported.
            import importlib

            try:
                return "ok " + importlib.import_module("statectl").__version__
            except Exception as e:  # reported to the driver as text
                return f"error {type(e).__name__}: {e}"

        try:
            answers = sc.parallelize(range(n), n).map(probe).collect()
        except Exception as e:  # a Py4J/Python error from the cluster
            raise StatectlError(
                f"the Spark engine could not run a task: {_last_line(str(e))}", hint=SHIP_HINT
            ) from None
        bad = [a for a in answers if not a.startswith("ok ")]
        if bad:
            raise StatectlError(
                f"a Spark executor cannot import statectl ({bad[0].removeprefix('error ')})",
                hint=SHIP_HINT,
            )
        self.checked = True


def _call(job: Callable[[], Any]) -> Any:
    return job()


def _guarded(fn: Callable[[Any], Any]) -> Callable[[tuple[int, Any]], tuple]:
    def run(item: tuple[int, Any]) -> tuple:
        index, job = item
        try:
            return (index, "ok", fn(job))
        except StatectlError as e:
            return (index, "statectl", type(e).__name__, str(e))
        except Exception as e:  # a bug: its traceback goes to the driver
            return (index, "bug", f"{type(e).__name__}: {e}", traceback.format_exc())

    return run


def _unwrap(outcome: tuple) -> Any:
    if outcome[1] == "ok":
        return outcome[2]
    if outcome[1] == "statectl":
        import statectl.errors as errors

        cls = getattr(errors, outcome[2], StatectlError)
        if not (isinstance(cls, type) and issubclass(cls, StatectlError)):
            cls = StatectlError
        raise cls(outcome[3])
    raise RuntimeError(f"a Spark task failed: {outcome[2]}\n{outcome[3]}")


def _last_line(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    for line in reversed(lines):
        if "Error" in line or "Exception" in line:
            return line[:300]
    return (lines[-1] if lines else text)[:300]


def parse_spark_confs(pairs: list[str]) -> dict[str, str]:
    """``KEY=VALUE`` strings (``--spark-conf``) as a dict."""
    confs: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise StatectlError(f"--spark-conf wants KEY=VALUE, got {pair!r}")
        confs[key.strip()] = value
    return confs


def spark_engine(spark: Any = None, confs: dict[str, str] | None = None) -> SparkEngine:
    """The Spark engine over ``spark``, or over a session built from ``confs`` on top of the
    usual ``spark-defaults.conf`` / ``SPARK_*`` environment (``getOrCreate``: an active session
    in this process is reused)."""
    if spark is None:
        try:
            import pyspark  # noqa: F401
        except ImportError:
            raise StatectlError(
                "the Spark engine needs PySpark: pip install 'statectl[spark]' (or pyspark)"
            ) from None
        from statectl.spark_session import quiet_session

        # Executors of a local or local-cluster master run this very Python.
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
        spark = quiet_session("statectl", dict(confs or {}), purpose="--engine spark")
    return SparkEngine(spark)


def engine_for(
    engine: str | Any = "local",
    *,
    memory: str | int | None = None,
    workers: int | None = None,
    spark: Any = None,
    spark_confs: dict[str, str] | None = None,
) -> Engine | SparkEngine:
    """An engine from the CLI/API arguments: ``"local"`` (bounded by ``memory``, ``workers``
    tasks at once), ``"spark"``, a SparkSession (the Spark engine on it), or an engine."""
    if isinstance(engine, Engine | SparkEngine):
        return engine
    if spark is not None or (engine is not None and not isinstance(engine, str)):
        return spark_engine(spark if spark is not None else engine)
    if engine == "local":
        return Engine.of(memory, workers)
    if engine == "spark":
        return spark_engine(None, spark_confs)
    raise StatectlError(f"--engine must be one of {', '.join(ENGINES)}, not {engine!r}")

"""The Spark engine: partition tasks as Spark tasks on a cluster, through PySpark.

A use case builds a list of independent, picklable tasks (zero-argument callables: one per
operator, table and partition) and hands them to an engine's ``run``, which yields their results
in order. The local engine (:class:`statectl.engine.Engine`) runs them here, in a fork pool or
in threads; this one runs each task as one Spark task, so executors read and write the state
files on the checkpoint's own filesystem while the driver keeps the last word (``_metadata`` and
logs are written by the caller, after ``run`` returned every result).

Restore and migrate run the local engine's two phases (statectl/engine.py) as two Spark stages
joined by a real Spark shuffle: spill tasks (one per savepoint data file) emit their rows as
Arrow IPC batches keyed ``(target partition, table, source file, batch)``,
``repartitionAndSortWithinPartitions`` brings each target partition's batches to one build task
in savepoint order, and the build task writes the target's state files on the target's own
filesystem. A shuffle, not spill files on a shared directory: executors of a real cluster share
no /tmp, and the target's filesystem (often an object store) is the wrong place for scratch
data that Spark's shuffle already moves, spills to each executor's local disks and retries.
The driver writes the checkpoint logs and ``_metadata`` last, after every build task returned.

Errors a task raises on purpose (a ``StatectlError``: a damaged file, a missing one) come back to
the driver as the same error class, message, path and hint, so a Spark run fails exactly like a
local one. The path is rebuilt on the driver: only there is it known that ``lake/ckpt/...``
(s3fs's form of the path, which is all an executor has) was opened as ``s3://lake/ckpt``.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import sys
import tempfile
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

import statectl.errors as errors_module
from statectl.engine import (
    BuildTask,
    Convert,
    Encoder,
    Engine,
    Place,
    SpilledTable,
    SpillTask,
    SpillWriters,
    StateEngine,
    StoreFormat,
    is_state_engine,
    parse_memory,
    spill_dir,
    table_schema,
)
from statectl.errors import StatectlError, describe_failure
from statectl.io import FileIO
from statectl.spark_session import quiet_session

ENGINES = ("local", "spark", "auto")
# A Spark task's memory budget (spill chunks, in-memory builds) unless --memory says otherwise:
# what a default 1 GiB executor keeps for Python beside the JVM.
DEFAULT_TASK_MEMORY = 512 << 20
# --engine auto: Spark when a session is at hand and the state's files are at least this big.
ENV_AUTO_THRESHOLD = "STATECTL_SPARK_THRESHOLD"
DEFAULT_AUTO_THRESHOLD = 1 << 30
# A StatectlError raised inside a Spark task travels to the driver inside Spark's own error text,
# as a JSON list: [class name, message, path, hint].
_MARK = "statectl-error"
_MARKED = re.compile(_MARK + r"(\[.*?\])" + _MARK, re.S)

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
    memory: int = DEFAULT_TASK_MEMORY  # what one Spark task may hold (restore's budget)

    @property
    def per_task(self) -> int:
        return self.memory

    @property
    def runs_locally(self) -> bool:
        """Tasks run on executors: they share no temporary directory with the driver."""
        return False

    @property
    def workers(self) -> int:
        return max(1, self.spark.sparkContext.defaultParallelism)

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

    def restore_stores(
        self,
        sp: Any,
        tables: list[Any],
        place: Place,
        partitions: int,
        fmt: StoreFormat,
        io: FileIO,
        store_dir: Callable[[str, int], str],
        *,
        encoder: Encoder,
        only: list[int] | None = None,
        convert: Convert | None = None,
    ) -> list[list[tuple[int, str | None]]]:
        """:func:`statectl.engine.restore_stores` as two Spark stages and a shuffle: build
        tasks write the target's store files; returns [table] -> [(partition, unique id)]."""
        built = list(range(partitions)) if only is None else only
        shuffled = self._shuffled(sp, tables, place, partitions, encoder, built, convert)
        n_tables = len(tables)
        # Paths computed here: the driver owns where files go, tasks only write them.
        dirs = [[store_dir(t.name, p) for p in built] for t in tables]
        build = _BuildPartition(n_tables, built, dirs, fmt, io, self.per_task)
        ids = _collect(shuffled.mapPartitionsWithIndex(build))
        by_index = dict(ids)
        return [
            [(p, by_index[i * n_tables + t]) for i, p in enumerate(built)] for t in range(n_tables)
        ]

    def partition_spills(
        self,
        sp: Any,
        tables: list[Any],
        place: Place,
        partitions: int,
        *,
        convert: Convert | None = None,
    ) -> Iterator[tuple[int, dict[str, SpilledTable]]]:
        """:func:`statectl.engine.partition_spills` through the shuffle: each target
        partition's rows arrive at the driver one partition at a time and go to local spill
        files (transformWithState and joins at formats 3/4 encode a partition here, whole or
        a chunk at a time within the budget)."""
        built = list(range(partitions))
        shuffled = self._shuffled(sp, tables, place, partitions, None, built, convert)
        schemas = [table_schema(sp, t, convert) for t in tables]
        with spill_dir() as directory:
            writers: dict[int, SpillWriters] = {}

            def done(p: int) -> tuple[int, dict[str, SpilledTable]]:
                for w in writers.values():
                    w.finish(p)
                return p, {
                    t.name: SpilledTable(
                        [os.path.join(directory, f"t{i:04d}", f"{p}.arrow")], schemas[i]
                    )
                    for i, t in enumerate(tables)
                }

            current = 0
            try:
                rows = shuffled.toLocalIterator(prefetchPartitions=False)
                for (p, t_index, _f, _b), data in rows:
                    while current < p:
                        yield done(current)
                        current += 1
                    if t_index not in writers:
                        writers[t_index] = SpillWriters(
                            os.path.join(directory, f"t{t_index:04d}"), schemas[t_index]
                        )
                    writers[t_index].write(p, _from_ipc(data))
            except Exception as e:
                _reraise(e)
            for w in writers.values():
                w.close()
            writers.clear()
            while current < partitions:
                yield done(current)
                current += 1

    def _shuffled(
        self,
        sp: Any,
        tables: list[Any],
        place: Place,
        partitions: int,
        encoder: Encoder | None,
        built: list[int],
        convert: Convert | None = None,
    ) -> Any:
        """Stage 1 (spill tasks, one per savepoint data file) and the shuffle: an RDD whose
        partition ``i * len(tables) + t`` holds table ``t``'s rows of target partition
        ``built[i]``, sorted by (source file, batch): the savepoint's order."""
        self.check_executors()
        sc = self.spark.sparkContext
        jobs = [
            (
                t_index,
                SpillTask(sp, t, f, place, partitions, "", self.per_task, encoder, convert),
            )
            for t_index, t in enumerate(tables)
            for f in range(len(t.files))
        ]
        position = {p: i for i, p in enumerate(built)}
        n_tables = len(tables)
        spilled = sc.parallelize(jobs, numSlices=max(1, len(jobs))).flatMap(
            _SpillRecords(set(built))
        )
        return spilled.repartitionAndSortWithinPartitions(
            max(1, len(built) * n_tables),
            partitionFunc=lambda k: position[k[0]] * n_tables + k[1],
        )

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


def _to_ipc(batch: pa.RecordBatch) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, batch.schema) as w:
        w.write_batch(batch)
    return sink.getvalue().to_pybytes()


def _from_ipc(data: bytes) -> pa.RecordBatch:
    return pa.ipc.open_stream(pa.py_buffer(data)).read_next_batch()


def _error_fields(e: StatectlError) -> tuple[str, str, str | None, str | None]:
    """What rebuilds ``e`` on the driver: its class name, bare message, path and hint."""
    return type(e).__name__, e.message, e.path, e.hint


def _user_error(e: Exception) -> StatectlError | None:
    """A task's failure as the StatectlError the local engine's run would end with, or None
    for a bug. Storage errors (no credentials, an endpoint the executor cannot reach) and OS
    errors are the user's to fix, and the CLI tells them so when they happen locally; the
    Spark boundary loses the exception's class and cause, so they are classified here, where
    both are still known, by the CLI's own rule (statectl.errors.describe_failure)."""
    if isinstance(e, StatectlError):
        return e
    line, code = describe_failure(e)
    if code != 2:
        return None
    message = line.removeprefix("error: ")
    filename = getattr(e, "filename", None)
    if filename and message.startswith(f"{filename}: "):  # the driver rebuilds its URL
        return StatectlError(message.removeprefix(f"{filename}: "), str(filename))
    return StatectlError(message)


def _marked(e: StatectlError) -> RuntimeError:
    """A StatectlError as an exception whose text Spark carries to the driver intact (JSON:
    one line, whatever the message quotes)."""
    return RuntimeError(f"{_MARK}{json.dumps(_error_fields(e))}{_MARK}")


def _reraise(e: Exception) -> None:
    """Raise a Spark job's failure on the driver: a task's StatectlError as itself."""
    m = _MARKED.search(str(e))
    if m:
        try:
            fields = json.loads(m.group(1))
        except ValueError:  # not ours after all: reported as the job's failure below
            fields = None
        if isinstance(fields, list) and len(fields) == 4:
            _unwrap((0, "statectl", *fields))
    if isinstance(e, StatectlError):
        raise e
    raise StatectlError(f"the Spark engine's job failed: {_last_line(str(e))}") from e


def _collect(rdd: Any) -> list[Any]:
    try:
        return rdd.collect()
    except Exception as e:  # Py4J: the task's error is inside the text
        _reraise(e)
        raise


@dataclass
class _SpillRecords:
    """Stage 1 on an executor: run one spill task into the executor's own scratch directory
    and emit its batches as ``((target partition, table, source file, batch), IPC bytes)``."""

    keep: set[int]

    def __call__(self, item: tuple[int, SpillTask]) -> Iterator[tuple[tuple, bytes]]:
        t_index, task = item
        scratch = tempfile.mkdtemp(prefix="statectl-spill-")
        try:
            task.directory = scratch
            try:
                task()
            except Exception as e:
                user = _user_error(e)
                if user is None:
                    raise  # a bug: Spark reports it with its traceback
                raise _marked(user) from None
            d = os.path.join(scratch, f"f{task.file_index:06d}")
            for name in sorted(os.listdir(d)) if os.path.isdir(d) else []:
                p = int(name.removesuffix(".arrow"))
                if p not in self.keep:  # one-partition operators: Spark never creates the rest
                    continue
                with pa.OSFile(os.path.join(d, name), "rb") as f:
                    for b, batch in enumerate(pa.ipc.open_stream(f)):
                        yield (p, t_index, task.file_index, b), _to_ipc(batch)
        finally:
            shutil.rmtree(scratch, ignore_errors=True)


@dataclass
class _BuildPartition:
    """Stage 2 on an executor: one (target partition, table)'s shuffled batches, in savepoint
    order, into a local spill file, then the local engine's build task writes the store."""

    n_tables: int
    built: list[int]
    dirs: list[list[str]]  # [table][position in built] -> store directory
    fmt: StoreFormat
    io: FileIO
    budget: int

    def __call__(self, index: int, records: Iterator[tuple[tuple, bytes]]) -> Iterator[tuple]:
        position, t_index = divmod(index, self.n_tables)
        p = self.built[position]
        scratch = tempfile.mkdtemp(prefix="statectl-build-")
        try:
            os.makedirs(os.path.join(scratch, "f000000"))
            f = w = None
            try:
                for _key, data in records:
                    batch = _from_ipc(data)
                    if w is None:
                        f = pa.OSFile(os.path.join(scratch, "f000000", f"{p}.arrow"), "wb")
                        w = pa.ipc.new_stream(f, batch.schema)
                    w.write_batch(batch)
            finally:
                if w is not None:
                    w.close()
                if f is not None:
                    f.close()
            task = BuildTask(
                scratch, 1, p, self.fmt, self.io, self.dirs[t_index][position], self.budget
            )
            try:
                yield index, task()
            except Exception as e:
                user = _user_error(e)
                if user is None:
                    raise  # a bug: Spark reports it with its traceback
                raise _marked(user) from None
        finally:
            shutil.rmtree(scratch, ignore_errors=True)


def _guarded(fn: Callable[[Any], Any]) -> Callable[[tuple[int, Any]], tuple]:
    def run(item: tuple[int, Any]) -> tuple:
        index, job = item
        try:
            return (index, "ok", fn(job))
        except Exception as e:
            user = _user_error(e)
            if user is not None:
                return (index, "statectl", *_error_fields(user))
            # a bug: its traceback goes to the driver
            return (index, "bug", f"{type(e).__name__}: {e}", traceback.format_exc())

    return run


def _unwrap(outcome: tuple) -> Any:
    if outcome[1] == "ok":
        return outcome[2]
    if outcome[1] == "statectl":
        _, _, name, message, path, hint = outcome
        cls = getattr(errors_module, name, StatectlError)
        if not (isinstance(cls, type) and issubclass(cls, StatectlError)):
            cls = StatectlError
        # Built here, not on the executor: the driver knows which URL a stripped path lies under
        # (statectl.errors.display_path), so the user reads the s3:// URL they typed.
        try:
            error = cls(message, path, hint)
        except TypeError:  # a subclass with a constructor of its own
            error = StatectlError(message, path, hint)
        raise error
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
        # Executors of a local or local-cluster master run this very Python.
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
        spark = quiet_session("statectl", dict(confs or {}), purpose="--engine spark")
    return SparkEngine(spark)


def active_session() -> Any:
    """The SparkSession active in this process, if PySpark is loaded and one is running
    (PySpark is not imported for the question: a plain CLI run has none)."""
    if "pyspark.sql" not in sys.modules:
        return None
    from pyspark.sql import SparkSession

    return SparkSession.getActiveSession()


def auto_threshold() -> int:
    """--engine auto's size threshold: $STATECTL_SPARK_THRESHOLD (e.g. 1G), else 1 GiB."""
    env = os.environ.get(ENV_AUTO_THRESHOLD, "").strip()
    if not env:
        return DEFAULT_AUTO_THRESHOLD
    return parse_memory(int(env)) if env.isdigit() else parse_memory(env)


def choose_engine(
    spark: Any, spark_confs: dict[str, str] | None, state_bytes: Callable[[], int] | None
) -> str:
    """``auto``: Spark when a session is at hand (passed, active in this process, or a
    ``spark.master`` given with --spark-conf) and the state's files are at least
    :func:`auto_threshold` bytes; else local (small state is faster without a cluster's
    start-up and task overheads)."""
    at_hand = spark is not None or active_session() is not None
    if not at_hand and "spark.master" not in (spark_confs or {}):
        return "local"
    if state_bytes is None or state_bytes() < auto_threshold():
        return "local"
    return "spark"


def engine_for(
    engine: str | Any = "local",
    *,
    memory: str | int | None = None,
    workers: int | None = None,
    spark: Any = None,
    spark_confs: dict[str, str] | None = None,
    state_bytes: Callable[[], int] | None = None,
) -> StateEngine:
    """An engine from the CLI/API arguments: ``"local"`` (bounded by ``memory``, ``workers``
    tasks at once), ``"spark"`` (on ``spark``, the active session, or one built from
    ``spark_confs``; ``memory`` is each Spark task's budget), ``"auto"`` (:func:`choose_engine`
    over ``state_bytes()``, the state's size), a SparkSession (the Spark engine on it), or an
    engine. ``spark`` given with ``"local"`` means the Spark engine (savepoint's ``spark=``)."""
    if is_state_engine(engine):
        return engine
    name, spark = _engine_name(engine, spark, spark_confs, state_bytes)
    if name == "local" and spark is None:
        return Engine.of(memory, workers)
    on_spark = spark_engine(spark if spark is not None else active_session(), spark_confs)
    if memory is not None:
        on_spark.memory = parse_memory(memory)
    return on_spark


def _engine_name(
    engine: str | Any,
    spark: Any,
    spark_confs: dict[str, str] | None,
    state_bytes: Callable[[], int] | None,
) -> tuple[str, Any]:
    """(the engine's name, the session it runs on): a session passed as ``engine`` means
    Spark; ``auto`` chooses, and drops the session when it chooses local."""
    if engine is not None and not isinstance(engine, str):
        return "spark", engine
    if engine not in ENGINES:
        raise StatectlError(f"--engine must be one of {', '.join(ENGINES)}, not {engine!r}")
    if engine == "auto":
        engine = choose_engine(spark, spark_confs, state_bytes)
        spark = spark if engine == "spark" else None
    return engine, spark

"""Plan a user's streaming query without running it, to learn its stateful operators.

``--query MODULE:FUNCTION`` names a function that builds the streaming DataFrame. We hand its
logical plan to Spark's own ``IncrementalExecution`` as the first batch of a run against a
scratch checkpoint. Planning a first batch makes Spark write exactly the operator metadata and
state schema files it would write for the real query (``StateSchemaAndOperatorMetadataRule``),
so we read them back with statectl's checkpoint reader instead of re-deriving operator ids,
names and schemas ourselves. Nothing runs: no source is read and no state is touched.

Planning needs no input data: a file source whose path does not exist (a CI job has no
production input) is planned against an empty stand-in directory, which gives the same
operators, ids and schemas (they come from the plan, not from files; a schema is required for
streaming file sources anyway). The output mode is checked, or inferred, by Spark's own
``UnsupportedOperationChecker``, the check ``DataStreamWriter.start`` makes.

The constructor of ``IncrementalExecution`` is internal to Spark (16 parameters in 4.3); it is
called by reflection so that Python ints widen to Java longs, and a Spark whose constructor
differs gets a clear error rather than a wrong plan.
"""

from __future__ import annotations

import contextlib
import inspect
import json
import os
import re
import shutil
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from statectl.backends import get_backend
from statectl.checkpoint.model import (
    PARTITIONS_CONF,
    PROVIDER_CONF,
    Checkpoint,
    Operator,
    load_operator,
)
from statectl.errors import StatectlError, UnsupportedError
from statectl.evolution_kinds import AggregateBuffer
from statectl.spark_session import quiet_session, spark_message
from statectl.user_code import load_query_function, user_errors

INCREMENTAL_EXECUTION = "org.apache.spark.sql.execution.streaming.runtime.IncrementalExecution"
OUTPUT_MODES = {"append": "Append", "update": "Update", "complete": "Complete"}
# The planning session logs errors only: Spark's start-up warnings are not the user's business.


@dataclass
class PlannedQuery:
    spec: str
    output_mode: str
    operators: list[Operator]
    # File source paths that did not exist and were planned against an empty stand-in.
    stand_ins: list[str] = field(default_factory=list)
    # The query's sources in Spark's order (the lines of offsets/N), as a restart numbers them.
    sources: list[PlannedSource] = field(default_factory=list)
    # Streaming aggregations: operator id -> its aggregates' buffers, from the physical plan.
    aggregates: dict[int, list[AggregateBuffer]] = field(default_factory=dict)
    # restore --from-query: the aggregates of the query the savepoint was taken with, by that
    # query's operator ids (the savepoint's), so buffers are matched by what they compute.
    savepoint_aggregates: dict[int, list[AggregateBuffer]] | None = None
    # Operator id -> per key field, the SQL of a grouping expression Spark keys the state by
    # under its internal name ``_groupingexpression`` (None: a column, named as the user named
    # it). Messages show the expression, not Spark's name.
    key_expressions: dict[int, list[str | None]] = field(default_factory=dict)


@dataclass
class PlannedSource:
    """One source of the planned query: its index (its line in ``offsets/N`` and its
    ``sources/<index>`` log), its description as Spark names it (``FileSource[/in]``,
    ``kafka``, ``rate-micro-batch``), the directory of a file source, and the source's own
    offset parser where Spark can build the source without reading from it."""

    index: int
    description: str
    file_path: str | None = None
    parse_offset: Callable[[str], str | None] | None = field(default=None, repr=False)
    name: str | None = None  # readStream.name(...): the key of offset log v2 (Spark 4.2+)

    @property
    def is_file(self) -> bool:
        return self.file_path is not None


def build_dataframe(func: Any, spark: Any, spec: str = "") -> Any:
    """Call the user's function with the session if it takes an argument, else with none."""
    params = [
        p
        for p in inspect.signature(func).parameters.values()
        if p.default is p.empty and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
    ]
    try:
        user_file = inspect.getsourcefile(func)
    except TypeError:
        user_file = None
    with user_errors(spec or getattr(func, "__name__", "query"), user_file):
        df = func(spark) if params else func()
    if not getattr(df, "isStreaming", False):
        raise StatectlError(
            "--query: the function must return a streaming DataFrame (spark.readStream...), "
            f"got {type(df).__name__}"
        )
    return df


def _incremental_execution(spark: Any, plan: Any, mode: str, state_dir: str, confs: dict) -> Any:
    jvm = spark._jvm
    java_confs = jvm.java.util.HashMap()
    for k, v in confs.items():
        java_confs.put(k, v)
    seq_meta = jvm.org.apache.spark.sql.execution.streaming.checkpointing.OffsetSeqMetadata.apply(
        0, 0, jvm.org.apache.spark.api.python.PythonUtils.toScalaMap(java_confs)
    )
    propagator = (
        getattr(jvm.org.apache.spark.sql.execution.streaming.runtime, "WatermarkPropagator$")
        .__getattr__("MODULE$")
        .noop()
    )
    args = [
        spark._jsparkSession,
        plan,
        getattr(jvm.org.apache.spark.sql.streaming.OutputMode, OUTPUT_MODES[mode])(),
        state_dir,
        jvm.java.util.UUID.randomUUID(),
        jvm.java.util.UUID.randomUUID(),
        0,  # currentBatchId
        jvm.scala.Option.apply(None),
        seq_meta,
        propagator,
        True,  # isFirstBatch: makes planning write metadata and schema files
        jvm.scala.collection.mutable.HashMap(),
        jvm.scala.collection.mutable.HashMap(),
        jvm.org.apache.spark.sql.execution.CommandExecutionMode.ALL(),
        False,
        False,
    ]
    cls = jvm.java.lang.Class.forName(INCREMENTAL_EXECUTION)
    ctors = [c for c in cls.getConstructors() if len(c.getParameterTypes()) == len(args)]
    if not ctors:
        raise UnsupportedError(
            f"--query planning needs Spark 4.3's IncrementalExecution; this Spark "
            f"({spark.version}) differs",
            hint="restore with --map UID=OPERATOR_ID instead",
        )
    arr = spark.sparkContext._gateway.new_array(jvm.java.lang.Object, len(args))
    for i, a in enumerate(args):
        arr[i] = a
    return ctors[0].newInstance(arr)


STAND_IN_METHODS = ("load", "json", "csv", "parquet", "orc", "text", "xml")


@contextlib.contextmanager
def stand_in_sources(found: list[str], replaced: dict[str, str] | None = None) -> Iterator[None]:
    """While the user's function runs: a file source whose path does not exist (Spark raises
    PATH_NOT_FOUND) is read from an empty temporary directory instead; ``found`` collects the
    paths, ``replaced`` maps each stand-in directory to the path it stands in for. Planning
    reads no files, so operators and schemas are the same."""
    from pyspark.errors import AnalysisException
    from pyspark.sql.streaming.readwriter import DataStreamReader

    tmp = tempfile.mkdtemp(prefix="statectl-stand-in-")
    originals = {
        n: getattr(DataStreamReader, n) for n in STAND_IN_METHODS if hasattr(DataStreamReader, n)
    }

    def wrap(orig: Callable[..., Any]) -> Callable[..., Any]:
        def method(self: Any, path: Any = None, *args: Any, **kwargs: Any) -> Any:
            try:
                return orig(self, path, *args, **kwargs)
            except AnalysisException as e:
                if path is None or e.getCondition() != "PATH_NOT_FOUND":
                    raise
                found.append(str(path))
                stand_in = os.path.join(tmp, str(len(found)))
                os.makedirs(stand_in, exist_ok=True)
                if replaced is not None:
                    replaced[stand_in] = str(path)
                return orig(self, stand_in, *args, **kwargs)

        return method

    try:
        for name, orig in originals.items():
            setattr(DataStreamReader, name, wrap(orig))
        yield
    finally:
        for name, orig in originals.items():
            setattr(DataStreamReader, name, orig)
        shutil.rmtree(tmp, ignore_errors=True)


def planning_session(progress: Callable[[str], None] | None = None) -> Any:
    """The local session planning runs in (the active one, or a quiet local[1] session)."""
    return quiet_session(
        "statectl-plan",
        {"spark.master": "local[1]", "spark.ui.enabled": "false"},
        purpose="--query",
        progress=progress,
        starting="starting Spark to plan the query",
    )


def check_output_mode(spark: Any, jplan: Any, mode: str | None) -> str:
    """The output mode Spark accepts for this query (``mode``, checked), or the first of
    append, update, complete that it accepts; Spark's own message when none is."""
    jvm = spark._jvm
    check = jvm.org.apache.spark.sql.catalyst.analysis.UnsupportedOperationChecker
    errors = []
    for m in [mode] if mode else list(OUTPUT_MODES):
        try:
            check.checkForStreaming(
                jplan, getattr(jvm.org.apache.spark.sql.streaming.OutputMode, OUTPUT_MODES[m])()
            )
            return m
        except Exception as e:  # py4j wraps Spark's AnalysisException
            errors.append(spark_message(e))
    raise StatectlError(
        f"--query: Spark does not accept the query in {mode or 'any'} output mode: {errors[0]}",
        hint="pass the --output-mode the query runs with" if mode else None,
    )


@contextlib.contextmanager
def _session_confs(spark: Any, confs: dict[str, str]) -> Iterator[None]:
    """``confs`` set on the session for the block, then put back as they were."""
    saved = {k: spark.conf.get(k, None) for k in confs}
    try:
        for k, v in confs.items():
            spark.conf.set(k, v)
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                spark.conf.unset(k)
            else:
                spark.conf.set(k, v)


def _analyzed(df: Any, spec: str) -> Any:
    """The analyzed logical plan of the user's DataFrame (Java)."""
    try:
        return df._jdf.queryExecution().analyzed()
    except Exception as e:
        raise StatectlError(
            f"--query {spec}: Spark cannot analyze the query: {spark_message(e)}"
        ) from None


def _classic_session(spark: Any, progress: Callable[[str], None] | None) -> Any:
    """The given session (a classic one: planning needs its JVM), else the planning one."""
    if spark is None:
        spark = planning_session(progress)
    if not hasattr(spark, "_jsparkSession"):
        raise UnsupportedError("--query needs a classic (not Spark Connect) SparkSession")
    return spark


def plan_query(
    spec: str,
    *,
    output_mode: str | None = None,
    confs: dict[str, str] | None = None,
    spark: Any = None,
    progress: Callable[[str], None] | None = None,
) -> PlannedQuery:
    """Plan the query that ``spec`` builds; its stateful operators as Spark would record them.

    ``confs`` are set on the session while planning (the pinned confs a restart applies, the
    target backend and partition count), then put back. ``output_mode`` None: inferred.
    """
    if output_mode is not None and output_mode not in OUTPUT_MODES:
        raise StatectlError(f"--output-mode must be one of {', '.join(OUTPUT_MODES)}")
    func = load_query_function(spec)
    spark = _classic_session(spark, progress)
    confs = dict(confs or {})
    stand_ins: list[str] = []
    replaced: dict[str, str] = {}
    with _session_confs(spark, confs), stand_in_sources(stand_ins, replaced):
        df = build_dataframe(func, spark, spec)
        if stand_ins and progress:
            progress(f"planning against an empty stand-in for {', '.join(stand_ins)}")
        jplan = _analyzed(df, spec)
        mode = check_output_mode(spark, jplan, output_mode)
        sources = planned_sources(spark, jplan, replaced)
        aggregates, operators, keys = _plan_first_batch(spark, df, spec, mode, confs)
    partitions = int(confs.get(PARTITIONS_CONF, 0) or 0)
    for op in operators:
        op.num_partitions = partitions or op.num_partitions
    return PlannedQuery(spec, mode, operators, stand_ins, sources, aggregates, key_expressions=keys)


def _plan_first_batch(
    spark: Any, df: Any, spec: str, mode: str, confs: dict[str, str]
) -> tuple[dict[int, list[AggregateBuffer]], list[Operator], dict[int, list[str | None]]]:
    """Plan ``df`` as batch 0 against a scratch checkpoint: the aggregation buffers of its
    plan, its stateful operators read back from what planning wrote, and the grouping
    expressions of their keys."""
    with tempfile.TemporaryDirectory(prefix="statectl-plan-") as tmp:
        # What MicroBatchExecution writes before it plans batch 0; transformWithState's
        # schema validation checks that the batch is in the offset log.
        with open(os.path.join(tmp, "metadata"), "w") as f:
            f.write('{"id":"00000000-0000-0000-0000-000000000000"}')
        os.makedirs(os.path.join(tmp, "offsets"))
        with open(os.path.join(tmp, "offsets", "0"), "w") as f:
            f.write('v1\n{"batchWatermarkMs":0,"batchTimestampMs":0,"conf":{}}')
        try:
            ie = _incremental_execution(
                spark, df._jdf.logicalPlan(), mode, os.path.join(tmp, "state"), confs
            )
            # Planning writes state/<op>/_metadata and schema files.
            executed = ie.executedPlan()
        except StatectlError:
            raise
        except Exception as e:
            raise StatectlError(
                f"--query {spec}: Spark cannot plan the query: {spark_message(e)}"
            ) from None
        aggregates = aggregate_buffers(executed)
        keys = key_expressions(executed)
        ckpt = Checkpoint.open(tmp)
        ids = sorted(
            int(f.name)
            for f in ckpt.io.list_dir(ckpt.path("state"))
            if f.is_dir and f.name.isdigit()
        )
        return aggregates, [load_operator(ckpt, op, 0) for op in ids], keys


FILE_SOURCE = re.compile(r"^FileSource\[(.*)\]$", re.S)


def planned_sources(spark: Any, jplan: Any, replaced: dict[str, str]) -> list[PlannedSource]:
    """The streaming relations of the analyzed plan, numbered as ``MicroBatchExecution``
    numbers them: leaves in plan order, the same relation (a self-union) once."""
    found: list[Any] = []
    it = jplan.collectLeaves().iterator()
    while it.hasNext():
        leaf = it.next()
        name = leaf.getClass().getSimpleName()
        if name in ("StreamingRelation", "StreamingRelationV2") and not any(
            leaf.equals(f) for f in found
        ):
            found.append(leaf)
    out = []
    for i, leaf in enumerate(found):
        desc = str(leaf.sourceName())
        m = FILE_SOURCE.match(desc)
        path = None
        if m and leaf.getClass().getSimpleName() == "StreamingRelation":
            path = replaced.get(m.group(1), m.group(1))
            desc = f"FileSource[{path}]"
        parser = None
        if leaf.getClass().getSimpleName() == "StreamingRelationV2":
            parser = _v2_offset_parser(spark, leaf)
        out.append(PlannedSource(i, desc, path, parser, _user_name(leaf)))
    return out


def _user_name(leaf: Any) -> str | None:
    """The name ``readStream.name(...)`` gave the source (Spark 4.2+), else None."""
    try:
        named = leaf.sourceIdentifyingName().toUserProvided()
    except Exception:  # a relation without the method (older planning JVMs)
        return None
    return str(named.get().name()) if named.isDefined() else None


def _v2_offset_parser(spark: Any, leaf: Any) -> Callable[[str], str | None]:
    """The source's own ``deserializeOffset``: a micro-batch stream built on a scratch
    checkpoint directory (built lazily, stopped after use; nothing is read). Returns Spark's
    message for an offset the source cannot parse, None when it parses, or when the source
    cannot be built here (then the offset is not checked)."""
    table, options = leaf.table(), leaf.extraOptions()

    def parse(text: str) -> str | None:
        with tempfile.TemporaryDirectory(prefix="statectl-source-") as tmp:
            try:
                stream = table.newScanBuilder(options).build().toMicroBatchStream(tmp)
            except Exception:
                return None
            try:
                stream.deserializeOffset(text).json()
                return None
            except Exception as e:
                return spark_message(e) or "the source cannot parse it"
            finally:
                with contextlib.suppress(Exception):
                    stream.stop()

    return parse


def _seq(jseq: Any) -> list[Any]:
    return [jseq.apply(i) for i in range(jseq.size())]


def _java_value(v: Any) -> Any:
    """A Catalyst literal's value as JSON-able Python (py4j converts numbers and booleans)."""
    if v is None or isinstance(v, (bool, int, float, str)):
        return v
    name = v.getClass().getSimpleName()
    if name == "Decimal":
        return v.toJavaBigDecimal().toPlainString()
    if name == "UTF8String":
        return v.toString()
    raise ValueError(name)


def _buffers_of(agg_exec: Any) -> list[AggregateBuffer]:
    # Whole-stage code generation wraps the aggregate node StateStoreSaveExec saves.
    while agg_exec.getClass().getSimpleName() in ("WholeStageCodegenExec", "InputAdapter"):
        agg_exec = agg_exec.child()
    out = []
    for expr in _seq(agg_exec.aggregateExpressions()):
        fn = expr.aggregateFunction()
        fields = [
            {
                "name": a.name(),
                "type": json.loads(a.dataType().json()),
                "nullable": a.nullable(),
                "metadata": {},
            }
            for a in _seq(fn.aggBufferAttributes())
        ]
        initial: list[Any] | None
        try:
            # A DeclarativeAggregate's own initial values, evaluated by Spark (foldable).
            initial = [_java_value(e.eval(None)) for e in _seq(fn.initialValues())]
        except Exception:
            initial = None  # an imperative aggregate: no declarative start
        out.append(AggregateBuffer(fn.sql(bool(expr.isDistinct())), fields, initial))
    return out


SAVES_AGGREGATES = ("StateStoreSaveExec", "SessionWindowStateStoreSaveExec")


def aggregate_buffers(plan: Any) -> dict[int, list[AggregateBuffer]]:
    """Operator id -> the aggregates whose buffers a StateStoreSaveExec (or a session window's
    SessionWindowStateStoreSaveExec) keeps: the aggregate node it saves (its child, a
    MergingSessionsExec for sessions), as planned. Empty where the plan has other shapes."""
    found: dict[int, list[AggregateBuffer]] = {}
    stack = [plan]
    while stack:
        node = stack.pop()
        stack += _seq(node.children())
        if node.getClass().getSimpleName() not in SAVES_AGGREGATES:
            continue
        try:
            info = node.stateInfo()
            if info.isDefined():
                found[int(info.get().operatorId())] = _buffers_of(node.child())
        except Exception:
            continue  # not an aggregate below: evolution refuses with its reason
    return found


GROUPING_EXPRESSION = "_groupingexpression"


def key_expressions(plan: Any) -> dict[int, list[str | None]]:
    """Operator id -> per key field, the SQL of the grouping expression Spark aliased
    ``_groupingexpression`` (``upper(k)``; None for a plain column), for the stateful operators
    keyed by one. Spark pulls a non-column grouping expression into a projection below the
    aggregate under that one name, whatever the expression."""
    nodes, stack = [], [plan]
    while stack:
        node = stack.pop()
        nodes.append(node)
        stack += _seq(node.children())
    aliases: dict[int, str] = {}
    for node in nodes:
        for expr in _seq(node.expressions()):
            if expr.getClass().getSimpleName() == "Alias" and expr.name() == GROUPING_EXPRESSION:
                aliases[int(expr.exprId().id())] = str(expr.child().sql())
    found: dict[int, list[str | None]] = {}
    for node in nodes:
        try:
            info = node.stateInfo()
            keys = _seq(node.keyExpressions())
        except Exception:
            continue  # not a stateful operator keyed by expressions
        names = [aliases.get(int(k.exprId().id())) if _is_grouping(k) else None for k in keys]
        if info.isDefined() and any(names):
            found[int(info.get().operatorId())] = names
    return found


def _is_grouping(expr: Any) -> bool:
    try:
        return str(expr.name()) == GROUPING_EXPRESSION
    except Exception:
        return False


def planning_confs(pinned: dict[str, str], backend: str, partitions: int) -> dict[str, str]:
    """What a restart of the restored checkpoint runs with."""
    confs = dict(pinned)
    confs[PROVIDER_CONF] = get_backend(backend).provider_classes[0]
    confs[PARTITIONS_CONF] = str(partitions)
    return confs

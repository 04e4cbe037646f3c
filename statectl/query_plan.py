"""Plan a user's streaming query without running it, to learn its stateful operators.

``--query MODULE:FUNCTION`` names a function that builds the streaming DataFrame. We hand its
logical plan to Spark's own ``IncrementalExecution`` as the first batch of a run against a
scratch checkpoint. Planning a first batch makes Spark write exactly the operator metadata and
state schema files it would write for the real query (``StateSchemaAndOperatorMetadataRule``),
so we read them back with statectl's checkpoint reader instead of re-deriving operator ids,
names and schemas ourselves. Nothing runs: no source is read and no state is touched.

The constructor of ``IncrementalExecution`` is internal to Spark (16 parameters in 4.3); it is
called by reflection so that Python ints widen to Java longs, and a Spark whose constructor
differs gets a clear error rather than a wrong plan.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import os
import sys
import tempfile
from dataclasses import dataclass
from typing import Any

from statectl.checkpoint.model import (
    PARTITIONS_CONF,
    PROVIDER_CLASSES,
    PROVIDER_CONF,
    Checkpoint,
    Operator,
    load_operator,
)
from statectl.errors import StatectlError, UnsupportedError

INCREMENTAL_EXECUTION = "org.apache.spark.sql.execution.streaming.runtime.IncrementalExecution"
OUTPUT_MODES = {"append": "Append", "update": "Update", "complete": "Complete"}


@dataclass
class PlannedQuery:
    spec: str
    output_mode: str
    operators: list[Operator]


def load_query_function(spec: str) -> Any:
    """``package.module:function`` or ``path/to/file.py:function``."""
    module_name, sep, func_name = spec.rpartition(":")
    if not sep or not module_name or not func_name:
        raise StatectlError(f"--query wants MODULE:FUNCTION or FILE.py:FUNCTION, got {spec!r}")
    if module_name.endswith(".py"):
        if not os.path.isfile(module_name):
            raise StatectlError("--query names a file that does not exist", module_name)
        name = "_statectl_query_" + os.path.splitext(os.path.basename(module_name))[0]
        mod_spec = importlib.util.spec_from_file_location(name, module_name)
        assert mod_spec and mod_spec.loader
        module = importlib.util.module_from_spec(mod_spec)
        mod_spec.loader.exec_module(module)
    else:
        if os.getcwd() not in sys.path:
            sys.path.insert(0, os.getcwd())
        try:
            module = importlib.import_module(module_name)
        except ImportError as e:
            raise StatectlError(
                f"--query: cannot import {module_name!r} ({e}); run from the directory that "
                "holds it or give FILE.py:FUNCTION"
            ) from None
    func = getattr(module, func_name, None)
    if not callable(func):
        raise StatectlError(f"--query: {module_name} has no function {func_name!r}")
    return func


def build_dataframe(func: Any, spark: Any) -> Any:
    """Call the user's function with the session if it takes an argument, else with none."""
    params = [
        p
        for p in inspect.signature(func).parameters.values()
        if p.default is p.empty and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
    ]
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


def plan_query(
    spec: str,
    *,
    output_mode: str = "append",
    confs: dict[str, str] | None = None,
    spark: Any = None,
) -> PlannedQuery:
    """Plan the query that ``spec`` builds; its stateful operators as Spark would record them.

    ``confs`` are set on the session while planning (the pinned confs a restart applies, the
    target backend and partition count), then put back.
    """
    if output_mode not in OUTPUT_MODES:
        raise StatectlError(f"--output-mode must be one of {', '.join(OUTPUT_MODES)}")
    func = load_query_function(spec)
    if spark is None:
        from pyspark.sql import SparkSession

        spark = (
            SparkSession.builder.master("local[1]")
            .appName("statectl-plan")
            .config("spark.ui.enabled", "false")
            .getOrCreate()
        )
        spark.sparkContext.setLogLevel("ERROR")
    if not hasattr(spark, "_jsparkSession"):
        raise UnsupportedError("--query needs a classic (not Spark Connect) SparkSession")
    confs = dict(confs or {})
    saved = {k: spark.conf.get(k, None) for k in confs}
    try:
        for k, v in confs.items():
            spark.conf.set(k, v)
        df = build_dataframe(func, spark)
        with tempfile.TemporaryDirectory(prefix="statectl-plan-") as tmp:
            # What MicroBatchExecution writes before it plans batch 0; transformWithState's
            # schema validation checks that the batch is in the offset log.
            with open(os.path.join(tmp, "metadata"), "w") as f:
                f.write('{"id":"00000000-0000-0000-0000-000000000000"}')
            os.makedirs(os.path.join(tmp, "offsets"))
            with open(os.path.join(tmp, "offsets", "0"), "w") as f:
                f.write('v1\n{"batchWatermarkMs":0,"batchTimestampMs":0,"conf":{}}')
            ie = _incremental_execution(
                spark, df._jdf.logicalPlan(), output_mode, os.path.join(tmp, "state"), confs
            )
            ie.executedPlan()  # planning writes state/<op>/_metadata and schema files
            ckpt = Checkpoint.open(tmp)
            ids = sorted(
                int(f.name)
                for f in ckpt.io.list_dir(ckpt.path("state"))
                if f.is_dir and f.name.isdigit()
            )
            operators = [load_operator(ckpt, op, 0) for op in ids]
    finally:
        for k, v in saved.items():
            if v is None:
                spark.conf.unset(k)
            else:
                spark.conf.set(k, v)
    partitions = int(confs.get(PARTITIONS_CONF, 0) or 0)
    for op in operators:
        if partitions:
            op.num_partitions = partitions
    return PlannedQuery(spec, output_mode, operators)


def planning_confs(pinned: dict[str, str], backend: str, partitions: int) -> dict[str, str]:
    """What a restart of the restored checkpoint runs with."""
    confs = dict(pinned)
    confs[PROVIDER_CONF] = PROVIDER_CLASSES[backend]
    confs[PARTITIONS_CONF] = str(partitions)
    return confs

"""Build large aggregation checkpoints for bench/scale.py without running Spark on all of it.

    python bench/synthesize.py --keys 100000000 --workdir /tmp/statectl-scale-100m
    python bench/scale.py --keys 100000000 --workdir /tmp/statectl-scale-100m --skip-spark

Spark needs hours on a 2-core machine to aggregate 100M keys (10M took 25 minutes). This
script has Spark write only a small template checkpoint of the same query as
``bench/scale.py`` (``groupBy(k).agg(sum(v), count(*))`` over ``k = 'key-<id>'``,
``v = id``), then writes the state Spark would hold after all N keys: a savepoint from the
template whose table is replaced, a million rows at a time, by ``SavepointWriter.with_state``
(streamed, so memory stays bounded), restored under ``--memory`` into ``agg-rocksdb-N`` and
``agg-hdfs-N`` at 2 partitions. ``scale.py`` finds them in its cache and measures on them.

The difference from a Spark-built checkpoint: each partition is one snapshot at one batch
(statectl's restore layout) instead of a chain of deltas/changelogs over several batches.
The rows, keys, schemas and partitioning are the same, and Spark reads what restore writes
(the restore tests continue real queries from it).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import statectl

TEMPLATE_KEYS = 1000
CHUNK = 1_000_000


def template(work: Path) -> Path:
    """A small Spark-written checkpoint of scale.py's query (HDFS provider, 2 partitions)."""
    ck = work / "template-hdfs"
    if (ck / "commits" / "0").exists():
        return ck
    shutil.rmtree(ck, ignore_errors=True)
    script = textwrap.dedent(
        f"""
        from pyspark.sql import SparkSession
        spark = (SparkSession.builder.master("local[2]").config("spark.ui.enabled", "false")
                 .config("spark.sql.shuffle.partitions", "2").getOrCreate())
        src = "{work}/template-input"
        (spark.range(0, {TEMPLATE_KEYS}, 1, 1)
         .selectExpr("concat('key-', id) as k", "id as v").write.mode("overwrite").parquet(src))
        q = (spark.readStream.schema("k string, v long").parquet(src)
             .groupBy("k").agg({{"v": "sum", "*": "count"}})
             .writeStream.format("noop").outputMode("update")
             .option("checkpointLocation", "{ck}").trigger(availableNow=True).start())
        q.awaitTermination()
        """
    )
    subprocess.run([sys.executable, "-c", script], check=True)
    return ck


def rows(keys: int, schema: pa.Schema) -> Iterator[pa.RecordBatch]:
    """The state after all ``keys`` keys: key-i -> (sum = i, count = 1), CHUNK rows at a time."""
    key_type = schema.field("key").type
    value_type = schema.field("value").type
    for start in range(0, keys, CHUNK):
        ids = pa.array(np.arange(start, min(start + CHUNK, keys), dtype=np.int64))
        k = pc.binary_join_element_wise("key-", pc.cast(ids, pa.string()), "")
        key = pa.StructArray.from_arrays([k], fields=list(key_type))
        ones = pa.array(np.ones(len(ids), dtype=np.int64))
        value = pa.StructArray.from_arrays([ids, ones], fields=list(value_type))
        yield pa.RecordBatch.from_arrays([key, value], names=["key", "value"])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--keys", type=int, default=100_000_000)
    ap.add_argument("--workdir", default="/tmp/statectl-scale-100m")
    ap.add_argument("--memory", default="1G", help="statectl's budget while writing")
    args = ap.parse_args()
    work = Path(args.workdir)
    work.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    base = statectl.open(str(template(work)))
    (op,) = base.operators
    sp = work / f"savepoint-{args.keys}"
    if not (sp / "_metadata").exists():
        shutil.rmtree(sp, ignore_errors=True)
        schema = op.tables[0].schema
        writer = statectl.SavepointWriter.from_savepoint(base)
        writer.with_state(op.uid, rows(args.keys, schema)).write(str(sp))
    print(f"savepoint of {args.keys:,} keys: {time.perf_counter() - t0:.0f} s", file=sys.stderr)
    for backend in ("rocksdb", "hdfs"):
        out = work / f"agg-{backend}-{args.keys}"
        if (out / "commits").is_dir():
            continue
        shutil.rmtree(out, ignore_errors=True)
        t = time.perf_counter()
        statectl.restore(str(sp), str(out), backend=backend, partitions=2, memory=args.memory)
        print(f"{out.name}: {time.perf_counter() - t:.0f} s", file=sys.stderr)
    os.sync()


if __name__ == "__main__":
    main()

"""Benchmark: statectl export vs Spark's statestore reader on a 1,000,000-key aggregation.

    python bench/read.py [--keys 1000000] [--workdir /tmp/statectl-bench]

Builds one aggregation checkpoint per backend with real Spark (cached in the work directory),
then, in one run, times:
  * `statectl export --operator 0 -o out.parquet` as a subprocess (end to end, Python start included),
  * the in-process read (checkpoint -> Arrow table) and its decode rate,
  * Spark's statestore reader writing the same Parquet: in a fresh process (JVM start included)
    and inside an already started session (JVM start excluded),
and prints a table.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path

PROVIDERS = {
    "hdfs": "org.apache.spark.sql.execution.streaming.state.HDFSBackedStateStoreProvider",
    "rocksdb": "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider",
}

SPARK_SESSION = textwrap.dedent(
    """
    from pyspark.sql import SparkSession
    spark = (SparkSession.builder.master("local[2]").config("spark.ui.enabled", "false")
             .config("spark.sql.shuffle.partitions", "2").config("spark.driver.memory", "4g")
             .getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    """
)


def build_checkpoints(work: Path, keys: int) -> dict[str, Path]:
    out = {b: work / f"agg-{b}-{keys}" for b in PROVIDERS}
    if all((p / "commits" / "0").exists() for p in out.values()):
        return out
    script = SPARK_SESSION + textwrap.dedent(
        f"""
        import shutil
        src = "{work}/input"
        shutil.rmtree(src, ignore_errors=True)
        spark.range({keys}).selectExpr("concat('key-', id) as k", "id as v").repartition(2).write.parquet(src)
        for backend, provider in {PROVIDERS!r}.items():
            ck = "{work}/agg-" + backend + "-{keys}"
            shutil.rmtree(ck, ignore_errors=True)
            spark.conf.set("spark.sql.streaming.stateStore.providerClass", provider)
            q = (spark.readStream.schema("k string, v long").parquet(src)
                 .groupBy("k").agg({{"v": "sum", "*": "count"}})
                 .writeStream.format("noop").outputMode("update")
                 .option("checkpointLocation", ck).trigger(availableNow=True).start())
            q.awaitTermination()
        """
    )
    subprocess.run([sys.executable, "-c", script], check=True)
    return out


def timed(cmd: list[str]) -> float:
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    return time.perf_counter() - t0


def spark_in_process(ckpts: dict[str, Path], work: Path) -> dict[str, float]:
    """Time the statestore reader writing Parquet inside one already-started session."""
    script = SPARK_SESSION + textwrap.dedent(
        f"""
        import time, json
        res = {{}}
        for backend, ck in {{k: str(v) for k, v in {dict(ckpts)!r}.items()}}.items():
            spark.read.format("statestore").load(ck).count()  # warm up the reader classes
            t0 = time.perf_counter()
            (spark.read.format("statestore").load(ck)
             .selectExpr("key", "struct(value.*) as value", "partition_id")
             .write.mode("overwrite").parquet("{work}/spark-warm-" + backend))
            res[backend] = time.perf_counter() - t0
        print("RESULT" + json.dumps(res))
        """
    ).replace("PosixPath(", "str(")
    out = subprocess.run([sys.executable, "-c", script], check=True, capture_output=True, text=True)
    line = next(x for x in out.stdout.splitlines() if x.startswith("RESULT"))
    import json

    return json.loads(line[len("RESULT") :])


def spark_cold(ck: Path, dst: Path) -> float:
    script = SPARK_SESSION + textwrap.dedent(
        f"""
        (spark.read.format("statestore").load("{ck}")
         .selectExpr("key", "struct(value.*) as value", "partition_id")
         .write.mode("overwrite").parquet("{dst}"))
        """
    )
    return timed([sys.executable, "-c", script])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--keys", type=int, default=1_000_000)
    ap.add_argument("--workdir", default="/tmp/statectl-bench")
    args = ap.parse_args()
    work = Path(args.workdir)
    work.mkdir(parents=True, exist_ok=True)
    ckpts = build_checkpoints(work, args.keys)

    from statectl.checkpoint.model import Checkpoint
    from statectl.state import Selection, read_state

    statectl_bin = shutil.which("statectl") or "statectl"
    rows = []
    warm = spark_in_process(ckpts, work)
    for backend, ck in ckpts.items():
        out = work / f"statectl-{backend}.parquet"
        if out.exists():
            out.unlink()
        e2e = timed([statectl_bin, "export", str(ck), "--operator", "0", "-o", str(out)])
        t0 = time.perf_counter()
        table = read_state(Checkpoint.open(str(ck)), Selection(0))
        read_s = time.perf_counter() - t0
        n = table.num_rows
        cold = spark_cold(ck, work / f"spark-cold-{backend}")
        rows.append((backend, n, e2e, read_s, cold, warm[backend]))

    header = (
        "backend",
        "rows",
        "statectl e2e s",
        "statectl read s",
        "read rows/s",
        "spark e2e s (JVM start)",
        "spark s (warm JVM)",
        "speed-up e2e",
        "speed-up warm",
    )
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    for backend, n, e2e, read_s, cold, warm_s in rows:
        print(
            f"| {backend} | {n:,} | {e2e:.2f} | {read_s:.2f} | {n / read_s:,.0f} | {cold:.2f} | "
            f"{warm_s:.2f} | {cold / e2e:.1f}x | {warm_s / e2e:.1f}x |"
        )
    print(f"\ncores: {os.cpu_count()}, python {sys.version.split()[0]}")


if __name__ == "__main__":
    main()

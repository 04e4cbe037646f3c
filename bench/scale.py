"""Benchmark: production-size state with the local engine (issue 11).

    python bench/scale.py [--keys 10000000] [--workdir /tmp/statectl-scale] [--memory 512M]

100M keys (not part of any test). Spark needs hours to aggregate them on a 2-core machine, so
``bench/synthesize.py`` writes the checkpoints instead (the state Spark would hold, streamed
into a small Spark-written template's savepoint and restored under a budget; 4.5 minutes and
~4 GB of disk), and this script finds them in its cache::

    python bench/synthesize.py --keys 100000000 --workdir /tmp/statectl-scale-100m
    python bench/scale.py --keys 100000000 --workdir /tmp/statectl-scale-100m \
        --skip-spark --spark-master '' --memory 1G

Compare with a 10M run on synthesized checkpoints too (same layout: one snapshot per
partition, where Spark's own have delta chains). Spark can still build them itself, caching
its input (``--input-files 40 --driver-memory 8g --hdfs-from-rocksdb``), given hours.

Builds aggregation checkpoints of N keys with real Spark (HDFS and RocksDB, 2 partitions;
cached in the work directory between runs), then prints one table, each row one command run
under ``bench/treemem.py``, which samples its whole process tree (statectl and its ``--workers``
processes; every JVM and Python worker below a Spark driver) every 25 ms, or ~100 ms with JVMs
(their ``smaps_rollup`` costs more CPU than the sampler allows itself). The columns: wall
time, rows/s and four of memory (stderr also names the processes at each row's peak):

* ``peak RSS MB, largest process``: the largest SINGLE process's peak (what this column showed
  before issue 11: ``ru_maxrss``, exact for processes their parents waited for; the sampled
  figure where larger, since pyspark never waits for its JVM). Not what the run needs: statectl
  runs partition tasks in parallel worker processes.
* ``tree peak RSS MB``: the peak of the RSS summed over the tree's processes alive at once.
  Pages shared after ``fork`` (the workers inherit the parent's interpreter and imports) and
  shared libraries count once per process, so it overstates; an upper bound. At least the
  previous column (where the samples missed a single process's exact peak).
* ``tree peak PSS MB``: the same with PSS (``/proc/PID/smaps_rollup``: each shared page split
  between the processes mapping it): the closest figure to the memory the run takes from the
  machine, the one to size a container by (``n/a`` where the file is unreadable).
* ``processes``: the most processes of the tree alive in one sample.

The sums are sampled: a peak held for less than a sampling interval can be missed (statectl's
last for seconds). The sampler's own process is not counted. The rows:

* ``statectl export`` (one operator to Parquet), ``statectl savepoint``, ``statectl restore``
  of that savepoint to RocksDB at 8 partitions under ``--memory 1G`` and the default budget
  (``--only-restore``: just the savepoint and these),
* ``statectl migrate`` HDFS -> RocksDB 2 -> 8 and RocksDB -> HDFS 8 -> 2 (the 8-partition
  RocksDB source is the previous row's output),
* the same export, savepoint and both migrates with ``--engine spark`` on
  ``--spark-master`` (default ``local-cluster[2,1,2048]``: separate executor JVMs and Python
  workers; cluster start-up included; the tree figures cover statectl's Python driver, the
  driver JVM pyspark launches as its child, the executor JVMs the driver JVM starts and their
  Python daemons and workers, 8 processes; the largest single one is a Python worker or the
  driver JVM, at most a quarter of the tree),
* Spark 4.3's own offline ``repartition`` (RocksDB 2 -> 8, on a copy) and its ``statestore``
  reader writing the same Parquet as the export, JVM start included (a ``local[2]`` session:
  the tree is the Python driver and its JVM child, whose executors are threads; the JVM's own
  short-lived commands count too, but a ``posix_spawn`` child sharing the JVM's memory until it
  execs counts once).

The machine may be shared: times are wall clock, not CPU time.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

PROVIDERS = {
    "hdfs": "org.apache.spark.sql.execution.streaming.state.HDFSBackedStateStoreProvider",
    "rocksdb": "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider",
}
SPARK_SESSION = textwrap.dedent(
    """
    import os
    from pyspark.sql import SparkSession
    spark = (SparkSession.builder.master("local[2]").config("spark.ui.enabled", "false")
             .config("spark.sql.shuffle.partitions", "2")
             .config("spark.driver.memory", os.environ.get("SCALE_DRIVER_MEMORY", "6g"))
             .getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    """
)
INPUT_FILES = 4  # default: the keys arrive in this many micro-batches (one input file each)


def _complete(ckpt: Path) -> bool:
    return (ckpt / "commits").is_dir() and any((ckpt / "commits").iterdir())


def build_checkpoints(
    work: Path, keys: int, input_files: int = INPUT_FILES, hdfs_from_rocksdb: bool = False
) -> dict[str, Path]:
    """Aggregation checkpoints (count and sum per key) of ``keys`` keys, cached in ``work``.

    ``hdfs_from_rocksdb``: Spark writes only the RocksDB one; the HDFS one is its
    ``statectl migrate`` (same keys and partitions), which needs no JVM heap for the state."""
    out = {b: work / f"agg-{b}-{keys}" for b in PROVIDERS}
    if all(_complete(p) for p in out.values()):
        return out
    work.mkdir(parents=True, exist_ok=True)
    providers = {b: p for b, p in PROVIDERS.items() if not (_complete(out[b]))}
    if hdfs_from_rocksdb:
        providers.pop("hdfs", None)
    if providers:
        _spark_build(work, keys, input_files, providers)
    if hdfs_from_rocksdb and not _complete(out["hdfs"]):
        shutil.rmtree(out["hdfs"], ignore_errors=True)
        subprocess.run(
            [
                sys.executable,
                "-m",
                "statectl.cli",
                "migrate",
                str(out["rocksdb"]),
                str(out["hdfs"]),
                "--backend",
                "hdfs",
                "--partitions",
                "2",
            ],
            check=True,
            env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)},
        )
    return out


def _spark_build(work: Path, keys: int, input_files: int, providers: dict[str, str]) -> None:
    script = SPARK_SESSION + textwrap.dedent(
        f"""
        import shutil
        src = "{work}/input-{keys}"
        if not os.path.exists(src + "/_SUCCESS"):  # the input is cached too
            shutil.rmtree(src, ignore_errors=True)
            (spark.range(0, {keys}, 1, {input_files})
             .selectExpr("concat('key-', id) as k", "id as v").write.parquet(src))
        for backend, provider in {providers!r}.items():
            ck = "{work}/agg-" + backend + "-{keys}"
            shutil.rmtree(ck, ignore_errors=True)
            spark.conf.set("spark.sql.streaming.stateStore.providerClass", provider)
            q = (spark.readStream.schema("k string, v long").option("maxFilesPerTrigger", 1)
                 .parquet(src).groupBy("k").agg({{"v": "sum", "*": "count"}})
                 .writeStream.format("noop").outputMode("update")
                 .option("checkpointLocation", ck).trigger(availableNow=True).start())
            q.awaitTermination()
        """
    )
    subprocess.run([sys.executable, "-c", script], check=True)


TREEMEM = Path(__file__).resolve().parent / "treemem.py"


@dataclass
class Measured:
    seconds: float
    single_rss: float  # MB: the largest single process's peak
    tree_rss: float  # MB: the peak of the tree's summed RSS
    tree_pss: float | None  # MB: the peak of the tree's summed PSS
    processes: int  # most processes of the tree alive at once
    at_peak: str  # the processes making up the tree's RSS peak ("java 399 + python 254 MB")


def measured(cmd: list[str]) -> Measured:
    """``cmd`` run to completion under ``bench/treemem.py`` in a fresh Python process.

    The sampler's process does nothing else, so every process it sees below itself (orphans
    included: it is their subreaper) is the command's, and its ``RUSAGE_CHILDREN`` is the
    command's tree alone."""
    res = subprocess.run(
        [sys.executable, str(TREEMEM), "--devnull", "--", *cmd], capture_output=True, text=True
    )
    try:
        out = json.loads(res.stdout.strip().splitlines()[-1])
    except (IndexError, ValueError):
        out = {"returncode": res.returncode}
    if out["returncode"] != 0:
        sys.stderr.write(res.stderr)
        raise subprocess.CalledProcessError(out["returncode"], cmd)
    if out["lingering"]:  # still running after the sampler's linger: memory it did not see
        print(f"  warning: {cmd[:4]} left processes {out['lingering']}", file=sys.stderr)
    mb = 1 << 20
    # ru_maxrss is exact but sees only processes their parents waited for (pyspark never
    # waits for its JVM); the sampled single-process peak sees every one: take the larger.
    single = max(out["max_rss_waited"] or 0, out["single_rss"])
    return Measured(
        seconds=out["seconds"],
        single_rss=single / mb,
        # The tree's peak is at least its largest process's: that bound is exact where the
        # samples missed the moment (a one-process run peaking for a few ms).
        tree_rss=max(out["tree_rss"], single) / mb,
        tree_pss=None if out["tree_pss"] is None else out["tree_pss"] / mb,
        processes=out["processes"],
        at_peak=" + ".join(f"{name} {rss / mb:.0f}" for _, name, rss, _ in out["at_peak"]) + " MB",
    )


def spark_script(body: str) -> list[str]:
    return [sys.executable, "-c", SPARK_SESSION + textwrap.dedent(body)]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--keys", type=int, default=10_000_000)
    ap.add_argument("--workdir", default="/tmp/statectl-scale")
    ap.add_argument("--memory", default=None, help="statectl --memory (default: its own)")
    ap.add_argument("--skip-spark", action="store_true", help="statectl rows only")
    ap.add_argument("--only-restore", action="store_true", help="savepoint and restore rows only")
    ap.add_argument(
        "--spark-master",
        default="local-cluster[2,1,2048]",
        help="master of the --engine spark rows ('' skips them)",
    )
    ap.add_argument("--input-files", type=int, default=INPUT_FILES, help="micro-batches to build")
    ap.add_argument("--driver-memory", default="6g", help="Spark's, while building")
    ap.add_argument(
        "--hdfs-from-rocksdb", action="store_true", help="derive the HDFS checkpoint by migrate"
    )
    args = ap.parse_args()
    work = Path(args.workdir)
    os.environ["SCALE_DRIVER_MEMORY"] = args.driver_memory
    ckpts = build_checkpoints(work, args.keys, args.input_files, args.hdfs_from_rocksdb)
    # This checkout's statectl (not whichever one is installed), as the executable runs it.
    os.environ["PYTHONPATH"] = str(Path(__file__).resolve().parent.parent)
    statectl_bin = [sys.executable, "-m", "statectl.cli"]
    mem = ["--memory", args.memory] if args.memory else []
    runs = work / ("runs-restore" if args.only_restore else "runs")
    shutil.rmtree(runs, ignore_errors=True)
    runs.mkdir()
    rows: list[tuple[str, Measured]] = []

    def run(what: str, cmd: list[str]) -> None:
        m = measured(cmd)
        rows.append((what, m))
        print(
            f"  {what}: {m.seconds:.1f} s, {m.single_rss:.0f} MB (1 process), "
            f"tree {m.tree_rss:.0f} MB RSS / {_mb(m.tree_pss)} MB PSS, {m.processes} processes ({m.at_peak})",
            file=sys.stderr,
        )

    hdfs, rocks = ckpts["hdfs"], ckpts["rocksdb"]
    if not args.only_restore:
        run(
            "statectl export (hdfs, 2 partitions) -> Parquet",
            [
                *statectl_bin,
                "export",
                str(hdfs),
                "--operator",
                "0",
                "-o",
                str(runs / "e.parquet"),
                *mem,
            ],
        )
    run(
        "statectl savepoint (hdfs, 2 partitions)",
        [*statectl_bin, "savepoint", str(hdfs), str(runs / "savepoints"), *mem],
    )
    (sp,) = (runs / "savepoints").iterdir()
    for budget in dict.fromkeys(("1G", args.memory)):  # once when --memory is 1G
        run(
            f"statectl restore (savepoint) -> rocksdb 8, --memory {budget or 'default'}",
            [
                *statectl_bin,
                "restore",
                str(runs / f"restored-{budget}"),
                "-s",
                str(sp),
                "--backend",
                "rocksdb",
                "--partitions",
                "8",
                *(["--memory", budget] if budget else []),
            ],
        )
    if not args.only_restore:
        run(
            "statectl migrate hdfs -> rocksdb, 2 -> 8",
            [
                *statectl_bin,
                "migrate",
                str(hdfs),
                str(runs / "rocksdb-8"),
                "--backend",
                "rocksdb",
                "--partitions",
                "8",
                *mem,
            ],
        )
        run(
            "statectl migrate rocksdb -> hdfs, 8 -> 2",
            [
                *statectl_bin,
                "migrate",
                str(runs / "rocksdb-8"),
                str(runs / "hdfs-2"),
                "--backend",
                "hdfs",
                "--partitions",
                "2",
                *mem,
            ],
        )
        if args.spark_master:
            on_spark = [
                "--engine",
                "spark",
                "--spark-conf",
                f"spark.master={args.spark_master}",
                "--spark-conf",
                "spark.ui.enabled=false",
                *mem,  # --memory: each Spark task's budget
            ]
            where = f"--engine spark, {args.spark_master}"
            run(
                f"statectl export (hdfs) -> Parquet, {where}",
                [
                    *statectl_bin,
                    "export",
                    str(hdfs),
                    "--operator",
                    "0",
                    "-o",
                    str(runs / "e-spark.parquet"),
                    *on_spark[:6],
                ],
            )
            run(
                f"statectl savepoint (hdfs), {where}",
                [*statectl_bin, "savepoint", str(hdfs), str(runs / "sp-spark"), *on_spark[:6]],
            )
            for src, dst, backend, n in (
                (hdfs, "rocksdb-8-spark", "rocksdb", "8"),
                (runs / "rocksdb-8-spark", "hdfs-2-spark", "hdfs", "2"),
            ):
                run(
                    f"statectl migrate -> {backend} {n}, {where}",
                    [
                        *statectl_bin,
                        "migrate",
                        str(src),
                        str(runs / dst),
                        "--backend",
                        backend,
                        "--partitions",
                        n,
                        *on_spark,
                    ],
                )
        if not args.skip_spark and not args.only_restore:
            copy = runs / "spark-repartition"
            shutil.copytree(rocks, copy)
            run(
                "Spark repartition (rocksdb, 2 -> 8), JVM start included",
                spark_script(
                    f"""
                    spark._streamingCheckpointManager.repartition("{copy}", 8)
                    """
                ),
            )
            run(
                "Spark statestore reader (hdfs) -> Parquet, JVM start included",
                spark_script(
                    f"""
                    (spark.read.format("statestore").load("{hdfs}")
                     .selectExpr("key", "struct(value.*) as value", "partition_id")
                     .write.mode("overwrite").parquet("{runs / "spark-read"}"))
                    """
                ),
            )
    print(
        f"| what ({args.keys:,} keys, {os.cpu_count()} cores) | seconds | rows/s "
        "| peak RSS MB, largest process | tree peak RSS MB | tree peak PSS MB | processes |"
    )
    print("|---|---|---|---|---|---|---|")
    for what, m in rows:
        print(
            f"| {what} | {m.seconds:.1f} | {args.keys / m.seconds:,.0f} | {m.single_rss:,.0f} "
            f"| {m.tree_rss:,.0f} | {_mb(m.tree_pss)} | {m.processes} |"
        )


def _mb(v: float | None) -> str:
    return "n/a" if v is None else f"{v:,.0f}"


if __name__ == "__main__":
    main()

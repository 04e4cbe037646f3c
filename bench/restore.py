"""Benchmark: restore/migrate 1,000,000-key state across backends with a partition change.

    python bench/restore.py [--keys 1000000] [--workdir /tmp/statectl-bench]

Uses the aggregation checkpoints of bench/read.py. Times in one run: `statectl migrate`
HDFS -> RocksDB (2 -> 3 partitions; zip+SST snapshots, and `--changelog` files) and
RocksDB -> HDFS (2 -> 3), end to end through the CLI,
beside Spark 4.3's own offline `repartition` (RocksDB only, 2 -> 3) on a copy of the RocksDB
checkpoint, in a fresh JVM.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from read import SPARK_SESSION, build_checkpoints, timed


def spark_repartition(ck: Path, work: Path, partitions: int) -> float:
    copy = work / "spark-repartition-copy"
    shutil.rmtree(copy, ignore_errors=True)
    shutil.copytree(ck, copy)
    script = SPARK_SESSION + textwrap.dedent(
        f"""
        spark._streamingCheckpointManager.repartition("{copy}", {partitions})
        """
    )
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-c", script], check=True)
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--keys", type=int, default=1_000_000)
    ap.add_argument("--workdir", default="/tmp/statectl-bench")
    args = ap.parse_args()
    work = Path(args.workdir)
    ckpts = build_checkpoints(work, args.keys)
    statectl_bin = shutil.which("statectl") or "statectl"
    rows = []
    for src, dst, extra in (
        ("hdfs", "rocksdb", []),
        ("hdfs", "rocksdb", ["--changelog"]),
        ("rocksdb", "hdfs", []),
    ):
        target = work / f"migrated-{src}-to-{dst}{'-changelog' if extra else ''}"
        shutil.rmtree(target, ignore_errors=True)
        t = timed(
            [
                statectl_bin,
                "migrate",
                str(ckpts[src]),
                str(target),
                "--backend",
                dst,
                "--partitions",
                "3",
                *extra,
            ]
        )
        layout = " (changelog files)" if extra else " (zip+SST)" if dst == "rocksdb" else ""
        rows.append((f"statectl migrate {src} -> {dst}{layout}, 2 -> 3 partitions", t))
    rows.append(
        (
            "Spark repartition (rocksdb, 2 -> 3), JVM start included",
            spark_repartition(ckpts["rocksdb"], work, 3),
        )
    )
    print(f"| what ({args.keys:,} keys) | seconds |")
    print("|---|---|")
    for what, t in rows:
        print(f"| {what} | {t:.2f} |")


if __name__ == "__main__":
    main()

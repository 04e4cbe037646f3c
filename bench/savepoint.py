"""Benchmark: `statectl savepoint` on 1,000,000-key state, beside Spark's statestore reader.

    python bench/savepoint.py [--keys 1000000] [--workdir /tmp/statectl-bench]

Reuses the aggregation checkpoints bench/read.py builds (and builds them if missing), then
times in one run: the canonical savepoint through the CLI (end to end) and in-process, and
Spark's `statestore` reader writing the same Parquet (cold JVM and warm session), and the
native savepoint (a copy of the backend files) in-process.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from read import build_checkpoints, spark_cold, spark_in_process, timed


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--keys", type=int, default=1_000_000)
    ap.add_argument("--workdir", default="/tmp/statectl-bench")
    args = ap.parse_args()
    work = Path(args.workdir)
    work.mkdir(parents=True, exist_ok=True)
    ckpts = build_checkpoints(work, args.keys)

    from statectl.savepoints.create import take_savepoint

    statectl_bin = shutil.which("statectl") or "statectl"
    warm = spark_in_process(ckpts, work)
    rows = []
    for backend, ck in ckpts.items():
        target = work / f"savepoints-{backend}"
        shutil.rmtree(target, ignore_errors=True)
        e2e = timed([statectl_bin, "savepoint", str(ck), str(target)])
        t0 = time.perf_counter()
        _, meta = take_savepoint(str(ck), str(target))
        inproc = time.perf_counter() - t0
        t0 = time.perf_counter()
        take_savepoint(str(ck), str(target), kind="native")
        native = time.perf_counter() - t0
        n = sum(op.rows for op in meta.operators)
        size = sum(f.bytes for op in meta.operators for t in op.tables for f in t.files)
        cold = spark_cold(ck, work / f"spark-cold-{backend}")
        rows.append((backend, n, size, e2e, inproc, native, cold, warm[backend]))
    header = (
        "backend",
        "rows",
        "savepoint MiB",
        "statectl savepoint e2e s",
        "in-process s",
        "native in-process s",
        "spark statestore->parquet e2e s",
        "spark warm s",
        "speed-up e2e",
    )
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    for backend, n, size, e2e, inproc, native, cold, warm_s in rows:
        print(
            f"| {backend} | {n:,} | {size / 2**20:.1f} | {e2e:.2f} | {inproc:.2f} | {native:.2f} | {cold:.2f} | "
            f"{warm_s:.2f} | {cold / e2e:.1f}x |"
        )


if __name__ == "__main__":
    main()

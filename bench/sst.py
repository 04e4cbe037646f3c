"""Benchmark: one RocksDB snapshot's SST, the vectorized writer against rocksdict's.

    python bench/sst.py [--keys 1250000] [--repeat 3]

A migrate's build step for one target partition, alone: aggregation-shaped entries (the
encoding-version byte and an UnsafeRow of a ``key-<id>`` string; a value row of two longs),
unsorted, written as a RocksDB database holding one SST. Two routes, each timed in CPU seconds
of this process (the machine may be shared; wall time would measure the neighbours):

* ``vectorized``: ``statectl.backends.writers._build_rocksdb`` as restore runs it (sort, then
  ``statectl/backends/sst.py``, then ingestion);
* ``rocksdict``: the route it replaced (sort, ``to_pylist``, one ``SstFileWriter`` put per
  entry, then ingestion), kept here only for this comparison.

Both databases are read back and compared entry for entry.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from statectl.backends.writers import _build_rocksdb, _rocksdb_options, sorted_entries


def entries(n: int) -> tuple[pa.Array, pa.Array]:
    """``n`` aggregation entries in a shuffled order, as a restore's spill holds them."""
    rng = np.random.default_rng(5)
    ids = rng.permutation(n)
    keys, values = [], []
    for i in ids.tolist():
        text = b"key-%d" % i
        padded = text + b"\0" * (-len(text) % 8)
        # UnsafeRow of one string: null bits, (offset << 32 | size), the padded bytes.
        row = (0).to_bytes(8, "little") + ((16 << 32) | len(text)).to_bytes(8, "little") + padded
        keys.append(b"\0" + row)
        values.append(b"\0" + bytes(8) + (i * 3).to_bytes(8, "little") + (2).to_bytes(8, "little"))
    return pa.array(keys, pa.large_binary()), pa.array(values, pa.large_binary())


def rocksdict_route(local: str, keys: pa.Array, values: pa.Array) -> None:
    from rocksdict import Rdict, SstFileWriter

    keys, values = sorted_entries(keys, values)
    sst = local + ".ingest.sst"
    writer = SstFileWriter(options=_rocksdb_options())
    writer.open(sst)
    for key, value in zip(keys.to_pylist(), values.to_pylist(), strict=True):
        writer[key] = value
    writer.finish()
    db = Rdict(local, _rocksdb_options())
    db.ingest_external_file([sst])
    db.flush()
    db.close()


def vectorized_route(local: str, keys: pa.Array, values: pa.Array) -> None:
    _build_rocksdb(local, [sorted_entries(keys, values)])


def read_back(local: str) -> list[tuple[bytes, bytes]]:
    from rocksdict import Rdict

    db = Rdict(local, _rocksdb_options())
    try:
        return list(db.items())
    finally:
        db.close()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--keys", type=int, default=1_250_000)  # 10M keys over 8 partitions
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    keys, values = entries(args.keys)
    routes = {"vectorized": vectorized_route, "rocksdict": rocksdict_route}
    best: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix="statectl-bench-sst-") as work:
        for _ in range(args.repeat):
            for name, route in routes.items():
                local = os.path.join(work, name)
                shutil.rmtree(local, ignore_errors=True)
                t0 = time.process_time()
                route(local, keys, values)
                best[name] = min(best.get(name, 1e9), time.process_time() - t0)
        same = read_back(os.path.join(work, "vectorized")) == read_back(
            os.path.join(work, "rocksdict")
        )
    print(f"{args.keys:,} entries, best of {args.repeat}, CPU seconds:")
    for name, seconds in best.items():
        print(f"  {name:<10} {seconds:6.2f} s  {args.keys / seconds / 1e6:5.2f} M entries/s")
    print(f"  speedup    {best['rocksdict'] / best['vectorized']:.1f}x; same entries: {same}")
    if not same:
        raise SystemExit("the databases differ")


if __name__ == "__main__":
    main()

"""How fast ``statectl history`` is on a checkpoint with many keys and many batches.

    python bench/history.py --keys 1000000 --batches 120 --partitions 8

Builds (once, cached in --workdir) an aggregation checkpoint in the HDFS layout from the
Spark-written fixture agg-hdfs: its logs, confs and schemas, with ``--batches`` batches whose
deltas put ``keys / batches`` new keys each plus updates of a tenth as many existing keys, and
a snapshot every ``--snapshot-every`` (10) versions per partition (what Spark's maintenance writes). Rows are random
bytes of the fixture's sizes: history reads record framing, never a row, in the modes timed
here. Then times ``history`` in each cheap mode (in process, and the CLI with ``--json``) and
prints a table. History's cost grows with the number of increment files and their records
(``counts``) or the number of files alone (``sizes``), not with the state's total size.

Measured 2026-11-27 on the shared 2-core machine (load average 7-15 from other work; best of
two runs, in process; the CLI adds its start-up and the JSON of every batch and partition):

    keys  batches  partitions  state files   sizes    counts   counts, CLI --json
    1M    120      8           1,056         0.2 s    3.3 s    5.7 s
    1M    1,000    8           8,080         1.4 s    4.9 s    -
    10M   1,000    8           8,016         1.7 s    25 s     -

``counts`` replays every increment's keys as hashes (exact rows): about 1 s per million
records plus about 2.5 ms per increment file read here. Extrapolated (linear in files and
records): 10M keys over 1,000 batches at 200 partitions is 200,000 increment files, about
8-10 minutes in ``counts`` on this machine and tens of seconds in ``sizes``, which reads only
listings, logs and zip metadata; on an object store each file read is a request, so
``counts`` pays the store's latency per increment (8 threads overlap partitions).
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow as pa

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from statectl.codecs.compression import compress_stream  # noqa: E402
from statectl.codecs.records import write_state_records  # noqa: E402
from statectl.history import history  # noqa: E402

TEMPLATE = ROOT / "fixtures" / "checkpoints" / "agg-hdfs"
KEY_BYTES, VALUE_BYTES = 24, 40  # about the fixture's UnsafeRow sizes
SNAPSHOT_EVERY = 10


def _binary(ids: np.ndarray, width: int, salt: int) -> pa.Array:
    """Fixed-width byte strings, unique per id (the id's bytes, then filler)."""
    raw = np.zeros((len(ids), width), np.uint8)
    raw[:, :8] = ids.astype("<i8").view(np.uint8).reshape(-1, 8)
    raw[:, 8:] = salt % 251
    data = pa.py_buffer(raw.tobytes())
    offsets = pa.py_buffer(np.arange(0, (len(ids) + 1) * width, width, dtype=np.int64).tobytes())
    return pa.LargeBinaryArray.from_buffers(pa.large_binary(), len(ids), [None, offsets, data])


def _logs(ck: Path, batches: int, partitions: int) -> None:
    """offsets/N and commits/N for every batch, one minute apart, the template's confs."""
    head, meta, *rest = (TEMPLATE / "offsets" / "0").read_text().split("\n")
    conf = json.loads(meta)
    conf["conf"]["spark.sql.shuffle.partitions"] = str(partitions)
    t0 = conf["batchTimestampMs"]
    for b in range(batches):
        conf["batchTimestampMs"] = t0 + b * 60_000
        (ck / "offsets" / str(b)).write_text("\n".join([head, json.dumps(conf), *rest]))
        (ck / "commits" / str(b)).write_text('v1\n{"nextBatchWatermarkMs":0}')


def build(ck: Path, keys: int, batches: int, partitions: int, every: int = SNAPSHOT_EVERY) -> None:
    if (ck / "commits" / str(batches - 1)).exists():
        return
    shutil.rmtree(ck, ignore_errors=True)
    for d in ("offsets", "commits", "sources"):
        (ck / d).mkdir(parents=True)
    shutil.copy(TEMPLATE / "metadata", ck / "metadata")
    shutil.copytree(TEMPLATE / "sources", ck / "sources", dirs_exist_ok=True)
    _logs(ck, batches, partitions)
    meta = ck / "state" / "0" / "_metadata"
    meta.mkdir(parents=True)
    (meta / "metadata").write_text(
        (TEMPLATE / "state/0/_metadata/metadata")
        .read_text()
        .replace('"numPartitions":2', f'"numPartitions":{partitions}')
    )
    rng = np.random.default_rng(7)
    per = max(keys // batches // partitions, 1)
    for p in range(partitions):
        d = ck / "state" / "0" / str(p)
        shutil.copytree(TEMPLATE / "state/0/0/_metadata", d / "_metadata")
        base = p * per * batches
        for v in range(1, batches + 1):
            new = np.arange(base + (v - 1) * per, base + v * per)
            old = rng.integers(base, base + (v - 1) * per, per // 10) if v > 1 else new[:0]
            ids = np.concatenate([new, old])
            k, val = _binary(ids, KEY_BYTES, 0), _binary(ids, VALUE_BYTES, v)
            (d / f"{v}.delta").write_bytes(compress_stream("lz4", write_state_records(k, val)))
            if v % every == 0:
                live = np.arange(base, base + v * per)
                snap = write_state_records(
                    _binary(live, KEY_BYTES, 0), _binary(live, VALUE_BYTES, v)
                )
                (d / f"{v}.snapshot").write_bytes(compress_stream("lz4", snap))


def _time(fn, repeat: int = 2) -> float:
    best = float("inf")
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--keys", type=int, default=1_000_000)
    ap.add_argument("--batches", type=int, default=120)
    ap.add_argument("--partitions", type=int, default=8)
    ap.add_argument("--snapshot-every", type=int, default=SNAPSHOT_EVERY)
    ap.add_argument("--workdir", default="/tmp/statectl-history-bench")
    args = ap.parse_args()
    name = f"agg-hdfs-{args.keys}-{args.batches}-{args.partitions}-{args.snapshot_every}"
    ck = Path(args.workdir) / name
    t = time.perf_counter()
    build(ck, args.keys, args.batches, args.partitions, args.snapshot_every)
    print(f"checkpoint {ck} ready in {time.perf_counter() - t:.1f} s")
    files = sum(1 for f in (ck / "state").rglob("*") if f.suffix in (".delta", ".snapshot"))
    size = sum(f.stat().st_size for f in (ck / "state").rglob("*") if f.is_file())
    print(f"{files} state files, {size / 1e6:.1f} MB")
    doc = history(str(ck))
    op = doc["operators"][0]
    print(f"rows {op['rows']} (exact: {op['rows_exact']}), restart {op['restart']}")
    print(f"{'mode':<8} {'in process':>12} {'CLI --json':>12}")
    for mode in ("sizes", "counts"):
        inproc = _time(lambda m=mode: history(str(ck), rows=m))
        cmd = [sys.executable, "-m", "statectl.cli", "history", str(ck), "--rows", mode, "--json"]
        cli = _time(lambda c=cmd: subprocess.run(c, check=True, capture_output=True), 1)
        print(f"{mode:<8} {inproc:>10.2f} s {cli:>10.2f} s")


if __name__ == "__main__":
    main()

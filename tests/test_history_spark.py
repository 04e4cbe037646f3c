"""``statectl history`` and ``statectl report`` on checkpoints Spark writes here, from input whose
every per-batch figure the test computes on its own.

The query: a file source (one file per batch), a 50 s watermark and ``dropDuplicates(id, ts)``,
four shuffle partitions. File ``b`` holds ``SIZES[b]`` distinct ids, all with event time
``(b + 1) * 100`` s. So, independently of any state file: batch ``b`` puts ``SIZES[b]`` keys,
its watermark is ``(100 b - 50)`` s (0 for batch 0), it evicts the keys of batch ``b - 2``
(event time at or below the watermark), and it leaves the keys of batches ``b - 1`` and ``b``.
Which partition a key lands in is Spark's own ``pmod(hash(id, ts), 4)`` over the input rows.
Run twice: HDFS with ids spread evenly, and RocksDB (changelog checkpointing) with four fifths
of each batch's ids in partition 0 (one hot key range), which history must flag as skewed.
"""

from __future__ import annotations

import glob
import json
import os
import shutil

import numpy as np
import pytest

import statectl
from statectl.codecs.murmur3 import hash_long
from statectl.history import history
from tests.helpers.cli import cli, cli_json

pytestmark = pytest.mark.spark

SIZES = [80, 30, 60, 120]
PARTITIONS = 4
DELAY_S = 50
HDFS = "org.apache.spark.sql.execution.streaming.state.HDFSBackedStateStoreProvider"
ROCKSDB = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"


def _ts(b: int) -> int:
    return (b + 1) * 100


def _candidates() -> dict[int, list[tuple[int, int]]]:
    """Batch -> (id, partition) of ids 0..1999 at the batch's event time: Spark's
    ``pmod(hash(id, ts), 4)`` (Murmur3, seed 42, the long id then the timestamp's
    microseconds), here with numpy; test_murmur3.py checks it against Spark."""
    ids = np.arange(2000, dtype=np.int64)
    out = {}
    for b in range(len(SIZES)):
        h = hash_long(ids, np.full(len(ids), 42, np.uint32))
        h = hash_long(np.full(len(ids), _ts(b) * 1_000_000, np.int64), h)
        p = np.mod(h.view(np.int32).astype(np.int64), PARTITIONS)
        out[b] = list(zip(ids.tolist(), p.tolist(), strict=True))
    return out


def _pick(cands: list[tuple[int, int]], n: int, skewed: bool) -> list[tuple[int, int]]:
    if not skewed:
        return cands[:n]
    hot = [c for c in cands if c[1] == 0][: n * 4 // 5]
    return hot + [c for c in cands if c[1] != 0][: n - len(hot)]


def _run(spark, tmp, provider: str, skewed: bool, cands) -> tuple[str, dict]:
    """Write the input, run the query to the end, return (checkpoint, expected figures)."""
    from pyspark.sql import functions as F

    inp, ckpt = os.path.join(tmp, "in"), os.path.join(tmp, "ckpt")
    os.makedirs(inp)
    batches = []
    for b, n in enumerate(SIZES):
        rows = _pick(cands[b], n, skewed)
        assert len(rows) == n
        batches.append(rows)
        path = os.path.join(inp, f"part-{b}.json")
        with open(path, "w") as f:
            f.writelines(json.dumps({"id": i, "ts": _ts(b)}) + "\n" for i, _ in rows)
        os.utime(path, (1_700_000_000 + b * 10, 1_700_000_000 + b * 10))
    confs = {
        "spark.sql.shuffle.partitions": str(PARTITIONS),
        "spark.sql.streaming.stateStore.providerClass": provider,
        "spark.sql.streaming.noDataMicroBatches.enabled": "false",
        "spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled": "true",
    }
    saved = {k: spark.conf.get(k, None) for k in confs}
    for k, v in confs.items():
        spark.conf.set(k, v)
    try:
        q = (
            spark.readStream.schema("id long, ts long")
            .option("maxFilesPerTrigger", 1)
            .json(inp)
            .withColumn("ts", F.timestamp_seconds("ts"))
            .withWatermark("ts", f"{DELAY_S} seconds")
            .dropDuplicates(["id", "ts"])
            .writeStream.format("noop")
            .option("checkpointLocation", ckpt)
            .trigger(availableNow=True)
            .start()
        )
        q.awaitTermination(300)
    finally:
        for k, v in saved.items():
            spark.conf.unset(k) if v is None else spark.conf.set(k, v)
    return ckpt, _expected(batches)


def _expected(batches: list[list[tuple[int, int]]]) -> dict:
    """Every figure of each batch, from the input alone (see the module docstring)."""
    out = {}
    for b, rows in enumerate(batches):
        live = rows + (batches[b - 1] if b else [])
        out[b] = {
            "watermark_ms": 0 if b == 0 else (100 * b - DELAY_S) * 1000,
            "puts": [sum(1 for _, p in rows if p == i) for i in range(PARTITIONS)],
            "removes": [
                sum(1 for _, p in batches[b - 2] if p == i) if b >= 2 else 0
                for i in range(PARTITIONS)
            ],
            "rows": [sum(1 for _, p in live if p == i) for i in range(PARTITIONS)],
        }
    return out


@pytest.fixture(scope="module")
def runs(spark, tmp_path_factory):
    cands = _candidates()
    hdfs = _run(spark, str(tmp_path_factory.mktemp("hist-hdfs")), HDFS, False, cands)
    rocks = _run(spark, str(tmp_path_factory.mktemp("hist-rocks")), ROCKSDB, True, cands)
    return {"hdfs": hdfs, "rocksdb": rocks}


def _load_cost(ckpt: str, p: int, version: int) -> tuple[int, int, int]:
    """(files, bytes, lag) of loading ``version`` of one partition, from a plain listing."""
    d = os.path.join(ckpt, "state", "0", str(p))
    snaps = {
        int(os.path.basename(f).split(".")[0]): f
        for pattern in ("*.snapshot", "*.zip")
        for f in glob.glob(os.path.join(d, pattern))
    }
    base = max((v for v in snaps if v <= version), default=0)
    files, size = 0, 0
    if base:
        files, size = 1, os.path.getsize(snaps[base])
        if snaps[base].endswith(".zip"):
            import zipfile

            meta = zipfile.ZipFile(snaps[base]).read("metadata").decode().split("\n", 1)[1]
            for e in json.loads(meta)["sstFiles"]:
                files += 1
                size += os.path.getsize(os.path.join(d, "SSTs", e["dfsSstFileName"]))
    for v in range(base + 1, version + 1):
        inc = glob.glob(os.path.join(d, f"{v}.delta")) + glob.glob(
            os.path.join(d, f"{v}.changelog")
        )
        files += 1
        size += os.path.getsize(inc[0])
    return files, size, version - base


@pytest.mark.parametrize("backend", ["hdfs", "rocksdb"])
@pytest.mark.parametrize("mode", ["counts", "exact"])
def test_every_figure_equals_the_independent_count(runs, backend, mode):
    ckpt, want = runs[backend]
    doc = (
        cli_json("history", ckpt, "--rows", mode) if mode == "counts" else history(ckpt, rows=mode)
    )
    assert [e["batch"] for e in doc["batches"]] == list(range(len(SIZES)))
    assert all(e["committed"] for e in doc["batches"])
    for e in doc["batches"]:
        b, w = e["batch"], want[e["batch"]]
        assert e["watermark_ms"] == w["watermark_ms"], b
        assert e["sources"][0]["kind"] == "file"
        assert e["sources"][0]["advance"] == {"files": 1}, b
        op = e["operators"]["0"]
        parts = op["partitions"]
        assert [p["rows"] for p in parts] == w["rows"], b
        assert op["rows"] == sum(w["rows"]) and op["rows_exact"], b
        assert [p["puts"] for p in parts] == w["puts"], b
        assert [p["removes"] for p in parts] == w["removes"], b
        assert op["evicted"] == sum(w["removes"]), b
        for p in parts:
            files, size, lag = _load_cost(ckpt, p["partition"], b + 1)
            assert (p["files"], p["bytes"], p["snapshot_lag"]) == (files, size, lag), (b, p)
    summary = doc["operators"][0]
    last = len(SIZES) - 1
    assert summary["rows"] == sum(want[last]["rows"])
    assert summary["evicted_total"] == sum(SIZES[: last - 1])
    assert summary["growth"]["rows"]["per_batch"] == pytest.approx(
        (sum(want[last]["rows"]) - sum(want[0]["rows"])) / last, abs=1e-3
    )
    restart = summary["restart"]
    costs = [_load_cost(ckpt, p, last + 1) for p in range(PARTITIONS)]
    assert restart["files"] == sum(c[0] for c in costs)
    assert restart["bytes"] == sum(c[1] for c in costs)
    assert restart["increments_to_replay"] == sum(c[2] for c in costs)
    assert doc["health"] == {"health": "ok", "problems": []}


def test_the_hot_key_range_is_flagged_and_the_even_one_is_not(runs):
    skewed = history(runs["rocksdb"][0])["operators"][0]["skew"]
    even = history(runs["hdfs"][0])["operators"][0]["skew"]
    assert skewed["skewed"] is True and skewed["rows"]["hot_partition"] == 0
    assert skewed["rows"]["ratio"] >= 3
    assert even["skewed"] is False and even["rows"]["ratio"] < 2
    # inspect --stats applies the same rule to the same state.
    stats = statectl.open(runs["rocksdb"][0]).stats(top=2)
    (tables,) = stats["operators"].values()
    assert tables["default"]["skewed"] is True
    # And history --top takes the largest keys from inspect --stats.
    top = history(runs["rocksdb"][0], top=2)["operators"][0]["largest_keys"]["default"]
    assert len(top) == 2 and top == tables["default"]["largest_keys"]


def test_terminal_history_fits_80_columns(runs):
    proc = cli("history", runs["rocksdb"][0], env={"COLUMNS": "80"})
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert max(len(line) for line in lines) <= 80
    assert "SKEWED" in proc.stdout
    assert any(c in proc.stdout for c in "▁▂▃▄▅▆▇") and "█" in proc.stdout


def test_report_in_headless_chromium(runs, tmp_path):
    """The report opens in a real Chromium with every chart drawn, the right series, no
    console error and no request beyond the file itself."""
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None and os.environ.get("CI") == "true":
        pytest.fail("CI must install Debian's chromium (.ci/run: apt-get install chromium)")
    if chromium is None:
        pytest.skip("no system chromium (apt-get install chromium)")
    sync_api = pytest.importorskip("playwright.sync_api")
    ckpt, _ = runs["rocksdb"]
    out = tmp_path / "report.html"
    proc = cli("report", ckpt, "-o", str(out))
    assert proc.returncode == 0, proc.stderr
    url = out.as_uri()
    requests, errors = [], []
    with sync_api.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
        page = browser.new_page()
        page.on("request", lambda r: requests.append(r.url))
        page.on("console", lambda m: m.type == "error" and errors.append(m.text))
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.goto(url)
        page.wait_for_function("document.querySelectorAll('.js-plotly-plot').length >= 6")
        charts = page.evaluate(
            """() => Object.fromEntries([...document.querySelectorAll('.js-plotly-plot')].map(
                d => [d.id, {traces: d.data.map(t => ({name: t.name, type: t.type,
                  x: (t.x || []).length, z: t.z ? [t.z.length, t.z[0].length] : null})),
                  title: d.layout.title.text, svg: d.querySelectorAll('svg').length}]))"""
        )
        page.screenshot(path=str(tmp_path / "report.png"), full_page=True)
        browser.close()
    n = len(SIZES)
    assert set(charts) == {
        "chart-rows",
        "chart-bytes",
        "chart-time",
        "chart-heat-0",
        "chart-sources",
        "chart-skew",
    }
    assert all(c["svg"] > 0 for c in charts.values())  # drawn, not just declared
    for chart in ("chart-rows", "chart-bytes"):
        (trace,) = charts[chart]["traces"]
        assert trace["x"] == n and trace["name"].startswith("0 "), chart
    assert [t["name"] for t in charts["chart-time"]["traces"]] == ["batch time", "watermark"]
    assert [t["x"] for t in charts["chart-time"]["traces"]] == [n, n]
    assert charts["chart-heat-0"]["traces"][0]["z"] == [PARTITIONS, n]
    assert charts["chart-sources"]["traces"][0]["x"] == n
    assert "file, files" in charts["chart-sources"]["traces"][0]["name"]
    assert charts["chart-skew"]["traces"][0]["x"] == PARTITIONS
    assert "rows per partition" in charts["chart-heat-0"]["title"]
    assert errors == []
    assert requests == [url]

"""``statectl history`` and ``statectl report`` on the bundled Spark-written checkpoints (no JVM):
its rows agree with ``inspect`` wherever it calls them exact, its byte figures are the files'
sizes, it reads S3 like a local path, and bad input is one line with exit code 2.
tests/test_history_spark.py checks every figure against input counted independently."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys

import pytest
from rich.console import Console

from statectl.cli.history import render_history, sparkline
from statectl.errors import StatectlError
from statectl.history import history
from statectl.inspection import inspect_path
from tests.helpers.cli import cli, cli_json
from tests.helpers.fixtures import FIXTURES

# One of each layout: HDFS deltas (+ snapshots), RocksDB zips, changelogs, checkpoint format
# 2, column families (transformWithState, join format 4), a multi-store join, a file source
# whose log is compacted, Kafka.
NAMES = [
    "agg-hdfs",
    "agg-snapshots-hdfs",
    "agg-rocksdb",
    "agg-snapshots-rocksdb-changelog",
    "agg-ckptv2-rocksdb",
    "session-ckptv2-rocksdb-changelog",
    "dedupwm-hdfs",
    "join-hdfs",
    "join4-rocksdb",
    "tws-rocksdb",
    "kafka-hdfs",
]


@pytest.mark.parametrize("name", NAMES)
def test_rows_agree_with_inspect_wherever_exact(name):
    """At the latest batch, every mode's exact rows equal inspect's (user column families)."""
    info = inspect_path(str(FIXTURES / name))
    want = {
        str(o["id"]): sum(s["rows"] for s in o["stores"] if not s["name"].startswith("$"))
        for o in info["operators"]
    }
    for mode in ("sizes", "counts", "exact"):
        doc = history(str(FIXTURES / name), rows=mode)
        last = next(e for e in doc["batches"] if e["batch"] == info["batch"])
        for uid, rows in want.items():
            got = last["operators"][uid]
            if mode != "sizes":
                assert got["rows_exact"], (mode, uid)
            if got["rows_exact"]:
                assert got["rows"] == rows, (mode, uid)
                assert sum(p["rows"] for p in got["partitions"]) == rows


def test_bytes_are_the_state_files_sizes():
    """HDFS without snapshots: a version loads every delta up to it."""
    root = FIXTURES / "agg-hdfs"
    doc = history(str(root))
    for e in doc["batches"]:
        op = e["operators"]["0"]
        for p in op["partitions"]:
            d = root / "state" / "0" / str(p["partition"])
            deltas = [d / f"{v}.delta" for v in range(1, e["batch"] + 2)]
            assert p["bytes"] == sum(os.path.getsize(f) for f in deltas)
            assert p["files"] == len(deltas) and p["snapshot_lag"] == e["batch"] + 1
            assert p["written"]["delta"] == os.path.getsize(deltas[-1])


def test_kafka_advance_is_the_offsets_difference():
    doc = history(str(FIXTURES / "kafka-hdfs"))
    totals = []
    for e in doc["batches"]:
        (src,) = e["sources"]
        assert src["kind"] == "kafka"
        totals.append(sum(r["offset"] for r in src["position"]))
        assert src["records_total"] == totals[-1]
    initial = (FIXTURES / "kafka-hdfs" / "sources" / "0" / "0").read_bytes()[4:]
    start = sum(v for parts in json.loads(initial).values() for v in parts.values())
    advances = [e["sources"][0]["advance"]["records"] for e in doc["batches"]]
    assert advances == [b - a for a, b in zip([start, *totals], totals, strict=False)]


def test_operator_filter_and_bad_input():
    doc = cli_json("history", str(FIXTURES / "join-hdfs"), "--operator", "0")
    assert [o["id"] for o in doc["operators"]] == [0]
    assert len(doc["operators"][0]["stores"]) == 4  # a v2 join's four stores, added up
    with pytest.raises(StatectlError, match="has no operator '9'"):
        history(str(FIXTURES / "join-hdfs"), operator="9")
    with pytest.raises(StatectlError, match="--rows must be one of sizes, counts, exact"):
        history(str(FIXTURES / "agg-hdfs"), rows="all")
    proc = cli("history", str(FIXTURES))
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1
    assert "not a Spark streaming checkpoint" in proc.stderr


def test_a_savepoint_has_no_history(tmp_path):
    from statectl.savepoints.create import take_savepoint

    url, _ = take_savepoint(str(FIXTURES / "agg-hdfs"), str(tmp_path))
    with pytest.raises(StatectlError, match="is a savepoint"):
        history(url)


def test_terminal_rendering_fits_80_columns():
    for name in ("agg-snapshots-rocksdb-changelog", "join-hdfs", "tws-rocksdb"):
        con = Console(width=80, record=True, file=io.StringIO())
        render_history(con, history(str(FIXTURES / name), top=3))
        text = con.export_text()
        assert max(len(line) for line in text.splitlines()) <= 80
        assert "restart reads" in text and "operator 0" in text


def test_sparkline_scales_and_buckets():
    assert sparkline([0, 1, 2, 3, 4, 5, 6, 7]) == "▁▂▃▄▅▆▇█"
    assert sparkline([5, 5]) == "▁▁"
    assert sparkline([1, None, 3]) == "▁ █"
    assert len(sparkline(list(range(1000)), width=40)) == 40


def test_report_is_self_contained(tmp_path):
    pytest.importorskip("plotly")
    out = tmp_path / "r.html"
    proc = cli("report", str(FIXTURES / "dedupwm-hdfs"), "-o", str(out))
    assert proc.returncode == 0, proc.stderr
    page = out.read_text()
    assert "<script src" not in page and "<link" not in page and "@import" not in page
    for div in ("chart-rows", "chart-bytes", "chart-time", "chart-heat-0", "chart-sources"):
        assert f'id="{div}"' in page
    again = cli("report", str(FIXTURES / "dedupwm-hdfs"), "-o", str(out))
    assert again.returncode == 2 and "refusing to overwrite" in again.stderr


def test_report_without_plotly_says_what_to_install(tmp_path):
    """A fresh ``pip install statectl`` has no plotly: one line naming the extra, exit 2."""
    code = (
        "import sys; sys.modules['plotly'] = None; "
        "import importlib.util as u; u.find_spec = lambda name, *a: None; "
        "from statectl.cli import main; main()"
    )
    proc = subprocess.run(
        [
            sys.executable,
            "-c",
            code,
            "report",
            str(FIXTURES / "agg-hdfs"),
            "-o",
            str(tmp_path / "r.html"),
        ],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 2
    assert proc.stderr.strip().endswith("pip install 'statectl[report]' (or pip install plotly)")
    assert not (tmp_path / "r.html").exists()


def test_history_on_s3_equals_local(s3_endpoint):
    import s3fs

    fs = s3fs.S3FileSystem(client_kwargs={"endpoint_url": s3_endpoint["AWS_ENDPOINT_URL"]})
    fs.mkdir("statectl-history")
    fs.put(str(FIXTURES / "agg-snapshots-rocksdb-changelog"), "statectl-history/c", recursive=True)
    fs.invalidate_cache()
    remote = history("s3://statectl-history/c")
    local = history(str(FIXTURES / "agg-snapshots-rocksdb-changelog"))
    assert remote["batches"] == local["batches"]
    assert remote["operators"] == local["operators"]


def test_estimates_are_flagged_once_old_increments_are_gone(fixture_copy):
    """Spark's maintenance deletes old files: with the changelogs before version 2 gone, rows
    are exact at each zip (numKeys) and an upper bound, flagged, between zips."""
    ck = fixture_copy("agg-snapshots-rocksdb-changelog")
    for p in (0, 1):
        (ck / "state" / "0" / str(p) / "1.changelog").unlink()
    exact = {e["batch"]: e["operators"]["0"] for e in history(str(ck), rows="exact")["batches"]}
    doc = history(str(ck))
    flags = set()
    for e in doc["batches"]:
        op, truth = e["operators"]["0"], exact[e["batch"]]
        for p, t in zip(op["partitions"], truth["partitions"], strict=True):
            flags.add(p["rows_exact"])
            if p["rows_exact"]:
                assert p["rows"] == t["rows"], e["batch"]
            elif p["rows"] is not None:
                assert p["rows"] >= t["rows"], e["batch"]  # an update counted as a new row
    assert flags == {True, False}
    # Batch 0 (version 1) no longer loads: nothing to count, nothing to restart from.
    first = doc["batches"][0]["operators"]["0"]
    assert first["rows"] is None and first["files"] is None

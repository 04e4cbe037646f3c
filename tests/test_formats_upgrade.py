"""Day-2 operations on restore and migrate (issue 23): fork or continue (the query id the new
checkpoint runs under), the event-time watermark it resumes at (``--watermark``, with the
state rows its next batch evicts), reprocessing from an earlier batch (``migrate --batch``),
and checkpoint format upgrades (``--checkpoint-format``). The Spark tests run the real
query on what statectl wrote."""

from __future__ import annotations

import datetime as dt
import json
import re
import shutil
import time
from pathlib import Path

import pytest

import statectl
from statectl.checkpoint.model import Checkpoint
from statectl.errors import StatectlError
from statectl.restoration import continuation
from statectl.restoration.continuation import parse_time
from statectl.state import Selection, read_state
from tests.helpers.cli import assert_one_line_error, cli_json
from tests.helpers.cli import run as cli
from tests.helpers.fixtures import FIXTURES
from tests.helpers.restore import assert_exactly_once
from tests.helpers.rows import arrow_rows, normalize
from tests.helpers.spark import PROVIDERS, build, run, write_input

WINDOW = str(FIXTURES / "window-hdfs")  # windowed count, watermark 5 s, batch 6 committed
CKPT_V2 = {"spark.sql.streaming.stateStore.checkpointFormatVersion": "2"}


def _query_id(ckpt: Path | str) -> str:
    return json.loads((Path(ckpt) / "metadata").read_text())["id"]


def _log(ckpt: Path, log: str, batch: int) -> tuple[str, dict]:
    version, meta = (Path(ckpt) / log / str(batch)).read_text().split("\n")[:2]
    return version, json.loads(meta)


# -- fork or continue -------------------------------------------------------------------------


def test_migrate_continues_the_query_by_default_and_forks_with_new_query_id(tmp_path):
    """Today's default stays: the same query id (exactly-once sinks keep deduplicating by
    query id and batch); --new-query-id writes a new one and the plan says fork."""
    source_id = _query_id(WINDOW)
    same = statectl.migrate(WINDOW, tmp_path / "same").to_dict()
    assert same["fork"] is False and same["query_id"] == source_id
    assert _query_id(tmp_path / "same") == source_id
    fork = statectl.migrate(WINDOW, tmp_path / "fork", new_query_id=True).to_dict()
    assert fork["fork"] is True and fork["query_id"] != source_id
    assert _query_id(tmp_path / "fork") == fork["query_id"]
    assert len(fork["query_id"]) == 36 and fork["query_id"].count("-") == 4
    text = cli("migrate", WINDOW, str(tmp_path / "fork2"), "--new-query-id").stdout
    assert f"fork: new query id {_query_id(tmp_path / 'fork2')}" in text
    text = cli("migrate", WINDOW, str(tmp_path / "same2")).stdout
    assert f"continues query {source_id} (same query id)" in text


def test_restore_dry_run_shows_fork_and_writes_nothing(tmp_path):
    sp = statectl.savepoint(WINDOW, tmp_path / "sp").path
    plan = statectl.restore(sp, tmp_path / "t", new_query_id=True, dry_run=True)
    doc = plan.to_dict()
    assert doc["fork"] is True and doc["query_id"] != _query_id(WINDOW)
    assert not (tmp_path / "t").exists()
    kept = statectl.restore(sp, tmp_path / "t2", dry_run=True).to_dict()
    assert kept["fork"] is False and kept["query_id"] == _query_id(WINDOW)


# -- watermark --------------------------------------------------------------------------------


def test_parse_time_takes_epoch_ms_and_iso():
    assert parse_time("1704067240000") == 1704067240000
    assert parse_time(5) == 5
    assert parse_time("2024-01-01T00:00:40Z") == 1704067240000
    assert parse_time("2024-01-01T00:00:40") == 1704067240000  # naive: UTC
    assert parse_time("2024-01-01T01:00:40+01:00") == 1704067240000


def test_bad_watermark_is_one_line_error(tmp_path):
    proc = cli("migrate", WINDOW, str(tmp_path / "t"), "--watermark", "yesterday", check_rc=None)
    assert_one_line_error(proc, "--watermark", "yesterday")
    assert not (tmp_path / "t").exists()


def _window_ends() -> list[dt.datetime]:
    ckpt = Checkpoint.open(WINDOW)
    rows = read_state(ckpt, Selection(0)).to_pylist()
    return [r["key"]["window"]["end"] for r in rows]


@pytest.mark.parametrize("at", ["before", "some", "after"])
def test_watermark_is_written_and_the_plan_counts_the_rows_evicted(tmp_path, at):
    """offsets/N's batchWatermarkMs and commits/N's nextBatchWatermarkMs both take the new
    watermark (Spark restarts at the larger); the plan counts the state rows whose window
    ends at or before it, as Spark's eviction predicate does."""
    all_ends = _window_ends()
    ends = sorted(set(all_ends))
    assert len(ends) >= 2
    w = {
        "before": ends[0] - dt.timedelta(seconds=1),
        "some": ends[0],
        "after": ends[-1],
    }[at]
    ms = int(w.timestamp() * 1000)
    doc = statectl.migrate(WINDOW, tmp_path / "t", watermark=w.isoformat()).to_dict()
    expected = sum(1 for e in all_ends if e <= w)
    assert expected == {"before": 0, "after": len(all_ends)}.get(at, expected)
    if at == "some":
        assert 0 < expected < len(all_ends)
    assert doc["watermark"]["to_ms"] == ms
    assert doc["watermark"]["from_ms"] == 1704067253000
    assert list(doc["watermark"]["evicts"].values()) == [expected]
    assert any(f"evicts {expected} rows" in c for c in doc["conversions"])
    batch = doc["resumes_at_batch"] - 1
    assert _log(tmp_path / "t", "offsets", batch)[1]["batchWatermarkMs"] == ms
    assert _log(tmp_path / "t", "commits", batch)[1]["nextBatchWatermarkMs"] == ms


def test_watermark_on_a_native_savepoint_is_refused(tmp_path):
    sp = statectl.savepoint(WINDOW, tmp_path / "sp", kind="native").path
    plan = statectl.restore(sp, tmp_path / "t", watermark=0, dry_run=True)
    assert not plan.ok and any("--watermark" in p for p in plan.problems)


# -- formats ----------------------------------------------------------------------------------


def test_migrate_to_checkpoint_format_2_names_the_conversion(tmp_path):
    src = FIXTURES / "agg-rocksdb"
    doc = statectl.migrate(src, tmp_path / "t", checkpoint_format=2).to_dict()
    assert doc["checkpoint_format"] == 2
    assert any("checkpoint format 1 -> 2" in c for c in doc["conversions"])
    batch = doc["resumes_at_batch"] - 1
    version, commit = _log(tmp_path / "t", "commits", batch)
    assert version == "v2" and len(commit["stateUniqueIds"]["0"]) == 2
    back = statectl.migrate(tmp_path / "t", tmp_path / "b", checkpoint_format=1).to_dict()
    assert any("checkpoint format 2 -> 1" in c for c in back["conversions"])
    assert _log(tmp_path / "b", "commits", batch)[0] == "v1"


def test_checkpoint_format_2_on_hdfs_and_unsupported_conversions_are_refused(tmp_path):
    src = FIXTURES / "agg-hdfs"
    for choice, needle in [
        ({"checkpoint_format": 2}, "checkpoint format 2 needs --backend rocksdb"),
        ({"offset_log": 2}, "keep offset log v1 and run the query without names"),
    ]:
        with pytest.raises(StatectlError, match=re.escape(needle)):
            statectl.migrate(src, tmp_path / "t", **choice)
        assert not (tmp_path / "t").exists()
    with pytest.raises(StatectlError, match=r"--row-checksums: .* not for column families"):
        statectl.migrate(FIXTURES / "tws-rocksdb", tmp_path / "t", row_checksums=True)
    assert not (tmp_path / "t").exists()
    proc = cli("migrate", str(src), str(tmp_path / "t"), "--offset-log", "3", check_rc=None)
    assert_one_line_error(proc, "--offset-log must be 1 or 2")


def test_changelog_on_and_off_are_named_conversions(tmp_path):
    """migrate names RocksDB changelog checkpointing turned off (a changelog checkpoint
    written as snapshots) or on (--changelog from snapshots), in --json and in the text plan;
    the same layout on both sides names nothing."""
    on, off = FIXTURES / "agg-rocksdb-changelog", FIXTURES / "agg-rocksdb"
    doc = statectl.migrate(on, tmp_path / "off").to_dict()
    assert any("changelog checkpointing on -> off" in c for c in doc["conversions"])
    assert not list((tmp_path / "off" / "state/0/0").glob("*.changelog"))
    doc = statectl.migrate(off, tmp_path / "on", changelog=True).to_dict()
    assert any("changelog checkpointing off -> on" in c for c in doc["conversions"])
    assert list((tmp_path / "on" / "state/0/0").glob("*.changelog"))
    for src, changelog in ((on, True), (off, False)):
        same = statectl.migrate(src, tmp_path / f"same-{src.name}", changelog=changelog)
        assert not any("changelog" in c for c in same.to_dict()["conversions"])
    text = cli("migrate", str(on), str(tmp_path / "hdfs"), "--backend", "hdfs").stdout
    assert "RocksDB changelog checkpointing on -> off" in text


LOG_V2 = FIXTURES / "spark42-agg-logv2-ckptv2-rocksdb"  # one source "events", commit log v3


def test_offset_log_v2_down_to_v1(tmp_path):
    """--offset-log 1: the named source becomes source 0 (offset line and sources/0), source
    evolution is unpinned, v2's metadata fields go, and the commit log v3 (sink evolution,
    Spark 4.2+) comes down to the checkpoint format's version; the plan names each."""
    doc = statectl.migrate(LOG_V2, tmp_path / "t", offset_log=1).to_dict()
    assert doc["offset_log_version"] == 1
    notes = " ".join(doc["conversions"])
    assert "offset log v2 -> v1: source 'events' becomes source 0" in notes
    assert "commit log v3 -> v2" in notes
    batch = doc["resumes_at_batch"] - 1
    lines = (tmp_path / "t" / "offsets" / str(batch)).read_text().split("\n")
    src = (LOG_V2 / "offsets" / str(batch)).read_text().split("\n")
    assert lines[0] == "v1" and lines[2:] == [src[2].removeprefix("events:")]
    meta = json.loads(lines[1])
    assert "sourceMetadataInfo" not in meta
    assert meta["conf"]["spark.sql.streaming.queryEvolution.enableSourceEvolution"] == "false"
    version, commit = _log(tmp_path / "t", "commits", batch)
    assert version == "v2" and "sinkMetadataMap" not in commit and commit["stateUniqueIds"]
    assert sorted(p.name for p in (tmp_path / "t" / "sources").iterdir()) == ["0"]
    assert sorted(p.name for p in (tmp_path / "t" / "sources" / "0").iterdir()) == sorted(
        p.name for p in (LOG_V2 / "sources" / "events").iterdir() if not p.name.endswith(".crc")
    )
    ckpt = Checkpoint.open(str(tmp_path / "t"))
    assert ckpt.offsets(batch).version == 1


def test_offset_log_v1_from_two_named_sources_is_refused_with_what_to_do(tmp_path):
    """Two named sources: v1 would order them by their place in the plan, which the
    checkpoint does not record; refused, the message says to keep offset log v2."""
    ck = tmp_path / "two"
    shutil.copytree(LOG_V2, ck)
    shutil.copytree(ck / "sources" / "events", ck / "sources" / "clicks")
    for f in (ck / "offsets").iterdir():
        if f.name.isdigit():
            line = f.read_text().rstrip("\n").split("\n")[-1].replace("events:", "clicks:")
            f.write_text(f.read_text().rstrip("\n") + "\n" + line)
    for crc in (ck / "offsets").glob(".*.crc"):
        crc.unlink()
    with pytest.raises(StatectlError, match=r"names 2 sources .* keep offset log v2"):
        statectl.migrate(ck, tmp_path / "t", offset_log=1)
    assert not (tmp_path / "t").exists()


@pytest.mark.parametrize(("backend", "header"), [("hdfs", 4), ("rocksdb", 8)])
def test_row_checksums_are_sparks_layout(tmp_path, backend, header):
    """Each value read raw is int32 LE CRC32C(key ‖ value) (RocksDB: then the value length)
    in front of the plain value, the layout of Spark's own row-checksum fixtures; statectl
    reads the rows back equal to the source's."""
    import google_crc32c

    from statectl.backends.hdfs import read_hdfs_store
    from statectl.backends.rocksdb import read_rocksdb_store
    from statectl.io import FileIO

    src = FIXTURES / "agg-hdfs"
    doc = statectl.migrate(src, tmp_path / "t", backend=backend, row_checksums=True).to_dict()
    io, root = FileIO.for_url(str(tmp_path / "t"))
    version = doc["resumes_at_batch"]
    checked = 0
    for p in (0, 1):
        store = f"{root}/state/0/{p}"
        raw = (
            read_hdfs_store(io, store, version, "lz4")
            if backend == "hdfs"
            else read_rocksdb_store(io, store, version, "lz4", merge_delimiter=b"")
        )
        for k, v in zip(raw.keys.to_pylist(), raw.values.to_pylist(), strict=True):
            body = v[header:]
            assert v[:4] == google_crc32c.value(k + body).to_bytes(4, "little")
            if header == 8:
                assert int.from_bytes(v[4:8], "little") == len(body)
            checked += 1
    assert checked == 7
    ours = arrow_rows(statectl.read_state(tmp_path / "t", operator=0).drop(["partition_id"]))
    theirs = arrow_rows(statectl.read_state(src, operator=0).drop(["partition_id"]))
    assert sorted(ours, key=repr) == sorted(theirs, key=repr)


@pytest.mark.parametrize("header", [4, 8])
def test_row_checksums_of_whole_arrays_are_the_per_row_layout(header):
    """with_row_checksums works on whole arrays (the CRC per row, the rest in Arrow): equal to
    the layout computed row by row, for empty, short and long rows, binary and large_binary,
    sliced and chunked arrays."""
    import random

    import google_crc32c
    import pyarrow as pa

    rnd = random.Random(header)
    keys = [rnd.randbytes(rnd.choice([0, 1, 3, 16, 40])) for _ in range(500)]
    values = [rnd.randbytes(rnd.choice([0, 1, 7, 24, 300, 5000])) for _ in range(500)]

    def want(ks: list[bytes], vs: list[bytes]) -> list[bytes]:
        out = []
        for k, v in zip(ks, vs, strict=True):
            head = google_crc32c.value(k + v).to_bytes(4, "little")
            out.append(head + (len(v).to_bytes(4, "little") if header == 8 else b"") + v)
        return out

    for t in (pa.binary(), pa.large_binary()):
        k, v = pa.array(keys, t), pa.array(values, t)
        cases = [
            (k, v, keys, values),
            (k.slice(7, 100), v.slice(7, 100), keys[7:107], values[7:107]),
            (pa.chunked_array([k[:9], k[9:]]), pa.chunked_array([v[:3], v[3:]]), keys, values),
            (k[:0], v[:0], [], []),
        ]
        for ka, va, ks, vs in cases:
            out_k, out_v = continuation.with_row_checksums(lambda a=ka, b=va: (a, b), header)
            assert out_k is ka and out_v.type == t
            assert out_v.to_pylist() == want(ks, vs)


# -- Spark: the real query on what statectl wrote -------------------------------------------


def _start(spark, case, d, ckpt, out: dict, confs: dict | None = None):
    """Start ``case`` on ``ckpt`` with a processing-time trigger (it keeps running); its
    batches land in ``out``. Confs are set only while it starts (the query keeps them)."""

    def collect(df, batch_id):
        out[batch_id] = sorted((normalize(tuple(r)) for r in df.collect()), key=repr)

    confs = dict(confs or {})
    for k, v in confs.items():
        spark.conf.set(k, v)
    try:
        df, mode = build(spark, case, d)
        return (
            df.writeStream.foreachBatch(collect)
            .outputMode(mode)
            .option("checkpointLocation", str(ckpt))
            .trigger(processingTime="500 milliseconds")
            .start()
        )
    finally:
        for k in confs:
            spark.conf.unset(k)


@pytest.mark.spark
def test_fork_at_checkpoint_format_2_runs_beside_the_original(spark, tmp_path):
    """A v1 RocksDB checkpoint migrated to checkpoint format v2 with --new-query-id: the fork
    (on Spark 4.3 with format v2) and the original (v1) run at the same time, neither stops
    the other, and both emit what an uninterrupted run emits. A copy under the same query id
    is the same query: starting it stops the running original (Spark's
    stopActiveRunOnRestart)."""
    d = tmp_path / "input"
    write_input(d, 0, 2)
    key = "spark.sql.streaming.stateStore.providerClass"
    run(spark, "agg", d, tmp_path / "orig", "rocksdb")
    doc = statectl.migrate(
        tmp_path / "orig", tmp_path / "fork", new_query_id=True, checkpoint_format=2
    ).to_dict()
    assert doc["fork"] and any("checkpoint format 1 -> 2" in c for c in doc["conversions"])
    statectl.migrate(tmp_path / "orig", tmp_path / "same")
    outs: dict[str, dict] = {"orig": {}, "fork": {}, "same": {}}
    orig = _start(spark, "agg", d, tmp_path / "orig", outs["orig"], {key: PROVIDERS["rocksdb"]})
    fork = _start(spark, "agg", d, tmp_path / "fork", outs["fork"], CKPT_V2)
    try:
        assert orig.id != fork.id and str(fork.id) == doc["query_id"]
        write_input(d, 2, 2)
        for q in (orig, fork):
            q.processAllAvailable()
        assert orig.isActive and fork.isActive
        # The original continuing is the uninterrupted run: the fork emits what it emits.
        assert sorted(outs["orig"]) == [2, 3] and outs["fork"] == outs["orig"]
        assert any(outs["orig"].values())
        same = _start(spark, "agg", d, tmp_path / "same", outs["same"])
        deadline = time.monotonic() + 60
        while orig.isActive and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not orig.isActive and same.id == orig.id and fork.isActive
        same.stop()
    finally:
        for q in (orig, fork):
            q.stop()
    forked = Checkpoint.open(str(tmp_path / "fork"))
    last = forked.latest_committed_batch
    assert last > doc["resumes_at_batch"] - 1 and forked.checkpoint_format_version(last) == 2


def windowed_update(spark, d):
    """A windowed count in update mode (each batch emits the windows it changed), watermark
    5 s: rows behind the watermark change nothing and are not emitted."""
    import pyspark.sql.functions as F

    df = (
        spark.readStream.schema("id long, k string, v long, ts timestamp")
        .option("maxFilesPerTrigger", 1)
        .json(str(d))
    )
    counts = df.withWatermark("ts", "5 seconds").groupBy(F.window("ts", "10 seconds"), "k")
    return counts.count(), "update"


def _late_input(d: Path) -> None:
    """Batch 3's file: rows an hour behind the watermark of batches 0-2 (dropped as late)."""
    t = dt.datetime(2023, 12, 31, 23, 0, 1)
    rows = [{"id": j, "k": "late", "v": j, "ts": t.isoformat()} for j in range(3)]
    (d / "part-003.json").write_text("\n".join(json.dumps(r) for r in rows))


@pytest.fixture(scope="module")
def late_run(spark, tmp_path_factory):
    """The windowed count over batches 0-2 and a batch 3 of late rows Spark drops."""
    tmp = tmp_path_factory.mktemp("late")
    d = tmp / "input"
    write_input(d, 0, 3)
    _late_input(d)
    out = run(spark, windowed_update, d, tmp / "ck", "hdfs")
    assert max(out) >= 3 and any(out.values())
    assert not any("late" in repr(r) for rows in out.values() for r in rows)
    return tmp, d, out


@pytest.mark.spark
def test_rewound_watermark_lets_late_rows_in(spark, late_run, tmp_path):
    """Reprocess batch 3 from batch 2 with the watermark rewound before the late rows: Spark
    now counts them (the original run dropped them)."""
    tmp, d, _ = late_run
    doc = cli_json(
        "migrate", str(tmp / "ck"), str(tmp_path / "rw"), "--batch", "2",
        "--watermark", "2023-12-31T22:00:00Z", "--new-query-id",
    )  # fmt: skip
    assert doc["resumes_at_batch"] == 3 and "rewound" in " ".join(doc["conversions"])
    assert list(doc["watermark"]["evicts"].values()) == [0]
    again = run(spark, windowed_update, d, tmp_path / "rw")
    late = [r for rows in again.values() for r in rows if "late" in repr(r)]
    assert late, again  # the late rows' window, counted


@pytest.mark.spark
def test_reprocess_from_batch_recipe(spark, late_run, tmp_path):
    """docs/guide.md's recipe: ``migrate CKPT NEW --batch N`` and the query restarted on NEW
    runs batches N+1.. again and emits what the original emitted for them."""
    tmp, d, out = late_run
    doc = cli_json("migrate", str(tmp / "ck"), str(tmp_path / "re"), "--batch", "1")
    assert doc["resumes_at_batch"] == 2 and doc["fork"] is False
    again = run(spark, windowed_update, d, tmp_path / "re")
    assert min(again) == 2
    assert {b: rows for b, rows in again.items() if rows} == {
        b: rows for b, rows in out.items() if b >= 2 and rows
    }


@pytest.mark.spark
def test_offset_log_v1_from_named_sources_runs_unnamed(spark, tmp_path):
    """A query with named sources (offset log v2) migrated with --offset-log 1 runs on Spark
    4.3 without names and continues exactly."""
    named = {"spark.sql.streaming.queryEvolution.enableSourceEvolution": "true"}
    d = tmp_path / "input"
    write_input(d, 0, 2)
    first = run(spark, "agg-named", d, tmp_path / "ck1", "hdfs", named)
    doc = statectl.migrate(tmp_path / "ck1", tmp_path / "ck2", offset_log=1).to_dict()
    assert doc["offset_log_version"] == 1
    write_input(d, 2, 1)
    continued = run(spark, "agg", d, tmp_path / "ck2")
    full = run(spark, "agg", d, tmp_path / "ck3", "hdfs")
    assert_exactly_once(first, continued, full)
    assert sorted(continued) == [2] and continued[2]
    assert Checkpoint.open(str(tmp_path / "ck2")).offsets(2).version == 1


@pytest.mark.spark
def test_row_checksums_turned_on_are_verified_by_spark(spark, tmp_path, monkeypatch):
    """--row-checksums on a checkpoint without them: Spark 4.3 loads the restored state with
    the pinned row checksums on both backends and continues exactly; the same restore with
    every checksum off by one bit fails in Spark, so Spark did verify them."""
    d = tmp_path / "input"
    write_input(d, 0, 2)
    first = run(spark, "agg", d, tmp_path / "ck1", "hdfs")
    for backend in ("hdfs", "rocksdb"):
        doc = statectl.migrate(
            tmp_path / "ck1", tmp_path / backend, backend=backend, row_checksums=True
        ).to_dict()
        assert doc["row_checksums"] and any("row checksums on" in c for c in doc["conversions"])
    real = continuation._native_crc32c()
    monkeypatch.setattr(continuation, "_native_crc32c", lambda: lambda b: real(b) ^ 1)
    statectl.migrate(tmp_path / "ck1", tmp_path / "bad", row_checksums=True)
    monkeypatch.undo()
    write_input(d, 2, 1)
    full = run(spark, "agg", d, tmp_path / "full", "hdfs")
    for backend in ("hdfs", "rocksdb"):
        continued = run(spark, "agg", d, tmp_path / backend)
        assert_exactly_once(first, continued, full)
        meta = Checkpoint.open(str(tmp_path / backend)).offsets(2)
        assert meta.conf["spark.sql.streaming.stateStore.rowChecksum.enabled"] == "true"
    with pytest.raises(Exception, match=r"(?i)checksum"):
        run(spark, "agg", d, tmp_path / "bad")

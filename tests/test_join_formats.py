"""Stream-stream join state formats 2, 3 and 4 (``spark.sql.streaming.join.stateFormatVersion``).

Reads equal Spark's (fixtures/spark-rows/), savepoints hold format 2's four tables whatever the
format, restore writes formats 3 and 4 byte for byte as Spark does, ``--join-state-format``
converts between them, and (Spark tier) the real join query continues from every restore with
the output of an uninterrupted run, matching restored rows from both sides.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from statectl.backends.rocksdb import read_rocksdb_store
from statectl.checkpoint.model import MERGE_OPERATOR_CONF, Checkpoint
from statectl.io import FileIO
from statectl.join_state import FORMAT_CONF
from statectl.restoration import restore
from statectl.savepoints.create import take_savepoint
from statectl.savepoints.store import Savepoint
from statectl.state import Selection, read_state
from tests.helpers.fixtures import FIXTURES, ROOT, load_manifest
from tests.helpers.reads import selection
from tests.helpers.restore import assert_exactly_once
from tests.helpers.rows import arrow_names, arrow_rows, spark_rows
from tests.helpers.spark import PROVIDERS, run

JOIN_FIXTURES = [
    "join3-rocksdb",
    "join4-rocksdb",
    "join4-leftsemi-rocksdb",
    "join4-samets-rocksdb",
    # Written by the release lines that have these formats (fixtures/generate_release.sh).
    "spark41-join3-rocksdb",
    "spark42-join3-rocksdb",
    "spark42-join4-rocksdb",
]
MANIFEST = {fx["name"]: fx for fx in load_manifest(include_pending=True)}
STORES_2 = [
    "left-keyToNumValues",
    "left-keyWithIndexToValue",
    "right-keyToNumValues",
    "right-keyWithIndexToValue",
]


def _spark_reads(name: str) -> dict[str, dict[str, Any]]:
    data = json.loads((ROOT / "fixtures" / MANIFEST[name]["spark_rows"]).read_text())
    return {json.dumps(r["options"], sort_keys=True): r for r in data["reads"]}


def _rows(table) -> list:
    return json.loads(json.dumps(arrow_rows(table)))


def _drop_event_time(rows: list) -> list:
    return sorted(([key[:-1], *rest] for key, *rest in rows), key=repr)


@pytest.mark.parametrize("name", JOIN_FIXTURES)
def test_reads_equal_spark(name):
    """Every storeName read equals Spark's rows. joinSide reads too, except format 4's
    ``__event_time``: Spark 4.3 shows it wrong (12395 for k0: the key's string bytes read as a
    long); statectl shows the event time its keyWithTsToValues read shows."""
    ckpt = Checkpoint.open(str(FIXTURES / name))
    theirs = _spark_reads(name)
    reads = MANIFEST[name]["reads"]
    # Not vacuous: both join sides and each side's two stores were read (and compared below).
    sides = sorted(r["options"]["joinSide"] for r in reads if "joinSide" in r["options"])
    stores = [r["options"]["storeName"] for r in reads if "storeName" in r["options"]]
    assert sides == ["left", "right"] and len(stores) == 4, reads
    assert any(theirs[json.dumps(r["options"], sort_keys=True)]["rows"] for r in reads)
    for read in reads:
        table = read_state(ckpt, selection(read))
        spark = theirs[json.dumps(read["options"], sort_keys=True)]
        assert json.loads(json.dumps(arrow_names(table.schema))) == spark["names"]
        ours = _rows(table)
        side = read["options"].get("joinSide")
        if side and "join4" in name:
            assert _drop_event_time(ours) == _drop_event_time(spark["rows"])
            store = _rows(read_state(ckpt, Selection(0, store=f"{side}-keyWithTsToValues")))
            assert sorted(r[0] for r in ours) == sorted(r[0] for r in store)
        else:
            assert ours == spark["rows"], read


def test_inspect_shows_joins_with_their_format():
    for name, fmt in (("join3-rocksdb", 3), ("join4-rocksdb", 4), ("join-rocksdb", None)):
        (op,) = Checkpoint.open(str(FIXTURES / name)).operators(4)
        assert op.kind.restorable
        assert op.kind.kind == ("stream-stream join" + (f" (state format {fmt})" if fmt else ""))
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "statectl.cli",
            "inspect",
            str(FIXTURES / "join4-rocksdb"),
            "--json",
        ],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        check=True,
    )
    (op,) = json.loads(proc.stdout)["operators"]
    assert op["kind"] == "stream-stream join (state format 4)" and op["restorable"]
    assert {s["kind"] for s in op["stores"]} == {"join column family"}


def _savepoint(name: str, tmp_path) -> tuple[str, Any]:
    return take_savepoint(str(FIXTURES / name), str(tmp_path / f"sp-{name}"))


def test_savepoints_are_format_independent(tmp_path):
    """Formats 2, 3 and 4 of the same query save the same four tables under the same uid;
    the source format is recorded. Format 3 holds format 2's very rows; format 4 the same
    values (Spark 4.3 leaves format 4's left-side matched flags false on an inner join)."""
    saved = {}
    for name, fmt in (("join-rocksdb", 2), ("join3-rocksdb", 3), ("join4-rocksdb", 4)):
        url, meta = _savepoint(name, tmp_path)
        (op,) = meta.operators
        assert op.state_format == fmt and op.column_families is None
        assert [t.name for t in op.tables] == STORES_2 == op.store_names
        assert all(t.kind == "join-store" for t in op.tables)
        sp = Savepoint.open(url)
        saved[fmt] = (
            op.uid,
            [(t.key_schema, t.value_schema, t.rows) for t in op.tables],
            {t.name: _rows(sp.read(Selection(0, store=t.name), op.uid)) for t in op.tables},
        )
    assert saved[2][:2] == saved[3][:2] == saved[4][:2]
    assert saved[2][2] == saved[3][2]

    def unmatched(rows: dict) -> dict:
        return {
            n: sorted(([k[:-1], v[:-1] if "Index" in n else v] for k, v, _ in r), key=repr)
            for n, r in rows.items()
        }

    assert unmatched(saved[4][2]) == unmatched(saved[2][2])


def _entries(root: Path, partition: int, version: int) -> tuple[list, dict]:
    io, path = FileIO.for_url(str(root))
    raw = read_rocksdb_store(io, f"{path}/state/0/{partition}", version, "lz4", merge_delimiter=b"")
    return sorted(zip(raw.keys.to_pylist(), raw.values.to_pylist(), strict=True)), raw.cf_ids


@pytest.mark.parametrize("name", JOIN_FIXTURES)
def test_restore_at_the_same_format_is_byte_identical(name, tmp_path):
    """Savepoint (format 2's tables), restore at the fixture's format and partition count:
    the RocksDB entries, column family ids, schema file and operator metadata are Spark's."""
    url, meta = _savepoint(name, tmp_path)
    target = tmp_path / "rt"
    plan = restore(url, str(target))
    fmt = int(MANIFEST[name]["confs"][FORMAT_CONF])
    assert not plan.problems and plan.join_state_format == fmt
    assert plan.conversions == [f"uid {meta.operators[0].uid}: join state format {fmt}, kept"]
    src = FIXTURES / name
    for p in (0, 1):
        assert _entries(target, p, 5) == _entries(src, p, 5)
    (theirs,) = (src / "state/0/_stateSchema/default").glob("[0-9]*")
    (ours,) = (target / "state/0/_stateSchema/default").glob("[0-9]*")
    if name.startswith("spark42-join4"):
        # Spark 4.2 recorded __event_time as non-nullable; a restore writes Spark 4.3's schema
        # (nullable; its length prefix one shorter), which 4.3 continues (test_releases.py).
        assert ours.read_bytes() == theirs.read_bytes().replace(
            b'"__event_time","type":"long","nullable":false',
            b'"__event_time","type":"long","nullable":true',
        ).replace(b"\x00\xa1{", b"\x00\xa0{")
    else:
        assert ours.read_bytes() == theirs.read_bytes()
    spark_meta = json.loads((src / "state/0/_metadata/v2/0").read_text().split("\n", 1)[1])
    our_meta = json.loads((target / "state/0/_metadata/v2/4").read_text().split("\n", 1)[1])
    for m in (spark_meta, our_meta):
        m["stateStoreInfo"][0].pop("stateSchemaFilePaths")
    assert our_meta == spark_meta
    assert Checkpoint.open(str(target)).offsets(4).conf[FORMAT_CONF] == str(fmt)


CONVERSIONS = [
    # (fixture, backend, partitions, --join-state-format, format written)
    ("join4-rocksdb", "rocksdb", 3, None, 4),
    ("join3-rocksdb", "rocksdb", 3, None, 3),
    ("join4-rocksdb", "hdfs", 3, None, 2),  # default on HDFS: format 2, said in the plan
    ("join3-rocksdb", "rocksdb", 2, 4, 4),
    ("join4-rocksdb", "rocksdb", 2, 3, 3),
    ("join-hdfs", "rocksdb", 3, 4, 4),
    ("join-hdfs", "rocksdb", 2, 3, 3),
    ("join4-rocksdb", "rocksdb", 3, 2, 2),
    ("join4-leftsemi-rocksdb", "hdfs", 1, 2, 2),
    # Several values under one (key, event time) in format 4.
    ("join4-samets-rocksdb", "rocksdb", 3, None, 4),
    ("join4-samets-rocksdb", "hdfs", 3, None, 2),
    ("join4-samets-rocksdb", "rocksdb", 2, 3, 3),
    # Spark 3.5 names no operator: its joins are known by their four stores.
    ("spark35-join-hdfs", "rocksdb", 3, 4, 4),
    ("spark35-join-leftsemi-hdfs", "rocksdb", 3, 3, 3),
]


@pytest.mark.parametrize(("backend", "n", "asked"), [("rocksdb", 3, None), ("hdfs", 2, 2)])
def test_format_4_keeps_several_values_under_one_key_and_time(tmp_path, backend, n, asked):
    """join4-samets: Spark keeps 2 values under one (key, event time). The savepoint holds
    each as its own row (format 2's index), and a restore at format 4 writes them back under one
    key: every value Spark read is there, none merged or lost; format 2 gets both indexes."""
    name = "join4-samets-rocksdb"
    theirs = _spark_reads(name)[json.dumps({"storeName": "left-keyWithTsToValues"})]["rows"]
    per_key: dict[str, int] = {}
    for key, _, _ in theirs:
        per_key[json.dumps(key)] = per_key.get(json.dumps(key), 0) + 1
    assert max(per_key.values()) == 2 and len(theirs) == 24
    url, meta = _savepoint(name, tmp_path)
    uid = meta.operators[0].uid
    saved = _rows(Savepoint.open(url).read(Selection(0, store="left-keyWithIndexToValue"), uid))
    assert len(saved) == 24  # indexed per join key, across event times (format 2's tables)
    plan = restore(
        url, str(tmp_path / "rt"), backend=backend, partitions=n, join_state_format=asked
    )
    assert not plan.problems
    ckpt = Checkpoint.open(str(tmp_path / "rt"))
    store = "left-keyWithTsToValues" if plan.join_state_format == 4 else "left-keyWithIndexToValue"
    got = _rows(read_state(ckpt, Selection(0, store=store)))
    if plan.join_state_format == 4:
        assert sorted(r[:2] for r in got) == sorted(r[:2] for r in theirs)
    else:
        assert sorted(r[:2] for r in got) == sorted(r[:2] for r in saved)
    values = sorted(v for _, v, _ in _rows(read_state(ckpt, Selection(0, join_side="left"))))
    assert values == sorted(v[:-1] for _, v, _ in theirs)


@pytest.mark.parametrize(("name", "backend", "n", "asked", "fmt"), CONVERSIONS)
def test_restore_converts_and_reads_back(name, backend, n, asked, fmt, tmp_path):
    """Every conversion reads back as the savepoint's logical tables, each key in the partition
    Spark places it (the read verifies placement by the join key only)."""
    url, meta = _savepoint(name, tmp_path)
    target = tmp_path / "rt"
    plan = restore(url, str(target), backend=backend, partitions=n, join_state_format=asked)
    assert not plan.problems and plan.join_state_format == fmt
    src = meta.operators[0].state_format or int(meta.pinned_confs.get(FORMAT_CONF, "2"))
    uid = meta.operators[0].uid
    change = f"{src} -> {fmt}" if src != fmt else f"{src}, kept"
    assert f"uid {uid}: join state format {change}" in plan.conversions
    if asked is None and src != fmt:
        assert any("restoring at format 2" in c for c in plan.conversions)
    ckpt = Checkpoint.open(str(target))
    assert ckpt.offsets(meta.batch_id).conf[FORMAT_CONF] == str(fmt)
    # Spark runs format 4 only with merge operator 2 (and reads a missing pin as 1).
    merge = ckpt.offsets(meta.batch_id).conf.get(MERGE_OPERATOR_CONF)
    assert merge == "2" if fmt == 4 else merge == meta.pinned_confs.get(MERGE_OPERATOR_CONF)
    assert ckpt.operators(meta.batch_id)[0].kind.fixed_format == (None if fmt == 2 else fmt)
    assert ckpt.num_partitions(meta.batch_id) == n and ckpt.backend(meta.batch_id) == backend
    back_url, back = take_savepoint(str(target), str(tmp_path / "back"))
    assert back.operators[0].state_format == fmt
    # A Spark 3.5 join gains its name (symmetricHashJoin) with its column families.
    assert back.operators[0].uid == uid or (uid.startswith("unknown-") and fmt != 2)
    sp, sp_back = Savepoint.open(url), Savepoint.open(back_url)

    def values(rows: list) -> list:  # format 4 keeps no index: values in event-time order
        return sorted(([k[:-1], v] for k, v in rows), key=repr)

    for store in STORES_2:
        a = _rows(sp.read(Selection(0, store=store), uid).drop_columns(["partition_id"]))
        b = _rows(
            sp_back.read(Selection(0, store=store), back.operators[0].uid).drop_columns(
                ["partition_id"]
            )
        )
        if store.endswith("keyWithIndexToValue"):
            a, b = values(a), values(b)
        assert a == b, store
    for side in ("left", "right"):  # Spark's joinSide view, read from the restored checkpoint
        table = read_state(ckpt, Selection(0, join_side=side)).drop_columns(["partition_id"])
        want = _rows(sp.read(Selection(0, join_side=side), uid).drop_columns(["partition_id"]))
        got = _rows(table)
        if fmt == 4:  # format 4 shows the join key with __event_time
            got = sorted(([k[:-1], v] for k, v in got), key=repr)
        if src == 4:
            want = sorted(([k[:-1], v] for k, v in want), key=repr)
        assert got == want


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "statectl.cli", *args],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )


def test_plan_refuses_formats_3_and_4_where_they_cannot_run(tmp_path):
    url, _ = _savepoint("join4-rocksdb", tmp_path)
    rt = str(tmp_path / "rt")
    for extra, why in (
        (["--backend", "hdfs", "--join-state-format", "4"], "which HDFS cannot hold"),
        (["--backend", "hdfs", "--join-state-format", "3"], "which HDFS cannot hold"),
        (["--changelog", "--join-state-format", "4"], "RocksDB changelog checkpoints"),
    ):
        proc = _cli("restore", rt, "-s", url, "--dry-run", *extra)
        assert proc.returncode == 2, proc.stderr
        (line,) = proc.stderr.strip().splitlines()
        assert line.startswith("statectl: error: --join-state-format") and why in line
    proc = _cli("restore", rt, "-s", url, "--join-state-format", "5", "--dry-run")
    assert proc.returncode == 2 and "must be 2, 3 or 4" in proc.stderr
    agg, _ = _savepoint("agg-hdfs", tmp_path)
    proc = _cli("restore", rt, "-s", agg, "--join-state-format", "4", "--dry-run")
    assert proc.returncode == 2 and "no stream-stream join" in proc.stderr
    assert not (tmp_path / "rt").exists()


def test_dry_run_says_what_it_converts(tmp_path):
    url, meta = _savepoint("join-hdfs", tmp_path)
    uid = meta.operators[0].uid
    rt = str(tmp_path / "rt")
    proc = _cli("restore", rt, "-s", url, "--backend", "rocksdb", "--join-state-format", "4",
                "--dry-run", "--json")  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    plan = json.loads(proc.stdout)
    assert plan["join_state_format"] == 4
    assert plan["conversions"] == [f"uid {uid}: join state format 2 -> 4"]
    proc = _cli("restore", rt, "-s", url, "--backend", "rocksdb", "--join-state-format", "4",
                "--dry-run")  # fmt: skip
    assert f"uid {uid}: join state format 2 -> 4" in proc.stdout
    url4, _ = _savepoint("join4-rocksdb", tmp_path)
    proc = _cli("restore", rt, "-s", url4, "--backend", "hdfs", "--dry-run", "--json")
    plan = json.loads(proc.stdout)
    assert proc.returncode == 0 and plan["join_state_format"] == 2
    assert plan["conversions"][0] == (
        "join state format 4 cannot be written to HDFS: restoring at format 2 "
        "(pass --join-state-format to choose)"
    )
    assert not (tmp_path / "rt").exists()


def test_migrate_converts_the_join_state_format(tmp_path):
    """`statectl migrate --join-state-format` converts as restore does, says so, and the
    migrated join reads back the fixture's rows; a format HDFS cannot hold is refused."""
    src = str(FIXTURES / "join-hdfs")
    dst = str(tmp_path / "m4")
    proc = _cli("migrate", src, dst, "--backend", "rocksdb", "--partitions", "3",
                "--join-state-format", "4")  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "join state format 2 -> 4" in proc.stdout
    ck = Checkpoint.open(dst)
    batch = ck.latest_committed_batch
    assert ck.offsets(batch).conf[FORMAT_CONF] == "4" and ck.num_partitions(batch) == 3
    for side in ("left", "right"):
        sel = Selection(0, join_side=side)
        # (key, value, partition_id): the partition count changed, the rows did not.
        ours = [r[:2] for r in _drop_event_time(_rows(read_state(ck, sel)))]
        theirs = sorted((r[:2] for r in _rows(read_state(Checkpoint.open(src), sel))), key=repr)
        assert ours == theirs and len(ours) > 0, side
    proc = _cli("migrate", src, str(tmp_path / "bad"), "--join-state-format", "4")
    assert proc.returncode == 2, proc.stderr
    (line,) = proc.stderr.strip().splitlines()
    assert line.startswith("statectl: error:") and "--join-state-format" in line
    assert not (tmp_path / "bad").exists()


# -- Spark: restore, restart the real join query, compare with an uninterrupted run ------------
def _input(d: Path, same_time: bool = False) -> None:
    """The join fixtures' input (fixtures/generate.py write_events, 4 batches); ``same_time``:
    join4-samets's, every row of a batch at one event time."""
    from fixtures.generate import write_events

    write_events(d, 4, same_time=same_time)


def _continuation(d: Path, same_time: bool = False) -> None:
    """A fifth file with event times of the last batch (00:00:36-39, above the watermark; with
    ``same_time`` all at 00:00:36), so that new left rows meet restored right rows and new
    right rows restored left ones; its v and id are >= 100, so the output tells restored rows
    (< 100) from new ones."""
    t0 = dt.datetime(2024, 1, 1)
    lines = [
        json.dumps(
            {
                "id": 100 + j,
                "k": f"k{j % 7}",
                "v": 100 + j,
                "ts": (t0 + dt.timedelta(seconds=36 + (0 if same_time else j % 4))).isoformat(),
            }
        )
        for j in range(14)
    ]
    path = d / "part-0004.json"
    path.write_text("\n".join(lines) + "\n")
    mtime = (t0 + dt.timedelta(seconds=4)).replace(tzinfo=dt.timezone.utc).timestamp()
    os.utime(path, (mtime, mtime))


SPARK_CELLS = [
    # (source backend, source format, target backend, --join-state-format, partitions,
    #  every row of a batch at one event time: several values under one (key, event time))
    ("rocksdb", 3, "rocksdb", None, 2, False),
    ("rocksdb", 3, "rocksdb", None, 3, False),
    ("rocksdb", 4, "rocksdb", None, 2, False),
    ("rocksdb", 4, "rocksdb", None, 3, False),
    ("hdfs", 2, "rocksdb", 4, 3, False),
    ("rocksdb", 4, "hdfs", 2, 3, False),
    ("rocksdb", 4, "rocksdb", None, 3, True),
]


def _store_reads(fmt: int) -> list[str]:
    if fmt == 4:
        return [f"{s}-{t}" for s in ("left", "right") for t in ("keyWithTsToValues", "tsWithKey")]
    return STORES_2


@pytest.mark.spark
@pytest.mark.parametrize(("src", "src_fmt", "dst", "asked", "n", "same_time"), SPARK_CELLS)
def test_join_query_continues_from_every_format(
    spark, tmp_path, src, src_fmt, dst, asked, n, same_time
):
    d = tmp_path / "input"
    _input(d, same_time)
    confs = {FORMAT_CONF: str(src_fmt)}
    first = run(spark, "join-fixture", d, tmp_path / "ck1", src, confs)
    sp_url, meta = take_savepoint(str(tmp_path / "ck1"), str(tmp_path / "sp"))
    assert meta.operators[0].state_format == src_fmt
    plan = restore(
        sp_url, str(tmp_path / "ck2"), backend=dst, partitions=n, join_state_format=asked
    )
    fmt = asked or src_fmt
    assert not plan.problems and plan.join_state_format == fmt
    ck2 = Checkpoint.open(str(tmp_path / "ck2"))
    assert ck2.offsets(meta.batch_id).conf[FORMAT_CONF] == str(fmt)

    # Spark's own reader sees what statectl wrote, store by store (column family by family).
    for store in _store_reads(fmt):
        df = (
            spark.read.format("statestore")
            .option("operatorId", 0)
            .option("storeName", store)
            .load(str(tmp_path / "ck2"))
        )
        assert spark_rows(df) == arrow_rows(read_state(ck2, Selection(0, store=store))), store

    if same_time:  # format 4 keeps several values under one (key, event time)
        src_ck = Checkpoint.open(str(tmp_path / "ck1"))
        keys = read_state(src_ck, Selection(0, store="left-keyWithTsToValues")).column("key")
        assert len({repr(k) for k in keys.to_pylist()}) < len(keys)
    _continuation(d, same_time)
    continued = run(spark, "join-fixture", d, tmp_path / "ck2")
    full = run(spark, "join-fixture", d, tmp_path / "ck3", src, confs)
    assert all(b > meta.batch_id for b in continued)
    rows = [r for part in continued.values() for r in part]
    # (lk, lv, lts, rk, rid, rts): restored left rows met new right rows, and the reverse.
    assert any(r[1] < 100 <= r[4] for r in rows), rows
    assert any(r[4] < 100 <= r[1] for r in rows), rows
    assert_exactly_once(first, continued, full)
    restored = Checkpoint.open(str(tmp_path / "ck2"))
    last = restored.latest_committed_batch
    assert restored.backend(last) == dst and restored.num_partitions(last) == n
    assert restored.offsets(last).conf[FORMAT_CONF] == str(fmt)
    assert (
        restored.offsets(last).conf["spark.sql.streaming.stateStore.providerClass"]
        == (PROVIDERS[dst])
    )


def _semi_continuation(d: Path, sp: Savepoint, uid: str, watermark_ms: int) -> tuple[int, int]:
    """Rows that meet restored state only: a right row (v odd, multiple of 3: right side only)
    one second after an unmatched restored left row, and a left row (v even, not a multiple of
    3: left side only) one second before a restored right row, on another key. Returns their v."""
    left = arrow_rows(sp.read(Selection(0, store="left-keyWithIndexToValue"), uid))
    right = arrow_rows(sp.read(Selection(0, store="right-keyWithIndexToValue"), uid))
    floor = dt.datetime.fromtimestamp(watermark_ms / 1000, dt.timezone.utc).replace(tzinfo=None)
    lk, _, lts, _ = next(
        v for _, v, _ in left if not v[-1] and dt.datetime.fromisoformat(v[2]) >= floor
    )
    rk, rts, _ = next(
        v for _, v, _ in right if v[0] != lk and dt.datetime.fromisoformat(v[1]) > floor
    )
    rows = [
        {"id": 100, "k": lk, "v": 105, "ts": (dt.datetime.fromisoformat(lts) + dt.timedelta(seconds=1)).isoformat()},
        {"id": 101, "k": rk, "v": 104, "ts": (dt.datetime.fromisoformat(rts) - dt.timedelta(seconds=1)).isoformat()},
    ]  # fmt: skip
    path = d / "part-0004.json"
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    mtime = dt.datetime(2024, 1, 1, 0, 0, 4, tzinfo=dt.timezone.utc).timestamp()
    os.utime(path, (mtime, mtime))
    return 105, 104


@pytest.mark.spark
@pytest.mark.parametrize(
    ("src_fmt", "dst", "asked", "n"),
    [(4, "rocksdb", None, 3), (4, "hdfs", 2, 2), (2, "rocksdb", None, 3), (3, "rocksdb", 4, 2)],
)
def test_left_semi_join_continues_from_every_format(spark, tmp_path, src_fmt, dst, asked, n):
    """join4-leftsemi's query (at join state formats 2, 3 and 4): a restored unmatched left row
    is emitted when a new right row meets it, and a new left row is emitted for meeting a
    restored right row, as in an uninterrupted run."""
    d = tmp_path / "input"
    _input(d)
    confs = {FORMAT_CONF: str(src_fmt)}
    first = run(spark, "join-leftsemi-fixture", d, tmp_path / "ck1", "rocksdb", confs)
    sp_url, meta = take_savepoint(str(tmp_path / "ck1"), str(tmp_path / "sp"))
    plan = restore(
        sp_url, str(tmp_path / "ck2"), backend=dst, partitions=n, join_state_format=asked
    )
    assert not plan.problems and plan.join_state_format == (asked or src_fmt)
    uid = meta.operators[0].uid
    wm = meta.next_batch_watermark_ms
    new_right_v, new_left_v = _semi_continuation(d, Savepoint.open(sp_url), uid, wm)
    continued = run(spark, "join-leftsemi-fixture", d, tmp_path / "ck2")
    full = run(spark, "join-leftsemi-fixture", d, tmp_path / "ck3", "rocksdb", confs)
    rows = [r for part in continued.values() for r in part]  # (lk, lv, lts)
    assert any(r[1] < 100 for r in rows), rows  # restored left met the new right row
    assert any(r[1] == new_left_v for r in rows), rows  # the new left met a restored right row
    del new_right_v
    assert_exactly_once(first, continued, full)


@pytest.mark.parametrize("name", ["join3-rocksdb", "join4-rocksdb"])
def test_placement_check_uses_the_join_key(name, fixture_copy):
    """Reads verify each key's partition by the join key alone (format 4's event time is not
    hashed: the intact fixture reads), and catch partition directories swapped."""
    from statectl.errors import CorruptFileError

    root = fixture_copy(name)
    store = "left-keyWithTsToValues" if name.startswith("join4") else "left-keyWithIndexToValue"
    for sel in (Selection(0, store=store), Selection(0, join_side="left")):
        assert read_state(Checkpoint.open(str(root)), sel).num_rows == 18
    state = root / "state" / "0"
    (state / "0").rename(state / "x")
    (state / "1").rename(state / "0")
    (state / "x").rename(state / "1")
    with pytest.raises(CorruptFileError, match="belong to another partition"):
        read_state(Checkpoint.open(str(root)), Selection(0, join_side="left"))


# -- Spark: outer joins continue from a restore -------------------------------------------------
def _outer_continuation(d: Path) -> None:
    """File 4: rows at the last batch's event times (00:00:36-38) whose v is a multiple of 6,
    so each passes both sides' filters (left v % 2 = 0, right v % 3 = 0) and meets restored rows
    of the other side, on keys k0-k3 only (restored rows of k4-k6 stay unmatched). File 5: one row at 00:01:40, whose watermark (00:01:30) evicts every restored row in
    the batch of file 6 (an availableNow run may end without a no-data batch), so Spark emits
    the outer rows of those that never matched (and only those: the restored ``matched`` flags
    decide). v and id >= 100 tell new rows from restored ones."""
    t0 = dt.datetime(2024, 1, 1)
    files = [
        [
            {"id": 100 + j, "k": f"k{j % 4}", "v": 102 + 6 * j, "ts": t0 + dt.timedelta(seconds=36 + j % 3)}
            for j in range(14)
        ],
        [{"id": 200, "k": "k0", "v": 200, "ts": t0 + dt.timedelta(seconds=100)}],
        [{"id": 201, "k": "k0", "v": 201, "ts": t0 + dt.timedelta(seconds=101)}],
    ]  # fmt: skip
    for i, rows in enumerate(files, start=4):
        path = d / f"part-{i:04d}.json"
        path.write_text("\n".join(json.dumps({**r, "ts": r["ts"].isoformat()}) for r in rows))
        mtime = (t0 + dt.timedelta(seconds=i)).replace(tzinfo=dt.timezone.utc).timestamp()
        os.utime(path, (mtime, mtime))


OUTER_CELLS = [
    # (join type, source backend, source format, target backend, --join-state-format,
    #  partitions, restore or `statectl migrate`)
    ("left_outer", "hdfs", 2, "hdfs", None, 3, "restore"),
    ("left_outer", "rocksdb", 3, "rocksdb", None, 3, "restore"),
    ("left_outer", "rocksdb", 4, "hdfs", 2, 2, "restore"),
    ("full_outer", "rocksdb", 2, "rocksdb", None, 3, "restore"),
    ("full_outer", "rocksdb", 4, "rocksdb", None, 3, "restore"),
    ("full_outer", "hdfs", 2, "rocksdb", 3, 2, "restore"),
    ("full_outer", "hdfs", 2, "rocksdb", 4, 3, "migrate"),
    ("right_outer", "hdfs", 2, "rocksdb", None, 3, "restore"),
    ("right_outer", "rocksdb", 3, "rocksdb", 4, 2, "restore"),
    # Format 2 on RocksDB (as fixture join-leftouter-rocksdb writes it).
    ("left_outer", "rocksdb", 2, "hdfs", None, 3, "restore"),
]


@pytest.mark.spark
@pytest.mark.parametrize(("how", "src", "src_fmt", "dst", "asked", "n", "via"), OUTER_CELLS)
def test_outer_join_continues_from_a_restore(
    spark, tmp_path, how, src, src_fmt, dst, asked, n, via
):
    """The join-leftouter / join-fullouter fixtures' query: restored rows match new rows of
    the other side, restored rows that never matched come out null-padded when the watermark
    passes them, and rows that did match do not, as in an uninterrupted run. The ``migrate``
    cell converts the format with ``statectl migrate --join-state-format`` (the CLI)."""
    from fixtures.generate import q_join_outer

    query = q_join_outer(how)
    d = tmp_path / "input"
    _input(d)
    confs = {FORMAT_CONF: str(src_fmt)}
    first = run(spark, query, d, tmp_path / "ck1", src, confs)
    sp_url, meta = take_savepoint(str(tmp_path / "ck1"), str(tmp_path / "sp"))
    assert meta.operators[0].state_format == src_fmt
    if via == "migrate":
        args = ["--backend", dst, "--partitions", str(n), "--join-state-format", str(asked)]
        proc = _cli("migrate", str(tmp_path / "ck1"), str(tmp_path / "ck2"), *args, "--json")
        assert proc.returncode == 0, proc.stderr
        info = json.loads(proc.stdout)
        assert info["join_state_format"] == asked and info["conversions"], info
    else:
        plan = restore(
            sp_url, str(tmp_path / "ck2"), backend=dst, partitions=n, join_state_format=asked
        )
        assert not plan.problems and plan.join_state_format == (asked or src_fmt)
    outer = "right" if how == "right_outer" else "left"  # the side whose rows are padded
    matched = [v[-1] for _, v, _ in arrow_rows(
        Savepoint.open(sp_url).read(Selection(0, store=f"{outer}-keyWithIndexToValue"), meta.operators[0].uid)
    )]  # fmt: skip
    assert True in matched and False in matched  # both kinds of restored row are exercised

    _outer_continuation(d)
    continued = run(spark, query, d, tmp_path / "ck2")
    full = run(spark, query, d, tmp_path / "ck3", src, confs)
    rows = [r for part in continued.values() for r in part]  # (lk, lv, lts, rk, rid, rts)
    assert any(r[1] is not None and r[1] < 100 and r[4] is not None and r[4] >= 100 for r in rows)
    assert any(r[4] is not None and r[4] < 100 and r[1] is not None and r[1] >= 100 for r in rows)
    if how in ("left_outer", "full_outer"):  # restored unmatched left rows, null-padded
        assert any(r[1] is not None and r[1] < 100 and r[3] is None for r in rows), rows
    if how in ("right_outer", "full_outer"):  # restored unmatched right rows, null-padded
        assert any(r[4] is not None and r[4] < 100 and r[0] is None for r in rows), rows
    assert_exactly_once(first, continued, full)
    restored = Checkpoint.open(str(tmp_path / "ck2"))
    last = restored.latest_committed_batch
    assert restored.backend(last) == dst and restored.num_partitions(last) == n
    assert restored.offsets(last).conf[FORMAT_CONF] == str(asked or src_fmt)


@pytest.mark.parametrize("store", ["left-keyToNumValues", "left-keyWithIndexToValue"])
def test_an_empty_format_4_partition_reads_as_empty_format_2_stores(store):
    """A format 4 partition without rows (a restore to more partitions than keys leaves some)
    reads as empty format 2 stores with their columns, not as a numpy error."""
    from statectl.join_state import v4_to_v2

    ck = Checkpoint.open(str(FIXTURES / "join4-rocksdb"))
    (op,) = ck.operators(ck.latest_committed_batch)
    family = read_state(ck, Selection(0, store="left-keyWithTsToValues"))
    assert family.num_rows
    whole = v4_to_v2(family, store, op.schema("left-keyWithTsToValues").key_schema)
    empty = v4_to_v2(family.slice(0, 0), store, op.schema("left-keyWithTsToValues").key_schema)
    assert empty.num_rows == 0 and empty.schema == whole.schema

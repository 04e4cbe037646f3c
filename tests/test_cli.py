"""The command line as a user runs it: output, JSON, exit codes and one-line errors."""

from __future__ import annotations

import json
import subprocess
import sys

import pyarrow.parquet as pq
import pytest

from tests.helpers.cli import assert_one_line_error, run
from tests.helpers.fixtures import FIXTURES, drop_crc


def test_help_lists_commands():
    out = run("--help").stdout
    for cmd in ("inspect", "list", "export"):
        assert cmd in out


def test_inspect_json():
    info = json.loads(run("inspect", str(FIXTURES / "agg-hdfs"), "--json").stdout)
    assert info["backend"] == "hdfs" and info["partitions"] == 2
    assert info["latest_committed_batch"] == info["batch"]
    (op,) = info["operators"]
    assert op["name"] == "stateStoreSave"
    assert op["stores"][0]["rows"] > 0
    assert "spark.sql.streaming.stateStore.providerClass" in info["pinned_confs"]
    assert info["source_offsets"]["0"] == {"logOffset": info["batch"]}


def test_inspect_human_output_mentions_the_same_facts():
    out = run("inspect", str(FIXTURES / "agg-rocksdb")).stdout
    assert "stateStoreSave" in out and "rocksdb" in out


@pytest.mark.parametrize(
    "name, kind, fmt",
    [
        ("agg-hdfs", "aggregation", 2),
        ("agg-v1-hdfs", "aggregation", 1),
        ("fmgws-v1-hdfs", "flatMapGroupsWithState", 1),
        ("join-hdfs", "stream-stream join", 2),
        ("join4-rocksdb", "stream-stream join (state format 4)", 4),
        ("session-hdfs", "session window aggregation", None),
    ],
)
def test_inspect_shows_each_operator_kind_and_state_format(name, kind, fmt):
    """The kind and its pinned state format (formats 1 and 2 of an aggregation differ in
    layout), in --json and in the text a user reads."""
    (op,) = json.loads(run("inspect", str(FIXTURES / name), "--json").stdout)["operators"]
    assert (op["kind"], op["state_format"]) == (kind, fmt)
    line = next(s for s in run("inspect", str(FIXTURES / name)).stdout.splitlines() if "kind " in s)
    assert kind in line
    assert (f"state format {fmt}" in line) == (fmt is not None)


def test_savepoint_inspect_keeps_the_source_state_format(tmp_path):
    run("savepoint", str(FIXTURES / "join4-rocksdb"), str(tmp_path))
    (sp,) = tmp_path.iterdir()
    (op,) = json.loads(run("inspect", str(sp), "--json").stdout)["operators"]
    assert (op["kind"], op["state_format"]) == ("stream-stream join", 4)


def test_list_reports_health(tmp_path):
    out = json.loads(run("list", str(FIXTURES), "--json").stdout)
    by_name = {e["path"].rsplit("/", 1)[-1]: e for e in out}
    assert by_name["agg-hdfs"]["health"] == "ok"
    assert by_name["agg-uncommitted-hdfs"]["health"] == "uncommitted"
    assert by_name["agg-rocksdb"]["backend"] == "rocksdb"


def test_list_reports_a_missing_delta(fixture_copy):
    ck = fixture_copy("agg-hdfs")
    delta = sorted((ck / "state" / "0" / "1").glob("*.delta"))[-1]
    delta.unlink()
    (entry,) = json.loads(run("list", str(ck.parent), "--json").stdout)
    assert entry["health"] == "damaged"
    assert any(delta.name in p for p in entry["problems"])


@pytest.mark.parametrize("ext", ["parquet", "jsonl", "csv"])
def test_export_formats(tmp_path, ext):
    out = tmp_path / f"state.{ext}"
    res = json.loads(
        run(
            "export", str(FIXTURES / "agg-hdfs"), "--operator", "0", "-o", str(out), "--json"
        ).stdout
    )
    assert res["rows"] > 0 and out.exists()
    if ext == "parquet":
        assert pq.read_table(out).num_rows == res["rows"]
    elif ext == "jsonl":
        assert len(out.read_text().splitlines()) == res["rows"]
    else:
        assert len(out.read_text().splitlines()) == res["rows"] + 1


def test_export_refuses_to_overwrite(tmp_path):
    out = tmp_path / "state.parquet"
    out.write_bytes(b"x")
    proc = run("export", str(FIXTURES / "agg-hdfs"), "-o", str(out), check_rc=None)
    assert_one_line_error(proc, "already exists")
    assert out.read_bytes() == b"x"


# -- bad input: one line naming the file, exit code 2, no traceback --------------------------
def test_not_a_checkpoint(tmp_path):
    assert_one_line_error(
        run("inspect", str(tmp_path), check_rc=None), str(tmp_path), "not a Spark"
    )


def test_missing_path(tmp_path):
    assert_one_line_error(
        run("inspect", str(tmp_path / "nope"), check_rc=None), "no such directory"
    )


def test_missing_delta_file(fixture_copy):
    ck = fixture_copy("agg-hdfs")
    delta = sorted((ck / "state" / "0" / "0").glob("*.delta"))[-1]
    delta.unlink()
    proc = run("export", str(ck), "-o", str(ck.parent / "o.parquet"), check_rc=None)
    assert_one_line_error(proc, delta.name, "missing")


def test_truncated_delta_file(fixture_copy):
    ck = fixture_copy("agg-hdfs")
    delta = sorted((ck / "state" / "0" / "0").glob("*.delta"), key=lambda p: p.stat().st_size)[-1]
    delta.write_bytes(delta.read_bytes()[:-30])
    drop_crc(delta)
    proc = run("export", str(ck), "-o", str(ck.parent / "o.parquet"), check_rc=None)
    assert_one_line_error(proc, delta.name)


def test_bad_lz4_checksum(fixture_copy):
    ck = fixture_copy("agg-hdfs")
    delta = sorted((ck / "state" / "0" / "0").glob("*.delta"), key=lambda p: p.stat().st_size)[-1]
    data = bytearray(delta.read_bytes())
    data[17] ^= 0xFF  # the first block's checksum field
    delta.write_bytes(bytes(data))
    drop_crc(delta)
    proc = run("export", str(ck), "-o", str(ck.parent / "o.parquet"), check_rc=None)
    assert_one_line_error(proc, delta.name, "checksum")


def test_future_offset_log_version(fixture_copy):
    ck = fixture_copy("agg-hdfs")
    last = max(int(p.name) for p in (ck / "offsets").iterdir() if p.name.isdigit())
    f = ck / "offsets" / str(last)
    f.write_text("v9" + f.read_text()[2:])
    drop_crc(f)
    assert_one_line_error(run("inspect", str(ck), check_rc=None), f"offsets/{last}", "v9")


def test_corrupt_rocksdb_zip(fixture_copy):
    ck = fixture_copy("agg-rocksdb")
    z = sorted((ck / "state" / "0" / "0").glob("*.zip"), key=lambda p: int(p.stem))[-1]
    z.write_bytes(z.read_bytes()[:40])
    drop_crc(z)
    proc = run("export", str(ck), "-o", str(ck.parent / "o.parquet"), check_rc=None)
    assert_one_line_error(proc, z.name)


def test_unsupported_type_in_schema(fixture_copy):
    ck = fixture_copy("agg-hdfs")
    from statectl.checkpoint.state_metadata import parse_schema_file, write_schema_file_v2

    p = ck / "state" / "0" / "0" / "_metadata" / "schema"
    _, (cf,) = parse_schema_file(p.read_bytes(), str(p))
    p.write_bytes(
        write_schema_file_v2(cf.key_schema.replace('"string"', '"variant"'), cf.value_schema)
    )
    drop_crc(p)
    proc = run("export", str(ck), "-o", str(ck.parent / "o.parquet"), check_rc=None)
    assert_one_line_error(proc, "variant")


def test_debug_shows_traceback(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "statectl.cli", "--debug", "inspect", str(tmp_path)],
        capture_output=True,
        text=True,
    )
    assert "Traceback" in proc.stderr
    # The same exit code and closing line as without --debug (it used to turn 2 into 1).
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip().splitlines()[-1].startswith("statectl: error: ")


@pytest.mark.parametrize(
    ("args", "code"), [(["inspect", str(FIXTURES / "agg-hdfs")], 0), (["inspect", "/nowhere"], 2)]
)
def test_main_gives_the_caller_its_wording_back(monkeypatch, capsys, args, code):
    """``main()`` words messages for the command line while it runs, and a Python caller in
    the same process (a test, a warm-up) reads the API's wording after it, whether the command
    succeeded or failed."""
    from statectl.cli import main
    from statectl.errors import wording

    monkeypatch.setattr(sys, "argv", ["statectl", *args])
    with pytest.raises(SystemExit) as exited:
        main()
    assert exited.value.code == code, capsys.readouterr()
    assert wording("--cli", "api=") == "api="

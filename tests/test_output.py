"""What people read: inspect/list at 80 columns, help, --version, export encodings, storage
options parsing and statectl.toml, and the one-line errors of item 5 of issue 9."""

from __future__ import annotations

import csv
import io
import itertools
import json
import os
import subprocess
import sys

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from rich.console import Console

from statectl.errors import StatectlError
from statectl.export import encode_table
from statectl.inspection import inspect_path, list_dir
from statectl.io import (
    FileIO,
    parse_storage_option,
    parse_storage_options,
    redact,
    storage_options,
    storage_options_for,
)
from statectl.render import compact_schema, render_inspect, render_list
from tests.helpers.fixtures import FIXTURES, ROOT


def run(*args: str, columns: int = 80, check_rc: int | None = 0, cwd=None):
    env = {**os.environ, "COLUMNS": str(columns), "PYTHONPATH": str(ROOT)}
    env.pop("LINES", None)
    proc = subprocess.run(
        [sys.executable, "-m", "statectl.cli", *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=cwd,
        timeout=120,
    )
    if check_rc is not None:
        assert proc.returncode == check_rc, proc.stderr + proc.stdout
    return proc


def assert_fits(text: str, width: int = 80, *, whole: str = "") -> None:
    """Every line fits ``width``, but for a line that only holds the path ``whole`` (paths are
    printed unbroken, so that they can be copied)."""
    for line in text.splitlines():
        if whole and line.rstrip().endswith(whole) and len(line.split()) <= 2:
            continue
        assert len(line.rstrip()) <= width, f"{len(line.rstrip())} > {width}: {line!r}"


# -- inspect and list at 80 columns -------------------------------------------------------
@pytest.mark.parametrize("name", ["agg-types-hdfs", "tws-rocksdb", "join-rocksdb", "multi-hdfs"])
def test_inspect_fits_80_columns_with_full_conf_names(name):
    out = run("inspect", str(FIXTURES / name)).stdout
    assert_fits(out)
    info = json.loads(run("inspect", str(FIXTURES / name), "--json").stdout)
    lines = out.splitlines()
    for conf in info["pinned_confs"]:
        assert any(line.startswith(conf) for line in lines), conf  # never cut or folded
    for offset in info["source_offsets"].values():
        assert json.dumps(offset, separators=(", ", ": ")) in out
    assert "{'" not in out  # no Python reprs
    for op in info["operators"]:
        for s in op["stores"]:
            assert s["name"] in out


def test_savepoint_inspect_and_list_fit_80_columns(tmp_path):
    sp = json.loads(
        run("savepoint", str(FIXTURES / "join-rocksdb"), str(tmp_path), "--json").stdout
    )
    out = run("inspect", sp["path"]).stdout
    assert_fits(out, whole=sp["path"].removeprefix("file://"))
    uid = next(iter(sp["operators"]))
    assert f"uid {uid}" in out and "next watermark" in out
    listed = run("list", str(tmp_path)).stdout
    assert_fits(listed, whole=str(tmp_path))
    assert sp["path"].rsplit("/", 1)[-1] in listed and uid in listed


def test_inspect_elides_long_schemas_and_wide_shows_them():
    info = json.loads(run("inspect", str(FIXTURES / "agg-types-hdfs"), "--json").stdout)
    key = info["operators"][0]["stores"][0]["key_schema"]
    assert key.startswith("struct<b:boolean,") and len(key) > 200  # --json: full Spark DDL
    narrow = run("inspect", str(FIXTURES / "agg-types-hdfs")).stdout
    assert "key    b:boolean, by:tinyint" in narrow and "more" in narrow
    assert "_groupingmapsort" not in narrow
    wide = run("inspect", str(FIXTURES / "agg-types-hdfs"), "--wide").stdout
    assert "_groupingmapsort:map<string,int>" in wide
    assert compact_schema(key) in wide  # the whole schema on one line
    assert "org.apache.spark.sql.execution.streaming.state.HDFSBackedStateStoreProvider" in wide
    assert "….HDFSBackedStateStoreProvider" in narrow


def test_list_fits_80_columns_and_names_are_whole():
    out = run("list", str(FIXTURES)).stdout
    assert_fits(out)
    names = [e["path"].rsplit("/", 1)[-1] for e in list_dir(str(FIXTURES))]
    lines = [line.split()[:1] for line in out.splitlines()]
    for n in names:
        if any(first == [n] for first in lines):
            continue
        # A name longer than the name column at 80 columns (the release-line fixtures,
        # spark42-agg-rowchecksum-rocksdb-changelog) folds onto the next line, nothing lost.
        assert any(
            a and b and n.startswith(a[0]) and a[0] + b[0] == n
            for a, b in itertools.pairwise(lines)
        ), n
    wide = run("list", str(FIXTURES), "--wide").stdout
    assert str(FIXTURES / "agg-rowchecksum-rocksdb-changelog") in wide
    assert "0:transformWithStateInPandasExec" in wide


def test_render_at_rich_console_width_80():
    """The same through rich directly (a console 80 wide, as in a terminal of 80 columns)."""
    console = Console(width=80, record=True, file=io.StringIO(), color_system=None)
    render_inspect(console, inspect_path(str(FIXTURES / "join-hdfs")))
    render_list(console, list_dir(str(FIXTURES)))
    text = console.export_text()
    assert_fits(text)
    assert "left-keyWithIndexToValue" in text


def test_compact_schema_elides_at_field_boundaries():
    s = "struct<a:int,b:struct<x:int,y:decimal(10,2)>,c:map<string,bigint>,d:string>"
    assert (
        compact_schema(s)
        == "a:int, b:struct<x:int,y:decimal(10,2)>, c:map<string,bigint>, d:string"
    )
    assert compact_schema(s, 40) == "a:int, … +3 more"
    assert compact_schema(s, 50) == "a:int, b:struct<x:int,y:decimal(10,2)>, … +2 more"
    assert compact_schema("struct<k:string>") == "k:string"
    assert len(compact_schema("struct<" + "x" * 100 + ":int>", 20)) <= 20


# -- help, version, completion ------------------------------------------------------------
@pytest.mark.parametrize(
    "cmd", [[], ["inspect"], ["list"], ["export"], ["savepoint"], ["dispose"], ["relabel"]]
)
def test_help_shows_flags_without_type_placeholders(cmd):
    out = run(*cmd, "--help", columns=120).stdout
    assert "<bool>" not in out
    assert "--json" in out or "--version" in out


def test_version_and_completion():
    from statectl import __version__

    assert run("--version").stdout.strip() == f"statectl {__version__}"
    help_text = run("--help", columns=120).stdout
    assert "--install-completion" in help_text and "--show-completion" in help_text


# -- errors: the flag that overwrites, not-a-join -------------------------------------------
def test_export_refusal_names_the_overwrite_flag(tmp_path):
    out = tmp_path / "state.csv"
    out.write_text("x")
    proc = run("export", str(FIXTURES / "agg-hdfs"), "-o", str(out), check_rc=2)
    assert proc.stderr.strip() == (
        f"statectl: error: {out}: already exists; refusing to overwrite "
        "(pass --overwrite to replace it)"  # the CLI's option, not the API's overwrite=True
    )
    assert out.read_text() == "x"


@pytest.mark.parametrize("name", ["agg-hdfs", "tws-rocksdb", "dedup-rocksdb"])
def test_join_side_on_a_non_join_checkpoint_operator(tmp_path, name):
    info = json.loads(run("inspect", str(FIXTURES / name), "--json", "--no-rows").stdout)
    op = info["operators"][0]
    proc = run(
        "export",
        str(FIXTURES / name),
        "--join-side",
        "left",
        "-o",
        str(tmp_path / "x.csv"),
        check_rc=2,
    )
    assert f"operator {op['id']} ({op['name']}) is not a stream-stream join" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("kind", ["canonical", "native"])
def test_join_side_on_a_non_join_savepoint_operator(tmp_path, kind):
    sp = json.loads(
        run("savepoint", str(FIXTURES / "agg-hdfs"), str(tmp_path), "--type", kind, "--json").stdout
    )
    proc = run(
        "export", sp["path"], "--join-side", "right", "-o", str(tmp_path / "x.csv"), check_rc=2
    )
    assert "operator 0 (stateStoreSave" in proc.stderr
    assert "is not a stream-stream join" in proc.stderr


# -- export encodings ----------------------------------------------------------------------
def test_jsonl_maps_are_objects_and_buffer_names_are_sparks(tmp_path):
    out = tmp_path / "types.jsonl"
    run("export", str(FIXTURES / "agg-types-hdfs"), "-o", str(out))
    rows = [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]
    maps = [r["key"]["_groupingmapsort"] for r in rows]
    assert all(m is None or isinstance(m, dict) for m in maps) and any(m for m in maps)
    assert any("héllo" in (r["key"]["s"] or "") for r in rows)  # UTF-8, not \\u00e9
    assert "\\u" not in out.read_text(encoding="utf-8")
    # count(*), sum(v), avg(v): Spark's buffer is count, sum, sum, count; repeats get _1.
    out2 = tmp_path / "buf.jsonl"
    run("export", str(FIXTURES / "agg-ckptv2-rocksdb"), "-o", str(out2))
    first = json.loads(out2.read_text().splitlines()[0])
    assert list(first["value"]) == ["count", "sum", "sum_1", "count_1"]
    out3 = tmp_path / "buf.parquet"
    run("export", str(FIXTURES / "agg-ckptv2-rocksdb"), "-o", str(out3))
    value = pq.read_schema(out3).field("value").type
    assert [value.field(i).name for i in range(value.num_fields)] == [
        "count",
        "sum",
        "sum_1",
        "count_1",
    ]
    assert value.field(3).metadata[b"statectl.original_name"] == b"count"


def _awkward_table() -> pa.Table:
    big, small = 2**63 - 1, -(2**63)
    value_t = pa.struct(
        [
            ("m", pa.map_(pa.string(), pa.int64())),
            ("im", pa.map_(pa.int32(), pa.string())),
            ("n", pa.int64()),
            ("f", pa.float64()),
            ("tags", pa.list_(pa.string())),
        ]
    )
    return pa.table(
        {
            "key": pa.array([{"k": "😀 é"}, {"k": "plain"}], pa.struct([("k", pa.string())])),
            "value": pa.array(
                [
                    {
                        "m": [("a", big), ("😀", small)],
                        "im": [(1, "x")],
                        "n": 2**53 + 1,
                        "f": float("nan"),
                        "tags": ["ünï", "🙂"],
                    },
                    {"m": [], "im": None, "n": big, "f": 1.5, "tags": []},
                ],
                value_t,
            ),
        }
    )


def test_jsonl_keeps_int64_exact_and_writes_valid_json():
    text = encode_table(_awkward_table(), "jsonl").decode("utf-8")
    rows = [json.loads(line) for line in text.splitlines()]
    assert rows[0]["value"]["m"] == {"a": 2**63 - 1, "😀": -(2**63)}
    assert rows[0]["value"]["n"] == 2**53 + 1 and rows[1]["value"]["n"] == 2**63 - 1
    assert "9223372036854775807" in text and "9007199254740993" in text
    assert rows[0]["value"]["im"] == [[1, "x"]]
    assert rows[0]["value"]["f"] == "NaN" and "NaN," not in text.replace('"NaN"', "")
    assert rows[0]["key"]["k"] == "😀 é" and "\\u" not in text


def test_csv_is_utf8_with_json_maps():
    data = encode_table(_awkward_table(), "csv")
    text = data.decode("utf-8")
    assert "\\ud83d" not in text and "\\u" not in text
    rows = list(csv.DictReader(io.StringIO(text)))
    assert rows[0]["key.k"] == "😀 é"
    assert json.loads(rows[0]["value.m"]) == {"a": 2**63 - 1, "😀": -(2**63)}
    assert json.loads(rows[0]["value.tags"]) == ["ünï", "🙂"]
    assert rows[1]["value.n"] == str(2**63 - 1)


# -- storage options: parsing, statectl.toml, redaction ------------------------------------
def test_parse_storage_options():
    assert parse_storage_option("anon=true") == {"anon": True}
    assert parse_storage_option("default_block_size=8388608") == {"default_block_size": 8388608}
    assert parse_storage_option("key=abc=def") == {"key": "abc=def"}
    assert parse_storage_option("key=007") == {"key": "007"}
    assert parse_storage_option("secret=12345") == {"secret": "12345"}  # secrets stay strings
    assert parse_storage_option("max_concurrency=4") == {"max_concurrency": 4}
    assert parse_storage_options(
        ["client_kwargs.endpoint_url=http://h:9000", "client_kwargs.region_name=eu-west-1"]
    ) == {"client_kwargs": {"endpoint_url": "http://h:9000", "region_name": "eu-west-1"}}
    for bad in ("novalue", "=x", "a..b=1"):
        with pytest.raises(StatectlError, match="--storage-option must look like KEY=VALUE"):
            parse_storage_option(bad)


def test_redact():
    assert redact(
        {
            "key": "AK",
            "secret": "s",
            "token": "t",
            "aws_access_key_id": "x",
            "client_kwargs": {"aws_secret_access_key": "y", "endpoint_url": "http://h"},
            "password": "p",
            "anon": False,
            "endpoint_url": "http://h",
        }
    ) == {
        "key": "***",
        "secret": "***",
        "token": "***",
        "aws_access_key_id": "***",
        "client_kwargs": {"aws_secret_access_key": "***", "endpoint_url": "http://h"},
        "password": "***",
        "anon": False,
        "endpoint_url": "http://h",
    }


def test_statectl_toml_prefixes_and_precedence(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "statectl.toml").write_text(
        '[storage."s3://lake/"]\nendpoint_url = "http://a"\nanon = false\n'
        'client_kwargs.region_name = "eu-west-1"\n\n'
        '[storage."s3://lake/public"]\nanon = true\n\n'
        '[storage."memory://mem"]\nstatectl_marker = "x"\n'
    )
    assert storage_options_for("s3://lake/ckpt") == {
        "endpoint_url": "http://a",
        "anon": False,
        "client_kwargs": {"region_name": "eu-west-1"},
    }
    assert storage_options_for("s3://lake/public/x")["anon"] is True
    assert storage_options_for("s3://lakehouse/x") == {}
    assert storage_options_for("s3://lake/publicity") == storage_options_for("s3://lake/ckpt")
    with storage_options({"anon": True, "client_kwargs": {"region_name": "us-east-1"}}):
        o = storage_options_for("s3://lake/ckpt")
        assert o["anon"] is True and o["endpoint_url"] == "http://a"
        assert o["client_kwargs"] == {"region_name": "us-east-1"}
        assert storage_options_for(str(tmp_path)) == {}  # local paths get no remote options
    assert storage_options_for("s3://lake/ckpt")["anon"] is False
    # FileIO.for_url passes them to fsspec.
    io_, _ = FileIO.for_url("memory://mem/x")
    assert io_.fs.storage_options.get("statectl_marker") == "x"


def test_bad_statectl_toml_is_a_one_line_error(tmp_path):
    (tmp_path / "statectl.toml").write_text("[storage\n")
    proc = run("inspect", str(FIXTURES / "agg-hdfs"), cwd=tmp_path, check_rc=2)
    assert "statectl.toml: is not valid TOML" in proc.stderr


def test_paths_in_messages_are_shown_as_the_user_named_their_directory():
    """The one rule behind "paths as you wrote them" (the CLI tests in test_cli_second_hour
    show it end to end): a path under a relatively named directory is shown relative, a
    ``file://`` URL as its path, anything else as it is."""
    from statectl.errors import StatectlError, display_paths_in, register_typed_root

    root = "/nonexistent-statectl-test/work/ck"
    register_typed_root(root, "ck")
    assert display_paths_in(f"{root}/state/0/1/4.delta: truncated") == (
        "ck/state/0/1/4.delta: truncated"
    )
    assert display_paths_in(f"inside the source checkpoint file://{root}.") == (
        "inside the source checkpoint ck."
    )
    for same in (f"s3://b{root}/x", f"{root}2/x", "v / 2", "a/b"):
        assert display_paths_in(same) == same
    assert display_paths_in("file:///elsewhere/x: no") == "/elsewhere/x: no"
    e = StatectlError("damaged", f"file://{root}/a.parquet")
    assert (str(e), e.path) == ("ck/a.parquet: damaged", "ck/a.parquet")

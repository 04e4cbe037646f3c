"""Adversarial inputs, bounded: one representative corruption per mutation class and family.

The cases run through bench/fuzz.py's own machinery (one implementation of mutation, run and
classification): a fresh copy of a bundled fixture (or of a savepoint of one), one mutation,
then the real CLI (``statectl.cli.main()`` in a forked child) for inspect, export of every
selection, savepoint and export from it (crafted savepoints: export, restore, export of the
restored checkpoint). Every case must end ``same`` or ``clean-error``: never a silently
different result, a traceback, a hang, a crash or a file touched outside the output directory.

Cases whose fix is owned elsewhere are ``xfail(strict=True)`` with the fix they wait for, so
they turn into failures (remove the mark) the moment that fix lands.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from typing import Any

import pytest

from statectl.backends.rocksdb import parse_snapshot_metadata
from statectl.checkpoint.logs import (
    parse_commit,
    parse_offset_seq,
    parse_source_log,
    parse_stream_metadata,
)
from statectl.checkpoint.state_metadata import parse_operator_metadata, parse_schema_file
from statectl.codecs.sparktypes import parse_schema
from statectl.errors import CorruptFileError

ROOT = Path(__file__).resolve().parent.parent
_spec = importlib.util.spec_from_file_location("statectl_bench_fuzz", ROOT / "bench" / "fuzz.py")
assert _spec and _spec.loader
fuzz = importlib.util.module_from_spec(_spec)
sys.modules["statectl_bench_fuzz"] = fuzz
_spec.loader.exec_module(fuzz)


SST0 = "state/0/0/SSTs/000012-321b9447-2f02-4eb2-b351-12e34eac2539.sst"
V2ZIP = "state/0/0/4_447139a4-ce96-4d11-a259-c2f8b8449d81.zip"
TWS_SCHEMA = "state/0/_stateSchema/default/0_b6041b9b-f04c-4d08-be25-1f12483a8a5a"
TWS_SST = "state/0/0/SSTs/000013-547e848b-879f-4b5e-aebf-45bfc84eefe2.sst"


def _c(family: str, fixture: str, mutation: dict[str, Any]) -> Any:
    cid = f"{family}-{fixture}-{mutation['cls']}-{mutation.get('kind') or mutation['file']}"
    if "path" in mutation:
        cid += "-" + ".".join(map(str, mutation["path"]))
    return pytest.param(family, fixture, mutation, id=cid)


def _flip(f: str, off: int = 40) -> dict[str, Any]:
    return {"cls": "flip", "file": f, "flips": [[off, 4]]}


CASES = [
    # -- HDFS (lz4) ---------------------------------------------------------------------------
    _c("hdfs", "agg-hdfs", _flip("state/0/0/4.delta")),
    _c("hdfs", "agg-hdfs", {"cls": "truncate", "file": "state/0/0/4.delta", "size": 20}),
    _c(
        "hdfs", "agg-hdfs", {"cls": "zero", "file": "state/0/1/4.delta", "offset": 10, "length": 30}
    ),
    _c("hdfs", "agg-hdfs", {"cls": "delete", "file": "state/0/0/3.delta"}),
    _c(
        "hdfs",
        "agg-hdfs",
        {"cls": "swap-partition", "file": "state/0/0/4.delta", "other": "state/0/1/4.delta"},
    ),
    _c(
        "hdfs",
        "agg-hdfs",
        {"cls": "swap-version", "file": "state/0/0/3.delta", "other": "state/0/0/4.delta"},
    ),
    _c(
        "hdfs",
        "agg-hdfs",
        {
            "cls": "json-type",
            "file": "offsets/3",
            "path": ["conf", "spark.sql.shuffle.partitions"],
            "value": 2,
        },
    ),
    _c(
        "hdfs",
        "agg-hdfs",
        {
            "cls": "json-type",
            "file": "offsets/3",
            "path": ["conf", "spark.sql.shuffle.partitions"],
            "value": "1",
        },
    ),
    _c(
        "hdfs",
        "agg-hdfs",
        {
            "cls": "json-type",
            "file": "state/0/_metadata/metadata",
            "path": ["stateStoreInfo", 0, "numPartitions"],
            "value": "2",
        },
    ),
    _c(
        "hdfs",
        "agg-hdfs",
        {"cls": "json-type", "file": "commits/3", "path": ["nextBatchWatermarkMs"], "value": []},
    ),
    _c("hdfs", "agg-hdfs", {"cls": "json-garbage", "file": "commits/3", "text": '{"a":'}),
    _c(
        "hdfs",
        "agg-hdfs",
        {
            "cls": "deep-json",
            "file": "state/0/_metadata/metadata",
            "depth": 100_000,
            "shape": "list",
        },
    ),
    _c(
        "hdfs",
        "agg-hdfs",
        {"cls": "deep-json", "file": "sources/0/0", "depth": 1000, "shape": "dict", "line": 1},
    ),
    _c("hdfs", "agg-hdfs", {"cls": "non-utf8", "file": "offsets/3", "offset": 5, "bytes": "ff"}),
    _c(
        "hdfs",
        "agg-hdfs",
        {"cls": "schema", "file": "state/0/0/_metadata/schema", "kind": "type", "seed": 1},
    ),
    _c(
        "hdfs",
        "agg-hdfs",
        {"cls": "schema", "file": "state/0/0/_metadata/schema", "kind": "utf", "seed": 2},
    ),
    _c(
        "hdfs",
        "agg-hdfs",
        {"cls": "schema", "file": "state/0/0/_metadata/schema", "kind": "deep", "seed": 3},
    ),
    # -- RocksDB zip + SSTs ------------------------------------------------------------------
    _c("rocksdb-zip", "agg-rocksdb", _flip(SST0, 200)),
    _c("rocksdb-zip", "agg-rocksdb", {"cls": "truncate", "file": "state/0/0/4.zip", "size": 100}),
    # the SST's first block zeroed: the iterator stops early without an error, rows are lost
    _c(
        "rocksdb-zip",
        "agg-rocksdb",
        {"cls": "zero", "file": SST0, "offset": 0, "length": 64},
    ),
    _c("rocksdb-zip", "agg-rocksdb", {"cls": "delete", "file": SST0}),
    _c(
        "rocksdb-zip",
        "agg-rocksdb",
        {"cls": "swap-partition", "file": "state/0/0/4.zip", "other": "state/0/1/4.zip"},
    ),
    _c(
        "rocksdb-zip",
        "agg-rocksdb",
        {"cls": "swap-version", "file": "state/0/0/3.zip", "other": "state/0/0/4.zip"},
    ),
    _c(
        "rocksdb-zip",
        "agg-rocksdb",
        {
            "cls": "json-type",
            "file": "state/0/0/4.zip",
            "member": "metadata",
            "path": ["numKeys"],
            "value": "7",
        },
    ),
    _c(
        "rocksdb-zip",
        "agg-rocksdb",
        {
            "cls": "json-type",
            "file": "state/0/0/4.zip",
            "member": "metadata",
            "path": ["sstFiles", 0, "localFileName"],
            "value": 5,
        },
    ),
    _c(
        "rocksdb-zip",
        "agg-rocksdb",
        {
            "cls": "deep-json",
            "file": "state/0/0/4.zip",
            "member": "metadata",
            "depth": 5000,
            "shape": "dict",
            "line": 1,
        },
    ),
    _c(
        "rocksdb-zip",
        "agg-rocksdb",
        {"cls": "zip-member", "file": "state/0/0/4.zip", "kind": "member-traversal", "seed": 1},
    ),
    _c(
        "rocksdb-zip",
        "agg-rocksdb",
        {"cls": "zip-member", "file": "state/0/0/4.zip", "kind": "deflate-damage", "seed": 1},
    ),
    _c(
        "rocksdb-zip",
        "agg-rocksdb",
        {"cls": "zip-member", "file": "state/0/0/4.zip", "kind": "metadata-types", "seed": 4},
    ),
    _c(
        "rocksdb-zip",
        "agg-rocksdb",
        {"cls": "zip-member", "file": "state/0/0/4.zip", "kind": "local-traversal", "seed": 1},
    ),
    _c(
        "rocksdb-zip",
        "agg-rocksdb",
        {"cls": "zip-member", "file": "state/0/0/4.zip", "kind": "local-absolute", "seed": 1},
    ),
    _c(
        "rocksdb-zip",
        "agg-rocksdb",
        {"cls": "zip-member", "file": "state/0/0/4.zip", "kind": "dfs-traversal", "seed": 1},
    ),
    # -- RocksDB changelog -------------------------------------------------------------------
    _c("rocksdb-changelog", "agg-rocksdb-changelog", _flip("state/0/0/4.changelog", 30)),
    _c(
        "rocksdb-changelog",
        "agg-rocksdb-changelog",
        {"cls": "truncate", "file": "state/0/1/4.changelog", "size": 33},
    ),
    _c(
        "rocksdb-changelog",
        "agg-rocksdb-changelog",
        {"cls": "delete", "file": "state/0/0/2.changelog"},
    ),
    _c(
        "rocksdb-changelog",
        "agg-rocksdb-changelog",
        {"cls": "swap-version", "file": "state/0/0/2.changelog", "other": "state/0/0/4.changelog"},
    ),
    _c(
        "rocksdb-changelog",
        "agg-rocksdb-changelog",
        {"cls": "deep-json", "file": "offsets/3", "depth": 100_000, "shape": "dict", "line": 1},
    ),
    _c(
        "rocksdb-changelog",
        "agg-rocksdb-changelog",
        {"cls": "non-utf8", "file": "state/0/0/_metadata/schema", "offset": 8, "bytes": "c328"},
    ),
    # -- checkpoint format v2 ----------------------------------------------------------------
    _c("ckptv2", "agg-ckptv2-rocksdb", {"cls": "truncate", "file": V2ZIP, "size": 50}),
    # the newest commit without its offsets: an error, not the state of the batch before
    _c("ckptv2", "agg-ckptv2-rocksdb", {"cls": "delete", "file": "offsets/3"}),
    _c(
        "ckptv2",
        "agg-ckptv2-rocksdb",
        {"cls": "json-type", "file": "commits/3", "path": ["stateUniqueIds", "0"], "value": [1, 2]},
    ),
    _c(
        "ckptv2",
        "agg-ckptv2-rocksdb",
        {"cls": "json-type", "file": "commits/3", "path": ["stateUniqueIds"], "value": "x"},
    ),
    _c(
        "ckptv2",
        "agg-ckptv2-rocksdb",
        {"cls": "json-garbage", "file": V2ZIP + ".crc", "text": "}{"},
    ),
    _c(
        "ckptv2",
        "agg-ckptv2-rocksdb",
        {"cls": "zip-member", "file": V2ZIP, "kind": "deflate-damage", "seed": 2},
    ),
    # -- transformWithState ------------------------------------------------------------------
    _c("tws", "tws-rocksdb", _flip(TWS_SST, 300)),
    # a flipped bit in a member name flagged UTF-8: UnicodeDecodeError inside zipfile
    _c(
        "tws",
        "tws-rocksdb-changelog",
        {"cls": "flip", "file": "state/0/0/1.zip", "flips": [[1436, 16], [3063, 8], [39, 128]]},
    ),
    _c("tws", "tws-rocksdb", {"cls": "schema", "file": TWS_SCHEMA, "kind": "type", "seed": 1}),
    _c("tws", "tws-rocksdb", {"cls": "schema", "file": TWS_SCHEMA, "kind": "chunks", "seed": 1}),
    _c(
        "tws",
        "tws-rocksdb",
        {"cls": "non-utf8", "file": TWS_SCHEMA, "offset": 30, "bytes": "eda080"},
    ),
    _c(
        "tws",
        "tws-rocksdb",
        {
            "cls": "json-type",
            "file": "state/0/_metadata/v2/0",
            "path": ["operatorPropertiesJson"],
            "value": 7,
        },
    ),
    _c(
        "tws",
        "tws-rocksdb",
        {
            "cls": "json-type",
            "file": "state/0/_metadata/v2/0",
            "path": ["stateStoreInfo", 0, "stateSchemaFilePaths"],
            "value": [1],
        },
    ),
    _c(
        "tws",
        "tws-rocksdb",
        {
            "cls": "json-type",
            "file": "state/0/_metadata/v2/0",
            "path": ["operatorInfo"],
            "value": [],
        },
    ),
    # -- codecs ------------------------------------------------------------------------------
    # zstd frames here carry no checksum: a flipped literal decodes to another value
    _c("codec", "agg-zstd-hdfs", _flip("state/0/0/4.delta", 20)),
    _c("codec", "agg-snappy-hdfs", _flip("state/0/0/4.delta", 20)),
    _c("codec", "agg-lzf-hdfs", {"cls": "truncate", "file": "state/0/1/4.delta", "size": 25}),
    _c(
        "codec",
        "agg-lzf-hdfs",
        {"cls": "zero", "file": "state/0/0/4.delta", "offset": 6, "length": 12},
    ),
    # -- crafted canonical savepoints (of agg-hdfs) ------------------------------------------
    *[
        _c(
            "savepoint",
            "agg-hdfs",
            {"cls": cls, "file": "_metadata", "target": [0, 0, 0], "seed": 1},
        )
        for cls in [
            "sp-abs-path",
            "sp-dotdot-path",
            "sp-symlink",
            "sp-drop-file",
            # the data is intact, only the recorded numbers lie: verification refuses it
            "sp-sha256",
            "sp-rows",
            "sp-bytes",
            "sp-flip",
            "sp-truncate",
        ]
    ],
    _c(
        "savepoint",
        "agg-hdfs",
        {
            "cls": "sp-operator-id",
            "file": "_metadata",
            "field": "operator_id",
            "value": "../../sentinel/pwned",
        },
    ),
    _c(
        "savepoint",
        "agg-hdfs",
        {
            "cls": "sp-json-type",
            "file": "_metadata",
            "path": ["operators", 0, "tables", 0, "name"],
            "value": "../../../../sentinel/pwned",
        },
    ),
    _c(
        "savepoint",
        "agg-hdfs",
        {"cls": "sp-operator-id", "file": "_metadata", "field": "operator_id", "value": -1},
    ),
    _c(
        "savepoint",
        "agg-hdfs",
        {"cls": "sp-huge-batch", "file": "_metadata", "value": 3_000_000},
    ),
    _c(
        "savepoint",
        "agg-hdfs",
        {"cls": "sp-json-type", "file": "_metadata", "pick": 3, "value": {}},
    ),
    _c(
        "savepoint",
        "agg-hdfs",
        {"cls": "sp-operator-id", "file": "_metadata", "field": "operator_id", "value": None},
    ),
    # -- kill -9 of a writing command at a moment (a fraction of its uninterrupted time), then
    # read back and re-run ----------------------------------------------------------------------
    *[
        _c("kill", fixture, {"cls": cls, "fraction": fraction, "file": f"at-{fraction}"})
        # Early in the command: the baseline that times it may run under a heavier load than
        # the kill (a full suite's other worker), so a kill at 0.5 of it can land after the
        # command finished (three of them did once). One late kill stays (restore at 0.6: a
        # kill after its metadata is written), and the longest delay lets the command finish.
        for fixture, cls, fraction in [
            ("agg-hdfs", "kill-savepoint", 0.05),
            ("agg-hdfs", "kill-savepoint", 0.3),
            ("agg-hdfs", "kill-restore", 0.05),
            ("agg-hdfs", "kill-restore", 0.6),
            ("agg-hdfs", "kill-migrate", 0.25),
            ("agg-hdfs", "kill-migrate", 50.0),  # finishes first: a normal run
            ("tws-rocksdb", "kill-restore", 0.3),
            ("tws-rocksdb", "kill-migrate", 0.3),
        ]
    ],
    # -- dispose of a savepoint around things that are not its own ----------------------------
    *[
        _c(
            "dispose",
            fixture,
            {
                "cls": cls,
                "perturb": perturb,
                "spelling": spelling,
                "seed": 5,
                "file": "+".join(perturb) or "none",
                "kind": spelling,
            },
        )
        for fixture, cls, perturb, spelling in [
            ("agg-hdfs", "dispose", [], "plain"),
            ("agg-hdfs", "dispose", [], "parent-cwd"),
            ("agg-hdfs", "dispose", [], "cwd-dot"),
            ("agg-hdfs", "dispose", [], "dotdot"),
            ("agg-hdfs", "dispose", [], "symlink"),
            ("agg-hdfs", "dispose", ["user-file"], "plain"),
            ("agg-hdfs", "dispose-force", ["user-file", "nested-checkpoint"], "trailing-slash"),
            ("agg-hdfs", "dispose-force", ["crafted-path"], "plain"),
            ("join-rocksdb", "dispose-force", ["copied-metadata"], "plain"),
            ("join-rocksdb", "dispose-force", ["missing-data-file", "unlisted-data-file"], "plain"),
        ]
    ],
]


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory: pytest.TempPathFactory) -> dict[int, Any]:
    """Every case at once, four forked children at a time (mostly I/O waits: ~12 s of CPU)."""
    fuzz.preload()
    camp = fuzz.Campaign(tmp_path_factory.mktemp("adversarial"), timeout=60)
    cases = [
        fuzz.Case(i, p.values[0], p.values[1], p.values[2]["cls"], p.values[2])
        for i, p in enumerate(CASES)
    ]
    return {c.index: c for c in fuzz.run_cases(camp, cases, jobs=4)}


@pytest.mark.parametrize("family,fixture,mutation", CASES)
def test_corruption_is_same_or_clean_error(
    outcomes: dict[int, Any], family: str, fixture: str, mutation: dict[str, Any]
) -> None:
    index = next(i for i, p in enumerate(CASES) if p.values[2] is mutation)
    case = outcomes[index]
    bad = [c for c in case.commands if c["outcome"] not in ("same", "clean-error")]
    detail = "; ".join(f"{c['name']}: {c['outcome']} {c['stderr'][-300:]}" for c in bad)
    assert case.outcome in ("same", "clean-error"), f"{case.outcome}: {detail} {case.events}"


def test_kills_land_mid_command_and_disposes_delete(outcomes: dict[int, Any]) -> None:
    """The kill and dispose cases test something: kills within the command's time interrupt it
    (all but three: the baseline that times a command and the kill may run under different
    loads), the longest delay lets it finish, and a plain dispose of an untouched savepoint
    deletes it."""
    kills = [c for c in outcomes.values() if c.family == "kill"]
    assert sum(1 for c in kills if c.killed) >= len(kills) - 3
    assert any(c.killed is False for c in kills)
    plain = [
        c
        for c in outcomes.values()
        if c.family == "dispose" and not c.mutation["perturb"] and c.mutation["kind"] == "plain"
    ]
    assert plain and all(c.outcome == "same" for c in plain)


def test_clean_errors_name_a_file(outcomes: dict[int, Any]) -> None:
    """A clean error is one line that says which file is damaged (not just that one is); under
    ``--json`` it is the JSON error object on stdout."""
    checked = 0
    for case in outcomes.values():
        for c in case.commands:
            if c["outcome"] == "clean-error":
                text = c["stderr"] or c.get("stdout", "")
                # dispose names the path as the user typed it ("." included)
                named = c["argv"][2] if case.family == "dispose" else "/"
                assert named in text, (case.mutation, text)
                checked += 1
    # Not vacuous: every case that ended in a clean error had a command whose error was checked
    # above, and there are such cases (truncated and deleted files end so).
    errors = [case for case in outcomes.values() if case.outcome == "clean-error"]
    assert errors and checked >= len(errors), (len(errors), checked)


# -- the parsers directly: every malformed input is a CorruptFileError naming the file ---------
DEEP = "[" * 100_000 + "]" * 100_000


@pytest.mark.parametrize(
    "parse",
    [
        lambda: parse_offset_seq('v1\n{"conf":{"spark.sql.shuffle.partitions":2}}\n-', 3, "F"),
        lambda: parse_offset_seq('v1\n{"batchWatermarkMs":"0"}', 3, "F"),
        lambda: parse_offset_seq("v1\n" + DEEP, 3, "F"),
        lambda: parse_commit('v2\n{"stateUniqueIds":{"0":[[1]]}}', 3, "F"),
        lambda: parse_commit('v1\n{"nextBatchWatermarkMs":[]}', 3, "F"),
        lambda: parse_source_log("v1\n[1]", "F"),
        lambda: parse_stream_metadata(DEEP, "F"),
        lambda: parse_operator_metadata('v2\n{"operatorInfo":[]}', "F"),
        lambda: parse_operator_metadata('v2\n{"stateStoreInfo":[{"numPartitions":"2"}]}', "F"),
        lambda: parse_operator_metadata('v2\n{"operatorPropertiesJson":7}', "F"),
        lambda: parse_operator_metadata("v2\n" + DEEP, "F"),
        lambda: parse_schema_file(b"\x00\x02v2\x00\x00\x00\x01\x00\x02\xff\xfe", "F"),
        lambda: parse_schema_file(b"\x00\x02v3\xff\xff\xff\xff", "F"),
        lambda: parse_snapshot_metadata('v1\n{"numKeys":"7"}', "F"),
        lambda: parse_snapshot_metadata('v1\n{"sstFiles":[{"localFileName":5}]}', "F"),
        lambda: parse_snapshot_metadata('v1\n{"columnFamilyMapping":{"default":"0"}}', "F"),
        lambda: parse_schema('{"type":"struct","fields":3}', "F"),
        lambda: parse_schema(DEEP, "F"),
    ],
)
def test_parsers_raise_corrupt_file_errors(parse: Any) -> None:
    with pytest.raises(CorruptFileError) as e:
        parse()
    assert str(e.value).startswith("F: ") and "\n" not in str(e.value)


def test_the_warm_up_leaves_the_api_wording(outcomes: dict[int, Any]) -> None:
    """The campaign ran ``main()`` in this process to warm up: a Python caller after it still
    reads the API's wording (``table=``, not ``--table``). It leaked once, failing a later
    test in the same pytest worker."""
    from statectl.errors import wording

    assert outcomes and wording("--cli", "api=") == "api="

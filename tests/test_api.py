"""The Python API: typed results, and every command's ``--json`` equal to the API's ``to_dict()``."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys

import pyarrow.parquet as pq
import pytest

import statectl
from statectl.checkpoint.model import Checkpoint
from statectl.cli import json_requested, render_error
from statectl.errors import MissingFileError, NotACheckpointError
from statectl.state import Selection
from statectl.state import read_state as raw_read_state
from tests.helpers.cli import cli_json
from tests.helpers.fixtures import FIXTURES
from tests.helpers.rows import arrow_rows


def without(doc: dict, *keys: str) -> dict:
    return {k: v for k, v in doc.items() if k not in keys}


@pytest.mark.parametrize("name", ["multi-hdfs", "tws-rocksdb", "join-rocksdb-changelog"])
def test_inspect_checkpoint_json_is_the_api_result(name):
    result = statectl.inspect(str(FIXTURES / name))
    assert cli_json("inspect", str(FIXTURES / name)) == result.to_dict()
    doc = result.to_dict()
    assert doc["schema_version"] == statectl.SCHEMA_VERSION == 1
    assert result.kind == "checkpoint" and result.batch == doc["batch"]
    assert [op.id for op in result.operators] == [op["id"] for op in doc["operators"]]
    assert sum(s.rows for op in result.operators for s in op.stores) > 0
    with pytest.raises(dataclasses.FrozenInstanceError):
        result.batch = 0  # type: ignore[misc]
    result.to_dict()["batch"] = -5  # a copy: the result does not change
    assert result.to_dict() == doc


def test_savepoint_restore_migrate_json_are_the_api_results(tmp_path):
    ckpt = str(FIXTURES / "multi-hdfs")
    sp = statectl.savepoint(ckpt, tmp_path / "api", uids={0: "order-totals", 1: "dedup"})
    cli_sp = cli_json("savepoint", ckpt, str(tmp_path / "cli"), "--uid", "0=order-totals",
                      "--uid", "1=dedup")  # fmt: skip
    assert without(cli_sp, "path") == without(sp.to_dict(), "path")
    assert cli_sp["schema_version"] == 1 and cli_sp["operators"] == {"order-totals": 7, "dedup": 48}
    assert sp.operators == cli_sp["operators"] and sp.batch == 3 and sp.type == "canonical"
    # The URL as before (a str then): str(), os.fspath() and .path; accepted as a path.
    assert str(sp) == os.fspath(sp) == sp.path and sp.path.startswith("file://")

    # inspect of a savepoint
    assert cli_json("inspect", sp.path) == statectl.inspect(sp).to_dict()
    assert statectl.inspect(sp).kind == "savepoint"

    # restore: same plan from the CLI and the API, each into its own target
    api = statectl.restore(sp, tmp_path / "r-api", backend="rocksdb", partitions=3)
    cli = cli_json("restore", "-s", sp.path, str(tmp_path / "r-cli"), "--backend", "rocksdb",
                   "--partitions", "3")  # fmt: skip
    assert without(cli, "target") == without(api.to_dict(), "target")
    assert api.ok and not api.dry_run and api.restored == {"order-totals": 0, "dedup": 1}
    assert api.partitions == 3 and api.resumes_at_batch == 4
    restored = Checkpoint.open(str(tmp_path / "r-api"))
    assert restored.num_partitions(3) == 3

    # a failing restore: exit 2 with the plan as JSON; the API raises with the same plan
    cli_fail = cli_json("restore", "-s", sp.path, str(tmp_path / "f-cli"), "--map",
                        "nope=1", rc=2)  # fmt: skip
    with pytest.raises(statectl.RestoreError) as err:
        statectl.restore(sp, tmp_path / "f-api", mapping={"nope": 1})
    assert without(cli_fail, "target") == without(err.value.result.to_dict(), "target")
    assert not err.value.result.ok and "nope" in err.value.result.problems[0]
    assert not (tmp_path / "f-api").exists() and not (tmp_path / "f-cli").exists()
    # the same under dry_run: returned, not raised
    dry = statectl.restore(sp, tmp_path / "f-api", mapping={"nope": 1}, dry_run=True)
    assert dry.dry_run and not dry.ok and dry.problems == err.value.result.problems

    # migrate
    api_m = statectl.migrate(ckpt, tmp_path / "m-api", backend="rocksdb", partitions=4)
    cli_m = cli_json("migrate", ckpt, str(tmp_path / "m-cli"), "--backend", "rocksdb",
                     "--partitions", "4")  # fmt: skip
    assert without(cli_m, "target") == without(api_m.to_dict(), "target")
    assert isinstance(api_m, statectl.MigrateResult) and api_m.savepoint is None
    assert api_m.source == ckpt and api_m.backend == "rocksdb" and api_m.partitions == 4


def test_read_state_is_the_statestore_table(tmp_path):
    ckpt = FIXTURES / "join-hdfs"
    left = statectl.read_state(ckpt, operator=0, join_side="left")
    assert left.num_rows > 0
    expected = raw_read_state(Checkpoint.open(str(ckpt)), Selection(0, join_side="left"))
    assert arrow_rows(left) == arrow_rows(expected)
    # the same table export writes
    cli_json("export", str(ckpt), "--join-side", "left", "-o", str(tmp_path / "l.parquet"))
    assert arrow_rows(pq.read_table(tmp_path / "l.parquet")) == arrow_rows(left)
    # from a savepoint, by uid
    sp = statectl.savepoint(FIXTURES / "tws-rocksdb", tmp_path / "sp", uids={0: "counter"})
    lst = statectl.read_state(sp, "counter", state_var="lst")
    assert arrow_rows(lst) == arrow_rows(
        statectl.read_state(FIXTURES / "tws-rocksdb", state_var="lst")
    )
    with pytest.raises(statectl.errors.StatectlError, match="at most one"):
        statectl.read_state(ckpt, store="x", join_side="left")
    with pytest.raises(statectl.errors.StatectlError, match="holds batch 4 only"):
        statectl.read_state(sp, "counter", state_var="lst", batch=1)


def test_api_names_are_the_functions():
    """No submodule is named like an API function: importing one would replace the function
    on the package (Python sets a submodule as its package's attribute)."""
    import importlib
    import pkgutil

    modules = {m.name for m in pkgutil.iter_modules(statectl.__path__)}
    api = {n for n in statectl.__all__ if callable(getattr(statectl, n))}
    assert not modules & api
    for m in modules:
        importlib.import_module(f"statectl.{m}")
    homes = ("statectl.api", "statectl.results", "statectl.processor.writing")
    assert all(getattr(statectl, n).__module__ in homes for n in api)


def test_json_requested():
    assert json_requested(["inspect", "x", "--json"])
    assert not json_requested(["inspect", "x"])
    assert not json_requested(["export", "x", "--", "--json"])


def test_render_error(capsys):
    err = MissingFileError("file does not exist", "/ck/state/0/0/2.delta")
    assert render_error(err, True) == 2
    out, errout = capsys.readouterr()
    assert errout == ""
    assert json.loads(out) == {
        "error": "/ck/state/0/0/2.delta: file does not exist",
        "path": "/ck/state/0/0/2.delta",
        "kind": "MissingFileError",
        "exit_code": 2,
    }
    assert render_error(NotACheckpointError("no such directory", "/nope"), False) == 2
    out, errout = capsys.readouterr()
    assert out == "" and errout == "statectl: error: /nope: no such directory\n"
    assert render_error(PermissionError(13, "Permission denied", "/ck/offsets/3"), True) == 2
    doc = json.loads(capsys.readouterr().out)
    assert doc == {
        "error": "/ck/offsets/3: Permission denied",
        "path": "/ck/offsets/3",
        "kind": "PermissionError",
        "exit_code": 2,
    }
    assert render_error(ZeroDivisionError("x"), True) == 3
    assert json.loads(capsys.readouterr().out)["exit_code"] == 3


def test_cli_error_under_json_is_json(tmp_path):
    missing = str(tmp_path / "nope")
    proc = subprocess.run(
        [sys.executable, "-m", "statectl.cli", "inspect", missing, "--json"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2 and proc.stderr == ""
    doc = json.loads(proc.stdout)
    assert doc["exit_code"] == 2 and doc["kind"] == "NotACheckpointError"
    assert doc["path"].endswith("nope") and "no such directory" in doc["error"]

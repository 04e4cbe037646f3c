"""Untrusted bytes: paths from metadata stay inside what the user named, savepoints are verified,
and dispose deletes exactly a savepoint's own files (issue 8's findings, one test each)."""

from __future__ import annotations

import io
import json
import os
import signal
import socket
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest

from statectl.savepoints.create import take_savepoint
from statectl.savepoints.format import seal
from tests.helpers.cli import run_cli
from tests.helpers.fixtures import FIXTURES


def assert_refused(proc: subprocess.CompletedProcess, *needles: str) -> None:
    assert proc.returncode == 2, proc.stderr + proc.stdout
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("statectl: error: "), proc.stderr
    for n in needles:
        assert n in lines[0], lines[0]


def rewrite_zip_metadata(zip_path: Path, edit) -> None:
    with zipfile.ZipFile(zip_path) as z:
        members = {n: z.read(n) for n in z.namelist()}
    head, _, body = members["metadata"].decode().partition("\n")
    meta = json.loads(body)
    edit(meta)
    members["metadata"] = (head + "\n" + json.dumps(meta)).encode()
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        for n, data in members.items():
            z.writestr(n, data)
    zip_path.write_bytes(buf.getvalue())
    crc = zip_path.parent / f".{zip_path.name}.crc"
    crc.unlink(missing_ok=True)  # a stale Hadoop sidecar would be caught first


# -- paths from a RocksDB zip --------------------------------------------------------------


@pytest.mark.parametrize("field", ["localFileName", "dfsSstFileName"])
def test_rocksdb_zip_paths_cannot_leave_the_checkpoint(fixture_copy, tmp_path, field):
    ckpt = fixture_copy("agg-rocksdb")
    outside = tmp_path / "outside"
    outside.mkdir()
    target = outside / "x.sh"
    if field == "dfsSstFileName":
        target.write_bytes(b"not an sst")
    for z in (ckpt / "state/0/0").glob("*.zip"):
        crafted = "../" * 12 + str(target).lstrip("/")
        rewrite_zip_metadata(z, lambda m, c=crafted: m["sstFiles"][0].__setitem__(field, c))
    before = target.read_bytes() if target.exists() else None
    for cmd in (["inspect", str(ckpt)], ["export", str(ckpt), "-o", str(tmp_path / "o.parquet")]):
        assert_refused(run_cli(*cmd), "outside its directory")
    after = target.read_bytes() if target.exists() else None
    assert after == before  # nothing written (localFileName) or read-and-used (dfsSstFileName)
    assert sorted(p.name for p in outside.iterdir()) == (["x.sh"] if before else [])


def test_zip_metadata_of_the_wrong_type_is_a_clean_error(fixture_copy, tmp_path):
    ckpt = fixture_copy("agg-rocksdb")
    for z in (ckpt / "state/0/0").glob("*.zip"):
        rewrite_zip_metadata(z, lambda m: m.__setitem__("sstFiles", [17]))
    assert_refused(run_cli("export", str(ckpt), "-o", str(tmp_path / "o.parquet")), "metadata")


def test_schema_path_outside_the_checkpoint_is_refused(fixture_copy, tmp_path):
    ckpt = fixture_copy("tws-rocksdb")
    meta = ckpt / "state/0/_metadata/v2/0"
    head, _, body = meta.read_text().partition("\n")
    obj = json.loads(body)
    obj["stateStoreInfo"][0]["stateSchemaFilePaths"] = ["file:/etc/passwd"]
    meta.write_text(head + "\n" + json.dumps(obj))
    (meta.parent / ".0.crc").unlink(missing_ok=True)
    assert_refused(run_cli("inspect", str(ckpt)), "schema file path")


# -- savepoints: confined and verified -------------------------------------------------------


@pytest.fixture
def canonical(tmp_path) -> Path:
    url, _ = take_savepoint(str(FIXTURES / "agg-hdfs"), str(tmp_path / "sps"))
    return Path(url.removeprefix("file://"))


def edit_metadata(sp: Path, edit) -> None:
    meta = json.loads((sp / "_metadata").read_text())
    edit(meta)
    (sp / "_metadata").write_text(json.dumps(seal(meta)))  # crafted: sealed again


def first_file(meta: dict) -> dict:
    return meta["operators"][0]["tables"][0]["files"][0]


def export(sp: Path, tmp_path: Path) -> subprocess.CompletedProcess:
    return run_cli("export", str(sp), "--operator", "0", "-o", str(tmp_path / "out.parquet"))


def test_intact_savepoint_exports(canonical, tmp_path):
    assert export(canonical, tmp_path).returncode == 0


@pytest.mark.parametrize(
    ("edit", "needle"),
    [
        (lambda m: first_file(m).__setitem__("path", "/etc/passwd"), "outside"),
        (lambda m: first_file(m).__setitem__("path", "../../outside.parquet"), "outside"),
        (lambda m: first_file(m).__setitem__("sha256", "0" * 64), "sha256"),
        (lambda m: first_file(m).__setitem__("bytes", 12), "bytes"),
        (lambda m: first_file(m).__setitem__("rows", first_file(m)["rows"] + 1), "rows"),
        (lambda m: m["operators"][0]["tables"][0]["files"].pop(), "data files"),
        (lambda m: m["operators"][0].__setitem__("operator_id", "../../x"), "operator_id"),
        (lambda m: m["operators"][0]["tables"][0].__setitem__("files", "abc"), "files"),
        (lambda m: m.__setitem__("operators", {"a": 1}), "operators"),
        (lambda m: m["operators"][0]["tables"][0].__setitem__("key_schema", "{"), "schema"),
    ],
)
def test_crafted_savepoint_metadata_is_refused(canonical, tmp_path, edit, needle):
    edit_metadata(canonical, edit)
    assert_refused(export(canonical, tmp_path), needle)


def test_a_changed_data_file_is_detected(canonical, tmp_path):
    part = next((canonical / "operators").rglob("part-00000.parquet"))
    data = bytearray(part.read_bytes())
    data[len(data) // 2] ^= 0x01
    part.write_bytes(bytes(data))
    assert_refused(export(canonical, tmp_path), "sha256")


def test_a_symlinked_data_file_is_not_followed(canonical, tmp_path):
    part = next((canonical / "operators").rglob("part-00000.parquet"))
    elsewhere = tmp_path / "elsewhere.parquet"
    elsewhere.write_bytes(part.read_bytes())
    part.unlink()
    part.symlink_to(elsewhere)
    assert_refused(export(canonical, tmp_path), "symbolic link")


def test_list_survives_a_malformed_savepoint(canonical, tmp_path):
    bad = canonical.parent / "savepoint-bad"
    bad.mkdir()
    (bad / "_metadata").write_text(
        '{"format": "statectl-savepoint", "format_version": 1, "operators": 5}'
    )
    proc = run_cli("list", str(canonical.parent), "--json")
    assert proc.returncode == 0, proc.stderr
    health = {Path(e["path"]).name: e["health"] for e in json.loads(proc.stdout)}
    assert health[canonical.name] == "ok" and health["savepoint-bad"] != "ok"


def test_savepoint_into_its_own_checkpoint_is_refused(fixture_copy):
    ckpt = fixture_copy("agg-hdfs")
    before = sorted(p.name for p in ckpt.iterdir())
    assert_refused(run_cli("savepoint", str(ckpt), str(ckpt)), "inside the checkpoint")
    assert_refused(run_cli("savepoint", str(ckpt), str(ckpt / "sp")), "inside the checkpoint")
    assert sorted(p.name for p in ckpt.iterdir()) == before


# -- dispose ---------------------------------------------------------------------------------


def test_dispose_refuses_a_copied_metadata_in_a_user_directory(canonical, tmp_path):
    project = tmp_path / "project"
    (project / "src").mkdir(parents=True)
    (project / "src/main.py").write_text("print('hi')\n")
    (project / "_metadata").write_bytes((canonical / "_metadata").read_bytes())
    assert_refused(run_cli("dispose", str(project), "--yes"))
    assert (project / "src/main.py").exists() and (project / "_metadata").exists()


def test_dispose_refuses_user_files_and_force_keeps_them(canonical):
    notes = canonical / "operators" / "notes.txt"
    notes.write_text("mine")
    assert_refused(run_cli("dispose", str(canonical), "--yes"), "--force", "notes.txt")
    assert (canonical / "_metadata").exists()
    proc = run_cli("dispose", str(canonical), "--yes", "--force", "--json")
    assert proc.returncode == 0, proc.stderr
    assert notes.read_text() == "mine"
    assert not (canonical / "_metadata").exists()
    assert [p for p in canonical.rglob("*") if p.is_file()] == [notes]


def test_dispose_never_deletes_a_checkpoint_restored_inside_it(canonical):
    live = canonical / "live"
    for name in ("offsets", "commits", "state/0/0"):
        (live / name).mkdir(parents=True)
    (live / "offsets" / "0").write_text("v1\n{}\n")
    assert_refused(run_cli("dispose", str(canonical), "--yes"), "not part of the savepoint")
    assert run_cli("dispose", str(canonical), "--yes", "--force").returncode == 0
    assert (live / "offsets" / "0").exists()


def test_dispose_refuses_symlinks_dot_forms_and_the_current_directory(canonical, tmp_path):
    link = tmp_path / "link"
    link.symlink_to(canonical)
    assert_refused(run_cli("dispose", str(link), "--yes"), "symbolic link")
    assert_refused(run_cli("dispose", ".", "--yes", cwd=canonical), "'.'")
    assert_refused(run_cli("dispose", str(canonical / "operators" / ".."), "--yes"), "'..'")
    assert_refused(
        run_cli("dispose", str(canonical), "--yes", cwd=canonical / "operators"),
        "current directory",
    )
    assert (canonical / "_metadata").exists()
    proc = run_cli("dispose", str(canonical), "--yes")
    assert proc.returncode == 0, proc.stderr
    assert not canonical.exists() and link.is_symlink()


# -- interrupted savepoints: workers die with the parent, SIGTERM cleans up ------------------

SLOW_SAVEPOINT = """
import os, sys, time
import statectl.savepoints.create as c
orig = c.write_table
def slow(*a, **k):
    open(os.path.join({pids!r}, str(os.getpid())), "w").close()
    time.sleep(60)
    return orig(*a, **k)
c.write_table = slow
sys.argv = ["statectl", "savepoint", {ckpt!r}, {target!r}]
from statectl.cli import main
main()
"""


def _start_slow_savepoint(tmp_path: Path) -> tuple[subprocess.Popen, Path, Path]:
    pids, target = tmp_path / "pids", tmp_path / "sp"
    pids.mkdir()
    code = SLOW_SAVEPOINT.format(
        pids=str(pids), ckpt=str(FIXTURES / "join-hdfs"), target=str(target)
    )
    env = {**os.environ, "STATECTL_WORKERS": "2"}
    proc = subprocess.Popen(
        [sys.executable, "-c", code], env=env, stderr=subprocess.PIPE, text=True
    )
    deadline = time.monotonic() + 60
    while len(list(pids.iterdir())) < 2:
        assert time.monotonic() < deadline, "workers never started"
        time.sleep(0.1)
    return proc, pids, target


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as f:  # a zombie is dead
        return f.read().split()[2] != "Z"


def _wait_dead(pids: list[int], seconds: float = 10) -> bool:
    deadline = time.monotonic() + seconds
    while any(_alive(p) for p in pids):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


def test_workers_die_with_a_killed_parent(tmp_path):
    proc, pids, _ = _start_slow_savepoint(tmp_path)
    workers = [int(p.name) for p in pids.iterdir()]
    proc.send_signal(signal.SIGKILL)
    proc.wait(10)
    assert _wait_dead(workers), "worker processes outlived their killed parent"


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_sigterm_and_ctrl_c_remove_the_partial_savepoint(tmp_path, sig):
    proc, pids, target = _start_slow_savepoint(tmp_path)
    workers = [int(p.name) for p in pids.iterdir()]
    proc.send_signal(sig)
    _, stderr = proc.communicate(timeout=30)
    assert proc.returncode in (128 + sig, 130), stderr
    assert "Traceback" not in stderr
    assert _wait_dead(workers)
    assert not target.exists() or not any(target.iterdir()), list(target.rglob("*"))


# -- storage errors are one line too ----------------------------------------------------------


def _cli_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env.update(extra)
    return env


def test_unreachable_endpoint_is_one_line(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # nothing listens there once closed
    env = _cli_env(
        AWS_ACCESS_KEY_ID="x",
        AWS_SECRET_ACCESS_KEY="y",
        AWS_ENDPOINT_URL=f"http://127.0.0.1:{port}",
        AWS_MAX_ATTEMPTS="1",
        HOME=str(tmp_path),
    )
    assert_refused(run_cli("inspect", "s3://lake/ckpt", env=env), "storage")


def test_missing_credentials_is_one_line(s3_endpoint, tmp_path):
    env = _cli_env(AWS_ENDPOINT_URL=s3_endpoint["AWS_ENDPOINT_URL"], HOME=str(tmp_path))
    proc = run_cli("inspect", "s3://statectl-test/ckpts/agg-hdfs", env=env)
    assert_refused(proc, "credentials")


def test_dispose_refuses_a_bucket_root(s3_endpoint):
    import s3fs

    s3fs.S3FileSystem.clear_instance_cache()  # earlier modules cached other endpoints
    fs = s3fs.S3FileSystem(client_kwargs={"endpoint_url": s3_endpoint["AWS_ENDPOINT_URL"]})
    if not fs.exists("statectl-trust"):  # moto keeps buckets across servers in one process
        fs.mkdir("statectl-trust")
    url, _ = take_savepoint(str(FIXTURES / "agg-hdfs"), "s3://statectl-trust/root-sp")
    fs.pipe("statectl-trust/_metadata", fs.cat(url.removeprefix("s3://") + "/_metadata"))
    env = {**os.environ, **s3_endpoint}
    assert_refused(run_cli("dispose", "s3://statectl-trust", "--yes", env=env), "bucket root")
    assert fs.exists("statectl-trust/_metadata")
    proc = run_cli("dispose", url, "--yes", env=env)
    assert proc.returncode == 0, proc.stderr
    fs.invalidate_cache()
    assert not fs.exists(url.removeprefix("s3://") + "/_metadata")

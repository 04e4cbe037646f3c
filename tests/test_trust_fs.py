"""Issue 26, the filesystem findings: symbolic links out of a checkpoint (2), FIFOs and devices
where a file is expected (3), a dispose that cannot delete everything (7) and a full target or
scratch filesystem (9). Each is met as a user meets it: the CLI in a subprocess, time-limited so
that a regression that blocks fails instead of hanging the suite.

Items 7 and 9 need what only a kernel gives: a directory that cannot be removed (a mount point)
and a filesystem that is really full (a small tmpfs). Both are made in a private mount namespace
(``unshare --user --map-root-user --mount``), so nothing is mounted outside the test's process;
where namespaces are not allowed those tests skip.
"""

from __future__ import annotations

import json
import os
import resource
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from statectl.savepoints.create import take_savepoint
from tests.helpers.fixtures import FIXTURES, ROOT

# Every command here takes a few seconds; one that blocks on a FIFO never ends.
TIMEOUT = 60


def statectl(
    *args: str,
    prefix: tuple[str, ...] = (),
    env: dict[str, str] | None = None,
    limit: Callable[[], None] | None = None,
) -> subprocess.CompletedProcess:
    """``statectl ARGS`` in a fresh process (after ``prefix``, e.g. a namespace shell)."""
    return subprocess.run(
        [*prefix, sys.executable, "-m", "statectl.cli", *args],
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})},
        preexec_fn=limit,
    )


def assert_refused(proc: subprocess.CompletedProcess, *needles: str) -> str:
    """Exit 2, one ``statectl: error:`` line holding every needle; the line."""
    assert proc.returncode == 2, proc.stderr + proc.stdout
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("statectl: error: "), proc.stderr
    for n in needles:
        assert n in lines[0], lines[0]
    return lines[0]


def export(ckpt: Path, out: Path, *extra: str) -> subprocess.CompletedProcess:
    return statectl("export", str(ckpt), "--operator", "0", "-o", str(out), *extra)


def newest_sst(ckpt: Path) -> str:
    return "state/0/0/SSTs/" + sorted(p.name for p in (ckpt / "state/0/0/SSTs").iterdir())[-1]


# -- 2. symbolic links out of a checkpoint ------------------------------------------------------
# (fixture, file, command): every kind of file the reader opens.
LINKED = [
    ("agg-hdfs", "state/0/0/3.delta", "export"),
    ("agg-hdfs", "offsets/3", "inspect"),
    ("agg-rocksdb-changelog", "state/0/0/4.changelog", "export"),
    ("agg-rocksdb", "sst", "export"),
]


def _command(cmd: str, ckpt: Path, tmp_path: Path) -> subprocess.CompletedProcess:
    if cmd == "export":
        return export(ckpt, tmp_path / "out.jsonl")
    return statectl("inspect", str(ckpt))


@pytest.mark.parametrize(("name", "rel", "cmd"), LINKED)
def test_a_file_linked_out_of_the_checkpoint_is_refused(fixture_copy, tmp_path, name, rel, cmd):
    ckpt = fixture_copy(name)
    rel = newest_sst(ckpt) if rel == "sst" else rel
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    shutil.move(ckpt / rel, elsewhere / "moved")
    (ckpt / rel).symlink_to(elsewhere / "moved")  # same bytes, checksums still match
    # (An SST named by a zip was refused already, by the zip's own path check.)
    needle = Path(rel).name if "SSTs" in rel else rel
    line = assert_refused(_command(cmd, ckpt, tmp_path), needle, "symbolic link", "outside")
    assert "Traceback" not in line and not (tmp_path / "out.jsonl").exists()


def test_a_link_to_dev_zero_is_refused_at_once(fixture_copy, tmp_path):
    ckpt = fixture_copy("agg-hdfs")
    (ckpt / "state/0/0/3.delta").unlink()
    (ckpt / "state/0/0/3.delta").symlink_to("/dev/zero")

    def bounded_memory() -> None:  # before: read until memory ran out; keep the machine safe
        resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30))

    proc = statectl("export", str(ckpt), "-o", str(tmp_path / "o.jsonl"), limit=bounded_memory)
    assert_refused(proc, "state/0/0/3.delta", "/dev/zero")


def test_a_savepoint_metadata_linked_out_is_refused(savepoint, tmp_path):
    elsewhere = tmp_path / "elsewhere-metadata"
    shutil.move(savepoint / "_metadata", elsewhere)
    (savepoint / "_metadata").symlink_to(elsewhere)
    assert_refused(statectl("inspect", str(savepoint)), "_metadata", "outside")


def test_links_that_stay_inside_are_followed(fixture_copy, tmp_path):
    """The chosen rule: a link to a regular file inside the checkpoint is read like the file."""
    ckpt = fixture_copy("agg-hdfs")
    (ckpt / "moved").mkdir()
    for name in ("3.delta", ".3.delta.crc"):
        shutil.move(ckpt / "state/0/0" / name, ckpt / "moved" / name)
        (ckpt / "state/0/0" / name).symlink_to(Path("../../../moved") / name)
    assert export(ckpt, tmp_path / "linked.jsonl").returncode == 0
    assert export(FIXTURES / "agg-hdfs", tmp_path / "plain.jsonl").returncode == 0
    linked = (tmp_path / "linked.jsonl").read_text()
    assert linked and linked == (tmp_path / "plain.jsonl").read_text()


# -- 3. FIFOs where a file is expected ----------------------------------------------------------
FIFOS = [
    ("agg-hdfs", "metadata", "inspect"),
    ("agg-hdfs", "offsets/3", "inspect"),
    ("agg-hdfs", "commits/3", "inspect"),
    ("agg-hdfs", "state/0/0/3.delta", "export"),
    ("agg-hdfs", "state/0/0/.3.delta.crc", "export"),  # a checksum sidecar
    ("agg-snapshots-hdfs", "state/0/0/12.snapshot", "export"),
    ("agg-rocksdb", "state/0/0/4.zip", "export"),
    ("agg-rocksdb", "sst", "export"),
    ("agg-rocksdb-changelog", "state/0/0/4.changelog", "export"),
]


@pytest.mark.parametrize(("name", "rel", "cmd"), FIFOS)
def test_a_fifo_in_a_checkpoint_is_refused_without_blocking(fixture_copy, tmp_path, name, rel, cmd):
    ckpt = fixture_copy(name)
    rel = newest_sst(ckpt) if rel == "sst" else rel
    (ckpt / rel).unlink()
    os.mkfifo(ckpt / rel)
    assert_refused(_command(cmd, ckpt, tmp_path), rel, "FIFO")


@pytest.fixture(scope="module")
def savepoint_master(tmp_path_factory) -> Path:
    url, _ = take_savepoint(str(FIXTURES / "agg-hdfs"), str(tmp_path_factory.mktemp("sps")))
    return Path(url.removeprefix("file://"))


@pytest.fixture
def savepoint(savepoint_master, tmp_path) -> Path:
    """A fresh copy of an intact savepoint of agg-hdfs, in its own ``sps`` directory."""
    dst = tmp_path / "sps" / savepoint_master.name
    shutil.copytree(savepoint_master, dst)
    return dst


def data_files(sp: Path) -> list[Path]:
    return sorted((sp / "operators").rglob("*.parquet"))


@pytest.mark.parametrize("cmd", ["inspect", "export", "dispose"])
def test_a_fifo_savepoint_metadata_is_refused_without_blocking(savepoint, tmp_path, cmd):
    (savepoint / "_metadata").unlink()
    os.mkfifo(savepoint / "_metadata")
    args = {
        "inspect": ["inspect", str(savepoint)],
        "export": ["export", str(savepoint), "--operator", "0", "-o", str(tmp_path / "o.jsonl")],
        "dispose": ["dispose", str(savepoint), "--yes"],
    }[cmd]
    assert_refused(statectl(*args), "_metadata", "FIFO")
    assert len(data_files(savepoint)) == 2  # dispose deleted nothing


def test_a_fifo_savepoint_data_file_is_refused_without_blocking(savepoint, tmp_path):
    part = data_files(savepoint)[0]
    part.unlink()
    os.mkfifo(part)
    assert_refused(export(savepoint, tmp_path / "o.jsonl"), part.name, "FIFO")


def test_list_reports_a_fifo_metadata_and_goes_on(savepoint):
    bad = savepoint.parent / "savepoint-fifo"
    bad.mkdir()
    os.mkfifo(bad / "_metadata")
    proc = statectl("list", str(savepoint.parent), "--json")
    assert proc.returncode == 0, proc.stderr
    entries = {Path(e["path"]).name: e for e in json.loads(proc.stdout)}
    assert entries[savepoint.name]["health"] == "ok"
    assert entries["savepoint-fifo"]["health"] != "ok"
    assert any("FIFO" in p for p in entries["savepoint-fifo"]["problems"])


# -- private mount namespaces (items 7 and 9) ---------------------------------------------------
NAMESPACE = ("unshare", "--user", "--map-root-user", "--mount")


def _namespaces_work() -> bool:
    if shutil.which("unshare") is None:
        return False
    try:
        probe = subprocess.run([*NAMESPACE, "true"], capture_output=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return probe.returncode == 0


needs_namespaces = pytest.mark.skipif(
    not _namespaces_work(), reason="unprivileged mount namespaces are not available here"
)


def in_namespace(setup: str) -> tuple[str, ...]:
    """A prefix running ``setup`` (shell) in a private mount namespace, then the command."""
    return (*NAMESPACE, "sh", "-euc", f'{setup}\nexec "$@"', "sh")


# -- 7. dispose that cannot delete everything -----------------------------------------------------
@needs_namespaces
@pytest.mark.parametrize("how", ["busy", "read-only"])
def test_dispose_reports_what_it_cannot_delete_and_a_retry_finishes(savepoint, how):
    """``busy``: the table directory is a mount point (its files deletable, the directory not);
    ``read-only``: nothing in it can be deleted. Both outlive only the first command."""
    table = data_files(savepoint)[0].parent
    ro = f"\nmount -o remount,bind,ro '{table}' '{table}'" if how == "read-only" else ""
    proc = statectl(
        "dispose",
        str(savepoint),
        "--yes",
        prefix=in_namespace(f"mount --bind '{table}' '{table}'{ro}"),
    )
    rel = str(table.relative_to(savepoint))
    assert_refused(proc, "could not delete", rel, "_metadata is kept")
    assert "Deleted" not in proc.stdout
    assert (savepoint / "_metadata").is_file()
    assert len(data_files(savepoint)) == (2 if how == "read-only" else 0)
    retry = statectl("dispose", str(savepoint), "--yes")  # the mount is gone with its namespace
    assert retry.returncode == 0, retry.stderr
    assert not savepoint.exists()


# -- 9. a full filesystem ---------------------------------------------------------------------------
def full_tmpfs(directory: Path) -> str:
    """Shell: mount a 64 KiB tmpfs on ``directory`` and fill it up."""
    return (
        f"mount -t tmpfs -o size=64k tmpfs '{directory}'\n"
        f"cat /dev/zero > '{directory}/filler' 2>/dev/null || true"
    )


@needs_namespaces
@pytest.mark.parametrize("cmd", ["export", "savepoint", "restore"])
def test_a_full_target_is_named(savepoint, tmp_path, cmd):
    full = tmp_path / "full"
    full.mkdir()
    target = full / ("out.jsonl" if cmd == "export" else "target")
    args = {
        "export": ["export", str(FIXTURES / "agg-hdfs"), "--operator", "0", "-o", str(target)],
        "savepoint": ["savepoint", str(FIXTURES / "agg-hdfs"), str(target)],
        "restore": ["restore", "-s", str(savepoint), str(target), "--backend", "rocksdb"],
    }[cmd]
    line = assert_refused(statectl(*args, prefix=in_namespace(full_tmpfs(full))), str(target))
    assert "statectl-" not in line and "No space left on device" in line


@needs_namespaces
def test_full_scratch_space_is_named(tmp_path):
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    env = {"STATECTL_TMPDIR": str(scratch), "TMPDIR": str(scratch)}
    proc = statectl(
        "export",
        str(FIXTURES / "agg-hdfs"),
        "--operator",
        "0",
        "-o",
        str(tmp_path / "out.parquet"),
        prefix=in_namespace(full_tmpfs(scratch)),
        env=env,
    )
    line = assert_refused(proc, f"{scratch}: cannot write statectl's scratch files here")
    assert "STATECTL_TMPDIR" in line and "statectl-spill" not in line
    assert not (tmp_path / "out.parquet").exists()

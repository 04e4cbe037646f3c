"""``statectl doctor`` on real Spark-written checkpoints damaged the ways users damage them
(copies of the fixtures; the fixtures themselves are never touched): the problem named, the
batches each store can be rebuilt at, the last recoverable batch, and the recovery command,
run as printed."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest
from typer.testing import CliRunner

from statectl.backends import get_backend
from statectl.backends.base import ReadOptions
from statectl.cli import app
from statectl.diagnosis import diagnose, spans
from statectl.in_progress import marker_bytes
from tests.helpers.cli import assert_one_line_error, run


def _doctor(path, rc: int) -> dict:
    """``statectl doctor PATH --json`` in this process (Typer's runner: no interpreter start)."""
    result = CliRunner().invoke(app, ["doctor", str(path), "--json"])
    assert result.exit_code == rc, result.output
    return json.loads(result.stdout)


def _messages(doc: dict) -> str:
    return "\n".join(p["message"] for p in doc["problems"])


def _store(doc: dict, op: int, partition: int) -> dict:
    return next(s for s in doc["stores"] if (s["operator"], s["partition"]) == (op, partition))


def _run_recovery(command: str) -> None:
    """The recovery command exactly as doctor printed it (``statectl`` is this tree's CLI)."""
    args = shlex.split(command)
    assert args[0] == "statectl"
    result = CliRunner().invoke(app, args[1:])
    assert result.exit_code == 0, result.output


@pytest.mark.parametrize(
    "name", ["agg-hdfs", "agg-rocksdb", "agg-ckptv2-rocksdb-changelog", "join-rocksdb-changelog"]
)
def test_healthy_checkpoints_exit_0(name):
    from tests.helpers.fixtures import FIXTURES

    doc = _doctor(FIXTURES / name, 0)
    assert doc["healthy"] and not doc["problems"] and not doc["recovery"]
    assert doc["last_recoverable_batch"] == doc["latest_committed_batch"] is not None
    assert all(s["rebuildable_batches"] for s in doc["stores"])


def test_deleted_delta_in_the_middle_of_a_chain(fixture_copy):
    ck = fixture_copy("agg-hdfs")
    (ck / "state/0/0/2.delta").unlink()  # .2.delta.crc stays, as `rm` leaves it
    doc = _doctor(ck, 1)
    assert "2.delta" in _messages(doc) and doc["last_recoverable_batch"] == 0
    assert _store(doc, 0, 0)["rebuildable_batches"] == "0"
    assert _store(doc, 0, 1)["rebuildable_batches"] == "0-3"
    assert doc["lost_batches"] == "1-3"
    assert doc["recovery"] == [
        f"statectl migrate file://{ck} file://{ck}-recovered-0 --batch 0",
    ]
    _run_recovery(doc["recovery"][0])
    healed = _doctor(f"{ck}-recovered-0", 0)
    assert healed["latest_committed_batch"] == healed["last_recoverable_batch"] == 0
    assert (ck / "state/0/0/.2.delta.crc").exists()  # the damaged checkpoint is left as it was


def test_truncated_latest_snapshot(fixture_copy):
    ck = fixture_copy("agg-snapshots-hdfs")
    snap = ck / "state/0/1/12.snapshot"
    snap.write_bytes(snap.read_bytes()[:-7])
    diag = diagnose(str(ck))
    assert diag.latest_committed_batch == 11 and diag.last_recoverable_batch == 10
    assert any("12.snapshot" in p.message and p.blocking for p in diag.problems)
    p1 = next(s for s in diag.stores if s.partition == 1)
    assert spans(p1.rebuildable) == "0-10"
    assert diag.recovery and diag.recovery[0].endswith("--batch 10")


def test_missing_commit_in_the_middle_and_at_the_end(fixture_copy):
    ck = fixture_copy("agg-hdfs")
    (ck / "commits/1").unlink()
    (ck / "commits/.1.crc").unlink()
    diag = diagnose(str(ck))
    assert diag.exit_code == 1 and diag.last_recoverable_batch == 3
    assert any("offsets without a commit: 1" in p.message for p in diag.problems)
    assert not any(p.blocking for p in diag.problems) and not diag.recovery
    (ck / "commits/3").unlink()  # its .3.crc stays: the entry was deleted, not never written
    diag = diagnose(str(ck))
    assert diag.latest_committed_batch == diag.last_recoverable_batch == 2
    assert any("commits/3: deleted" in p.message for p in diag.problems)
    assert "batch 3 is not committed: Spark re-runs it on restart" in diag.notes


def test_newest_commit_without_offsets_recovers_as_printed(fixture_copy):
    ck = fixture_copy("agg-rocksdb")
    (ck / "offsets/3").unlink()
    (ck / "offsets/.3.crc").unlink()
    doc = _doctor(ck, 1)
    assert "commits without offsets: 3" in _messages(doc)
    assert doc["last_recoverable_batch"] == 2 and doc["lost_batches"] == "3"
    assert doc["recovery"][-1].endswith("--batch 2")
    _run_recovery(doc["recovery"][-1])
    assert _doctor(f"{ck}-recovered-2", 0)["latest_committed_batch"] == 2


def test_missing_and_damaged_metadata(fixture_copy):
    ck = fixture_copy("agg-hdfs")
    (ck / "metadata").unlink()
    (ck / ".metadata.crc").unlink()
    diag = diagnose(str(ck))
    assert [p.kind for p in diag.problems] == ["metadata"]
    assert "new query id" in diag.problems[0].message and not diag.problems[0].blocking
    assert diag.last_recoverable_batch == 3 and not diag.recovery
    (ck / "state/0/1/4.delta").unlink()  # and the latest state: migrate, then drop its null id
    diag = diagnose(str(ck))
    assert diag.recovery[-1] == f"rm -- {ck}-recovered-2/metadata"
    _run_recovery(diag.recovery[0])
    (ck.parent / f"{ck.name}-recovered-2" / "metadata").unlink()
    assert diagnose(f"{ck}-recovered-2").last_recoverable_batch == 2
    (ck / "metadata").write_text('{"id": 42')
    diag = diagnose(str(ck))
    assert diag.problems[0].blocking and "metadata" in diag.recovery[0]


def test_corrupted_sst(fixture_copy):
    ck = fixture_copy("agg-rocksdb")
    d = ck / "state/0/1"
    backend = get_backend("rocksdb")
    newest = backend.copy_files(backend_io(), str(d), 4, ReadOptions())
    sst = next(p for p in newest if p.endswith(".sst") and not p.endswith(".crc"))
    data = bytearray(Path(sst).read_bytes())
    data[len(data) // 2] ^= 0xFF
    Path(sst).write_bytes(bytes(data))
    # The batches whose zip names that SST cannot be rebuilt; the newest other one can.
    using = {
        v - 1
        for v in range(1, 5)
        if sst in backend.copy_files(backend_io(), str(d), v, ReadOptions())
    }
    diag = diagnose(str(ck))
    p1 = next(s for s in diag.stores if s.partition == 1)
    assert set(p1.rebuildable) == {0, 1, 2, 3} - using
    assert diag.last_recoverable_batch == max({0, 1, 2, 3} - using, default=None)
    assert any(sst.rsplit("/", 1)[1] in p for p in p1.problems)


def backend_io():
    from statectl.io import FileIO

    return FileIO.for_url("/")[0]


def test_deleted_changelog(fixture_copy):
    ck = fixture_copy("agg-rocksdb-changelog")
    (ck / "state/0/1/2.changelog").unlink()
    diag = diagnose(str(ck))
    assert diag.last_recoverable_batch == 0 and diag.lost_batches == [1, 2, 3]
    assert any("2.changelog" in p.message for p in diag.problems)
    # A changelog only an old version needs: the latest batch still restarts.
    ck2 = fixture_copy("agg-snapshots-rocksdb-changelog")
    (ck2 / "state/0/0/11.changelog").unlink()
    diag = diagnose(str(ck2))
    p0 = next(s for s in diag.stores if s.partition == 0)
    assert spans(p0.rebuildable) == "0-9,11" and diag.last_recoverable_batch == 11
    assert not any(p.blocking for p in diag.problems)
    assert any("rebuilt at logged batches 10 " in n for n in diag.notes)


def test_gap_in_the_logs(fixture_copy):
    ck = fixture_copy("agg-hdfs")
    for log in ("offsets", "commits"):
        (ck / log / "1").unlink()
        (ck / log / ".1.crc").unlink()
    diag = diagnose(str(ck))
    assert sum("gap in the log: no entry for 1" in p.message for p in diag.problems) == 2
    assert diag.last_recoverable_batch == 3


def test_leftovers(fixture_copy, tmp_path):
    ck = fixture_copy("agg-hdfs")
    (ck / "state/0/0/.5.delta.0b8e1c4e-6d4c-4c1e-9d0e-0c1b2a3f4e5d.tmp").write_bytes(b"x")
    diag = diagnose(str(ck))
    assert [p.kind for p in diag.problems] == ["leftover"] and diag.last_recoverable_batch == 3
    target = tmp_path / "half"
    target.mkdir()
    (target / "metadata").write_bytes(marker_bytes("migrate", str(ck), str(target)))
    doc = _doctor(target, 1)
    assert "in progress or interrupted" in _messages(doc)
    assert doc["recovery"] == [f"statectl migrate {ck} {target} --overwrite"]


def test_unreadable_is_exit_2(tmp_path):
    (tmp_path / "empty").mkdir()
    assert_one_line_error(run("doctor", str(tmp_path / "empty"), check_rc=None), "checkpoint")


def test_human_output_names_the_problem_and_the_command(fixture_copy):
    ck = fixture_copy("agg-hdfs")
    (ck / "state/0/1/3.delta").unlink()
    out = run("doctor", str(ck), check_rc=1).stdout
    assert "problems found" in out and "3.delta" in out
    assert "last recoverable batch: 1" in out and "lost: batches 2-3" in out
    assert f"recover: statectl migrate file://{ck} file://{ck}-recovered-1 --batch 1" in out


def test_api_doctor_is_the_json(fixture_copy, tmp_path):
    """``statectl.doctor()`` returns what ``doctor --json`` prints, healthy or not; a path that
    is no checkpoint raises the error the command exits 2 with."""
    import statectl
    from statectl.errors import StatectlError

    ck = fixture_copy("agg-hdfs")
    assert statectl.doctor(ck).to_dict() == _doctor(ck, 0)
    (ck / "state/0/0/2.delta").unlink()
    diag = statectl.doctor(ck)
    assert diag.exit_code == 1 and diag.last_recoverable_batch == 0
    assert diag.to_dict() == _doctor(ck, 1)
    (tmp_path / "empty").mkdir()
    with pytest.raises(StatectlError):
        statectl.doctor(tmp_path / "empty")

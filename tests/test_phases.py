"""statectl/codecs/phases.py: the phase timers bench/scale.py reads (issue 27)."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from statectl.codecs import phases
from statectl.engine import iter_tasks


def _lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_phases_are_off_without_the_variable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(phases.ENV, raising=False)
    with phases.phase("read"):
        pass
    phases.flush()
    assert list(tmp_path.iterdir()) == []
    assert phases._totals == {}


def test_nested_phases_are_exclusive_and_flushed_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "p.jsonl"
    monkeypatch.setenv(phases.ENV, str(out))
    with phases.phase("outer"), phases.phase("inner"):
        time.sleep(0.2)  # all of it inside the inner phase
    assert list(phases.timed(iter([1, 2]), "gen")) == [1, 2]
    phases.flush()
    phases.flush()  # nothing new: no second line
    (line,) = _lines(out)
    assert line["pid"] == os.getpid()
    got = line["phases"]
    assert set(got) == {"outer", "inner", "gen"}
    assert got["outer"][2] == 1 and got["inner"][2] == 1 and got["gen"][2] == 3
    # exclusive: the sleep is the inner phase's, not also the outer one's
    assert got["inner"][1] >= 0.2 > got["outer"][1]
    assert all(v[0] >= 0 for v in got.values())


def test_workers_flush_their_own_phases(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    out = tmp_path / "p.jsonl"
    monkeypatch.setenv(phases.ENV, str(out))
    with phases.phase("parent"):
        results = list(iter_tasks([_work, _work, _work], 2, threads=False))
    phases.flush()
    assert results == [7, 7, 7]
    lines = _lines(out)
    by_pid: dict[int, list[str]] = {}
    for line in lines:
        by_pid.setdefault(line["pid"], []).extend(line["phases"])
    workers = [p for p in by_pid if p != os.getpid()]
    assert workers and all(by_pid[p] == ["task"] * len(by_pid[p]) for p in workers)
    tasks = sum(line["phases"]["task"][2] for line in lines if "task" in line["phases"])
    assert tasks == 3  # each task counted once, in the worker that ran it
    assert "parent" in by_pid[os.getpid()]  # the parent's phase is not copied into a worker


def _work() -> int:
    with phases.phase("task"):
        return 7

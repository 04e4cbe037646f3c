"""statectl/checkpoint/writers.py against every fixture's files: parse with the parsers
(statectl/checkpoint/logs.py, state_metadata.py), write back, and get Spark's bytes (or, where
Spark's bytes are not what the writer makes, the same parse)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from statectl.checkpoint.logs import (
    batch_id_of,
    parse_commit,
    parse_offset_seq,
    parse_stream_metadata,
)
from statectl.checkpoint.state_metadata import parse_operator_metadata
from statectl.checkpoint.writers import (
    commit_bytes,
    offset_seq_bytes,
    operator_metadata_bytes,
    stream_metadata_bytes,
)
from tests.helpers.fixtures import FIXTURES

CHECKPOINTS = sorted(p for p in FIXTURES.iterdir() if (p / "offsets").is_dir())


def _log_files(ckpt: Path, log: str) -> list[Path]:
    d = ckpt / log
    return sorted(p for p in d.iterdir() if p.is_file() and batch_id_of(p.name) is not None)


def _operator_metadata_files(ckpt: Path) -> list[Path]:
    state = ckpt / "state"
    if not state.is_dir():
        return []
    v1 = state.glob("*/_metadata/metadata")
    v2 = (p for p in state.glob("*/_metadata/v2/*") if p.name.isdigit())
    return sorted([*v1, *v2])


def _round_trip(
    path: Path, parse: Callable[[str], Any], write: Callable[[Any], bytes]
) -> tuple[bool, bool]:
    """(bytes equal, parse equal) of ``path`` parsed and written back."""
    original = path.read_bytes()
    parsed = parse(original.decode())
    written = write(parsed)
    reparsed = parse(written.decode())
    return written == original, _comparable(reparsed) == _comparable(parsed)


def _comparable(parsed: Any) -> Any:
    """A parse result without its ``raw`` text (the bytes, compared on their own)."""
    if hasattr(parsed, "__dict__"):
        return {k: v for k, v in vars(parsed).items() if k != "raw"}
    return parsed


@pytest.mark.parametrize("ckpt", CHECKPOINTS, ids=[p.name for p in CHECKPOINTS])
def test_every_log_file_round_trips_to_sparks_bytes(ckpt):
    """``metadata``, every ``offsets/N`` and ``commits/N`` and every operator metadata file:
    Spark's bytes exactly (json4s writes compact JSON in the parsed key order)."""
    cases: list[tuple[Path, Callable[[str], Any], Callable[[Any], bytes]]] = [
        (ckpt / "metadata", lambda t: parse_stream_metadata(t, "metadata"), stream_metadata_bytes)
    ]
    for p in _log_files(ckpt, "offsets"):
        cases.append((p, lambda t, p=p: parse_offset_seq(t, int(p.name), str(p)), offset_seq_bytes))
    for p in _log_files(ckpt, "commits"):
        cases.append((p, lambda t, p=p: parse_commit(t, int(p.name), str(p)), commit_bytes))
    for p in _operator_metadata_files(ckpt):
        cases.append(
            (p, lambda t, p=p: parse_operator_metadata(t, str(p)), operator_metadata_bytes)
        )
    differ = []
    for path, parse, write in cases:
        same_bytes, same_parse = _round_trip(path, parse, write)
        assert same_parse, path
        if not same_bytes:
            differ.append(str(path.relative_to(ckpt)))
    assert not differ, f"written bytes differ from Spark's: {differ}"

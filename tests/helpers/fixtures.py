"""The bundled checkpoints (fixtures/): their paths, the manifest, fixtures/generate.py and the
rows Spark 4.3 recorded for them. No statectl import: tests/conftest.py loads this."""

from __future__ import annotations

import functools
import importlib.util
import json
import pathlib
from typing import Any

ROOT = pathlib.Path(__file__).resolve().parent.parent.parent
FIXTURES = ROOT / "fixtures" / "checkpoints"
MANIFEST = ROOT / "fixtures" / "manifest.json"


def load_manifest(include_pending: bool = False) -> list[dict[str, Any]]:
    """The fixtures of fixtures/manifest.json.

    Entries marked ``pending`` are operator kinds / state formats statectl does not model yet
    (issue 10); the generic parametrized tests skip them and tests/test_operator_kinds.py
    records what statectl does with them today.
    """
    if not MANIFEST.exists():
        return []
    data = json.loads(MANIFEST.read_text())
    fixtures = data["fixtures"] if isinstance(data, dict) else data
    return [f for f in fixtures if include_pending or not f.get("pending")]


@functools.cache
def fixture_generator() -> Any:
    """fixtures/generate.py as a module: its queries, specs and helpers (no Spark started)."""
    spec = importlib.util.spec_from_file_location("fixture_generate", ROOT / "fixtures/generate.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def restore_target(fx: dict[str, Any]) -> tuple[str, int]:
    """Where a fixture is restored by the tests that restore every fixture: another partition
    count always; the other backend where Spark allows it (transformWithState and join formats
    3/4 are RocksDB only), else the same backend; a changelog source becomes zip snapshots."""
    join_format = fx["confs"].get("spark.sql.streaming.join.stateFormatVersion")
    if fx["query"].startswith("tws") or join_format in ("3", "4"):
        return "rocksdb", 3
    return ("rocksdb" if fx["backend"] in ("hdfs", "rocksdb-changelog") else "hdfs"), 3


def drop_crc(path: pathlib.Path) -> None:
    """Remove a file's Hadoop ``.crc`` sidecar, as a writer that edits the file should: tests
    that damage a file on purpose reach the check they test, not the sidecar check."""
    (path.parent / f".{path.name}.crc").unlink(missing_ok=True)


def recorded_read(fx: dict[str, Any], read: dict[str, Any]) -> dict[str, Any]:
    """What Spark 4.3's reader returned for ``read`` when ``fx`` was generated: names, rows."""
    data = json.loads((FIXTURES.parent / fx["spark_rows"]).read_text())

    def key(r: dict[str, Any]) -> str:
        return json.dumps([r["operatorId"], r.get("options", {})], sort_keys=True)

    return {key(r): r for r in data["reads"]}[key(read)]

"""Checking restores: a restored query continued exactly once, two checkpoints hold the same
state files, two savepoints the same tables; the entries of RocksDB snapshots; a savepoint
crafted with many keys."""

from __future__ import annotations

import hashlib
import json
import re
import zipfile
from pathlib import Path

import google_crc32c
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from rocksdict import AccessType, Options, Rdict

from statectl.checkpoint.model import Checkpoint
from statectl.io import FileIO
from statectl.savepoints.create import take_savepoint
from statectl.savepoints.format import seal
from statectl.savepoints.layout import write_table
from statectl.state import StoreEncoding, _split_list_blob, load_raw
from tests.helpers.fixtures import FIXTURES

UUID = re.compile(rb"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


def session_merged_across_restore(rows: list) -> bool:
    """A session that began before the savepoint (batch 3's events start at 24 s) and holds
    events after it: restored state merged with new events."""
    return any(r[0][0] < "2024-01-01T00:00:24" and r[0][1] > "2024-01-01T00:00:27" for r in rows)


def assert_exactly_once(first: dict, continued: dict, full: dict) -> None:
    """What the first run and the restored run emitted together is what one uninterrupted run
    emitted (batch ids may differ: a watermark-only batch can end the first run)."""
    split = sorted(
        (r for part in (first, continued) for rows in part.values() for r in rows), key=repr
    )
    assert split == sorted((r for rows in full.values() for r in rows), key=repr)


def _rocksdb_entries(zip_path: Path, tmp: Path) -> list[tuple[bytes, bytes]]:
    """Every entry of a RocksDB snapshot (zip + SSTs) as Spark would load it."""
    db = tmp / f"db-{len(list(tmp.iterdir()))}"
    db.mkdir()
    with zipfile.ZipFile(zip_path) as z:
        z.extractall(db)
        meta = json.loads(z.read("metadata").decode().split("\n", 1)[1])
    for f in meta["sstFiles"]:
        (db / f["localFileName"]).write_bytes(
            (zip_path.parent / "SSTs" / f["dfsSstFileName"]).read_bytes()
        )
    (db / "metadata").unlink()
    d = Rdict(str(db), Options(raw_mode=True), access_type=AccessType.read_only())
    try:
        return list(d.items())
    finally:
        d.close()


def assert_same_checkpoint(a: Path, b: Path, tmp: Path) -> None:
    """The same files with the same contents; names and contents compared with unique ids
    (uuids) masked, RocksDB snapshots by their entries (SSTs record creation times)."""

    def files(root: Path) -> dict[str, Path]:
        return {
            UUID.sub(b"U", str(p.relative_to(root)).encode()).decode(): p
            for p in root.rglob("*")
            if p.is_file() and not p.name.endswith(".sst") and not p.name.startswith(".")
        }

    fa, fb = files(a), files(b)
    assert sorted(fa) == sorted(fb)
    for rel, pa_ in fa.items():
        pb = fb[rel]
        if rel.endswith(".zip"):
            assert _rocksdb_entries(pa_, tmp) == _rocksdb_entries(pb, tmp), rel
            ma, mb = (
                json.loads(zipfile.ZipFile(p).read("metadata").decode().split("\n", 1)[1])
                for p in (pa_, pb)
            )
            for m in (ma, mb):
                for f in m.pop("sstFiles"):
                    assert f["sizeBytes"] > 0
            assert ma == mb, rel
        elif rel.endswith(".zip.crc"):
            # Spark's JSON CRC32C of a zip (checkpoint format 2): each side's matches its zip,
            # whose bytes differ by the SSTs' creation times.
            for crc, zip_path in ((pa_, fa[rel[:-4]]), (pb, fb[rel[:-4]])):
                data = zip_path.read_bytes()
                digest = google_crc32c.value(data)
                recorded = json.loads(crc.read_text())
                assert recorded["value"] % (1 << 32) == digest, rel  # Java's signed int
                assert recorded["mainFileSize"] == len(data), rel
        elif rel != "metadata":  # the finished checkpoint's metadata: the same query id
            # operator metadata names its schema file by its absolute path
            ca = UUID.sub(b"U", pa_.read_bytes().replace(str(a).encode(), b"ROOT"))
            cb = UUID.sub(b"U", pb.read_bytes().replace(str(b).encode(), b"ROOT"))
            assert ca == cb, rel


def savepoint_contents(sp: str) -> tuple[dict, dict[str, str]]:
    """A savepoint's _metadata without what differs between two runs, and its files' sha256."""
    root = Path(sp.removeprefix("file://"))
    meta = json.loads((root / "_metadata").read_text())
    for volatile in ("created_at", "metadata_sha256"):
        meta.pop(volatile)
    files = {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*.parquet"))
    }
    return meta, files


# -- fast: the engine plumbing ---------------------------------------------------------------


def entries_by_family(ckpt: Checkpoint) -> list[set[tuple[str, bytes, bytes]]]:
    """Per partition: every live RocksDB entry as (column family name, key, value), a list
    value as Spark's RocksDB returns it. (A list put by one batch and appended to by a later one
    is two records in two SST files; the RocksDB binding we read them with joins them with ",",
    where Spark's merge operator with mergeOperatorVersion 2 joins them with nothing.)"""
    batch = ckpt.latest_committed_batch
    op = ckpt.operators(batch)[0]
    enc = StoreEncoding.of(ckpt, batch)
    lists = {
        v["stateName"]
        for v in op.properties.get("stateVariables", [])
        if v.get("stateVariableType") == "ListState"
    }
    out = []
    for p in range(op.num_partitions):
        raw = load_raw(ckpt, op, "default", p, batch, enc)
        names = {i: n for n, i in raw.cf_ids.items()}
        entries = set()
        for k, v in zip(raw.keys.to_pylist(), raw.values.to_pylist(), strict=True):
            name = names[int.from_bytes(k[:2], "little")]
            if name in lists:
                elements = _split_list_blob(v, name)
                v = enc.merge_delimiter.join(len(e).to_bytes(4, "little") + e for e in elements)
            entries.add((name, k[2:], v))
        out.append(entries)
    return out


def synthetic_savepoint(tmp_path: Path, keys: int) -> str:
    """The agg-hdfs fixture's savepoint with ``keys`` keys (wide values) instead of its own."""
    tmp_path.mkdir(exist_ok=True)
    url, _ = take_savepoint(str(FIXTURES / "agg-hdfs"), str(tmp_path / "sp"))
    root = Path(url.removeprefix("file://"))
    doc = json.loads((root / "_metadata").read_text())
    table = doc["operators"][0]["tables"][0]
    old = pq.read_table(root / table["files"][0]["path"])
    key_t, value_t = old.schema.field("key").type, old.schema.field("value").type
    files = []
    per_file = keys // 2
    for part in range(2):
        ids = np.arange(part * per_file, (part + 1) * per_file)
        key_cols = [pa.array([f"key-{i:012d}-{'x' * 150}" for i in ids])]
        if key_t.num_fields > 1:
            key_cols += [
                pa.nulls(len(ids), key_t.field(i).type) for i in range(1, key_t.num_fields)
            ]
        value_cols = [
            pa.array(ids, value_t.field(i).type)
            if pa.types.is_integer(value_t.field(i).type)
            else pa.nulls(len(ids), value_t.field(i).type)
            for i in range(value_t.num_fields)
        ]
        t = pa.table(
            {
                "key": pa.StructArray.from_arrays(key_cols, fields=list(key_t)),
                "value": pa.StructArray.from_arrays(value_cols, fields=list(value_t)),
                "partition_id": pa.array(np.full(len(ids), part), pa.int32()),
            }
        )
        rel = f"operators/big/default/part-{part:05d}.parquet"
        f = write_table(FileIO.for_url(str(root))[0], str(root), rel, t)  # as savepoints do
        files.append({"path": f.path, "rows": f.rows, "bytes": f.bytes, "sha256": f.sha256})
    table["files"] = files
    table["rows"] = keys
    (root / "_metadata").write_text(json.dumps(seal(doc)))  # crafted: sealed again
    return url

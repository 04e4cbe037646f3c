"""The transformWithState encoder reproduces Spark's RocksDB entries byte for byte, and the
snapshot writer packages them the way Spark's RocksDBFileManager does."""

from __future__ import annotations

import json
import zipfile

import pyarrow as pa
import pyarrow.compute as pc
import pytest

from statectl.backends.writers import write_rocksdb_snapshot
from statectl.checkpoint.model import Checkpoint
from statectl.checkpoint.state_metadata import ColumnFamilySchema
from statectl.io import FileIO
from statectl.savepoints.create import take_savepoint
from statectl.savepoints.store import Savepoint
from statectl.state import StoreEncoding, load_raw
from statectl.tws_encode import assign_cf_ids, encode_operator_partition
from tests.helpers.fixtures import FIXTURES
from tests.helpers.restore import entries_by_family


@pytest.mark.parametrize(
    "name",
    [
        "tws-rocksdb",
        "tws-rocksdb-changelog",
        "tws-mergev1-rocksdb",
        "tws-mergev1-rocksdb-changelog",
        "tws-avro-rocksdb",
        "tws-rows-rocksdb",
        "tws-ttl-rocksdb",
    ],
)
def test_encoded_entries_equal_the_ones_spark_wrote(tmp_path, name):
    ckpt = Checkpoint.open(str(FIXTURES / name))
    batch = ckpt.latest_committed_batch
    op = ckpt.operators(batch)[0]
    enc = StoreEncoding.of(ckpt, batch)
    url, meta = take_savepoint(str(FIXTURES / name), str(tmp_path))
    sp, state = Savepoint.open(url), meta.operators[0]
    families = [ColumnFamilySchema(**cf) for cf in state.column_families]
    for p in range(op.num_partitions):
        raw = load_raw(ckpt, op, "default", p, batch, enc)
        tables = {}
        for t in state.tables:
            data = sp.read_table(t)
            tables[t.name] = data.filter(pc.equal(data.column("partition_id"), p))
        keys, values = encode_operator_partition(
            tables,
            {t.name: t.kind for t in state.tables},
            families,
            raw.cf_ids,
            state.properties["timeMode"],
            enc.merge_delimiter,
            enc.avro,
        )
        ours = sorted(zip(keys.to_pylist(), values.to_pylist(), strict=True))
        spark = sorted(zip(raw.keys.to_pylist(), raw.values.to_pylist(), strict=True))
        assert len(ours) >= 18 and ours == spark


def test_snapshot_zip_layout(tmp_path):
    families = [
        ColumnFamilySchema("cnt", "{}", "{}"),
        ColumnFamilySchema("$rowCounter_lst", "{}", "{}"),
    ]
    ids = assign_cf_ids(families)
    assert ids == {"default": 1, "cnt": 2, "$rowCounter_lst": 3}
    import pyarrow as pa

    keys = pa.array([b"\x02\x00\x00k", b"\x03\x00\x00k", b"\x02\x00\x00a"], pa.large_binary())
    values = pa.array([b"\x00v1", b"\x00v2", b"\x00v3"], pa.large_binary())
    io, root = FileIO.for_url(str(tmp_path))
    written = write_rocksdb_snapshot(
        io, root, 7, keys, values, column_families=ids, num_internal_keys=1
    )
    assert written[-1].endswith("/7.zip") and all("/SSTs/" in w for w in written[:-1])
    with zipfile.ZipFile(tmp_path / "7.zip") as z:
        names = z.namelist()
        head, body = z.read("metadata").decode().split("\n", 1)
    assert head == "v1" and "CURRENT" in names and any(n.startswith("MANIFEST-") for n in names)
    assert not any(n.endswith(".sst") or n in ("LOCK", "LOG") for n in names)
    meta = json.loads(body)
    assert meta["numKeys"] == 2 and meta["numInternalKeys"] == 1
    assert meta["columnFamilyMapping"] == ids and meta["maxColumnFamilyId"] == 3
    assert meta["columnFamilyTypeMap"] == {"default": False, "cnt": False, "$rowCounter_lst": True}
    for f in meta["sstFiles"]:
        assert (tmp_path / "SSTs" / f["dfsSstFileName"]).stat().st_size == f["sizeBytes"]
        assert f["dfsSstFileName"].startswith(f["localFileName"][:-4] + "-")


@pytest.mark.parametrize("name", ["tws-ttl-rocksdb", "tws-rocksdb", "tws-rows-rocksdb"])
def test_restore_through_another_partition_count_rewrites_sparks_entries(tmp_path, name):
    """Restored to 3 partitions, then from there back to Spark's 2: every entry of every
    column family (TTL indexes, counts, minimum expiries, timers) is the one Spark wrote, in the
    partition Spark wrote it to; values keep their original ttlExpirationMs."""
    from statectl.restoration import restore

    spark = entries_by_family(Checkpoint.open(str(FIXTURES / name)))
    sp1, _ = take_savepoint(str(FIXTURES / name), str(tmp_path / "sp1"))
    plan = restore(sp1, str(tmp_path / "three"), partitions=3)
    assert not plan.problems
    three = entries_by_family(Checkpoint.open(str(tmp_path / "three")))
    assert len(three) == 3 and set().union(*three) == set().union(*spark)
    sp2, _ = take_savepoint(str(tmp_path / "three"), str(tmp_path / "sp2"))
    assert not restore(sp2, str(tmp_path / "two"), partitions=2).problems
    assert entries_by_family(Checkpoint.open(str(tmp_path / "two"))) == spark
    families = {f for entries in spark for f, _, _ in entries}
    if name == "tws-ttl-rocksdb":
        assert {"$ttl_cnt", "$ttl_lst", "$min_lst", "$count_lst"} <= families


@pytest.mark.parametrize("delimiter", [b",", b""])
def test_merging_no_list_elements_gives_no_entries(delimiter):
    """A partition where one side of a join (or a list state) has no rows: no entries, not an
    IndexError (a Spark 3.5 left semi join restored at format 4 over 3 partitions had one)."""
    from statectl.tws_encode import merge_lists

    empty = pa.array([], pa.large_binary())
    keys, values, counts = merge_lists(empty, empty, delimiter)
    assert len(keys) == len(values) == len(counts) == 0
    keys, values, counts = merge_lists(
        pa.array([b"a", b"b", b"a"], pa.large_binary()),
        pa.array([b"x", b"y", b"z"], pa.large_binary()),
        delimiter,
    )
    assert keys.to_pylist() == [b"a", b"b"] and counts.tolist() == [2, 1]
    one = b"\x01\x00\x00\x00"
    assert values.to_pylist() == [one + b"x" + delimiter + one + b"z", one + b"y"]

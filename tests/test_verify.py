"""Verification on every read: checksums, RocksDB key counts, partition counts, key placement.

Each test damages a copy of a bundled fixture the way a real failure would (an edited log, a
swapped state file, a flipped bit) and proves the read fails with a one-line error naming the
file instead of returning different rows.
"""

from __future__ import annotations

import glob
import os
import shutil

import pytest

from statectl.checkpoint.model import Checkpoint
from statectl.checksums import check_hadoop_crc, check_spark_checksum, crc32c, hadoop_crc_path
from statectl.errors import CorruptFileError, StatectlError
from statectl.inspection import inspect_checkpoint
from statectl.state import Selection, read_state
from tests.helpers.cli import assert_one_line_error, run
from tests.helpers.fixtures import FIXTURES, drop_crc, load_manifest


def read(ck, *, verify: bool = True, **sel):
    return read_state(Checkpoint.open(str(ck), verify=verify), Selection(**sel))


# -- the checksum formats themselves -----------------------------------------------------------
def test_crc32c_check_value():
    assert crc32c(b"123456789") == 0xE3069283


def test_every_bundled_checksum_verifies():
    """Every Hadoop sidecar and every Spark checksum file in the fixtures matches its file."""
    n = 0
    for sidecar in glob.glob(str(FIXTURES / "**" / ".*.crc"), recursive=True):
        d, b = os.path.split(sidecar)
        main = os.path.join(d, b[1:-4])
        with open(main, "rb") as f, open(sidecar, "rb") as s:
            check_hadoop_crc(f.read(), s.read(), main, sidecar)
        n += 1
    spark = glob.glob(str(FIXTURES / "**" / "[0-9]*.crc"), recursive=True)
    for sidecar in spark:
        with open(sidecar[:-4], "rb") as f, open(sidecar, "rb") as s:
            check_spark_checksum(f.read(), s.read(), sidecar[:-4], sidecar)
    assert n > 1000 and len(spark) >= 10


# -- 1. Hadoop .crc sidecars -------------------------------------------------------------------
def _sidecar(data: bytes, chunk: int = 512) -> bytes:
    import struct
    import zlib

    crcs = [zlib.crc32(data[i : i + chunk]) for i in range(0, len(data), chunk)]
    return b"crc\x00" + struct.pack(f">i{len(crcs)}I", chunk, *crcs)


@pytest.mark.parametrize("size", [0, 1, 511, 512, 513, 5000])
def test_hadoop_crc_of_any_length(size):
    data = bytes(range(256)) * 20
    data = data[:size]
    check_hadoop_crc(data, _sidecar(data), "f", ".f.crc")
    for damaged in (data + b"!", data[:-1] if data else b"?", b"\x01" + data[1:] if data else None):
        if damaged is not None and damaged != data:
            with pytest.raises(CorruptFileError, match=r"f: does not match its checksum \.f\.crc"):
                check_hadoop_crc(damaged, _sidecar(data), "f", ".f.crc")
    with pytest.raises(CorruptFileError):
        check_hadoop_crc(data, _sidecar(data)[:-1] if size else b"crc", "f", ".f.crc")


def test_edited_commit_log_fails_naming_it(fixture_copy):
    ck = fixture_copy("agg-hdfs")
    f = ck / "commits" / "3"
    f.write_text(f.read_text().replace('"nextBatchWatermarkMs":0', '"nextBatchWatermarkMs":9'))
    with pytest.raises(CorruptFileError, match=r"commits/3: does not match its checksum \.3\.crc"):
        inspect_checkpoint(Checkpoint.open(str(ck)), rows=False)


def test_edited_operator_metadata_fails(fixture_copy):
    ck = fixture_copy("agg-hdfs")
    f = ck / "state" / "0" / "_metadata" / "metadata"
    f.write_text(f.read_text().replace("stateStoreSave", "stateStoreSavX"))
    with pytest.raises(CorruptFileError, match=r"_metadata/metadata: does not match its checksum"):
        inspect_checkpoint(Checkpoint.open(str(ck)), rows=False)


def test_swapped_delta_files_fail_on_their_sidecars(fixture_copy):
    """Swapped state files (a classic of copying tools) are caught by the stale sidecars."""
    ck = fixture_copy("agg-snappy-hdfs")  # snappy: no checksum of its own
    a, b = ck / "state/0/0/4.delta", ck / "state/0/1/4.delta"
    tmp = ck / "swap"
    shutil.move(a, tmp)
    shutil.move(b, a)
    shutil.move(tmp, b)
    with pytest.raises(
        CorruptFileError, match=r"4\.delta: does not match its checksum \.4\.delta\.crc"
    ):
        read(ck)


def test_sidecar_mismatch_is_a_one_line_cli_error(fixture_copy):
    ck = fixture_copy("agg-rocksdb")
    sst = sorted((ck / "state/0/0/SSTs").glob("*.sst"))[-1]
    data = bytearray(sst.read_bytes())
    data[len(data) // 3] ^= 0x01
    sst.write_bytes(bytes(data))
    proc = run("export", str(ck), "-o", str(ck.parent / "o.parquet"), check_rc=None)
    assert_one_line_error(proc, sst.name, f".{sst.name}.crc", "changed or damaged")
    assert not (ck.parent / "o.parquet").exists()


def test_damaged_sidecar_header_is_named(fixture_copy):
    ck = fixture_copy("agg-hdfs")
    side = ck / "offsets" / ".3.crc"
    side.write_bytes(b"xyz\x00" + side.read_bytes()[4:])
    with pytest.raises(CorruptFileError, match=r"\.3\.crc: is not a Hadoop checksum file"):
        Checkpoint.open(str(ck)).offsets(3)


def test_missing_sidecars_are_fine(fixture_copy):
    ck = fixture_copy("agg-hdfs")
    want = read(ck).num_rows
    for side in glob.glob(str(ck / "**" / ".*.crc"), recursive=True):
        os.remove(side)
    assert read(ck).num_rows == want


# -- 2. Spark 4.1+ CRC32C checkpoint file checksums --------------------------------------------
def _latest(store, ext):
    return max(store.glob(f"*.{ext}"), key=lambda p: int(p.name.split("_")[0]))


def test_spark_checksum_catches_an_edited_changelog(fixture_copy):
    ck = fixture_copy("agg-ckptv2-rocksdb-changelog")
    log = _latest(ck / "state/0/0", "changelog")
    data = bytearray(log.read_bytes())
    data[-10] ^= 0x40
    log.write_bytes(bytes(data))
    drop_crc(log)  # only the Spark checksum is left to catch it
    with pytest.raises(
        CorruptFileError, match=rf"{log.name}: does not match its checksum {log.name}\.crc"
    ):
        read(ck)


def test_spark_checksum_catches_a_swapped_zip(fixture_copy):
    ck = fixture_copy("agg-ckptv2-rocksdb")
    z = _latest(ck / "state/0/0", "zip")
    older = sorted((ck / "state/0/0").glob("*.zip"), key=lambda p: int(p.name.split("_")[0]))[0]
    z.write_bytes(older.read_bytes())
    drop_crc(z)
    with pytest.raises(
        CorruptFileError, match=rf"{z.name}: does not match its checksum {z.name}\.crc"
    ):
        read(ck)


def test_spark_checksum_files_are_not_data(fixture_copy):
    """``X.crc`` beside every v2 state file is never taken for a state file or a log entry."""
    ck = fixture_copy("agg-ckptv2-rocksdb")
    for name in ("offsets", "commits"):
        (ck / name / "3.crc").write_text("{}")
    c = Checkpoint.open(str(ck))
    assert c.latest_committed_batch == 3
    assert read(ck).num_rows == read(FIXTURES / "agg-ckptv2-rocksdb").num_rows


def test_invalid_spark_checksum_json_is_named(fixture_copy):
    ck = fixture_copy("agg-ckptv2-rocksdb")
    z = _latest(ck / "state/0/1", "zip")
    crc = z.parent / (z.name + ".crc")
    crc.write_text("{not json")
    drop_crc(crc)
    with pytest.raises(CorruptFileError, match=rf"{crc.name}: is not a Spark checksum file"):
        read(ck)


# -- 7. --no-verify skips checksums over data files, never over metadata -----------------------
def test_no_verify_skips_data_file_checksums_only(fixture_copy):
    ck = fixture_copy("agg-hdfs")
    delta = ck / "state/0/0/4.delta"
    side = hadoop_crc_path(str(delta))
    with open(side, "r+b") as f:  # a stale sidecar over an intact file
        f.seek(8)
        f.write(b"\x00\x00\x00\x00")
    with pytest.raises(CorruptFileError):
        read(ck)
    assert read(ck, verify=False).num_rows == read(FIXTURES / "agg-hdfs").num_rows
    f = ck / "commits" / "3"
    f.write_text(f.read_text() + " ")
    with pytest.raises(StatectlError, match="commits/3"):
        read(ck, verify=False)


# -- 3. RocksDB: iterator status and numKeys ---------------------------------------------------
def test_every_bundled_snapshot_has_the_key_count_its_metadata_records():
    """numKeys + numInternalKeys equals the keys a full iteration returns, for every zip."""
    from statectl.backends.rocksdb import _read_zip
    from statectl.io import FileIO

    io, _ = FileIO.for_url(str(FIXTURES))
    zips = glob.glob(str(FIXTURES / "*" / "state" / "**" / "*.zip"), recursive=True)
    for z in zips:
        state, meta = _read_zip(io, os.path.dirname(z), z)
        assert meta.num_keys >= 0 and len(state) == meta.expected_keys, z
    assert len(zips) > 100


def _flip_sst_bit(ck):
    z = max((ck / "state/0/0").glob("*.zip"), key=lambda p: int(p.stem))
    sst = sorted((ck / "state/0/0/SSTs").glob("*.sst"))[-1]
    data = bytearray(sst.read_bytes())
    data[20] ^= 0x01  # inside the first data block
    sst.write_bytes(bytes(data))
    drop_crc(sst)  # the sidecar would catch it first
    return z


def test_sst_bit_flip_fails_instead_of_dropping_rows(fixture_copy):
    ck = fixture_copy("agg-rocksdb")
    z = _flip_sst_bit(ck)
    out = ck.parent / "o.parquet"
    proc = run("export", str(ck), "-o", str(out), check_rc=None)
    assert_one_line_error(proc, z.name, "checksum mismatch")
    assert not out.exists()


def test_key_count_below_metadata_is_corruption(fixture_copy):
    """Whatever makes RocksDB return fewer keys than recorded, the read fails naming the zip."""
    import zipfile

    ck = fixture_copy("agg-rocksdb")
    z = max((ck / "state/0/1").glob("*.zip"), key=lambda p: int(p.stem))
    with zipfile.ZipFile(z) as src:
        members = {n: src.read(n) for n in src.namelist()}
    head, body = members["metadata"].decode().split("\n", 1)
    members["metadata"] = (head + "\n" + body.replace('"numKeys":', '"numKeys":1', 1)).encode()
    with zipfile.ZipFile(z, "w") as dst:
        for n, data in members.items():
            dst.writestr(n, data)
    drop_crc(z)
    with pytest.raises(
        CorruptFileError, match=rf"{z.name}: RocksDB returned \d+ keys, the snapshot"
    ):
        read(ck)


# -- 4. partition counts: pinned conf, operator metadata and directories agree ----------------
def _pin_partitions(ck, value: str):
    f = ck / "offsets" / "3"
    text = f.read_text()
    assert '"spark.sql.shuffle.partitions":"2"' in text
    f.write_text(
        text.replace(
            '"spark.sql.shuffle.partitions":"2"', f'"spark.sql.shuffle.partitions":"{value}"'
        )
    )
    drop_crc(f)  # an edit that also fixed (or dropped) the sidecar
    return f


@pytest.mark.parametrize(
    ("value", "needles"),
    [
        ("1", ("spark.sql.shuffle.partitions=1", "partition counts disagree")),
        ("0", ("spark.sql.shuffle.partitions is '0', not a positive number",)),
        ("3", ("spark.sql.shuffle.partitions=3", "partition counts disagree")),
    ],
)
def test_edited_pinned_partition_count_fails(fixture_copy, value, needles):
    ck = fixture_copy("agg-hdfs")
    _pin_partitions(ck, value)
    out = ck.parent / "o.parquet"
    proc = run("export", str(ck), "-o", str(out), check_rc=None)
    assert_one_line_error(proc, "offsets/3", *needles)
    assert not out.exists()


def test_non_numeric_pinned_partition_count_fails(fixture_copy):
    ck = fixture_copy("agg-rocksdb")
    _pin_partitions(ck, "two")
    with pytest.raises(
        CorruptFileError, match=r"offsets/3: pinned spark\.sql\.shuffle\.partitions is 'two'"
    ):
        inspect_checkpoint(Checkpoint.open(str(ck)), rows=False)


def test_missing_partition_directory_fails(fixture_copy):
    ck = fixture_copy("agg-rocksdb")
    shutil.move(ck / "state/0/1", ck / "state/0/7")
    with pytest.raises(
        CorruptFileError, match=r"offsets/3: partition counts disagree.*directories 0,7"
    ):
        read(ck)


def test_operator_metadata_partition_count_must_agree(fixture_copy):
    ck = fixture_copy("agg-hdfs")
    f = ck / "state/0/_metadata/metadata"
    f.write_text(f.read_text().replace('"numPartitions":2', '"numPartitions":4'))
    drop_crc(f)
    with pytest.raises(CorruptFileError, match="operator metadata of operator 0 says 4"):
        read(ck)


# -- 6. symbolic links inside a checkpoint are followed, never skipped -------------------------
def _symlink_operator(ck, tmp_path):
    real = tmp_path / "elsewhere" / "op0"
    real.parent.mkdir()
    shutil.move(ck / "state" / "0", real)
    (ck / "state" / "0").symlink_to(real, target_is_directory=True)
    return real


def test_symlinked_operator_directory_is_followed(fixture_copy, tmp_path):
    ck = fixture_copy("agg-rocksdb")
    want = read(FIXTURES / "agg-rocksdb")
    _symlink_operator(ck, tmp_path)
    info = inspect_checkpoint(Checkpoint.open(str(ck)))
    assert [op["name"] for op in info["operators"]] == ["stateStoreSave"]
    assert info["operators"][0]["stores"][0]["rows"] == want.num_rows
    assert info["operators"][0]["bytes"] > 0
    assert read(ck).equals(want)


def test_symlinked_partition_and_log_directories_are_followed(fixture_copy, tmp_path):
    ck = fixture_copy("agg-hdfs")
    want = read(FIXTURES / "agg-hdfs")
    for rel in ("state/0/1", "commits", "offsets"):
        real = tmp_path / rel.replace("/", "_")
        shutil.move(ck / rel, real)
        (ck / rel).symlink_to(real, target_is_directory=True)
    assert read(ck).equals(want)


def test_broken_symlinked_operator_is_an_error(fixture_copy, tmp_path):
    ck = fixture_copy("agg-hdfs")
    shutil.rmtree(ck / "state" / "0")
    (ck / "state" / "0").symlink_to(tmp_path / "gone", target_is_directory=True)
    proc = run("inspect", str(ck), check_rc=None)
    assert_one_line_error(proc, "state/0", "broken symbolic link")


def test_symlink_loop_is_an_error(fixture_copy):
    ck = fixture_copy("agg-hdfs")
    (ck / "state" / "0" / "0" / "loop").symlink_to(ck / "state", target_is_directory=True)
    with pytest.raises(StatectlError, match="symbolic link loop"):
        inspect_checkpoint(Checkpoint.open(str(ck)))


# -- 5. key placement: every key read from partition p hashes to p -----------------------------
def _swap(a, b):
    tmp = a.parent / (a.name + ".swap")
    shutil.move(a, tmp)
    shutil.move(b, a)
    shutil.move(tmp, b)


@pytest.mark.parametrize(
    "name,sel",
    [
        ("agg-hdfs", {}),
        ("agg-rocksdb-changelog", {}),
        ("join-rocksdb", {"join_side": "left"}),
        ("join-hdfs", {"store": "right-keyWithIndexToValue"}),
        ("join-hdfs", {"store": "left-keyToNumValues"}),
        ("tws-rocksdb", {"state_var": "cnt"}),
        ("tws-rocksdb", {"state_var": "lst"}),
        ("tws-rocksdb", {"state_var": "mp"}),
        ("tws-rocksdb", {"registered_timers": True}),
        ("window-hdfs", {}),
    ],
)
def test_swapped_partition_directories_fail(fixture_copy, name, sel):
    ck = fixture_copy(name)
    assert read(ck, **sel).num_rows > 0
    # Swap the partitions' contents (sidecars travel along: no checksum sees it); the schema
    # stays in partition 0, where Spark keeps it.
    a, b = ck / "state/0/0", ck / "state/0/1"
    tmp = ck.parent / "swap"
    for src, dst in ((a, tmp), (b, a), (tmp, b)):
        for f in [p for p in src.rglob("*") if p.is_file() and "_metadata" not in p.parts]:
            (dst / f.relative_to(src)).parent.mkdir(parents=True, exist_ok=True)
            shutil.move(f, dst / f.relative_to(src))
    with pytest.raises(
        CorruptFileError, match=r"state/0/[01]: \d+ of \d+ keys read from partition"
    ):
        read(ck, **sel)


def test_delta_files_swapped_with_their_sidecars_fail(fixture_copy):
    ck = fixture_copy("agg-zstd-hdfs")
    for name in ("4.delta", ".4.delta.crc"):
        _swap(ck / "state/0/0" / name, ck / "state/0/1" / name)
    proc = run("export", str(ck), "-o", str(ck.parent / "o.parquet"), check_rc=None)
    assert_one_line_error(proc, "state/0/0", "belong to another partition")
    # --no-verify skips the (expensive) placement check: the user asked for the bytes as they are
    assert read(ck, verify=False).num_rows > 0


def test_every_fixture_table_is_placed_where_spark_put_it():
    """The placement rule holds for every table of every bundled checkpoint (no false alarm)."""
    from statectl.savepoints.create import table_tasks
    from statectl.state import StoreEncoding, read_partition

    for fx in load_manifest():  # pending kinds (join formats 3/4) have no placement rule yet
        c = Checkpoint.open(str(FIXTURES / fx["name"]))
        b = c.latest_committed_batch
        enc = StoreEncoding.of(c, b)
        for op in c.operators(b):
            for task in table_tasks(op):
                for p in range(op.num_partitions):
                    read_partition(c, op, task.selection, p, b, enc)


# -- 7. --no-verify on the read commands ------------------------------------------------------
def test_no_verify_on_every_read_command(fixture_copy, tmp_path):
    """Swapped partitions (sidecars included): each read command refuses, and with
    --no-verify reads what is there, as the user asked."""
    ck = fixture_copy("agg-hdfs")
    for name in ("4.delta", ".4.delta.crc"):
        _swap(ck / "state/0/0" / name, ck / "state/0/1" / name)
    out = tmp_path / "o.parquet"
    commands = {
        "export": ["export", str(ck), "-o", str(out)],
        "savepoint": ["savepoint", str(ck), str(tmp_path / "sps")],
        "migrate": ["migrate", str(ck), str(tmp_path / "migrated")],
    }
    for cmd in commands.values():
        assert_one_line_error(run(*cmd, check_rc=None), "belong to another partition")
    assert not out.exists() and not (tmp_path / "migrated").exists()
    for cmd in commands.values():
        run(*cmd, "--no-verify")
    assert out.exists() and (tmp_path / "migrated" / "commits").exists()


def test_inspect_no_verify_skips_data_checksums(fixture_copy):
    ck = fixture_copy("agg-rocksdb")
    sst = sorted((ck / "state/0/0/SSTs").glob("*.sst"))[-1]
    side = ck / "state/0/0/SSTs" / f".{sst.name}.crc"
    data = bytearray(side.read_bytes())
    data[-1] ^= 0x01  # a stale sidecar over an intact SST
    side.write_bytes(bytes(data))
    assert_one_line_error(run("inspect", str(ck), check_rc=None), sst.name)
    run("inspect", str(ck), "--no-verify", "--json")


def test_list_reports_a_symlink_loop_as_damage(fixture_copy):
    from statectl.inspection import list_dir

    ck = fixture_copy("agg-hdfs")
    (ck / "state" / "0" / "0" / "loop").symlink_to(ck / "state", target_is_directory=True)
    (entry,) = list_dir(str(ck.parent))
    assert entry["health"] == "damaged"
    assert any("symbolic link loop" in p for p in entry["problems"])


def test_list_reports_a_non_numeric_partition_count(fixture_copy):
    from statectl.inspection import list_dir

    ck = fixture_copy("agg-hdfs")
    _pin_partitions(ck, "two")
    (entry,) = list_dir(str(ck.parent))
    assert entry["health"] == "damaged" and entry["partitions"] is None
    assert any("is 'two', not a positive number" in p for p in entry["problems"])

"""Every kind of source through the commands a user runs (issue 22): inspect, export,
savepoint (canonical and native), diff, edit, restore into the other backend at another
partition count, and migrate, on checkpoints of Kafka, Delta, an unknown source (fixtures/sources.py: their
Spark writers' exact bytes over real Spark state), rate, rate-micro-batch and a PySpark Python
data source (written by Spark 4.3, fixtures/generate.py). The restored ``sources/`` files and
offset lines are the source checkpoint's, byte for byte."""

from __future__ import annotations

import json
import subprocess
import sys
from functools import partial
from pathlib import Path

import pytest

from statectl.checkpoint.model import Checkpoint
from statectl.processor.writing import SavepointWriter
from statectl.sources import kinds as K
from statectl.sources import recognise
from tests.helpers.fixtures import FIXTURES, fixture_generator
from tests.helpers.spark import run

# fixture -> the kind statectl recognises; the other backend it is restored into
CASES = {
    "kafka-hdfs": ("kafka", "rocksdb"),
    "kafka-rocksdb": ("kafka", "hdfs"),
    "delta-rocksdb": ("delta", "hdfs"),
    "opaque-hdfs": ("opaque", "rocksdb"),
    "ratev1-hdfs": ("rate", "rocksdb"),
    "rate-hdfs": ("rate-micro-batch", "rocksdb"),
    "rate-rocksdb": ("rate-micro-batch", "hdfs"),
    # offsets shaped like Kafka's but no initial-offsets file: not Kafka; written by Python's
    # json.dumps (a space after ':'), which no JVM source writes: a Python data source
    "pysource-hdfs": ("python", "rocksdb"),
}


def cli(*args: str) -> str:
    proc = subprocess.run(
        [sys.executable, "-m", "statectl.cli", *args], capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr + proc.stdout
    return proc.stdout


def source_files(root: Path) -> dict[str, bytes]:
    """Every file under ``sources/`` but Hadoop's .crc sidecars."""
    d = root / "sources"
    if not d.exists():
        return {}
    return {
        str(p.relative_to(d)): p.read_bytes()
        for p in sorted(d.rglob("*"))
        if p.is_file() and not p.name.startswith(".")
    }


def offset_lines(root: Path) -> dict[str, list[str]]:
    """The source lines of every ``offsets/N`` (the batch metadata line pins the backend and
    partition count, which a restore changes)."""
    return {
        p.name: p.read_text().split("\n")[2:]
        for p in (root / "offsets").iterdir()
        if p.name.isdigit()
    }


def assert_sources_carried(src: Path, dst: Path) -> None:
    assert source_files(dst) == source_files(src)
    want = offset_lines(src)
    got = offset_lines(dst)
    assert got and all(got[b] == want[b] for b in got), (got, want)


@pytest.mark.parametrize("name", sorted(CASES))
def test_every_command_carries_the_source(tmp_path, name):
    kind, other = CASES[name]
    src = FIXTURES / name
    info = json.loads(cli("inspect", str(src), "--json"))
    (source,) = info["sources"]
    assert source["kind"] == kind
    assert info["source_offsets"]  # the existing key stays
    assert "source 0" in cli("inspect", str(src), "--no-rows")
    out = tmp_path / "state.jsonl"
    assert json.loads(cli("export", str(src), "-o", str(out), "--json"))["rows"] == 7

    sp = Path(json.loads(cli("savepoint", str(src), str(tmp_path / "sp"), "--json"))["path"][7:])
    meta = json.loads((sp / "_metadata").read_text())
    (recorded,) = meta["sources"]
    assert recorded["kind"] == kind and recorded["offset"] == source["offset"]
    assert json.loads(cli("inspect", str(sp), "--json"))["sources"][0]["kind"] == kind
    restored = tmp_path / "restored"
    cli("restore", str(restored), "-s", str(sp), "--backend", other, "--partitions", "3")
    assert_sources_carried(src, restored)
    assert Checkpoint.open(str(restored)).num_partitions(3) == 3

    # diff and edit: the savepoint holds its checkpoint's state, and an edited savepoint
    # still restores with the source's files.
    assert json.loads(cli("diff", str(src), str(sp), "--json"))["differs"] is False
    edited = tmp_path / "edited"
    done = json.loads(
        cli(
            "edit",
            str(sp),
            str(edited),
            "--operator",
            "0",
            "--delete-where",
            "key.k = 'k0'",
            "--json",
        )
    )
    assert done["tables"]["default"]["removed"] == 1
    assert json.loads(cli("diff", str(sp), str(edited), "--json"))["differs"] is True
    from_edit = tmp_path / "from-edit"
    cli("restore", str(from_edit), "-s", str(edited), "--backend", other, "--partitions", "3")
    assert_sources_carried(src, from_edit)

    native = json.loads(
        cli("savepoint", str(src), str(tmp_path / "nsp"), "--type", "native", "--json")
    )
    back = tmp_path / "from-native"
    cli("restore", str(back), "-s", native["path"])
    assert_sources_carried(src, back)

    migrated = tmp_path / "migrated"
    cli("migrate", str(src), str(migrated), "--backend", other, "--partitions", "3")
    assert_sources_carried(src, migrated)
    cli("dispose", str(sp), "--yes")  # the carried files are the savepoint's own
    assert not sp.exists()


def test_kafka_initial_offsets_keep_their_zero_byte(tmp_path):
    """SPARK-19517: KafkaSourceInitialOffsetWriter writes a zero byte before ``v1``."""
    data = (FIXTURES / "kafka-hdfs" / "sources" / "0" / "0").read_bytes()
    assert data.startswith(b"\x00v1\n")
    cli("migrate", str(FIXTURES / "kafka-hdfs"), str(tmp_path / "m"), "--partitions", "3")
    assert (tmp_path / "m" / "sources" / "0" / "0").read_bytes() == data


def test_inspect_shows_kafka_partitions_and_delta_versions():
    kafka = json.loads(cli("inspect", str(FIXTURES / "kafka-hdfs"), "--json", "--no-rows"))
    assert kafka["sources"][0]["position"] == [
        {"topic": "events", "partition": 0, "offset": 24},
        {"topic": "events", "partition": 1, "offset": 16},
    ]
    assert "events/0 @ 24, events/1 @ 16" in cli("inspect", str(FIXTURES / "kafka-hdfs"))
    delta = json.loads(cli("inspect", str(FIXTURES / "delta-rocksdb"), "--json", "--no-rows"))
    (pos,) = delta["sources"][0]["position"]
    assert pos["table_id"] == "6f1f7ad2-3c5e-4c4b-9d0e-2b7b1c1d5e42" and pos["version"] == 4


def test_recognition_is_conservative():
    kafka_file = {"0": b'\x00v1\n{"t":{"0":0}}'}
    assert recognise('{"t":{"0":5}}', kafka_file) is K.KAFKA
    assert recognise('{"t":{"0":5}}', {}) is K.OPAQUE  # Kafka-shaped, no initial offsets
    assert recognise('{"t":{"0":5}}', {**kafka_file, "1": b"x"}) is K.OPAQUE
    assert recognise("7", {"0": b"v1\n1795776415120"}) is K.RATE
    assert recognise("7", {}) is K.OPAQUE  # memory / socket: LongOffset, nothing to check
    assert recognise('{"offset":1,"timestamp":2}', {}) is K.RATE_MICRO_BATCH
    assert recognise('{"offset":1,"timestamp":2}', {"0": b"?"}) is K.OPAQUE
    assert recognise('{"logOffset":3}', {}) is K.FILE
    assert recognise(None, {"0": b'v1\n{"path":"/a","timestamp":1,"batchId":0}'}) is K.FILE
    assert recognise('{"shard-7":"seq-0042"}', {"0": b"\x89SHRD"}) is K.OPAQUE
    assert recognise("not json", {}) is K.OPAQUE


def test_each_kind_checks_the_offsets_it_accepts():
    assert K.KAFKA.check({"t": {"0": 5, "1": -2}}) is None
    assert "Kafka offset" in (K.KAFKA.check({"t": {"x": 5}}) or "")
    assert K.DELTA.check(json.loads(K.DELTA_EXAMPLE)) is None
    assert K.DELTA.check({"reservoirId": "x"}) is not None
    assert K.RATE.check(3) is None and K.RATE.check(-1) is not None
    assert K.RATE_MICRO_BATCH.check({"offset": 1, "timestamp": 2}) is None
    assert K.PYTHON.check({"events": {"0": 3}}) is None
    assert "not recognised" in (K.OPAQUE.check({"shard-7": "seq-0042"}) or "")
    assert "seen-files log" in (K.FILE.check({"logOffset": 3}) or "")


@pytest.mark.spark
def test_rate_micro_batch_continues_on_the_other_backend_at_3_partitions(spark, tmp_path):
    """The rate-micro-batch fixture (Spark 4.3, HDFS, 2 partitions) restored to RocksDB at 3
    partitions, continued for two batches: the same rows as batches 4 and 5 of one
    uninterrupted run (rate-micro-batch is deterministic with startTimestamp)."""
    q_rate = fixture_generator().q_rate
    sp = json.loads(cli("savepoint", str(FIXTURES / "rate-hdfs"), str(tmp_path / "sp"), "--json"))
    restored = tmp_path / "restored"
    cli("restore", str(restored), "-s", sp["path"], "--backend", "rocksdb", "--partitions", "3")
    continued: dict[int, list] = {}
    for _ in range(2):  # one batch per availableNow run (the source never ends)
        continued.update(run(spark, q_rate, tmp_path / "unused", restored))
    full: dict[int, list] = {}
    for _ in range(6):
        full.update(run(spark, q_rate, tmp_path / "unused", tmp_path / "full"))
    assert sorted(continued) == [4, 5]
    assert continued == {b: full[b] for b in (4, 5)}
    assert Checkpoint.open(str(restored)).backend(5) == "rocksdb"


def cli_fails(*args: str) -> str:
    proc = subprocess.run(
        [sys.executable, "-m", "statectl.cli", *args], capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 2, proc.stderr + proc.stdout
    return proc.stderr


def test_source_offsets_are_checked_against_the_source_kind(tmp_path):
    """A Kafka offset must be Kafka's shape; a topic rename writes the JSON given (what
    Spark's KafkaSourceOffset reads); an unknown source's position is never edited."""
    kafka = json.loads(cli("savepoint", str(FIXTURES / "kafka-hdfs"), str(tmp_path), "--json"))
    err = cli_fails(
        "restore", str(tmp_path / "bad"), "-s", kafka["path"], "--dry-run",
        "--source-offsets", '0={"events":{"x":1}}',
    )  # fmt: skip
    assert "not a Kafka offset" in err
    renamed = '{"renamed":{"0":24,"1":16}}'
    cli("restore", str(tmp_path / "r"), "-s", kafka["path"], "--source-offsets", f"0={renamed}")
    assert (tmp_path / "r" / "offsets" / "3").read_text().split("\n")[2:] == [renamed]
    opaque = json.loads(cli("savepoint", str(FIXTURES / "opaque-hdfs"), str(tmp_path), "--json"))
    err = cli_fails(
        "restore", str(tmp_path / "o"), "-s", opaque["path"], "--dry-run",
        "--source-offsets", '0={"shard-7":"seq-0043"}',
    )  # fmt: skip
    assert "refused" in err and "not recognised" in err
    # ... and without an edit it restores, byte for byte (test_every_command_carries_the_source)
    cli("restore", str(tmp_path / "o2"), "-s", opaque["path"], "--dry-run")


def test_a_savepoint_written_by_the_state_processor_keeps_the_source_files(tmp_path):
    src = FIXTURES / "kafka-hdfs"
    sp = json.loads(cli("savepoint", str(src), str(tmp_path / "sp"), "--json"))["path"]
    written = SavepointWriter.from_savepoint(sp).write(str(tmp_path / "edited"))
    restored = tmp_path / "restored"
    cli("restore", str(restored), "-s", written.path, "--partitions", "3")
    assert_sources_carried(src, restored)


@pytest.mark.spark
def test_python_data_source_continues_on_the_other_backend_at_3_partitions(spark, tmp_path):
    """The PySpark Python data source fixture (offsets ``{"events":{"0":n,"1":n}}``, opaque to
    statectl) restored to RocksDB at 3 partitions and continued for two batches (its offsets
    now allowed to 36): the rows of batches 4 and 5 of one uninterrupted run."""
    query = partial(fixture_generator().q_pysource, stop=36)
    sp = json.loads(cli("savepoint", str(FIXTURES / "pysource-hdfs"), str(tmp_path), "--json"))
    restored = tmp_path / "restored"
    cli("restore", str(restored), "-s", sp["path"], "--backend", "rocksdb", "--partitions", "3")
    continued: dict[int, list] = {}
    for _ in range(3):  # the third run finds nothing new
        continued.update(run(spark, query, tmp_path / "unused", restored))
    full: dict[int, list] = {}
    for _ in range(7):
        full.update(run(spark, query, tmp_path / "unused", tmp_path / "full"))
    assert sorted(continued) == [4, 5] and sorted(full) == list(range(6))
    assert continued == {b: full[b] for b in (4, 5)}


def restored_source_lines(root: Path, batch: int = 3) -> list[str]:
    return (root / "offsets" / str(batch)).read_text().split("\n")[2:]


DELTA_AT_4 = (
    '{"sourceVersion":1,"reservoirId":"6f1f7ad2-3c5e-4c4b-9d0e-2b7b1c1d5e42",'
    '"reservoirVersion":4,"index":-1,"isStartingVersion":false}'
)


def test_kafka_partition_added_and_kafka_swapped_for_delta(tmp_path):
    """Edits of a Kafka source on restore (CLI, subprocess): a partition added at earliest
    (-2), the offset re-serialised in JsonUtils.partitionOffsets' order and the plan showing
    the old and new position; -1 refused (Spark's readers assert a start is earliest); the
    source swapped for Delta with ``delta:JSON`` (its Kafka sources/ file then not carried);
    a Delta offset without the prefix, and a swap to a file source, refused with the reason."""
    sp = json.loads(cli("savepoint", str(FIXTURES / "kafka-hdfs"), str(tmp_path), "--json"))["path"]
    added = tmp_path / "added"
    given = '0={"events": {"2": -2, "1": 16, "0": 24}}'
    plan = json.loads(cli("restore", str(added), "-s", sp, "--json", "--source-offsets", given))
    (src,) = plan["sources"]
    assert src["old_offset"] == '{"events":{"0":24,"1":16}}'
    assert src["offset"] == '{"events":{"0":24,"1":16,"2":-2}}'
    assert "added events/2 @ earliest" in src["note"]
    assert restored_source_lines(added) == ['{"events":{"0":24,"1":16,"2":-2}}']
    assert (added / "sources" / "0" / "0").read_bytes().startswith(b"\x00v1\n")  # still Kafka

    err = cli_fails(
        "restore", str(tmp_path / "latest"), "-s", sp, "--dry-run",
        "--source-offsets", '0={"events":{"0":24,"1":16,"2":-1}}',
    )  # fmt: skip
    assert "events/2: -1 (latest)" in err and "-2, earliest" in err

    swapped = tmp_path / "delta"
    plan = json.loads(
        cli(
            "restore", str(swapped), "-s", sp, "--json", "--source-offsets", f"0=delta:{DELTA_AT_4}"
        )
    )
    (src,) = plan["sources"]
    assert src["offset"] == DELTA_AT_4 and src["replaces"] == "source 0 (Kafka)"
    assert "swapped for a Delta Lake source" in src["note"]
    assert restored_source_lines(swapped) == [DELTA_AT_4]
    assert not (swapped / "sources").exists()  # Delta writes nothing under sources/
    info = json.loads(cli("inspect", str(swapped), "--json", "--no-rows"))
    assert info["sources"][0]["kind"] == "delta"

    err = cli_fails(
        "restore",
        str(tmp_path / "no"),
        "-s",
        sp,
        "--dry-run",
        "--source-offsets",
        f"0={DELTA_AT_4}",
    )
    assert "not a Kafka offset" in err and f"give it as delta:{DELTA_AT_4}" in err
    err = cli_fails(
        "restore", str(tmp_path / "no"), "-s", sp, "--dry-run", "--source-offsets", "0=file:{}"
    )
    assert "cannot swap to file" in err and "seen-files log" in err


def test_file_source_swapped_for_kafka_and_a_source_dropped(tmp_path):
    """A file backfill handed over to Kafka (``kafka:JSON``: the seen-files log is not
    written); a join's first source dropped without ``--query`` (``0=drop``): refused without
    -n, with -n the second source continues as source 0 with its own seen-files log."""
    sp = json.loads(cli("savepoint", str(FIXTURES / "agg-hdfs"), str(tmp_path / "a"), "--json"))
    kafka = tmp_path / "kafka"
    cli("restore", str(kafka), "-s", sp["path"], "--source-offsets", '0=kafka:{"events":{"0":0}}')
    assert restored_source_lines(kafka) == ['{"events":{"0":0}}']
    assert not (kafka / "sources").exists()

    join = json.loads(cli("savepoint", str(FIXTURES / "join-hdfs"), str(tmp_path / "j"), "--json"))
    err = cli_fails(
        "restore",
        str(tmp_path / "no"),
        "-s",
        join["path"],
        "--dry-run",
        "--source-offsets",
        "0=drop",
    )
    assert "source 0 of the savepoint" in err and "-n" in err
    whole = tmp_path / "whole"
    cli("restore", str(whole), "-s", join["path"])
    dropped = tmp_path / "dropped"
    plan = json.loads(
        cli(
            "restore",
            str(dropped),
            "-s",
            join["path"],
            "-n",
            "--json",
            "--source-offsets",
            "0=drop",
        )
    )
    assert [(s["index"], s["position"], s.get("from")) for s in plan["sources"]] == [
        (0, "kept", 1),
        (None, "dropped", None),
    ]
    assert restored_source_lines(dropped) == ['{"logOffset":3}']
    assert source_files(dropped) == {
        k.replace("1/", "0/", 1): v for k, v in source_files(whole).items() if k.startswith("1/")
    }

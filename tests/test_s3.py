"""Reading a checkpoint from a real S3 endpoint on loopback (moto's server) through s3fs."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from statectl.checkpoint.model import Checkpoint
from statectl.state import Selection, read_state
from tests.helpers.fixtures import FIXTURES, ROOT, drop_crc
from tests.helpers.restore import assert_same_checkpoint, savepoint_contents
from tests.helpers.rows import arrow_rows
from tests.helpers.spark import CLUSTER as SPARK_ENGINE_CLUSTER


@pytest.fixture(scope="module")
def bucket(s3_endpoint):
    import s3fs

    fs = s3fs.S3FileSystem(client_kwargs={"endpoint_url": s3_endpoint["AWS_ENDPOINT_URL"]})
    fs.mkdir("statectl-test")
    for name in ("agg-hdfs", "agg-rocksdb"):
        fs.put(str(FIXTURES / name), f"statectl-test/ckpts/{name}", recursive=True)
    fs.invalidate_cache()
    return "s3://statectl-test/ckpts"


@pytest.mark.parametrize("name", ["agg-hdfs", "agg-rocksdb"])
def test_read_from_s3_equals_local(bucket, name):
    remote = read_state(Checkpoint.open(f"{bucket}/{name}"), Selection(0))
    local = read_state(Checkpoint.open(str(FIXTURES / name)), Selection(0))
    assert remote.num_rows > 0
    assert arrow_rows(remote) == arrow_rows(local)


def test_cli_list_and_export_on_s3(bucket, s3_endpoint, tmp_path):
    env = {**os.environ, **s3_endpoint}
    out = subprocess.run(
        [sys.executable, "-m", "statectl.cli", "list", bucket, "--json"],
        capture_output=True,
        text=True,
        env=env,
        check=True,
    )
    entries = json.loads(out.stdout)
    assert sorted(e["path"].rsplit("/", 1)[-1] for e in entries) == ["agg-hdfs", "agg-rocksdb"]
    target = f"{bucket}/exports/agg.parquet"
    subprocess.run(
        [sys.executable, "-m", "statectl.cli", "export", f"{bucket}/agg-hdfs", "-o", target],
        capture_output=True,
        text=True,
        env=env,
        check=True,
    )
    import pyarrow.parquet as pq
    import s3fs

    fs = s3fs.S3FileSystem(client_kwargs={"endpoint_url": s3_endpoint["AWS_ENDPOINT_URL"]})
    with fs.open(target.removeprefix("s3://"), "rb") as f:
        assert pq.read_table(f).num_rows > 0


def test_savepoint_to_and_from_s3(bucket, s3_endpoint, tmp_path):
    """A savepoint written to S3, then read there: inspect and export work through s3fs."""
    from statectl.savepoints.create import take_savepoint
    from statectl.savepoints.store import Savepoint

    url, meta = take_savepoint(str(FIXTURES / "join-rocksdb"), "s3://statectl-test/savepoints")
    assert url.startswith("s3://statectl-test/savepoints/savepoint-")
    sp = Savepoint.open(url)
    local = read_state(
        Checkpoint.open(str(FIXTURES / "join-rocksdb")), Selection(0, join_side="right")
    )
    assert arrow_rows(sp.read(Selection(0, join_side="right"), 0)) == arrow_rows(local)
    env = {**os.environ, **s3_endpoint}
    info = json.loads(
        subprocess.run(
            [sys.executable, "-m", "statectl.cli", "inspect", url, "--json"],
            capture_output=True,
            text=True,
            env=env,
            check=True,
        ).stdout
    )
    assert info["kind"] == "savepoint" and info["batch"] == meta.batch_id


@pytest.mark.parametrize(
    ("name", "backend"),
    [("join-hdfs", "rocksdb"), ("tws-rocksdb", "rocksdb"), ("agg-rocksdb", "hdfs")],
)
def test_restore_from_and_to_s3(bucket, tmp_path, name, backend):
    """A savepoint on S3 restores to a checkpoint on S3 that reads back like a local one."""
    from statectl.restoration import restore
    from statectl.savepoints.create import take_savepoint
    from statectl.savepoints.store import table_selection

    url, meta = take_savepoint(str(FIXTURES / name), "s3://statectl-test/sp-restore")
    target = f"s3://statectl-test/restored/{name}-{backend}"
    plan = restore(url, target, backend=backend, partitions=3)
    assert not plan.problems
    src, dst = Checkpoint.open(str(FIXTURES / name)), Checkpoint.open(target)
    assert dst.latest_committed_batch == src.latest_committed_batch
    assert dst.backend(dst.latest_committed_batch) == backend
    for op in meta.operators:
        for t in op.tables:
            sel = table_selection(op.operator_id, t)
            a = read_state(dst, sel).drop_columns(["partition_id"])
            b = read_state(src, sel).drop_columns(["partition_id"])
            assert arrow_rows(a) == arrow_rows(b)


# -- storage options: --storage-option and statectl.toml, without AWS_* in the environment ----
def _clean_env() -> dict[str, str]:
    """The environment of a user who configured nothing for AWS: no AWS_*, no FSSPEC_*."""

    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "FSSPEC_"))}
    env["PYTHONPATH"] = str(ROOT)
    return env


def _statectl(
    *args: str, cwd=None, check: bool = True, timeout: float = 120
) -> subprocess.CompletedProcess:
    proc = subprocess.run(
        [sys.executable, "-m", "statectl.cli", *args],
        capture_output=True,
        text=True,
        env=_clean_env(),
        cwd=cwd,
        timeout=timeout,
    )
    if check:
        assert proc.returncode == 0, proc.stderr
    return proc


def _options(s3_endpoint) -> list[str]:
    return [
        "--storage-option",
        f"client_kwargs.endpoint_url={s3_endpoint['AWS_ENDPOINT_URL']}",
        "--storage-option",
        "key=testing",
        "--storage-option",
        "secret=testing",
    ]


def test_storage_option_flags_reach_every_path(bucket, s3_endpoint, tmp_path):
    """inspect, list and export (S3 in, S3 out) with --storage-option only; inspect --json shows
    the effective options with the secrets redacted."""
    opts = _options(s3_endpoint)
    info = json.loads(_statectl(*opts, "inspect", f"{bucket}/agg-hdfs", "--json").stdout)
    assert info["backend"] == "hdfs"
    assert info["storage_options"] == {
        "client_kwargs": {"endpoint_url": s3_endpoint["AWS_ENDPOINT_URL"]},
        "key": "***",
        "secret": "***",
    }
    human = _statectl(*opts, "inspect", f"{bucket}/agg-hdfs", "--no-rows").stdout
    assert '"key": "***"' in human and "testing" not in human
    entries = json.loads(_statectl(*opts, "list", bucket, "--json").stdout)
    assert {e["path"].rsplit("/", 1)[-1] for e in entries} >= {"agg-hdfs", "agg-rocksdb"}
    target = f"{bucket}/exports/by-option.jsonl"
    out = json.loads(
        _statectl(*opts, "export", f"{bucket}/agg-rocksdb", "-o", target, "--json").stdout
    )
    assert out["path"] == target and out["rows"] > 0
    # An existing output names the flag that overwrites, with the URL as the user wrote it.
    again = _statectl(*opts, "export", f"{bucket}/agg-rocksdb", "-o", target, check=False)
    assert again.returncode == 2
    assert f"{target}: already exists; refusing to overwrite" in again.stderr
    assert "--overwrite" in again.stderr


def test_errors_keep_the_url_scheme(bucket, s3_endpoint):
    proc = _statectl(*_options(s3_endpoint), "inspect", f"{bucket}/nope", check=False)
    assert proc.returncode == 2
    assert proc.stderr.startswith(f"statectl: error: {bucket}/nope: "), proc.stderr


def test_without_options_s3_is_not_configured(bucket):
    """The same command without options fails (no credentials, no endpoint): the options above
    are what made it work, not something in the environment."""
    proc = _statectl("inspect", f"{bucket}/agg-hdfs", check=False)
    assert proc.returncode == 2
    (line,) = proc.stderr.strip().splitlines()  # one line naming the URL and what to do
    assert line.startswith(f"statectl: error: {bucket}/agg-hdfs")
    assert "cannot access storage" in line and "--storage-option" in line
    proc = _statectl("inspect", f"{bucket}/agg-hdfs", "--json", check=False)
    error = json.loads(proc.stdout)  # under --json: the same error as one JSON object
    assert proc.returncode == 2 and error["exit_code"] == 2
    assert "cannot access storage" in error["error"] and error["path"].startswith(bucket)


def test_statectl_toml_storage_section(bucket, s3_endpoint, tmp_path):
    """A [storage."s3://bucket/"] section configures every S3 path of savepoint, inspect and
    restore run from the directory holding statectl.toml."""
    (tmp_path / "statectl.toml").write_text(
        '[savepoint]\ndir = "s3://statectl-test/toml-savepoints"\n\n'
        '[storage."s3://statectl-test/"]\n'
        f'endpoint_url = "{s3_endpoint["AWS_ENDPOINT_URL"]}"\n'
        'key = "testing"\nsecret = "testing"\n\n'
        '[storage."s3://other-bucket/"]\nanon = true\n'
    )
    sp = json.loads(_statectl("savepoint", f"{bucket}/agg-rocksdb", "--json", cwd=tmp_path).stdout)
    assert sp["path"].startswith("s3://statectl-test/toml-savepoints/savepoint-")
    info = json.loads(_statectl("inspect", sp["path"], "--json", cwd=tmp_path).stdout)
    assert info["kind"] == "savepoint"
    assert info["storage_options"] == {
        "endpoint_url": s3_endpoint["AWS_ENDPOINT_URL"],
        "key": "***",
        "secret": "***",
    }
    target = "s3://statectl-test/toml-restored/agg"
    _statectl("restore", target, "-s", sp["path"], "--backend", "hdfs", cwd=tmp_path)
    restored = read_state(Checkpoint.open(target), Selection(0)).drop_columns(["partition_id"])
    local = read_state(Checkpoint.open(str(FIXTURES / "agg-rocksdb")), Selection(0))
    assert arrow_rows(restored) == arrow_rows(local.drop_columns(["partition_id"]))
    # Command-line options merge over the file's (and win where both set a key).
    info = json.loads(
        _statectl(
            "--storage-option",
            "use_ssl=false",
            "--storage-option",
            "key=other",
            "inspect",
            sp["path"],
            "--json",
            cwd=tmp_path,
        ).stdout
    )
    assert info["storage_options"]["use_ssl"] is False
    assert info["storage_options"]["endpoint_url"] == s3_endpoint["AWS_ENDPOINT_URL"]


def test_relabel_on_s3_and_across_filesystems(bucket, tmp_path):
    """relabel copies server-side on S3 and through statectl from local to S3; the source
    savepoints are unchanged and the copies read the same state under the new uid."""
    from statectl.savepoints.create import take_savepoint
    from statectl.savepoints.relabel import relabel
    from statectl.savepoints.store import Savepoint

    local_url, meta = take_savepoint(str(FIXTURES / "agg-hdfs"), str(tmp_path))
    s3_url, _ = take_savepoint(str(FIXTURES / "agg-hdfs"), "s3://statectl-test/sp-relabel")
    (uid,) = [op.uid for op in meta.operators]
    for src, target in ((s3_url, None), (local_url, "s3://statectl-test/sp-relabel-copy")):
        out = relabel(src, {uid: "totals"}, target)
        assert out["path"].startswith("s3://statectl-test/sp-relabel")
        new, old = Savepoint.open(out["path"]), Savepoint.open(src)
        assert [op.uid for op in old.metadata.operators] == [uid]
        paths = [f.path for op in new.metadata.operators for t in op.tables for f in t.files]
        assert paths and all(p.startswith("operators/totals/") for p in paths)
        assert arrow_rows(new.read(Selection(), "totals")) == arrow_rows(old.read(Selection(), uid))


def test_checksums_are_verified_on_s3(bucket, s3_endpoint, fixture_copy):
    """Spark's CRC32C checksum files are checked through s3fs too (and sidecars, when copied)."""
    import s3fs

    from statectl.errors import CorruptFileError

    ck = fixture_copy("agg-ckptv2-rocksdb-changelog")
    log = max((ck / "state/0/0").glob("*.changelog"), key=lambda p: int(p.name.split("_")[0]))
    data = bytearray(log.read_bytes())
    data[-10] ^= 0x40
    log.write_bytes(bytes(data))
    (log.parent / f".{log.name}.crc").unlink()
    fs = s3fs.S3FileSystem(client_kwargs={"endpoint_url": s3_endpoint["AWS_ENDPOINT_URL"]})
    fs.put(str(ck), "statectl-test/damaged/ckptv2", recursive=True)
    fs.invalidate_cache()
    with pytest.raises(CorruptFileError, match=rf"{log.name}: does not match its checksum"):
        read_state(Checkpoint.open("s3://statectl-test/damaged/ckptv2"), Selection(0))


def test_restore_on_s3_with_parallel_transfers(bucket, tmp_path, monkeypatch):
    """A restore from S3 to S3 on 3 workers (threads: concurrent transfers) under a tiny
    budget writes what a local in-memory restore writes, file for file."""
    import threading
    import time

    from statectl.io import FileIO
    from statectl.restoration import restore
    from statectl.savepoints.create import take_savepoint

    local_sp, _ = take_savepoint(str(FIXTURES / "join-hdfs"), str(tmp_path / "sp"))
    expected = tmp_path / "expected"
    restore(local_sp, str(expected), backend="rocksdb", partitions=5, workers=1)

    lock, in_flight, most = threading.Lock(), [0], [0]
    real = FileIO.write_atomic

    def counting(self, path, data, **kw):
        with lock:
            in_flight[0] += 1
            most[0] = max(most[0], in_flight[0])
        try:
            if self.protocol != "file":
                time.sleep(0.05)  # long enough for transfers to overlap if they can
            return real(self, path, data, **kw)
        finally:
            with lock:
                in_flight[0] -= 1

    monkeypatch.setattr(FileIO, "write_atomic", counting)
    url, _ = take_savepoint(str(FIXTURES / "join-hdfs"), "s3://statectl-test/sp-parallel")
    target = "s3://statectl-test/restored-parallel/join"
    restore(url, target, backend="rocksdb", partitions=5, memory=600, workers=3)
    assert most[0] >= 2
    io, root = FileIO.for_url(target)
    io.fs.get(root, str(tmp_path / "got"), recursive=True)
    (tmp_path / "dbs").mkdir()
    assert_same_checkpoint(expected, tmp_path / "got", tmp_path / "dbs")


# -- the Spark engine on S3: executors open the bucket with the options the driver was given ---
# A local cluster: a master, two workers and their executors in processes of their own, started
# from the CLI's environment, which has no AWS_*; so the storage options reach the executors
# only inside the tasks (the pickled FileIO carries its filesystem's options), as on a real
# cluster whose executors share nothing with the driver's machine.
CLUSTER = ["--engine", "spark", *SPARK_ENGINE_CLUSTER]
MULTI = "multi-hdfs"  # two operators (aggregation, deduplication) on HDFS, 2 partitions
# Not under the bucket fixture's ckpts/: test_cli_list_and_export_on_s3 lists exactly those.
CLUSTER_CKPT = f"s3://statectl-test/cluster-ckpts/{MULTI}"


def _download_savepoint(url: str, local) -> tuple[dict, dict[str, str]]:
    """An S3 savepoint's _metadata (without what differs between runs) and its data files'
    sha256, from a local copy."""
    from statectl.io import FileIO

    io, root = FileIO.for_url(url)
    io.fs.get(root, str(local), recursive=True)
    return savepoint_contents(str(local))


@pytest.fixture(scope="module")
def cluster_savepoint(bucket, s3_endpoint) -> str:
    """``statectl savepoint --engine spark`` of multi-hdfs on S3, run on a local cluster, the
    bucket configured by --storage-option only; its savepoint URL (on S3). Module-scoped: the
    cluster's start is most of its 20-40 s."""
    import s3fs

    fs = s3fs.S3FileSystem(client_kwargs={"endpoint_url": s3_endpoint["AWS_ENDPOINT_URL"]})
    fs.put(str(FIXTURES / MULTI), CLUSTER_CKPT.removeprefix("s3://"), recursive=True)
    fs.invalidate_cache()
    proc = _statectl(
        *_options(s3_endpoint),
        "savepoint",
        CLUSTER_CKPT,
        "s3://statectl-test/sp-cluster",
        "--json",
        *CLUSTER,
        timeout=600,
    )
    out = json.loads(proc.stdout)
    assert out["engine"] == "spark"
    assert out["path"].startswith("s3://statectl-test/sp-cluster/savepoint-")
    return out["path"]


@pytest.mark.spark
def test_spark_engine_savepoint_on_s3_equals_local(cluster_savepoint, tmp_path):
    """The executors read the checkpoint from S3 and write the data files there: every
    operator's tables read the rows the local engine's savepoint of the same checkpoint reads,
    from the same files (byte for byte) under the same _metadata."""
    from statectl.savepoints.create import take_savepoint
    from statectl.savepoints.store import Savepoint, table_selection

    local_url, _ = take_savepoint(CLUSTER_CKPT, "s3://statectl-test/sp-cluster-local")
    on_spark, local = Savepoint.open(cluster_savepoint), Savepoint.open(local_url)
    ops = local.metadata.operators
    assert [op.uid for op in on_spark.metadata.operators] == [op.uid for op in ops]
    assert len(ops) == 2
    for op in ops:
        for t in op.tables:
            sel = table_selection(op.operator_id, t)
            rows = arrow_rows(local.read(sel, op.uid))
            assert rows, (op.uid, t.name)
            assert arrow_rows(on_spark.read(sel, op.uid)) == rows, (op.uid, t.name)
    assert _download_savepoint(cluster_savepoint, tmp_path / "spark") == _download_savepoint(
        local_url, tmp_path / "local"
    )


@pytest.mark.spark
def test_spark_engine_restore_on_s3_equals_local(s3_endpoint, cluster_savepoint, tmp_path):
    """``statectl restore --engine spark`` of the cluster's S3 savepoint to a new S3 target at 3
    partitions (the checkpoint has 2) on RocksDB (it is HDFS), the bucket configured by
    statectl.toml only (in the driver's directory: the executors have none), equals the local
    engine's restore: the same rows in the same partitions, the same files."""
    from statectl.io import FileIO
    from statectl.restoration import restore
    from statectl.savepoints.store import Savepoint, table_selection

    (tmp_path / "statectl.toml").write_text(
        '[storage."s3://statectl-test/"]\n'
        f'endpoint_url = "{s3_endpoint["AWS_ENDPOINT_URL"]}"\n'
        'key = "testing"\nsecret = "testing"\n'
    )
    target = "s3://statectl-test/restored-cluster/multi"
    argv = ["--backend", "rocksdb", "--partitions", "3"]
    proc = _statectl(
        "restore",
        target,
        "-s",
        cluster_savepoint,
        *argv,
        "--json",
        *CLUSTER,
        cwd=tmp_path,
        timeout=600,
    )
    out = json.loads(proc.stdout)
    assert out["engine"] == "spark" and out["ok"] and out["partitions"] == 3
    local = tmp_path / "local"
    restore(cluster_savepoint, str(local), backend="rocksdb", partitions=3)

    on_spark, expected = Checkpoint.open(target), Checkpoint.open(str(local))
    batch = expected.latest_committed_batch
    assert on_spark.latest_committed_batch == batch
    assert on_spark.backend(batch) == "rocksdb" and on_spark.num_partitions(batch) == 3
    placed = set()
    for op in Savepoint.open(cluster_savepoint).metadata.operators:
        for t in op.tables:
            sel = table_selection(op.operator_id, t)
            rows = read_state(expected, sel)  # with partition_id: placement must match too
            assert rows.num_rows > 0, (op.uid, t.name)
            assert arrow_rows(read_state(on_spark, sel)) == arrow_rows(rows), (op.uid, t.name)
            placed |= set(rows.column("partition_id").to_pylist())
    assert placed == {0, 1, 2}
    io, root = FileIO.for_url(target)
    io.fs.get(root, str(tmp_path / "spark"), recursive=True)
    (tmp_path / "dbs").mkdir()
    assert_same_checkpoint(local, tmp_path / "spark", tmp_path / "dbs")


@pytest.mark.spark
def test_spark_engine_errors_name_the_s3_url(bucket, s3_endpoint, spark, fixture_copy):
    """A damaged file that an executor reads fails the run as it fails on the local engine: the
    same class, message and path, with the s3:// URL the user gave (an executor only has s3fs's
    form of the path, "bucket/key"), for savepoint's tasks and restore's spill stage alike."""
    import s3fs

    import statectl
    from statectl.errors import CorruptFileError
    from statectl.io import storage_options
    from statectl.savepoints.store import Savepoint

    endpoint = s3_endpoint["AWS_ENDPOINT_URL"]
    fs = s3fs.S3FileSystem(client_kwargs={"endpoint_url": endpoint})
    ck = fixture_copy("agg-hdfs")
    delta = max((ck / "state/0/1").glob("*.delta"), key=lambda p: int(p.stem))
    delta.write_bytes(delta.read_bytes()[:-7])
    drop_crc(delta)
    fs.put(str(ck), "statectl-test/damaged-spark/agg-hdfs", recursive=True)
    src = "s3://statectl-test/damaged-spark/agg-hdfs"
    # The session's executors were started without this module's AWS_* environment: the options
    # reach them with the tasks.
    options = {"endpoint_url": endpoint, "key": "testing", "secret": "testing"}

    def failures(run) -> tuple[CorruptFileError, CorruptFileError]:
        with storage_options(options):
            with pytest.raises(CorruptFileError) as local:
                run()
            with pytest.raises(CorruptFileError) as on_spark:
                run(engine="spark", spark=spark)
        return local.value, on_spark.value

    local, on_spark = failures(lambda **kw: statectl.savepoint(src, "s3://statectl-test/x", **kw))
    assert local.path == f"{src}/state/0/1/{delta.name}"
    assert (str(on_spark), on_spark.path) == (str(local), local.path)

    with storage_options(options):
        url = statectl.savepoint(f"{bucket}/agg-hdfs", "s3://statectl-test/sp-damaged").path
        sp = Savepoint.open(url)
    data = f"{url}/{sp.metadata.operators[0].tables[0].files[0].path}"
    damaged = bytearray(fs.cat_file(data.removeprefix("s3://")))
    damaged[len(damaged) // 2] ^= 0xFF  # the same size, other bytes: the sha256 tells
    fs.pipe_file(data.removeprefix("s3://"), bytes(damaged))
    targets = iter(
        ("s3://statectl-test/restored-damaged/a", "s3://statectl-test/restored-damaged/b")
    )
    local, on_spark = failures(
        lambda **kw: statectl.restore(url, next(targets), backend="rocksdb", partitions=3, **kw)
    )
    assert local.path == data and "sha256 differs" in str(local)
    assert (str(on_spark), on_spark.path) == (str(local), local.path)

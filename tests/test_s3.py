"""Reading a checkpoint from a real S3 endpoint on loopback (moto's server) through s3fs."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import pytest

from statectl.checkpoint.model import Checkpoint
from statectl.state import Selection, read_state
from tests.conftest import FIXTURES, arrow_rows


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def s3_endpoint():
    moto_server = pytest.importorskip("moto.server")
    port = _free_port()
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=port)
    server.start()
    env = {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}",
    }
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        yield env
    finally:
        server.stop()
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


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
    from statectl.restore import restore
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

"""The checkpoint model on real Spark-written fixtures, and its errors on damaged copies."""

from __future__ import annotations

import pytest

from statectl.checkpoint.logs import parse_commit, parse_offset_seq
from statectl.checkpoint.model import Checkpoint
from statectl.checkpoint.state_metadata import (
    ColumnFamilySchema,
    parse_schema_file,
    write_schema_file_v2,
    write_schema_file_v3,
)
from statectl.errors import CorruptFileError, NotACheckpointError, StatectlError, UnsupportedError
from tests.helpers.fixtures import FIXTURES
from tests.helpers.rows import arrow_rows


def test_agg_checkpoint_model():
    ckpt = Checkpoint.open(str(FIXTURES / "agg-hdfs"))
    assert ckpt.query_id and len(ckpt.query_id) == 36
    last = ckpt.latest_committed_batch
    assert last is not None and last >= 2
    assert ckpt.offset_batches[-1] == last
    assert ckpt.backend(last) == "hdfs"
    assert ckpt.num_partitions(last) == 2
    assert ckpt.checkpoint_format_version(last) == 1
    (op,) = ckpt.operators(last)
    assert op.name == "stateStoreSave"
    assert op.store_names == ["default"]
    assert '"name":"count"' in op.schemas[0].value_schema


def test_rocksdb_backend_is_read_from_pinned_conf():
    ckpt = Checkpoint.open(str(FIXTURES / "agg-rocksdb"))
    assert ckpt.backend(ckpt.latest_committed_batch) == "rocksdb"


def test_uncommitted_last_batch_is_not_latest():
    ckpt = Checkpoint.open(str(FIXTURES / "agg-uncommitted-hdfs"))
    assert ckpt.uncommitted_batches == [ckpt.offset_batches[-1]]
    assert ckpt.latest_committed_batch == ckpt.offset_batches[-1] - 1


def test_offset_log_versions():
    v1 = parse_offset_seq(
        'v1\n{"batchWatermarkMs":5,"batchTimestampMs":7,"conf":{"a":"b"}}\n{"logOffset":3}\n-',
        3,
        "x",
    )
    assert v1.batch_watermark_ms == 5 and v1.conf == {"a": "b"}
    assert v1.offsets == {"0": '{"logOffset":3}', "1": None}
    v2 = parse_offset_seq('v2\n{"batchWatermarkMs":0,"batchTimestampMs":1}\nsrc1:{"x":1}', 0, "x")
    assert v2.offsets == {"src1": '{"x":1}'}
    with pytest.raises(UnsupportedError, match="newer than statectl supports"):
        parse_offset_seq("v3\n{}", 0, "offsets/0")
    with pytest.raises(CorruptFileError, match="offsets/0"):
        parse_offset_seq("", 0, "offsets/0")


def test_commit_log_versions():
    c = parse_commit(
        'v2\n{"nextBatchWatermarkMs":9,"stateUniqueIds":{"0":[["u1"],["u2"]]}}', 1, "c"
    )
    assert c.next_batch_watermark_ms == 9 and c.state_unique_ids == {"0": [["u1"], ["u2"]]}
    assert parse_commit("v1", 0, "c").next_batch_watermark_ms == 0
    with pytest.raises(UnsupportedError):
        parse_commit("v4\n{}", 0, "c")


def test_schema_files_round_trip():
    key = '{"type":"struct","fields":[{"name":"k","type":"string","nullable":true,"metadata":{}}]}'
    value = '{"type":"struct","fields":[{"name":"c","type":"long","nullable":true,"metadata":{}}]}'
    version, (cf,) = parse_schema_file(write_schema_file_v2(key, value), "s")
    assert version == 2 and (cf.key_schema, cf.value_schema) == (key, value)
    fams = [
        ColumnFamilySchema(
            "mp",
            key,
            value,
            0,
            0,
            {"keyStateEncoderType": "PrefixKeyScanStateEncoderSpec", "numColsPrefixKey": 1},
            value,
        ),
        ColumnFamilySchema("cnt", key, value),
    ]
    version, back = parse_schema_file(write_schema_file_v3(fams), "s")
    assert version == 3 and back == fams


def test_spark_schema_file_bytes_round_trip():
    """Our v2 writer reproduces the schema file Spark wrote, byte for byte."""
    path = FIXTURES / "agg-hdfs" / "state" / "0" / "0" / "_metadata" / "schema"
    data = path.read_bytes()
    _, (cf,) = parse_schema_file(data, str(path))
    assert write_schema_file_v2(cf.key_schema, cf.value_schema) == data


def test_not_a_checkpoint(tmp_path):
    with pytest.raises(NotACheckpointError, match="no such directory"):
        Checkpoint.open(str(tmp_path / "missing"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(NotACheckpointError, match="not a Spark streaming checkpoint"):
        Checkpoint.open(str(tmp_path / "empty"))


def test_batch_that_is_not_committed(fixture_copy):
    ckpt = Checkpoint.open(str(fixture_copy("agg-hdfs")))
    with pytest.raises(StatectlError, match="not a committed batch"):
        ckpt.resolve_batch(999)


def test_spark_v3_schema_file_bytes_round_trip():
    """transformWithState's schema v3 file, rewritten by us, is byte-identical to Spark's."""
    (path,) = (FIXTURES / "tws-rocksdb" / "state" / "0" / "_stateSchema" / "default").glob(
        "0_*[!c]"
    )
    data = path.read_bytes()
    version, families = parse_schema_file(data, str(path))
    assert version == 3
    assert {f.name for f in families} >= {"cnt", "lst", "mp", "$rowCounter_lst"}
    assert write_schema_file_v3(families) == data


def test_transform_with_state_operator():
    ckpt = Checkpoint.open(str(FIXTURES / "tws-rocksdb"))
    op = ckpt.operator(0, ckpt.latest_committed_batch)
    assert op.uses_column_families and op.metadata_version == 2
    assert op.name == "transformWithStateInPandasExec"
    assert op.schema("mp").num_cols_prefix_key == 1
    assert {v["stateName"] for v in op.properties["stateVariables"]} >= {"cnt", "lst", "mp"}


def test_memory_filesystem_url():
    """Every path goes through fsspec: a checkpoint in memory:// reads like the local one."""
    import fsspec

    from statectl.state import Selection, read_state

    fs = fsspec.filesystem("memory")
    fs.put(str(FIXTURES / "join-rocksdb"), "/statectl-test/join-rocksdb", recursive=True)
    remote = Checkpoint.open("memory://statectl-test/join-rocksdb")
    local = Checkpoint.open(str(FIXTURES / "join-rocksdb"))
    assert remote.latest_committed_batch == local.latest_committed_batch
    for side in ("left", "right"):
        sel = Selection(0, join_side=side)
        assert arrow_rows(read_state(remote, sel)) == arrow_rows(read_state(local, sel))

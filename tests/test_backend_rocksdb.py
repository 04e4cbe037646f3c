"""The RocksDB backend (statectl/backends/rocksdb.py) against the backend conformance suite."""

from __future__ import annotations

from tests.helpers.backend_conformance import BackendTests


class TestRocksDBBackend(BackendTests):
    backend_name = "rocksdb"
    increment_suffix = "changelog"
    # Zip+SST snapshots, changelogs, checkpoint format 2, row checksums and column families
    # (transformWithState), all written by Spark.
    spark_fixtures = (
        "agg-rocksdb",
        "agg-rocksdb-changelog",
        "agg-ckptv2-rocksdb",
        "agg-ckptv2-rocksdb-changelog",
        "agg-rowchecksum-rocksdb-changelog",
        "tws-rocksdb",
    )

"""The HDFS backend (statectl/backends/hdfs.py) against the backend conformance suite."""

from __future__ import annotations

from tests.helpers.backend_conformance import BackendTests


class TestHdfsBackend(BackendTests):
    backend_name = "hdfs"
    increment_suffix = "delta"
    # Snapshots and deltas, another codec, and row checksums (Spark 4.1+), all by Spark.
    spark_fixtures = ("agg-hdfs", "agg-snapshots-hdfs", "agg-zstd-hdfs", "agg-rowchecksum-hdfs")

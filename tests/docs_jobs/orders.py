"""The query the docs' ``--query jobs/orders.py:build`` examples name: the bundled multi-hdfs
fixture's query (dropDuplicates(id, k), then a count per k). tests/test_docs.py copies this file
to ``jobs/orders.py`` in the directory the commands run in; events are read from ``./input``."""

from __future__ import annotations

import os


def build(spark):
    return (
        spark.readStream.schema("id long, k string, v long, ts timestamp")
        .option("maxFilesPerTrigger", 1)
        .json(os.path.abspath("input"))
        .dropDuplicates(["id", "k"])
        .groupBy("k")
        .count()
    )

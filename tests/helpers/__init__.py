"""Plain helpers shared by the test modules (no fixtures: those live in tests/conftest.py).

Test modules import from here, never from each other:

- ``fixtures``: where the bundled checkpoints are, the manifest, the rows Spark recorded;
- ``reads``: one recorded read of a fixture as a statectl Selection, and exported;
- ``rows``: comparing Arrow tables with Spark rows by position;
- ``spark``: the streaming queries the Spark tests run and the runner that collects their output;
- ``restore``: checking a restored query continued exactly once, comparing checkpoints and
  savepoints, crafting savepoints;
- ``cli``: running ``statectl`` in a subprocess and checking its one-line errors;
- ``s3``: a moto S3 server on loopback;
- ``changelog``: writing RocksDB changelog files as Spark's writers do;
- ``unsaferow``: UnsafeRows written from Python values, one row at a time.
"""

"""What every state store backend must do, as one base class of tests (in the style of
zarr-python's ``zarr.testing.store.StoreTests``).

A backend's test module subclasses :class:`BackendTests`, names the backend and the Spark-written
fixtures to read, and inherits every case: identity and the registry; write then read for every
layout it has (and checkpoint format 2 where capable); an empty partition; a missing increment;
checksum verification; the entry codec's round trip; a streamed write equal to a whole one; a
chunked read equal to a whole one; and reads of real Spark checkpoints compared with what
Spark's own reader returned (fixtures/spark-rows). Real files, real RocksDB, no mocks.
"""

from __future__ import annotations

import json
import re
import zipfile
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from statectl.backends import (
    Backend,
    ReadOptions,
    WriteOptions,
    all_backends,
    backend_for_provider,
    get_backend,
)
from statectl.backends.replay import bounded_replay
from statectl.checkpoint.model import Checkpoint, store_dir
from statectl.checksums import spark_checksum_file, spark_crc_path
from statectl.errors import MissingFileError, StatectlError
from statectl.io import FileIO
from statectl.state import StoreEncoding, read_state
from tests.helpers.fixtures import FIXTURES, load_manifest, recorded_read
from tests.helpers.reads import selection
from tests.helpers.rows import arrow_rows

_UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
CODECS = ("lz4", "zstd", "snappy", "lzf")
_binaries = st.lists(st.binary(max_size=40), max_size=30)
LOCAL = FileIO.for_url("/")[0]  # the local filesystem: every path here is absolute


def _binary(items: list[bytes]) -> pa.LargeBinaryArray:
    return pa.array(items, type=pa.large_binary())


def _entries(n: int, seed: int = 0) -> tuple[list[bytes], list[bytes]]:
    """``n`` distinct row keys and their values (arbitrary bytes, as a backend sees them)."""
    rng = np.random.default_rng(seed)
    keys = [b"k%06d" % i + rng.bytes(int(rng.integers(0, 24))) for i in range(n)]
    values = [rng.bytes(int(rng.integers(0, 64))) for _ in range(n)]
    return keys, values


def _pairs(keys: pa.Array, values: pa.Array) -> list[tuple[bytes, bytes]]:
    return sorted(zip(keys.to_pylist(), values.to_pylist(), strict=True))


class BackendTests:
    """Subclass with ``backend_name`` (and ``increment_suffix``, ``spark_fixtures``)."""

    backend_name: ClassVar[str]
    increment_suffix: ClassVar[str]  # the file a version after a snapshot needs: "delta"
    # Spark-written checkpoints of this backend whose reads fixtures/spark-rows records.
    spark_fixtures: ClassVar[tuple[str, ...]] = ()

    # -- helpers ---------------------------------------------------------------------------
    @property
    def backend(self) -> Backend:
        return get_backend(self.backend_name)

    def formats(self) -> list[tuple[str, bool]]:
        """(layout, checkpoint format 2) for every layout, format 2 where capable."""
        caps = self.backend.capabilities
        out = [(layout, False) for layout in caps.layouts]
        if caps.checkpoint_format_2:
            out += [(layout, True) for layout in caps.sorted_layouts]
        return out

    def rows(self, keys: list[bytes], values: list[bytes]) -> tuple[pa.Array, pa.Array]:
        """Row bytes as this backend stores them (its entry codec's envelope)."""
        return self.backend.entry_codec().encode(_binary(keys), _binary(values))

    def write(
        self, root: Path, layout: str, v2: bool, n: int, *, version: int = 3, codec: str = "lz4"
    ) -> tuple[str, ReadOptions, tuple[pa.Array, pa.Array]]:
        directory = str(root / "store")
        keys, values = self.rows(*_entries(n))
        uid = self.backend.write(
            LOCAL,
            directory,
            WriteOptions(layout, version, codec, unique_ids=v2),
            keys,
            values,
        )
        assert (uid is not None) == v2
        return directory, ReadOptions(codec=codec, unique_id=uid), (keys, values)

    # -- identity --------------------------------------------------------------------------
    def test_registry_knows_it(self):
        backend = self.backend
        assert backend.name == self.backend_name
        assert backend in all_backends()
        for cls in backend.provider_classes:
            assert backend.recognises(cls)
            assert backend_for_provider(cls) is backend
        others = [b for b in all_backends() if b is not backend]
        assert not any(b.recognises(c) for b in others for c in backend.provider_classes)

    def test_capabilities_are_consistent(self):
        caps = self.backend.capabilities
        assert caps.layouts and len(set(caps.layouts)) == len(caps.layouts)
        assert set(caps.sorted_layouts) <= set(caps.layouts)
        assert all(caps.layout(layout) == layout for layout in caps.layouts)
        assert caps.layout("no such layout") == caps.layouts[0]
        assert self.backend.title and self.backend.title.lower() == self.backend.name

    # -- write, then read ------------------------------------------------------------------
    @pytest.mark.parametrize("codec", CODECS)
    def test_write_then_read_every_layout(self, tmp_path, codec):
        for i, (layout, v2) in enumerate(self.formats()):
            root = tmp_path / f"{i}"
            directory, opts, (keys, values) = self.write(root, layout, v2, 300, codec=codec)
            io = LOCAL
            state = self.backend.load(io, directory, 3, opts)
            assert _pairs(state.keys, state.values) == _pairs(keys, values), (layout, v2)
            assert 3 in self.backend.versions(io, directory)
            files = self.backend.files_for_version(io, directory, 3, opts)
            assert files and all(io.exists(f) for f in files)
            name = files[-1].rsplit("/", 1)[-1]
            assert self.backend.owns_file(name)
            assert self.backend.check(io, directory, 3, opts) == []
            copies = self.backend.copy_files(io, directory, 3, opts)
            assert set(files) <= set(copies) and all(io.exists(f) for f in copies)
            # A copy of the files (a native savepoint) loads as the original does.
            self.assert_copy_loads(copies, directory, root / "copy", opts, state)

    def assert_copy_loads(
        self, copies: list[str], directory: str, target: Path, opts: ReadOptions, state: Any
    ) -> None:
        for f in copies:
            dst = target / Path(f).relative_to(directory)
            dst.parent.mkdir(parents=True, exist_ok=True)
            dst.write_bytes(Path(f).read_bytes())
        copied = self.backend.load(LOCAL, str(target), 3, opts)
        assert copied.keys.to_pylist() == state.keys.to_pylist()
        assert copied.values.to_pylist() == state.values.to_pylist()

    def test_empty_partition(self, tmp_path):
        for i, (layout, v2) in enumerate(self.formats()):
            directory, opts, _ = self.write(tmp_path / f"{i}", layout, v2, 0)
            io = LOCAL
            assert len(self.backend.load(io, directory, 3, opts)) == 0
            chunks = self.backend.events(io, directory, 3, opts, max_bytes=1 << 10).chunks()
            assert sum(len(c) for c in chunks) == 0
        io = LOCAL
        assert len(self.backend.load(io, str(tmp_path), 0, ReadOptions())) == 0

    def test_missing_increment_is_a_clean_error(self, tmp_path):
        layout = self.backend.capabilities.layouts[0]
        directory, opts, _ = self.write(tmp_path, layout, False, 10, version=1)
        io = LOCAL
        with pytest.raises(MissingFileError) as e:
            self.backend.load(io, directory, 2, opts)
        assert f"2.{self.increment_suffix}" in str(e.value)
        assert e.value.path is not None and "store" in e.value.path
        problems = self.backend.check(io, directory, 2, opts)
        assert len(problems) == 1 and f"2.{self.increment_suffix}" in problems[0]
        # The cheap health check (list, inspect) finds it from the names alone.
        missing = self.backend.missing_files(io, directory, 2, column_families=False)
        assert len(missing) == 1 and f"2.{self.increment_suffix}" in missing[0]
        assert self.backend.missing_files(io, directory, 1, column_families=False) == []

    def test_flipped_byte_under_a_checksum_is_refused(self, tmp_path):
        for i, (layout, v2) in enumerate(self.formats()):
            directory, opts, _ = self.write(tmp_path / f"{i}", layout, v2, 50)
            io = LOCAL
            path = Path(self.backend.files_for_version(io, directory, 3, opts)[-1])
            data = path.read_bytes()
            sidecar = Path(spark_crc_path(str(path)))
            if not sidecar.exists():  # the writer keeps none here: Spark 4.1+ may
                sidecar.write_bytes(spark_checksum_file(data, 0))
            assert self.backend.check(io, directory, 3, opts) == []
            flipped = bytearray(data)
            flipped[len(flipped) // 2] ^= 0x01
            path.write_bytes(bytes(flipped))
            with pytest.raises(StatectlError) as e:
                self.backend.load(io, directory, 3, opts)
            assert path.name in str(e.value)
            assert self.backend.check(io, directory, 3, opts)

    # -- the entry codec -------------------------------------------------------------------
    @settings(
        max_examples=60,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.differing_executors],
    )
    @given(data=st.data(), keys=_binaries)
    def test_entry_codec_round_trip(self, data, keys):
        caps = self.backend.capabilities
        values = data.draw(st.lists(st.binary(max_size=40), min_size=len(keys), max_size=len(keys)))
        cf_id = data.draw(st.none() | st.integers(-(1 << 15), (1 << 15) - 1))
        cf_id = cf_id if caps.column_families else None
        checksum = caps.row_checksums and data.draw(st.booleans())
        key_version = data.draw(st.booleans())
        codec = self.backend.entry_codec(
            cf_id=cf_id, row_checksum=checksum, key_version=key_version
        )
        sums = np.array(
            data.draw(
                st.lists(
                    st.integers(-(1 << 31), (1 << 31) - 1), min_size=len(keys), max_size=len(keys)
                )
            ),
            dtype=np.int32,
        )
        ek, ev = codec.encode(_binary(keys), _binary(values), sums if checksum else None)
        back = codec.decode(ek, ev)
        assert back.keys.to_pylist() == keys and back.values.to_pylist() == values
        assert (back.checksums is None) == (not checksum)
        if checksum:
            assert back.checksums.tolist() == sums.tolist()
        again = codec.encode(back.keys, back.values, back.checksums)
        assert again[0].to_pylist() == ek.to_pylist() and again[1].to_pylist() == ev.to_pylist()

    # -- streamed writes and chunked reads -------------------------------------------------
    @pytest.mark.parametrize("codec", CODECS)
    def test_streamed_write_equals_whole_write(self, tmp_path, codec):
        keys, values = self.rows(*_entries(2000, seed=1))
        table = pa.table({"key": keys, "value": values})
        batches = table.to_batches(max_chunksize=97)  # many batches, a run per few of them
        for i, (layout, v2) in enumerate(self.formats()):
            opts = WriteOptions(layout, 4, codec, unique_ids=v2)
            whole, streamed = tmp_path / f"{i}w", tmp_path / f"{i}s"
            scratch = tmp_path / f"{i}scratch"
            scratch.mkdir()
            io = LOCAL
            uw = self.backend.write(io, str(whole), opts, keys, values)
            us = self.backend.write_streamed(
                io, str(streamed), opts, lambda: iter(batches), str(scratch), 1 << 14
            )
            self.assert_same_files(whole, streamed, ReadOptions(codec, uw), ReadOptions(codec, us))

    def assert_same_files(self, a: Path, b: Path, oa: ReadOptions, ob: ReadOptions) -> None:
        """The same file names (unique ids masked) and bytes; a RocksDB zip by its entries and
        metadata (its SSTs record creation times)."""

        def files(root: Path) -> dict[str, Path]:
            return {
                _UUID.sub("U", str(p.relative_to(root))): p
                for p in root.rglob("*")
                if p.is_file() and not p.name.endswith(".sst")
            }

        fa, fb = files(a), files(b)
        assert sorted(fa) == sorted(fb)
        for rel, pa_ in fa.items():
            if rel.endswith(".zip"):
                ma, mb = (_zip_metadata(p) for p in (pa_, fb[rel]))
                assert ma == mb, rel
            elif not rel.endswith(".crc"):  # a checksum of a zip: each matches its own
                assert pa_.read_bytes() == fb[rel].read_bytes(), rel
        io = LOCAL
        version = max(self.backend.versions(io, str(a)))
        sa = self.backend.load(io, str(a), version, oa)
        sb = self.backend.load(io, str(b), version, ob)
        assert sa.keys.to_pylist() == sb.keys.to_pylist()
        assert sa.values.to_pylist() == sb.values.to_pylist()
        assert self.backend.check(io, str(b), version, ob) == []

    # -- Spark's own checkpoints -----------------------------------------------------------
    def fixture_reads(self) -> list[tuple[dict[str, Any], dict[str, Any]]]:
        manifest = {fx["name"]: fx for fx in load_manifest()}
        return [(manifest[n], r) for n in self.spark_fixtures for r in manifest[n]["reads"]]

    def test_spark_fixtures_read_as_spark_recorded(self):
        assert self.spark_fixtures, "name at least one Spark-written fixture"
        for fx, read in self.fixture_reads():
            path = str(FIXTURES / fx["name"])
            ckpt = Checkpoint.open(path)
            batch = ckpt.latest_committed_batch
            assert batch is not None
            assert ckpt.store_backend(batch) is self.backend
            sel = selection(read)
            ours = json.loads(json.dumps(arrow_rows(read_state(ckpt, sel))))
            assert ours == recorded_read(fx, read)["rows"], fx["name"]

    def test_spark_fixtures_load_whole_and_chunked_alike(self, tmp_path):
        for name in self.spark_fixtures:
            ckpt = Checkpoint.open(str(FIXTURES / name))
            batch = ckpt.latest_committed_batch
            assert batch is not None
            enc = StoreEncoding.of(ckpt, batch)
            for op in ckpt.operators(batch):
                for store in op.store_names:
                    for p in range(op.num_partitions):
                        scratch = tmp_path / f"{name}-{op.operator_id}-{store}-{p}"
                        self._check_partition(ckpt, enc, op, store, p, batch, scratch)

    def _check_partition(
        self,
        ckpt: Checkpoint,
        enc: StoreEncoding,
        op: Any,
        store: str,
        p: int,
        batch: int,
        scratch: Path,
    ) -> None:
        directory = store_dir(ckpt, op.operator_id, p, store)
        uid = None
        if enc.checkpoint_format == 2 and self.backend.capabilities.checkpoint_format_2:
            ids = ckpt.commit(batch).state_unique_ids or {}
            uid = ids[str(op.operator_id)][p][op.store_names.index(store)]
        opts = enc.read_options(uid, True)
        assert self.backend.check(ckpt.io, directory, batch + 1, opts) == []
        whole = self.backend.load(ckpt.io, directory, batch + 1, opts)
        records = self.backend.events(ckpt.io, directory, batch + 1, opts, max_bytes=512)
        scratch.mkdir()
        if records.unique:
            pieces = [(c.keys, c.values) for c in records.chunks()]
        else:  # a tiny budget: the external replay by key hash
            pieces = list(
                bounded_replay(
                    records,
                    budget=1 << 10,
                    max_bytes=512,
                    scratch=str(scratch),
                    merge_delimiter=enc.merge_delimiter,
                )
            )
        keys = [k for ks, _ in pieces for k in ks.to_pylist()]
        values = [v for _, vs in pieces for v in vs.to_pylist()]
        assert sorted(zip(keys, values, strict=True)) == _pairs(whole.keys, whole.values)
        if not op.uses_column_families:
            # The entry codec takes Spark's bytes apart and puts them back byte for byte.
            codec = self.backend.entry_codec(row_checksum=enc.row_checksum, key_version=False)
            back = codec.decode(whole.keys, whole.values)
            again = codec.encode(back.keys, back.values, back.checksums)
            assert again[1].to_pylist() == whole.values.to_pylist()


def _zip_metadata(path: Path) -> dict[str, Any]:
    meta = json.loads(zipfile.ZipFile(path).read("metadata").decode().split("\n", 1)[1])
    for f in meta.pop("sstFiles"):
        assert f["sizeBytes"] > 0
    return meta

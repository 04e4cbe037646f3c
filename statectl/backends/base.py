"""The backend contract: what statectl needs from a state store provider's files.

A :class:`Backend` owns everything that differs between Spark's state store providers: its
identity (the name statectl uses, the provider classes Spark records in the offset log, how a
store directory's files look), which versions a partition has, loading a partition at a version
(whole, or in chunks for a bounded read), the bytes of its keys and values (one
:class:`EntryCodec`), writing a partition in each of its layouts, health checks, and what it is
capable of. Callers hold a Backend object and never compare backend names.
"""

from __future__ import annotations

import posixpath
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Protocol, TypeVar

import pyarrow as pa

from statectl.backends.entries import EntryCodec
from statectl.codecs.records import RecordBatch
from statectl.errors import MissingFileError, StatectlError
from statectl.io import FileIO

F = TypeVar("F")
SNAPSHOT, CHANGELOG = "snapshot", "changelog"
# Batches of a partition's entries, read again on each call (a streamed write reads them twice:
# once to size the output, once to write it).
Batches = Callable[[], Iterator[pa.RecordBatch]]


@dataclass(frozen=True)
class VersionRecords:
    """The records that make up a version, in replay order and a chunk at a time: the base
    snapshot's (each key once, all puts; none without a snapshot), then the overlay's (the
    deltas or changelogs after it). Each call reads the files again."""

    base: Callable[[], Iterator[RecordBatch]] | None
    overlay: Callable[[], Iterator[RecordBatch]] | None

    @property
    def unique(self) -> bool:
        """One snapshot's unique keys (or nothing): no replay needed."""
        return self.overlay is None

    def chunks(self) -> Iterator[RecordBatch]:
        """All of them, in replay order."""
        if self.base is not None:
            yield from self.base()
        if self.overlay is not None:
            yield from self.overlay()


@dataclass
class RawState:
    """The live entries of one store partition at one version, as the backend stores them.

    HDFS: UnsafeRow bytes. RocksDB: the RocksDB key and value bytes, still carrying the encoding
    version byte and, for column-family stores, the 2-byte column family id (``cf_ids``).
    """

    keys: pa.LargeBinaryArray
    values: pa.LargeBinaryArray
    # RocksDB virtual column families: name -> id, from the snapshot's metadata.
    cf_ids: dict[str, int] = field(default_factory=dict)
    files: list[str] = field(default_factory=list)  # the files it was rebuilt from

    def __len__(self) -> int:
        return len(self.keys)


def empty_raw_state() -> RawState:
    empty = pa.array([], type=pa.large_binary())
    return RawState(empty, empty)


def version_chain(
    snapshots: Mapping[int, F], increments: Mapping[int, F], version: int, store_dir: str, ext: str
) -> tuple[F | None, list[F]]:
    """The newest snapshot at or below ``version`` and the increments (deltas or changelogs)
    after it up to ``version``, the way both providers load a version."""
    base = max((v for v in snapshots if v <= version), default=0)
    chain = []
    for v in range(base + 1, version + 1):
        if v not in increments:
            raise MissingFileError(
                f"state version {version} needs {v}.{ext}, which is missing "
                f"(newest usable snapshot: {base or 'none'})",
                posixpath.join(store_dir, f"{v}.{ext}"),
                "the checkpoint is incomplete; pick an older --batch",
            )
        chain.append(increments[v])
    return snapshots.get(base), chain


@dataclass(frozen=True)
class ReadOptions:
    """How a partition's files are read: the pinned codec, the checkpoint id of a format 2
    checkpoint, the list-state merge delimiter, and whether checksums are verified."""

    codec: str = "lz4"
    unique_id: str | None = None
    merge_delimiter: bytes = b""
    verify: bool = True


@dataclass(frozen=True)
class WriteOptions:
    """How a partition is written: the layout (one of the backend's), the version its files
    carry, the codec, and whether its files carry a fresh unique id (checkpoint format 2)."""

    layout: str
    version: int
    codec: str
    unique_ids: bool = False


@dataclass(frozen=True)
class Capabilities:
    """What a backend can hold, so that planners ask instead of naming backends."""

    layouts: tuple[str, ...]  # the layouts its writer has, the first the default
    column_families: bool  # virtual column families (transformWithState, joins at 3/4)
    checkpoint_format_2: bool  # unique ids per version and lineage (Spark 4.1+)
    row_checksums: bool  # Spark's per-row checksum (4.1+)
    sorted_layouts: tuple[str, ...] = ()  # layouts whose writer wants keys in RocksDB order
    # Keys go through Spark's key encoders (prefix-scan, timestamp keys) rather than being the
    # key row as it is.
    key_encoders: bool = False

    def column_families_in(self, layout: str) -> bool:
        """Whether ``layout`` can hold column families (RocksDB: only a zip+SST snapshot)."""
        return self.column_families and layout in self.sorted_layouts

    def checkpoint_format_2_in(self, layout: str) -> bool:
        """Whether ``layout`` is written with unique ids (RocksDB: only a zip+SST snapshot)."""
        return self.checkpoint_format_2 and layout in self.sorted_layouts

    def layout(self, requested: str | None) -> str:
        """``requested`` if this backend has it, else its default layout (a restore asks for
        RocksDB's changelog layout; HDFS writes its snapshot whatever was asked)."""
        return requested if requested in self.layouts else self.layouts[0]


class Backend(Protocol):
    """One state store provider's files (see the module docstring)."""

    name: str  # what statectl calls it: "hdfs", "rocksdb"
    title: str  # what messages call it: "HDFS", "RocksDB"
    # Provider classes Spark records under spark.sql.streaming.stateStore.providerClass; the
    # first is the one a restore pins.
    provider_classes: tuple[str, ...]
    capabilities: Capabilities

    def recognises(self, provider_class: str) -> bool:
        """Whether Spark's recorded provider class is this backend."""
        ...

    def owns_file(self, name: str) -> bool:
        """Whether a file name in a store directory is one of this backend's version files."""
        ...

    def versions(self, io: FileIO, store_dir: str) -> list[int]:
        """The versions a store partition directory can be loaded at, ascending."""
        ...

    def files_for_version(
        self, io: FileIO, store_dir: str, version: int, opts: ReadOptions
    ) -> list[str]:
        """The files Spark reads to load ``version``, in order (a clean error naming a missing
        one)."""
        ...

    def copy_files(self, io: FileIO, store_dir: str, version: int, opts: ReadOptions) -> list[str]:
        """Every file a copy of ``version`` needs (a native savepoint): the version's files, the
        files they name (RocksDB's SSTs), and their checksum sidecars where the backend keeps
        them."""
        ...

    def load(self, io: FileIO, store_dir: str, version: int, opts: ReadOptions) -> RawState:
        """The live entries of one store partition at ``version``, in memory."""
        ...

    def events(
        self,
        io: FileIO,
        store_dir: str,
        version: int,
        opts: ReadOptions,
        *,
        max_bytes: int,
        metas: list | None = None,
    ) -> VersionRecords:
        """The records of ``version`` in replay order, about ``max_bytes`` at a time."""
        ...

    def iterates_in_key_order(self) -> bool:
        """Whether a lone snapshot's entries come sorted by key (RocksDB's order)."""
        ...

    def entry_codec(
        self, *, cf_id: int | None = None, row_checksum: bool = False, key_version: bool = True
    ) -> EntryCodec:
        """The codec of this backend's key and value bytes for one store or column family."""
        ...

    def write(
        self, io: FileIO, store_dir: str, opts: WriteOptions, keys: pa.Array, values: pa.Array
    ) -> str | None:
        """One partition from memory (keys and values already this backend's bytes); returns
        the unique id its files carry (or None)."""
        ...

    def write_streamed(
        self,
        io: FileIO,
        store_dir: str,
        opts: WriteOptions,
        batches: Batches,
        scratch: str,
        budget: int,
    ) -> str | None:
        """One partition larger than ``budget``, never all in memory: the same files as
        :meth:`write` of all ``batches``."""
        ...

    def check(self, io: FileIO, store_dir: str, version: int, opts: ReadOptions) -> list[str]:
        """Health: problems loading ``version`` (missing files, failed checksums), one line
        each; empty when it loads."""
        ...

    def missing_files(
        self, io: FileIO, store_dir: str, version: int, *, column_families: bool
    ) -> list[str]:
        """Cheap health of a checkpoint format 1 store (``list``, ``inspect``): problems
        finding the files that load ``version``, from their names alone (nothing is read), one
        line each. ``column_families``: the store holds them, so it needs what holds them."""
        ...


def check_layout(backend: Backend, layout: str) -> None:
    if layout not in backend.capabilities.layouts:
        raise StatectlError(
            f"the {backend.name} backend has no {layout!r} layout "
            f"(it has: {', '.join(backend.capabilities.layouts)})"
        )

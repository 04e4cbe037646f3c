"""A Spark streaming checkpoint directory, read-only: logs, pinned confs, operators, stores.

Which batch is "latest" follows Spark: the newest batch with a ``commits/N`` entry is the
latest *committed* batch; a newer ``offsets/N`` without its commit is a batch Spark will re-run.
State after committed batch B is state store version B+1.
"""

from __future__ import annotations

import posixpath
import re
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from statectl.backends import Backend, backend_for_provider
from statectl.checkpoint.logs import (
    CommitMetadata,
    OffsetSeq,
    batch_id_of,
    parse_commit,
    parse_offset_seq,
    parse_source_log,
    parse_stream_metadata,
)
from statectl.checkpoint.state_metadata import (
    ColumnFamilySchema,
    OperatorMetadata,
    StoreInfo,
    parse_operator_metadata,
    parse_schema_file,
)
from statectl.checksums import read_text_verified, read_verified
from statectl.codecs.sparktypes import parse_schema
from statectl.errors import (
    CorruptFileError,
    MissingFileError,
    NotACheckpointError,
    StatectlError,
)
from statectl.io import FileIO
from statectl.operators import (
    OperatorKind,
    classify,
    is_global_limit_key,
    is_session_key,
    session_prefix,
    single_partition,
)

# The operator of checkpoints without operator metadata (Spark < 4.0).
UNKNOWN_OPERATOR = "unknown"
PROVIDER_CONF = "spark.sql.streaming.stateStore.providerClass"
PARTITIONS_CONF = "spark.sql.shuffle.partitions"
CODEC_CONF = "spark.sql.streaming.stateStore.compression.codec"
ENCODING_CONF = "spark.sql.streaming.stateStore.encodingFormat"
MERGE_OPERATOR_CONF = "spark.sql.streaming.stateStore.rocksdb.mergeOperatorVersion"
ROW_CHECKSUM_CONF = "spark.sql.streaming.stateStore.rowChecksum.enabled"
# Named sources, offset log v2 (Spark 4.2+).
SOURCE_EVOLUTION_CONF = "spark.sql.streaming.queryEvolution.enableSourceEvolution"


@dataclass
class StoreDescription:
    """One logical state store (or column family) of an operator, with its schemas."""

    name: str
    key_schema: str  # Spark JSON
    value_schema: str  # Spark JSON
    num_cols_prefix_key: int = 0
    key_encoder_spec: dict[str, Any] = field(default_factory=dict)
    key_schema_id: int = 0
    value_schema_id: int = 0
    user_key_schema: str | None = None
    schema_file: str | None = None


@dataclass
class Operator:
    """A stateful operator as it exists on disk for one batch."""

    operator_id: int
    name: str
    num_partitions: int
    metadata_version: int | None
    # Physical stores (directories), in Spark's order, e.g. the four stores of a join v1/v2.
    store_names: list[str]
    # The schemas: one per physical store, or one per column family for CF-based operators.
    schemas: list[StoreDescription]
    properties: dict[str, Any] = field(default_factory=dict)
    uses_column_families: bool = False

    @property
    def kind(self) -> OperatorKind:
        """The operator kind spec (statectl/operators.py) this state matches."""
        plain = [] if self.uses_column_families else self.schemas
        return classify(
            self.name,
            self.store_names,
            column_families=self.uses_column_families,
            prefix_columns=[s.num_cols_prefix_key for s in plain],
            key_schemas=[s.key_schema for s in plain],
            families=[s.name for s in self.schemas] if self.uses_column_families else (),
        )

    def schema(self, name: str) -> StoreDescription:
        for s in self.schemas:
            if s.name == name:
                return s
        raise StatectlError(
            f"operator {self.operator_id} ({self.name}) has no store or state variable {name!r}; "
            f"it has: {', '.join(s.name for s in self.schemas)}"
        )


class Checkpoint:
    """A checkpoint directory opened read-only through a :class:`FileIO`.

    ``verify=False`` (``--no-verify``) skips the expensive checks only: checksums over state
    data files and key placement. Metadata checksums and consistency checks always run.
    """

    def __init__(self, io: FileIO, root: str, *, verify: bool = True) -> None:
        self.io = io
        self.root = root.rstrip("/")
        self.verify = verify
        if not io.is_dir(self.root):
            if io.exists(self.root):
                raise NotACheckpointError("is a file, not a checkpoint directory", self.root)
            raise NotACheckpointError("no such directory", self.root)
        if not io.exists(self.path("offsets")) and not io.exists(self.path("metadata")):
            raise NotACheckpointError(
                "not a Spark streaming checkpoint (no 'metadata' file and no 'offsets/' log)",
                self.root,
                "pass the directory given as checkpointLocation",
            )
        self._offsets: dict[int, OffsetSeq] = {}
        self._commits: dict[int, CommitMetadata] = {}

    @classmethod
    def open(cls, url: str, *, verify: bool = True) -> Checkpoint:
        io, root = FileIO.for_url(url)
        return cls(io, root, verify=verify)

    def path(self, *parts: str) -> str:
        return posixpath.join(self.root, *parts)

    def read_text(self, path: str) -> str:
        """A metadata file of this checkpoint, checked against its checksum sidecar."""
        return read_text_verified(self.io, path)

    def read_bytes(self, path: str) -> bytes:
        return read_verified(self.io, path)

    def url(self) -> str:
        return self.io.url(self.root)

    # -- logs -----------------------------------------------------------------------------
    @cached_property
    def query_id(self) -> str | None:
        p = self.path("metadata")
        if not self.io.exists(p):
            return None
        return parse_stream_metadata(self.read_text(p), p)

    def _batch_ids(self, log: str) -> list[int]:
        entries = self.io.list_dir(self.path(log))
        names = {f.name for f in entries}
        for name in names:
            orphan = name[1:-4] if name.startswith(".") and name.endswith(".crc") else None
            if orphan and orphan.isdigit() and orphan not in names:
                # Hadoop writes and renames a file with its checksum, and deletes them together:
                # a checksum without its file means the file was deleted afterwards.
                raise MissingFileError(
                    f"was deleted (its checksum .{orphan}.crc is still there); restore it from a "
                    "backup",
                    self.path(log, orphan),
                )
        return sorted({b for f in entries if (b := _log_batch(f)) is not None})

    @cached_property
    def offset_batches(self) -> list[int]:
        return self._batch_ids("offsets")

    @cached_property
    def commit_batches(self) -> list[int]:
        return self._batch_ids("commits")

    @property
    def latest_committed_batch(self) -> int | None:
        committed = set(self.commit_batches) & set(self.offset_batches)
        if self.commit_batches and self.commit_batches[-1] not in committed:
            # Spark writes offsets/N before commits/N: a newest commit without its offset log
            # entry is damage, and falling back to an older batch would silently export old state
            b = self.commit_batches[-1]
            raise MissingFileError(
                f"offset log entry for committed batch {b} is missing", off_path(self, b)
            )
        return max(committed) if committed else None

    @property
    def uncommitted_batches(self) -> list[int]:
        last = self.latest_committed_batch
        return [b for b in self.offset_batches if last is None or b > last]

    def resolve_batch(self, batch: int | None) -> int:
        """The batch to read: ``batch`` if committed, else the latest committed one."""
        if batch is not None and batch in self.commit_batches and batch in self.offset_batches:
            return batch  # a committed batch is readable whatever newer log entries look like
        latest = self.latest_committed_batch
        if latest is None:
            raise StatectlError(
                "has no committed batch yet: there is no state to read", self.path("commits")
            )
        if batch is None:
            return latest
        if batch not in self.commit_batches or batch not in self.offset_batches:
            have = self.commit_batches
            span = f"{have[0]}..{have[-1]}" if have else "none"
            raise StatectlError(
                f"batch {batch} is not a committed batch of this checkpoint (committed: {span})",
                self.root,
            )
        return batch

    def offsets(self, batch: int) -> OffsetSeq:
        if batch not in self._offsets:
            p = self.path("offsets", str(batch))
            if not self.io.exists(p):
                raise MissingFileError(f"offset log entry for batch {batch} is missing", p)
            self._offsets[batch] = parse_offset_seq(self.read_text(p), batch, p)
        return self._offsets[batch]

    def commit(self, batch: int) -> CommitMetadata:
        if batch not in self._commits:
            p = self.path("commits", str(batch))
            if not self.io.exists(p):
                raise MissingFileError(f"commit log entry for batch {batch} is missing", p)
            self._commits[batch] = parse_commit(self.read_text(p), batch, p)
        return self._commits[batch]

    def source_log_dirs(self) -> list[str]:
        return [f.name for f in self.io.list_dir(self.path("sources")) if f.is_dir]

    def source_log(self, source: str, batch: int) -> list[dict[str, Any]]:
        """File source entries of one source log entry (plain or compacted)."""
        for name in (str(batch), f"{batch}.compact"):
            p = self.path("sources", source, name)
            if self.io.exists(p):
                return parse_source_log(self.read_text(p), p)
        raise MissingFileError(f"source log entry {batch} missing", self.path("sources", source))

    # -- pinned configuration --------------------------------------------------------------
    def backend(self, batch: int) -> str:
        """The name of the backend the offset log pins (:meth:`store_backend`'s)."""
        return self.store_backend(batch).name

    def store_backend(self, batch: int) -> Backend:
        off = self.offsets(batch)
        return backend_for_provider(off.pinned_conf(PROVIDER_CONF), off_path(self, batch))

    def checkpoint_format_version(self, batch: int) -> int:
        """Spark derives it from the commit log version: v1 -> 1, v2 -> 2, v3 (sink
        evolution) -> 2 with stateUniqueIds, else 1 (4.3's CheckpointVersionManager)."""
        commit = self.commit(batch)
        if commit.version == 3:
            return 2 if commit.state_unique_ids is not None else 1
        return 1 if commit.version == 1 else 2

    def num_partitions(self, batch: int) -> int:
        value = self.offsets(batch).pinned_conf(PARTITIONS_CONF)
        if value is None:
            raise StatectlError(
                "the offset log does not pin spark.sql.shuffle.partitions", off_path(self, batch)
            )
        if not value.isdigit() or int(value) < 1:
            raise CorruptFileError(
                f"pinned spark.sql.shuffle.partitions is {value!r}, not a positive number",
                off_path(self, batch),
            )
        return int(value)

    # -- operators -------------------------------------------------------------------------
    def operator_ids(self) -> list[int]:
        ids = []
        for f in self.io.list_dir(self.path("state")):
            if not f.name.isdigit():
                continue
            if not f.is_dir:  # never skip an operator silently
                what = "a broken symbolic link" if f.is_link else "a file"
                raise CorruptFileError(f"is {what}, not an operator's state directory", f.path)
            ids.append(int(f.name))
        return sorted(ids)

    def operator(self, operator_id: int, batch: int) -> Operator:
        return load_operator(self, operator_id, batch)

    def operators(self, batch: int) -> list[Operator]:
        return [self.operator(op, batch) for op in self.operator_ids()]


def _log_batch(f: Any) -> int | None:
    """The batch id of a log entry (a file; neither hidden nor a compacted source log)."""
    if f.is_dir or f.name.startswith(".") or f.name.endswith(".compact"):
        return None
    return batch_id_of(f.name)


def off_path(ckpt: Checkpoint, batch: int) -> str:
    return ckpt.path("offsets", str(batch))


_V2_NAME = re.compile(r"^\d+$")


def _operator_metadata(ckpt: Checkpoint, op: int, batch: int) -> OperatorMetadata | None:
    """v2 metadata (the newest file at or below the batch) wins over v1."""
    meta_dir = ckpt.path("state", str(op), "_metadata")
    v2 = [
        int(f.name)
        for f in ckpt.io.list_dir(posixpath.join(meta_dir, "v2"))
        if _V2_NAME.match(f.name)
    ]
    eligible = [b for b in v2 if b <= batch] or v2
    if eligible:
        p = posixpath.join(meta_dir, "v2", str(max(eligible)))
        return parse_operator_metadata(ckpt.read_text(p), p)
    p = posixpath.join(meta_dir, "metadata")
    if not ckpt.io.exists(p) and ckpt.io.exists(posixpath.join(meta_dir, ".metadata.crc")):
        raise MissingFileError(
            "operator metadata was deleted (its checksum .metadata.crc is still there); restore "
            "it from a backup",
            p,
        )
    if ckpt.io.exists(p):
        return parse_operator_metadata(ckpt.read_text(p), p)
    return None


def relocate_schema_path(ckpt: Checkpoint, op: int, recorded: str) -> str:
    """Spark records absolute schema paths; resolve them inside *this* checkpoint's directory."""
    marker = f"/state/{op}/"
    idx = recorded.rfind(marker) if isinstance(recorded, str) else -1
    source = ckpt.path("state", str(op), "_metadata")
    if idx < 0:
        # Never follow a recorded path out of the checkpoint (it is untrusted data).
        raise CorruptFileError(
            f"schema file path {recorded!r} is not under state/{op}/ of a checkpoint", source
        )
    return ckpt.io.inside(ckpt.path("state", str(op)), recorded[idx + len(marker) :], source)


def _store_dir_names(ckpt: Checkpoint, op: int) -> list[str]:
    """Physical store names, by listing ``state/<op>/0/`` (for checkpoints without operator
    metadata)."""
    first = ckpt.path("state", str(op), "0")
    if not ckpt.io.exists(first):
        return []
    stores = [
        f.name
        for f in ckpt.io.list_dir(first)
        if f.is_dir and not f.name.startswith("_") and f.name not in ("SSTs", "logs")
    ]
    return stores or ["default"]


def store_dir(ckpt: Checkpoint, op: int, partition: int, store: str) -> str:
    """``StateStoreId.storeCheckpointLocation``: "default" lives in the partition directory."""
    base = ckpt.path("state", str(op), str(partition))
    return base if store == "default" else posixpath.join(base, store)


def partition_absent(ckpt: Checkpoint, op: Operator, partition: int) -> bool:
    """A partition directory that is missing because Spark never writes it (a streaming limit
    keeps its state in partition 0 only): empty state, not damage."""
    return op.kind.partition_may_be_absent(partition) and not ckpt.io.exists(
        ckpt.path("state", str(op.operator_id), str(partition))
    )


def check_partition_count(
    ckpt: Checkpoint, op: int, batch: int, meta: OperatorMetadata | None
) -> int:
    """The operator's partition count, after checking that the pinned conf, the operator
    metadata and the partition directories agree.

    Believing one of them alone turns an edited offset log into an export of half the rows.
    """
    listed = sorted(
        int(f.name)
        for f in ckpt.io.list_dir(ckpt.path("state", str(op)))
        if f.is_dir and f.name.isdigit()
    )
    recorded = sorted({s.num_partitions for s in meta.stores if s.num_partitions}) if meta else []
    try:
        pinned = ckpt.num_partitions(batch)
    except CorruptFileError:
        raise
    except StatectlError:
        # Nothing pinned: very old checkpoints, and the planning directory of `restore --query`
        # (metadata for N partitions, schema in partition 0 only). The listing decides, as before.
        return len(listed)
    problems = _partition_problems(ckpt, op, pinned, listed, recorded, meta)
    if problems:
        raise CorruptFileError(
            f"partition counts disagree: the offset log pins {PARTITIONS_CONF}={pinned}, but "
            + "; ".join(problems),
            off_path(ckpt, batch),
            "the offset log or the state directory was edited; restore them from a backup",
        )
    return pinned


def _partition_problems(
    ckpt: Checkpoint,
    op: int,
    partitions: int,
    listed: list[int],
    recorded: list[int],
    meta: OperatorMetadata | None,
) -> list[str]:
    """How the metadata and the directories disagree with the pinned partition count."""
    problems = []
    if partitions < 1:
        problems.append(f"{PARTITIONS_CONF}={partitions} is not a partition count")
    if recorded and recorded != [partitions]:
        problems.append(f"operator metadata of operator {op} says {'/'.join(map(str, recorded))}")
    contiguous = listed == list(range(len(listed)))
    if not _one_task(ckpt, op, listed, meta) and (
        not contiguous or (listed and len(listed) != partitions)
    ):
        problems.append(
            f"state/{op} has partition directories {_ranges(listed)}"
            if not contiguous
            else f"state/{op} has {len(listed)} partition directories"
        )
    return problems


def _one_task(ckpt: Checkpoint, op: int, listed: list[int], meta: OperatorMetadata | None) -> bool:
    """A streaming limit runs in one task: Spark writes state/<op>/0 only, at any count. Spark < 4
    names no operator: its limit is known by its key schema."""
    if listed != [0]:
        return False
    return single_partition(meta.operator_name) if meta is not None else _limit_schema(ckpt, op)


def _limit_schema(ckpt: Checkpoint, op: int) -> bool:
    """Whether partition 0 of operator ``op`` holds a streaming limit's state (its schema file)."""
    p = posixpath.join(store_dir(ckpt, op, 0, "default"), "_metadata", "schema")
    if not ckpt.io.exists(p):
        return False
    version, families = load_schema_file(ckpt, p)
    return version != 3 and len(families) == 1 and is_global_limit_key(families[0].key_schema)


def _ranges(ids: list[int]) -> str:
    return ",".join(map(str, ids[:8])) + (",..." if len(ids) > 8 else "")


def load_operator(ckpt: Checkpoint, op: int, batch: int) -> Operator:
    """One operator as its files describe it."""
    meta = _operator_metadata(ckpt, op, batch)
    listed_stores = _store_dir_names(ckpt, op)
    partitions = check_partition_count(ckpt, op, batch, meta)
    if meta is not None and meta.stores:
        infos = meta.stores
    else:
        infos = [StoreInfo(s, 0, partitions) for s in listed_stores]
    schemas: list[StoreDescription] = []
    uses_cf = False
    for info in infos:
        described, families = _store_schemas(ckpt, op, info, meta)
        schemas.extend(described)
        uses_cf = uses_cf or families
    return Operator(
        operator_id=op,
        name=meta.operator_name if meta else UNKNOWN_OPERATOR,
        num_partitions=partitions,
        metadata_version=meta.version if meta else None,
        store_names=[i.store_name for i in infos],
        schemas=schemas,
        properties=meta.properties if meta else {},
        uses_column_families=uses_cf,
    )


def _store_schemas(
    ckpt: Checkpoint, op: int, info: StoreInfo, meta: OperatorMetadata | None
) -> tuple[list[StoreDescription], bool]:
    """One store's schemas (its column families' for a v3 schema file) and whether they are
    column families."""
    if info.schema_file_paths:
        p = relocate_schema_path(ckpt, op, info.schema_file_paths[-1])
        _, families = load_schema_file(ckpt, p)
        return [_describe(f, p) for f in families], True
    p = posixpath.join(store_dir(ckpt, op, 0, info.store_name), "_metadata", "schema")
    if not ckpt.io.exists(p):
        raise MissingFileError(
            f"state schema file of operator {op} store {info.store_name!r} is missing", p
        )
    version, families = load_schema_file(ckpt, p)
    if version == 3:
        return [_describe(f, p) for f in families], True
    f = families[0]
    prefix = info.num_cols_prefix_key
    if meta is None and is_session_key(f.key_schema):
        # Spark < 4 records no numColsPrefixKey, but its session window store always
        # has one: the grouping columns (StreamingSessionWindowStateManagerImplV1), so
        # RocksDB keys are prefix-encoded. Bytes that do not parse so fail the read.
        prefix = session_prefix(f.key_schema)
    desc = StoreDescription(info.store_name, f.key_schema, f.value_schema, prefix, schema_file=p)
    return [desc], False


def load_schema_file(ckpt: Checkpoint, path: str) -> tuple[int, list[ColumnFamilySchema]]:
    """A schema file whose schema strings are all Spark struct types (else a clean error now,
    rather than a traceback in whichever reader parses them first)."""
    version, families = parse_schema_file(ckpt.read_bytes(path), path)
    for f in families:
        for text in (f.key_schema, f.value_schema, f.user_key_schema):
            if text is not None:
                parse_schema(text, path)
    return version, families


def _describe(f: ColumnFamilySchema, path: str) -> StoreDescription:
    return StoreDescription(
        name=f.name,
        key_schema=f.key_schema,
        value_schema=f.value_schema,
        num_cols_prefix_key=int(f.key_encoder_spec.get("numColsPrefixKey", 0)),
        key_encoder_spec=f.key_encoder_spec,
        key_schema_id=f.key_schema_id,
        value_schema_id=f.value_schema_id,
        user_key_schema=f.user_key_schema,
        schema_file=path,
    )

"""migrate's pass-through: a store's bytes carried from the source checkpoint to the target.

A migrate that changes nothing in a store (no query, no evolution, no join format conversion,
plain UnsafeRow keys and values that both backends lay out alike) need not decode every value
into a typed savepoint and encode it back: each source partition's live entries are read as
bytes, only the keys are decoded (Spark places a key by hashing its columns, through the
operator kind's own placement, :meth:`~statectl.operators.OperatorKind.placements`), and the
entries go to the target partitions' spill files with nothing but RocksDB's encoding-version
byte added or removed. The build phase (:func:`statectl.engine.build_stores`) writes the target
files from the spills exactly as a restore does.

What is not plainly the same bytes on both sides takes the savepoint path: column families
(transformWithState, joins at formats 3/4), prefix-encoded keys (session windows on RocksDB),
Avro encoding, row checksums, a join whose format changes, and any kind restore has no spec for.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass

import pyarrow as pa

from statectl.backends import get_backend
from statectl.checkpoint.model import Checkpoint, Operator, partition_absent
from statectl.codecs.phases import phase, timed
from statectl.codecs.sparktypes import parse_schema
from statectl.codecs.unsaferow_decode import decode_unsafe_rows
from statectl.engine import (
    Engine,
    SpillWriters,
    StoreFormat,
    build_stores,
    run_tasks,
    spill_dir,
    split_by_partition,
    uses_threads,
)
from statectl.errors import StatectlError
from statectl.io import FileIO
from statectl.join_state import format_of, pinned_format
from statectl.operators import JOIN_KINDS
from statectl.state import (
    StoreEncoding,
    binary_parts,
    check_partition_ids,
    check_schema,
    live_entries,
    placement_checked,
    prepend,
    slice_bytes,
)
from statectl.tws_encode import VERSION

_SPILL_SCHEMA = pa.schema([("key", pa.large_binary()), ("value", pa.large_binary())])
# The most a source partition's replay holds (the overlay up to three quarters of it; the
# hashed replay an eighth in memory, the rest spilled): the pass-through writes each chunk as
# it is read, so its tree stays near the workers' chunks (916-985 MB at 10M keys, issue 27).
# The chunks themselves are capped by state.READ_CHUNK_BYTES.
REPLAY_BUDGET = 256 << 20
NO_PREFIX = "NoPrefixKeyStateEncoderSpec"


def _kind_reason(ckpt: Checkpoint, batch: int, op: Operator) -> str | None:
    """What the operator's kind and the checkpoint's encoding rule out."""
    kind = op.kind
    enc = StoreEncoding.of(ckpt, batch)
    if op.uses_column_families or format_of(kind) is not None:
        return "column families"
    if not kind.restorable:
        return "no restore spec for this kind"
    if enc.avro:
        return "Avro state encoding"
    if enc.row_checksum:
        return "row checksums"
    return None


def _conversion_reason(
    ckpt: Checkpoint,
    batch: int,
    op: Operator,
    join_state_format: int | None,
    state_formats: dict[str, int] | None,
) -> str | None:
    """A state format the restore converts: its bytes change."""
    kind = op.kind
    if kind in JOIN_KINDS and join_state_format not in (
        None,
        pinned_format(ckpt.offsets(batch).conf),
    ):
        return "join state format conversion"
    asked = (state_formats or {}).get(kind.format_conf or "")
    if asked is not None and asked != kind.state_format(ckpt.offsets(batch).conf):
        return "state format conversion"
    return None


def _schema_reason(op: Operator) -> str | None:
    """Keys that are not placed by their plain bytes, or types statectl cannot decode."""
    for desc in op.schemas:
        spec = desc.key_encoder_spec.get("keyStateEncoderType", NO_PREFIX)
        if desc.num_cols_prefix_key or op.kind.prefix_columns(desc.key_schema) or spec != NO_PREFIX:
            return "prefix-encoded keys"
        try:
            check_schema(desc)
        except StatectlError:
            return "a type statectl cannot decode"
    if [d.name for d in op.schemas] != op.store_names:
        return "stores without schemas"
    return None


def fallback_reason(
    ckpt: Checkpoint,
    batch: int,
    op: Operator,
    join_state_format: int | None,
    state_formats: dict[str, int] | None = None,
) -> str | None:
    """Why ``op``'s state at ``batch`` must take the savepoint path (None: its bytes pass
    through unchanged). The same for either target backend: nothing accepted here differs
    between HDFS and RocksDB but the encoding-version byte."""
    return (
        _kind_reason(ckpt, batch, op)
        or _conversion_reason(ckpt, batch, op, join_state_format, state_formats)
        or _schema_reason(op)
    )


def _has_version_byte(rows: pa.Array) -> bool:
    """Every row starts with RocksDB's encoding-version byte as statectl writes it."""
    data, offsets = binary_parts(rows)
    starts = offsets[:-1]
    return bool((offsets[1:] > starts).all() and (data[starts] == VERSION[0]).all())


def to_target(rows: pa.Array, source: str, target: str) -> pa.LargeBinaryArray:
    """Source entry bytes as the target backend keeps them: each backend's entry codec says
    whether its rows carry the encoding-version byte in front of the UnsafeRow (RocksDB's do,
    as statectl writes it; HDFS's are the UnsafeRow)."""
    rows = rows.cast(pa.large_binary()) if rows.type != pa.large_binary() else rows
    prefix = get_backend(source).entry_codec().row_prefix
    if prefix == get_backend(target).entry_codec().row_prefix:
        if prefix and not _has_version_byte(rows):
            return prepend(slice_bytes(rows, prefix), VERSION)
        return rows
    if prefix:  # -> a backend whose rows carry no version byte
        return slice_bytes(rows, prefix)
    return prepend(rows, VERSION)


@dataclass
class RawSpillTask:
    """Phase 1 of a pass-through: one source partition of one store, its live entries spilled
    by target partition as the target backend's bytes (the keys decoded for placement only)."""

    ckpt: Checkpoint
    op: Operator
    store: str
    partition: int
    batch: int
    enc: StoreEncoding  # read once for every task (the offsets file)
    target_backend: str
    partitions: int
    directory: str
    budget: int

    def __call__(self) -> int:
        out = SpillWriters(os.path.join(self.directory, f"f{self.partition:06d}"), _SPILL_SCHEMA)
        if partition_absent(self.ckpt, self.op, self.partition):
            return 0
        enc = self.enc
        skip = enc.store_backend.entry_codec().row_prefix  # the encoding-version byte
        schema = parse_schema(self.op.schema(self.store).key_schema)
        checked = self.ckpt.verify and placement_checked(self.ckpt, self.op, self.batch)
        counts = (self.partitions, self.op.num_partitions) if checked else (self.partitions,)
        where = self.ckpt.path("state", str(self.op.operator_id), str(self.partition))
        scratch = tempfile.mkdtemp(prefix="passthrough-", dir=self.directory)
        rows = 0
        try:
            entries = live_entries(
                self.ckpt,
                self.op,
                self.store,
                self.partition,
                self.batch,
                enc,
                min(self.budget, REPLAY_BUDGET),
                scratch,
            )
            for keys, values in timed(entries, "read+replay"):
                if not len(keys):
                    continue
                with phase("decode"):
                    key = decode_unsafe_rows(keys, schema, where, skip_prefix=skip)
                with phase("place"):
                    placed = self.op.kind.placements(self.store, key, counts)
                    if checked:  # as the savepoint path checks what it reads
                        check_partition_ids(self.ckpt, self.op, placed[1], self.partition)
                with phase("encode"):
                    chunk = pa.table(
                        {
                            "key": to_target(keys, enc.backend, self.target_backend),
                            "value": to_target(values, enc.backend, self.target_backend),
                        }
                    )
                with phase("spill write"):
                    split_by_partition(chunk, placed[0], out)
                rows += len(keys)
                del key, placed, chunk  # freed before the next chunk is read
        finally:
            out.close()
            shutil.rmtree(scratch, ignore_errors=True)
        return rows


def restore_raw_stores(
    ckpt: Checkpoint,
    op: Operator,
    batch: int,
    partitions: int,
    fmt: StoreFormat,
    io: FileIO,
    store_dir: Callable[[str, int], str],
    engine: Engine,
    *,
    only: list[int] | None = None,
) -> tuple[list[list[tuple[int, str | None]]], dict[str, int]]:
    """Every store of ``op`` written to the target from the source's bytes: [store] ->
    [(partition, unique id)] as :func:`statectl.engine.restore_stores` returns, and the rows
    written per store."""
    threads = uses_threads(ckpt.io, io)
    built = list(range(partitions)) if only is None else only
    target = fmt.backend
    with spill_dir() as directory:
        dirs = [os.path.join(directory, f"t{i:04d}") for i in range(len(op.store_names))]
        enc = StoreEncoding.of(ckpt, batch)
        jobs = [
            RawSpillTask(ckpt, op, s, p, batch, enc, target, partitions, d, engine.per_task)
            for s, d in zip(op.store_names, dirs, strict=True)
            for p in range(op.num_partitions)
        ]
        counts = run_tasks(jobs, engine.workers, threads=threads)  # type: ignore[arg-type]
        n = op.num_partitions
        rows = {s: sum(counts[i * n : (i + 1) * n]) for i, s in enumerate(op.store_names)}
        spilled = [(s, d, n) for s, d in zip(op.store_names, dirs, strict=True)]
        return build_stores(spilled, built, fmt, io, store_dir, engine, threads=threads), rows

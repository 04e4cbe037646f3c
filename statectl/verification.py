"""Which files of a checkpoint's batch nothing can verify (``inspect``, ``list``, ``savepoint``).

statectl checks every file it reads against the checksums stored beside it
(statectl/checksums.py), and cross-checks what is recorded elsewhere: a savepoint's sizes and
sha256, Spark's CRC32C sidecars with the main file's size, checkpoint format 2's unique ids in
file names and changelog lineages, every key's partition. A file without a checksum sidecar
has none of the first kind: S3A writes no Hadoop ``.crc``, and copy tools drop them. Two such
``N.delta`` files of one partition swapped still decode, and give an older state, exactly as
Spark would load it. So such files are not silently trusted: they are reported, by path,
relative to the checkpoint, so a user knows that this checkpoint's state is only as good as
the copy it came from. Nothing fails because of them.

Checked from directory listings (which files a version needs, and whether their sidecars are
there), so ``list`` can afford it; under checkpoint format 2 the newest changelog of each store
partition is read too, as its lineage names the files before it.
"""

from __future__ import annotations

import posixpath

from statectl.checkpoint.model import Checkpoint, partition_absent, store_dir
from statectl.checksums import hadoop_crc_path, spark_crc_path
from statectl.errors import StatectlError
from statectl.state_rows import StoreEncoding

# RocksDB's SSTs are named (with a unique suffix) and sized in the zip that lists them, and
# each block carries RocksDB's own checksum: their identity and contents are verified.
_SELF_VERIFIED = (".sst",)


def _names(ckpt: Checkpoint, directory: str, cache: dict[str, set[str]]) -> set[str]:
    if directory not in cache:
        cache[directory] = {e.name for e in ckpt.io.list_dir(directory)}
    return cache[directory]


def _has_checksum(
    ckpt: Checkpoint, path: str, cache: dict[str, set[str]], *, data_file: bool
) -> bool:
    """Whether a checksum sidecar (Hadoop's; for a state file also Spark's) is beside ``path``."""
    names = _names(ckpt, posixpath.dirname(path), cache)
    if posixpath.basename(hadoop_crc_path(path)) in names:
        return True
    return data_file and posixpath.basename(spark_crc_path(path)) in names


def _state_files(ckpt: Checkpoint, batch: int) -> list[str]:
    """The state files Spark reads to load ``batch``'s state, every store of every operator."""
    enc = StoreEncoding.of(ckpt, batch)
    backend = enc.store_backend
    ids = (ckpt.commit(batch).state_unique_ids or {}) if enc.checkpoint_format >= 2 else {}
    out: list[str] = []
    for op in ckpt.operators(batch):
        for p in range(op.num_partitions):
            if partition_absent(ckpt, op, p):
                continue
            for i, store in enumerate(op.store_names):
                uid = _unique_id(ids, op.operator_id, p, i)
                opts = enc.read_options(uid, True)
                d = store_dir(ckpt, op.operator_id, p, store)
                out += backend.files_for_version(ckpt.io, d, batch + 1, opts)
    return out


def _operator_files(ckpt: Checkpoint) -> list[str]:
    """Each operator's metadata and state schema files (``state/<op>/_metadata/…``,
    ``state/<op>/_stateSchema/…`` and a store's ``_metadata/schema``): what the operator and
    its stores' schemas are read from."""
    out: list[str] = []
    state = ckpt.path("state")
    if not ckpt.io.is_dir(state):
        return out
    for op_dir in ckpt.io.list_dir(state):
        for sub in ("_metadata", "_stateSchema"):
            d = posixpath.join(op_dir.path, sub)
            if ckpt.io.is_dir(d):
                out += [f.path for f in ckpt.io.walk_files(d)]
    return out


def _unique_id(ids: dict, operator_id: int, partition: int, store: int) -> str | None:
    try:
        return str(ids[str(operator_id)][partition][store])
    except (KeyError, IndexError, TypeError):
        return None


def unverifiable_files(ckpt: Checkpoint, batch: int) -> list[str]:
    """The files reading ``batch`` needs that have no checksum sidecar, relative to the
    checkpoint, sorted: the logs of the batch, the operators' metadata and state schema files,
    and the state files of every store partition.
    Damage that stops them from being found is reported where they are read, not here."""
    cache: dict[str, set[str]] = {}
    logs = [
        ckpt.path("metadata"),
        ckpt.path("offsets", str(batch)),
        ckpt.path("commits", str(batch)),
    ]
    found = [
        p for p in logs if ckpt.io.exists(p) and not _has_checksum(ckpt, p, cache, data_file=False)
    ]
    found += [
        p
        for p in _operator_files(ckpt)
        if not p.endswith(".crc") and not _has_checksum(ckpt, p, cache, data_file=False)
    ]
    try:
        state = _state_files(ckpt, batch)
    except StatectlError:
        state = []  # missing or damaged: the read itself reports it
    found += [
        p
        for p in state
        if not p.endswith(_SELF_VERIFIED) and not _has_checksum(ckpt, p, cache, data_file=True)
    ]
    root = ckpt.root.rstrip("/") + "/"
    return sorted({p[len(root) :] if p.startswith(root) else p for p in found})

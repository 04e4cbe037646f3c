"""``statectl relabel``: a copy of a savepoint whose operators carry new uids.

Savepoints are immutable (a deployment may point at one), so relabelling writes a copy beside
the source (or under a target): the data files of a renamed uid move to
``operators/<NEW>/...``, so folder names keep matching uids; each file is written atomically
and ``_metadata`` last, so the copy is complete or visibly incomplete.
"""

from __future__ import annotations

import dataclasses
import posixpath
from typing import Any

from statectl.errors import StatectlError
from statectl.io import FileIO
from statectl.savepoints.format import (
    METADATA_FILE,
    OperatorState,
    SavepointMetadata,
    uid_problem,
)
from statectl.savepoints.layout import new_dir_name, safe_name, write_metadata
from statectl.savepoints.store import Savepoint


def _check_mapping(sp: Savepoint, mapping: dict[str, str]) -> None:
    uids = {op.uid for op in sp.metadata.operators}
    missing = sorted(set(mapping) - uids)
    if missing:
        raise StatectlError(
            f"no operator with uid {', '.join(missing)}; uids: {', '.join(sorted(uids))}", sp.root
        )
    for new_uid in mapping.values():
        problem = uid_problem(new_uid)
        if problem is not None:
            raise StatectlError(f"cannot relabel to {new_uid!r}: {problem}", sp.root)
    new = [mapping.get(op.uid, op.uid) for op in sp.metadata.operators]
    if len(set(new)) != len(new):
        raise StatectlError(f"uids would not be unique: {new}", sp.root)


def _moved(rel: str, old: str, new_uid: str) -> str:
    """Where a data file of operator ``old`` goes when it is renamed ``new_uid``."""
    prefix = f"operators/{safe_name(old)}/"
    if not rel.startswith(prefix):
        return rel
    return f"operators/{safe_name(new_uid)}/{rel[len(prefix) :]}"


def _renamed(
    m: SavepointMetadata, mapping: dict[str, str]
) -> tuple[list[OperatorState], dict[str, str]]:
    """The operators under their new uids, and where each data file moves (relative paths)."""
    renames: dict[str, str] = {}  # relative path in the source -> in the copy
    ops = []
    for op in m.operators:
        new_uid = mapping.get(op.uid, op.uid)
        tables = []
        for t in op.tables:
            files = []
            for f in t.files:
                renames[f.path] = _moved(f.path, op.uid, new_uid)
                files.append(dataclasses.replace(f, path=renames[f.path]))
            tables.append(dataclasses.replace(t, files=files))
        ops.append(dataclasses.replace(op, uid=new_uid, tables=tables))
    return ops, renames


def relabel(url: str, mapping: dict[str, str], target: str | None = None) -> dict[str, Any]:
    """A new savepoint whose operators ``OLD`` are named ``NEW``; the source is not modified.
    The copy goes beside the source, or under ``target``."""
    sp = Savepoint.open(url)
    _check_mapping(sp, mapping)
    if target:
        out_io, parent = FileIO.for_url(target)
    else:
        out_io, parent = sp.io, posixpath.dirname(sp.root)
    m = sp.metadata
    out_root = posixpath.join(parent, new_dir_name(m.query_id, m.batch_id))
    ops, renames = _renamed(m, mapping)
    # Every other file (a native savepoint's embedded checkpoint) is copied where it was.
    for f in sp.io.walk_files(sp.root):
        rel = f.path[len(sp.root) + 1 :]
        if rel == METADATA_FILE:
            continue
        dst = posixpath.join(out_root, renames.get(rel, rel))
        if out_io.fs is sp.io.fs:  # same filesystem: no bytes through this process
            out_io.copy_atomic(f.path, dst)
        else:
            out_io.write_atomic(dst, sp.io.read_bytes(f.path))
    write_metadata(out_io, out_root, dataclasses.replace(m, operators=ops))
    return {
        "path": out_io.url(out_root),
        "source": sp.url(),
        "relabelled": {old: mapping[old] for old in mapping},
    }

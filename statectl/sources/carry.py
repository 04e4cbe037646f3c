"""Each source of a checkpoint as statectl reads, savepoints and restores it.

A source is a line of ``offsets/N`` (keyed by index, or by name in offset log v2) and the
files Spark keeps for it under ``sources/<key>/``. A file source's seen-files log is parsed
(the savepoint keeps its entries, ``source_logs``, and a restore lays the log out again);
every other kind's files are carried as bytes: copied into the savepoint under
``sources/<key>/``, recorded with size and SHA-256 in ``_metadata`` ``sources``, and written
back byte for byte by ``restore`` and ``migrate``.
"""

from __future__ import annotations

import hashlib
import json
import posixpath
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from statectl.checksums import read_verified
from statectl.errors import CorruptFileError, MissingFileError
from statectl.io import FileIO
from statectl.sources.kinds import (
    FILE,
    MISSING,
    SourceKind,
    kind_named,
    offset_value,
    recognise,
)

# Where a canonical savepoint keeps the carried files, and where a native one has them (its
# embedded checkpoint, statectl/savepoints/native.py EMBEDDED).
SAVEPOINT_DIR = "sources"
NATIVE_DIR = "checkpoint/sources"


class SourceFiles(Mapping[str, bytes]):
    """The files under ``sources/<key>/`` (relative path -> bytes), read when first asked:
    recognising a kind reads one or two small files, not a whole seen-files log."""

    def __init__(self, ckpt: Any, key: str) -> None:
        self._io: FileIO = ckpt.io
        self._verify: bool = ckpt.verify
        self.directory: str = ckpt.path("sources", key)
        self._paths: dict[str, str] = {}
        for f in ckpt.io.walk_files(self.directory):
            rel = posixpath.relpath(f.path, self.directory)
            # Hidden files are Hadoop's .crc sidecars and temp files, not the source's.
            if not any(part.startswith(".") for part in rel.split("/")):
                self._paths[rel] = f.path
        self._read: dict[str, bytes] = {}

    def __getitem__(self, rel: str) -> bytes:
        if rel not in self._read:
            self._read[rel] = read_verified(self._io, self._paths[rel], verify=self._verify)
        return self._read[rel]

    def __iter__(self) -> Iterator[str]:
        return iter(sorted(self._paths))

    def __len__(self) -> int:
        return len(self._paths)

    def path(self, rel: str) -> str:
        return self._paths[rel]


@dataclass
class CheckpointSource:
    """One source of one batch: its key (index or name), kind, offset text and files."""

    key: str
    name: str | None
    kind: SourceKind
    offset: str | None
    files: SourceFiles

    def describe(self) -> dict[str, Any]:
        """For ``inspect`` (and its ``--json``)."""
        value = offset_value(self.offset)
        out = {
            "key": self.key,
            "name": self.name,
            "kind": self.kind.name,
            "title": self.kind.title,
            "offset": self.offset,
            "position": self.kind.position(value),
            "files": list(self.files),
        }
        return {**out, "summary": position_text(out)}


def checkpoint_sources(ckpt: Any, batch: int) -> list[CheckpointSource]:
    """Every source of ``batch``: the offset log's, then any other ``sources/`` directory."""
    off = ckpt.offsets(batch)
    named = off.version != 1
    keys = list(off.offsets)
    keys += sorted(d for d in ckpt.source_log_dirs() if d not in off.offsets)
    out = []
    for key in keys:
        files = SourceFiles(ckpt, key)
        offset = off.offsets.get(key)
        out.append(
            CheckpointSource(key, key if named else None, recognise(offset, files), offset, files)
        )
    return out


def file_source_logs(ckpt: Any, batch: int) -> dict[str, list[dict[str, Any]]]:
    """Each *file* source's seen-files log up to ``batch``, compacted into one list of
    entries (savepoint ``source_logs``). Other kinds' files are carried as bytes."""
    logs: dict[str, list[dict[str, Any]]] = {}
    for src in checkpoint_sources(ckpt, batch):
        if src.kind is FILE and src.files:
            logs[src.key] = _seen_files(ckpt, src, batch)
    return logs


def _seen_files(ckpt: Any, src: CheckpointSource, batch: int) -> list[dict[str, Any]]:
    """From the latest compaction at or before ``batch`` (which holds every earlier batch)."""
    compacts, plain = _log_batches(src.files)
    base = max((c for c in compacts if c <= batch), default=-1)
    later = sorted(b for b in plain if base < b <= batch)
    entries: list[dict[str, Any]] = list(ckpt.source_log(src.key, base)) if base >= 0 else []
    for b in later:
        entries.extend(ckpt.source_log(src.key, b))
    return entries


def _log_batches(names: Iterable[str]) -> tuple[list[int], list[int]]:
    """The batches of a seen-files log's files: (``N.compact`` ones, plain ``N`` ones)."""
    compacts: list[int] = []
    plain: list[int] = []
    for n in names:
        stem = n[: -len(".compact")] if n.endswith(".compact") else n
        if stem.isdigit():
            (compacts if stem != n else plain).append(int(stem))
    return compacts, plain


def native_source_files(ckpt: Any, batch: int) -> list[str]:
    """The ``sources/`` files a native savepoint copies: a file source's log up to its
    offset's batch (Spark's own layout), every file of any other kind."""
    out = []
    for src in checkpoint_sources(ckpt, batch):
        limit = None
        if src.kind is FILE:
            value = offset_value(src.offset)
            limit = value.get("logOffset") if isinstance(value, dict) else None
        for rel in src.files:
            if src.kind is FILE:
                stem = rel[: -len(".compact")] if rel.endswith(".compact") else rel
                if not stem.isdigit() or (limit is not None and int(stem) > limit):
                    continue
            out.append(src.files.path(rel))
    return out


def savepoint_sources(
    ckpt: Any, batch: int, out: tuple[FileIO, str] | None
) -> list[dict[str, Any]]:
    """``_metadata`` ``sources``: each source's key, name, kind, offset, position and files.
    With ``out`` (a canonical savepoint's io and root) the files of every kind but a file
    source are copied to ``sources/<key>/``; without it they are recorded where a native
    savepoint keeps its copy (``checkpoint/sources/<key>/``)."""
    prefix = SAVEPOINT_DIR if out is not None else NATIVE_DIR
    entries = []
    for src in checkpoint_sources(ckpt, batch):
        entry = src.describe()
        del entry["title"], entry["summary"]
        entry["files"] = []
        if src.kind is not FILE:
            for rel in src.files:
                data = src.files[rel]
                path = posixpath.join(prefix, src.key, rel)
                if out is not None:
                    out[0].write_atomic(posixpath.join(out[1], path), data)
                entry["files"].append(
                    {"path": path, "bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}
                )
        entries.append(entry)
    return entries


def _safe_rel(rel: str) -> bool:
    parts = rel.split("/")
    return bool(rel) and all(p not in ("", ".", "..") and "\\" not in p for p in parts)


def _carried_rel(key: Any, f: Any, sp_root: str) -> str:
    """A carried file's path under its source's directory, checked to stay there."""
    path = f.get("path") if isinstance(f, dict) else None
    if not isinstance(path, str) or not _safe_rel(path) or not isinstance(key, str):
        raise CorruptFileError(f"_metadata: source file {path!r} is not a plain path", sp_root)
    head, _, rel = path.partition(f"sources/{key}/")
    if head not in ("", "checkpoint/") or not _safe_rel(rel) or not _safe_rel(key):
        raise CorruptFileError(
            f"_metadata: source file {path!r} is not under sources/{key}/", sp_root
        )
    return rel


def carried_files(entry: Any, sp_io: FileIO, sp_root: str) -> Iterator[tuple[str, str, bytes]]:
    """The carried files of one ``_metadata`` ``sources`` entry: (path in the savepoint, path
    under the source's directory, bytes), each checked against its size and SHA-256."""
    if not isinstance(entry, dict) or kind_named(entry.get("kind")) is FILE:
        return
    for f in entry.get("files") or []:
        rel = _carried_rel(entry.get("key"), f, sp_root)
        full = posixpath.join(sp_root, f["path"])
        if not sp_io.exists(full):
            raise MissingFileError("a source file of the savepoint is missing", full)
        data = sp_io.read_bytes(full)
        if len(data) != f.get("bytes") or hashlib.sha256(data).hexdigest() != f.get("sha256"):
            raise CorruptFileError("does not match its size and SHA-256 in _metadata", full)
        yield f["path"], rel, data


def copy_carried_sources(
    sources: list[Any] | None, sp_io: FileIO, sp_root: str, out_io: FileIO, out_root: str
) -> None:
    """A savepoint written from another (the state processor) keeps its carried source files,
    verified, at the same paths its ``_metadata`` ``sources`` names."""
    for entry in sources or []:
        for path, _, data in carried_files(entry, sp_io, sp_root):
            out_io.write_atomic(posixpath.join(out_root, path), data)


def write_carried_sources(
    sources: list[Any] | None,
    sp_io: FileIO,
    sp_root: str,
    io: FileIO,
    root: str,
    keys: Mapping[str, str] | None = None,
) -> None:
    """Write every carried source file back under ``root/sources/<key>/``, byte for byte.
    ``keys`` (restore with a changed query) maps each savepoint source to the key it has in
    the restored query; a source it does not map is not restored."""
    for entry in sources or []:
        old = entry.get("key") if isinstance(entry, dict) else None
        new = old if keys is None else keys.get(str(old))
        if new is None:
            continue
        for _, rel, data in carried_files(entry, sp_io, sp_root):
            io.write_atomic(posixpath.join(root, "sources", new, rel), data)


def savepoint_source_rows(m: Any) -> list[dict[str, Any]]:
    """``inspect`` of a savepoint: its recorded sources (for savepoints older than the
    ``sources`` field, recognised from the offsets alone)."""
    if m.sources is not None:
        rows = []
        for e in m.sources:
            kind = kind_named(e.get("kind"))
            files = [f.get("path") for f in e.get("files") or [] if isinstance(f, dict)]
            row = {**e, "title": kind.title, "files": files}
            rows.append({**row, "summary": position_text(row)})
        return rows
    rows = []
    for key, text in m.offsets.items():
        kind = recognise(text, {})
        row = {
            "key": key,
            "name": key if m.offset_log_version != 1 else None,
            "kind": kind.name,
            "title": kind.title,
            "offset": text,
            "position": kind.position(offset_value(text)),
            "files": [],
        }
        rows.append({**row, "summary": position_text(row)})
    return rows


def position_text(src: dict[str, Any]) -> str:
    """One line for a source in ``inspect``: its kind and position (Kafka: each
    topic-partition's offset; Delta: the table id and version), else its raw offset."""
    files = src.get("files") or []
    extra = f" ({len(files)} file{'s' if len(files) != 1 else ''} in sources/)" if files else ""
    return f"{src.get('title') or src.get('kind')}: {_where(src)}{extra}"


def _where(src: dict[str, Any]) -> str:
    rows = src.get("position") or []
    if src.get("kind") == "kafka" and rows:
        return ", ".join(
            f"{r['topic']}/{r['partition']} @ {r.get('marker') or r['offset']}" for r in rows
        )
    if src.get("kind") == "delta" and rows:
        r = rows[0]
        return f"table {r['table_id']} version {r['version']} index {r['index']}"
    offset = src.get("offset")
    if offset is None:
        return "no offset yet"
    value = offset_value(offset)
    # Shown as inspect always showed offsets: JSON with a space after ',' and ':'.
    return str(offset) if value is MISSING else json.dumps(value, separators=(", ", ": "))


def carried_paths(sources: list[Any] | None) -> list[str]:
    """The savepoint-relative paths of every carried source file ``_metadata`` records
    (``dispose`` deletes them with the savepoint)."""
    return [
        f["path"]
        for e in sources or []
        if isinstance(e, dict)
        for f in e.get("files") or []
        if isinstance(f, dict) and isinstance(f.get("path"), str) and _safe_rel(f["path"])
    ]

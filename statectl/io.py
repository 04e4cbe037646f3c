"""The one place statectl touches storage: a small FileIO over fsspec.

Format code receives a :class:`FileIO` and paths relative to nothing in particular (full URLs or
local paths); it never imports fsspec itself. Writes are atomic: a temporary hidden name in the
same directory, then a rename, so a crash never leaves a file that looks complete.
"""

from __future__ import annotations

import posixpath
import uuid
from collections.abc import Iterator
from dataclasses import dataclass

import fsspec
from fsspec.core import url_to_fs

from statectl.errors import MissingFileError, StatectlError


@dataclass(frozen=True)
class FileInfo:
    """One directory entry: its full path (in the filesystem's own form), base name, size, kind."""

    path: str
    name: str
    size: int
    is_dir: bool
    is_link: bool = False  # a symbolic link (local file system); is_dir/size describe its target


class FileIO:
    """Files under one filesystem, addressed by the filesystem's own path strings.

    ``FileIO.for_url("s3://bucket/ckpt")`` returns the FileIO and the root path in the form the
    filesystem wants (no protocol for s3fs, an absolute path for the local filesystem).
    """

    def __init__(self, fs: fsspec.AbstractFileSystem) -> None:
        self.fs = fs

    @classmethod
    def for_url(cls, url: str, **storage_options: object) -> tuple[FileIO, str]:
        fs, path = url_to_fs(url, **storage_options)
        return cls(fs), path.rstrip("/") or "/"

    @property
    def protocol(self) -> str:
        proto = self.fs.protocol
        return proto[0] if isinstance(proto, (tuple, list)) else proto

    def url(self, path: str) -> str:
        """A URL for ``path`` that another process (or Spark) can open."""
        return self.fs.unstrip_protocol(path)

    @staticmethod
    def join(*parts: str) -> str:
        return posixpath.join(*parts)

    # -- reading ---------------------------------------------------------------------------
    def exists(self, path: str) -> bool:
        return bool(self.fs.exists(path))

    def is_dir(self, path: str) -> bool:
        return bool(self.fs.isdir(path))

    def read_bytes(self, path: str) -> bytes:
        try:
            return self.fs.cat_file(path)
        except FileNotFoundError:
            raise MissingFileError("file does not exist", path) from None
        except IsADirectoryError:
            raise StatectlError("is a directory, expected a file", path) from None

    def read_bytes_if_exists(self, path: str) -> bytes | None:
        """The file's bytes, or None when it does not exist.

        ``exists`` first: on object stores it is answered from the listing cache when the
        directory was listed (as state directories are), so an absent checksum sidecar costs
        no request.
        """
        try:
            if not self.fs.exists(path):
                return None
            return self.fs.cat_file(path)
        except (FileNotFoundError, IsADirectoryError):
            return None

    def read_text(self, path: str) -> str:
        data = self.read_bytes(path)
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError:
            raise StatectlError("is not UTF-8 text; the file is corrupt", path) from None

    def size(self, path: str) -> int:
        return int(self.fs.size(path))

    def list_dir(self, path: str) -> list[FileInfo]:
        """Entries of a directory, hidden (dot) files included; [] when it does not exist.

        Symbolic links are followed: a link to a directory is listed as a directory, so every
        reader sees a symlinked ``state/0`` the same way (fsspec reports links as "other").
        A broken link is listed as a file, which then fails to read, naming it.
        """
        try:
            entries = self.fs.ls(path, detail=True)
        except FileNotFoundError:
            return []
        out = []
        for e in entries:
            full = e["name"].rstrip("/")
            name = posixpath.basename(full)
            if full.rstrip("/") == path.rstrip("/"):
                continue  # some filesystems list the directory itself
            is_link = bool(e.get("islink"))
            is_dir = e.get("type") == "directory" or (is_link and self.is_dir(full))
            out.append(FileInfo(full, name, int(e.get("size") or 0), is_dir, is_link))
        return sorted(out, key=lambda f: f.name)

    def walk_files(self, path: str, _seen: frozenset[str] = frozenset()) -> Iterator[FileInfo]:
        """Every file under ``path``, recursively, following directory links (never in a loop)."""
        real = posixpath.realpath(path) if self.protocol in ("file", "local") else path
        if real in _seen:
            raise StatectlError("symbolic link loop: a link points to a directory above it", path)
        for info in self.list_dir(path):
            if info.is_dir:
                yield from self.walk_files(info.path, _seen | {real})
            else:
                yield info

    def du(self, path: str) -> int:
        return sum(f.size for f in self.walk_files(path))

    # -- writing ---------------------------------------------------------------------------
    def write_atomic(self, path: str, data: bytes, *, overwrite: bool = False) -> None:
        """Write ``data`` to a hidden temporary name beside ``path``, then rename it into place.

        On object stores the rename is a copy plus delete, which is still all-or-nothing for
        readers: the final key appears only once the copy completed.
        """
        parent, name = posixpath.split(path)
        if not overwrite and self.exists(path):
            raise StatectlError("already exists; refusing to overwrite", path)
        self.fs.makedirs(parent, exist_ok=True)
        tmp = posixpath.join(parent, f".{name}.{uuid.uuid4()}.tmp")
        try:
            with self.fs.open(tmp, "wb") as f:
                f.write(data)
            self.fs.mv(tmp, path)
        except BaseException:
            if self.fs.exists(tmp):
                self.fs.rm(tmp)
            raise

    def makedirs(self, path: str) -> None:
        self.fs.makedirs(path, exist_ok=True)

    def remove(self, path: str, recursive: bool = False) -> None:
        self.fs.rm(path, recursive=recursive)

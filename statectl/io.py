"""The one place statectl touches storage: a small FileIO over fsspec.

Format code receives a :class:`FileIO` and paths relative to nothing in particular (full URLs or
local paths); it never imports fsspec itself. Writes are atomic: a temporary hidden name in the
same directory, then a rename, so a crash never leaves a file that looks complete.
"""

from __future__ import annotations

import contextvars
import errno
import functools
import json
import os
import posixpath
import stat
import uuid
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, BinaryIO, TypeGuard, TypeVar

import fsspec
from fsspec.core import split_protocol, url_to_fs

from statectl.config import storage_sections
from statectl.errors import (
    CorruptFileError,
    MissingFileError,
    StatectlError,
    register_typed_root,
    register_url_root,
)


def relative_inside(rel: object, source: str) -> str:
    """A relative path taken from data (metadata, logs), checked to stay below its directory.

    The one rule for every path statectl reads from untrusted metadata: a non-empty string of
    plain components, no absolute path, no URL, no ``..``, no backslash or NUL. ``source`` is
    the file the path came from, named in the error.
    """
    if not isinstance(rel, str) or not rel or rel.strip() != rel:
        raise CorruptFileError(f"path {rel!r} is not a valid relative path", source)
    parts = rel.split("/")
    if (
        rel.startswith("/")
        or "://" in rel
        or "\\" in rel
        or "\0" in rel
        or any(p in ("", ".", "..") for p in parts)
    ):
        raise CorruptFileError(
            f"path {rel!r} points outside its directory; refusing to follow it", source
        )
    return rel


# -- storage options ------------------------------------------------------------------------
# Set once per command (by the CLI's --storage-option, or the API's ``storage_options``) and
# looked up by FileIO.for_url, so no use case threads them through its calls.
_STORAGE_OPTIONS: contextvars.ContextVar[dict[str, Any] | None] = contextvars.ContextVar(
    "statectl_storage_options", default=None
)
LOCAL_PROTOCOLS = (None, "file", "local")
SECRET_WORDS = {"key", "secret", "token", "password", "passwd", "credentials", "sas", "sig"}


def set_storage_options(options: Mapping[str, Any] | None) -> contextvars.Token:
    """Options for every non-local URL from now on (in this context); returns a reset token."""
    return _STORAGE_OPTIONS.set(dict(options) if options else None)


@contextmanager
def storage_options(options: Mapping[str, Any] | None = None, **kwargs: Any) -> Iterator[None]:
    """``with storage_options(endpoint_url=..., key=..., secret=...):`` for the Python API."""
    token = set_storage_options(deep_merge(dict(options or {}), kwargs))
    try:
        yield
    finally:
        _STORAGE_OPTIONS.reset(token)


def deep_merge(base: dict[str, Any], extra: Mapping[str, Any]) -> dict[str, Any]:
    """``extra`` over ``base``; nested dicts (client_kwargs, config_kwargs) merge key by key."""
    out = dict(base)
    for k, v in extra.items():
        if isinstance(v, Mapping) and isinstance(out.get(k), dict):
            out[k] = deep_merge(out[k], v)
        else:
            out[k] = dict(v) if isinstance(v, Mapping) else v
    return out


def parse_storage_option(text: str) -> dict[str, Any]:
    """``KEY=VALUE`` as a (nested) dict: ``client_kwargs.endpoint_url=http://h:9000`` becomes
    ``{"client_kwargs": {"endpoint_url": "http://h:9000"}}``. Values that read as JSON scalars
    (true, false, null, numbers) become them; anything else stays a string, and so do the values
    of secret-like names (a numeric password is still a string)."""
    key, sep, raw = text.partition("=")
    parts = key.strip().split(".")
    if not sep or not all(parts):
        raise StatectlError(f"--storage-option must look like KEY=VALUE, got {text!r}")
    value: Any = raw
    try:
        parsed = json.loads(raw)
        if (parsed is None or isinstance(parsed, (bool, int, float))) and not _secret(parts[-1]):
            value = parsed
    except ValueError:
        pass
    for part in reversed(parts):
        value = {part: value}
    return value


def parse_storage_options(texts: list[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for t in texts:
        out = deep_merge(out, parse_storage_option(t))
    return out


def _prefix_matches(prefix: str, url: str) -> bool:
    if prefix.endswith("/"):
        return url.startswith(prefix) or url == prefix.rstrip("/")
    return url == prefix or url.startswith(prefix + "/")


def storage_options_for(url: str) -> dict[str, Any]:
    """The effective fsspec options for ``url``: ``[storage."PREFIX"]`` sections of statectl.toml
    that are prefixes of it (longer prefixes override shorter ones), then the options set for
    the command (``--storage-option``), which apply to every non-local URL."""
    out: dict[str, Any] = {}
    sections = storage_sections()
    for prefix in sorted(sections, key=len):
        if _prefix_matches(prefix, url):
            out = deep_merge(out, sections[prefix])
    cli = _STORAGE_OPTIONS.get()
    if cli and split_protocol(url)[0] not in LOCAL_PROTOCOLS:
        out = deep_merge(out, cli)
    return out


def _secret(name: str) -> bool:
    """key, secret, aws_access_key_id, session_token, password ... (by word, not substring)."""
    return bool(set(str(name).lower().replace("-", "_").split("_")) & SECRET_WORDS)


def redact(options: Mapping[str, Any]) -> dict[str, Any]:
    """Options safe to print: values of key/secret/token/password-like names become ``***``."""
    out: dict[str, Any] = {}
    for k, v in options.items():
        if isinstance(v, Mapping):
            out[k] = redact(v)
        elif _secret(k) and v is not None:
            out[k] = "***"
        else:
            out[k] = v
    return out


# Errors of the storage client itself (no credentials, endpoint unreachable, bad signature) are
# configuration mistakes, not bugs: they become one-line StatectlErrors naming the URL. Matched
# by class name so that no cloud SDK is imported here.
STORAGE_ERROR_BASES = {"BotoCoreError", "ClientError", "NoCredentialsError", "ClientConnectorError"}
STORAGE_HINT = (
    "configure the endpoint and credentials with --storage-option KEY=VALUE or a "
    '[storage."PREFIX"] section in statectl.toml (docs/guide.md, Storage)'
)

F = TypeVar("F", bound=Callable[..., Any])


def _storage_errors(method: F) -> F:
    @functools.wraps(method)
    def wrapper(self: FileIO, path: str, *args: Any, **kwargs: Any) -> Any:
        try:
            return method(self, path, *args, **kwargs)
        except Exception as e:
            if isinstance(e, StatectlError) or not any(
                c.__name__ in STORAGE_ERROR_BASES for c in type(e).__mro__
            ):
                raise
            raise StatectlError(
                f"cannot access storage: {str(e) or type(e).__name__}", self.url(path), STORAGE_HINT
            ) from e

    return wrapper  # type: ignore[return-value]


# -- what may be opened ----------------------------------------------------------------------
# The one rule for every file statectl reads (checkpoints and savepoints alike, local files
# only: fsspec's remote filesystems have neither links nor special files): only a regular file
# is opened, checked with stat before the open (a FIFO blocks open() and read() forever, a
# device such as /dev/zero never ends), opened non-blocking and checked again with fstat (a
# file swapped between the two is refused). A file that is itself a symbolic link must resolve
# inside the directory the user named, or inside a directory linked into it (linked
# directories such as a ``state/0`` on another disk are the user's layout and are followed).
_SPECIAL_KINDS = {
    stat.S_IFIFO: "a FIFO (named pipe)",
    stat.S_IFCHR: "a character device",
    stat.S_IFBLK: "a block device",
    stat.S_IFSOCK: "a socket",
}
NOT_REGULAR_HINT = "statectl opens only regular files; replace it with the file it stands for"
# A full filesystem, or a quota reached, while writing.
_FULL_ERRNOS = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)


def below(path: str, root: str) -> bool:
    """Whether the normalised ``path`` is ``root`` or lies under it (no filesystem access)."""
    path, root = posixpath.normpath(path), posixpath.normpath(root)
    return path == root or path.startswith(root.rstrip("/") + "/")


def _not_regular(mode: int, path: str) -> StatectlError:
    if stat.S_ISDIR(mode):
        return StatectlError("is a directory, expected a file", path)
    kind = _SPECIAL_KINDS.get(stat.S_IFMT(mode), "not a regular file")
    return CorruptFileError(
        f"is {kind}, not a regular file; refusing to open it", path, NOT_REGULAR_HINT
    )


def is_full(e: BaseException) -> TypeGuard[OSError]:
    """An OSError of a full filesystem (or a quota, or a file size limit)."""
    return isinstance(e, OSError) and e.errno in _FULL_ERRNOS


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

    def __init__(self, fs: fsspec.AbstractFileSystem, root: str | None = None) -> None:
        self.fs = fs
        # The directory the user named (for_url): files read below it through a symbolic link
        # must resolve inside it (see _check_link). None: no confinement, regular files only.
        self.root = root

    @classmethod
    def for_url(cls, url: str, **options: Any) -> tuple[FileIO, str]:
        """The single place storage options are looked up (see :func:`storage_options_for`);
        explicit ``options`` win over them."""
        merged = deep_merge(storage_options_for(url), options)
        try:
            fs, path = url_to_fs(url, **merged)
        except (ImportError, ValueError, TypeError) as e:
            raise StatectlError(f"cannot open this URL ({e})", url) from None
        root = path.rstrip("/") or "/"
        io = cls(fs, root)
        if io.protocol not in LOCAL_PROTOCOLS:
            # Errors built from the stripped path ("lake/ckpt") show the URL ("s3://lake/ckpt").
            register_url_root(root, io.url)
        elif split_protocol(url)[0] is None and not os.path.isabs(url):
            # A local path the user named relatively: shown so in messages, not absolute.
            register_typed_root(root, url)
        return io, root

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

    def inside(self, root: str, rel: object, source: str) -> str:
        """``root``/``rel`` for a ``rel`` taken from data, refused unless it stays under ``root``
        (symbolic links included, on the local filesystem)."""
        path = posixpath.join(root, relative_inside(rel, source))
        if self.is_local:
            real_root = os.path.realpath(root)
            real = os.path.realpath(path)
            if real != real_root and not real.startswith(real_root.rstrip("/") + "/"):
                raise CorruptFileError(
                    f"path {rel!r} resolves outside {root} (a symbolic link?); refusing to "
                    "follow it",
                    source,
                )
        return path

    def real(self, path: str) -> str:
        """``path`` with symbolic links resolved (local files); as given elsewhere."""
        if self.is_local:
            return os.path.realpath(path)
        return posixpath.normpath(path).rstrip("/") or "/"

    def is_within(self, path: str, other: FileIO, root: str) -> bool:
        """Whether ``path`` (on this filesystem) is ``root`` (on ``other``) or below it."""
        if self.protocol != other.protocol:
            return False
        a, b = self.real(path), other.real(root)
        return a == b or a.startswith(b.rstrip("/") + "/")

    @property
    def is_local(self) -> bool:
        return self.protocol in ("file", "local")

    # -- opening: the one place a file is opened for reading ----------------------------------
    def _check_link(self, path: str) -> None:
        """Refuse a file that is a symbolic link resolving outside the named directory (and
        outside every directory linked into it on the way to the file)."""
        root = self.root
        if root is None or not below(path, root) or not os.path.islink(path):
            return
        real = os.path.realpath(path)
        top = posixpath.normpath(root)
        allowed = {os.path.realpath(top)}
        d = posixpath.dirname(posixpath.normpath(path))
        while d != top and below(d, top):
            allowed.add(os.path.realpath(d))
            d = posixpath.dirname(d)
        if not any(below(real, a) for a in allowed):
            raise CorruptFileError(
                f"is a symbolic link to {real}, outside {root}; refusing to follow it",
                path,
                "copy the file into the directory instead of linking it",
            )

    def _open_local(self, path: str) -> BinaryIO:
        """A local regular file opened for reading, never blocking (see _SPECIAL_KINDS)."""
        path = self.fs._strip_protocol(path)  # file:// URLs and relative paths, as fsspec does
        self._check_link(path)
        try:
            before = os.stat(path)
        except (FileNotFoundError, NotADirectoryError):
            what = "is a broken symbolic link" if os.path.islink(path) else "file does not exist"
            raise MissingFileError(what, path) from None
        if not stat.S_ISREG(before.st_mode):
            raise _not_regular(before.st_mode, path)
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
        try:
            now = os.fstat(fd)
            if not stat.S_ISREG(now.st_mode):
                raise _not_regular(now.st_mode, path)
            if (now.st_dev, now.st_ino) != (before.st_dev, before.st_ino):
                raise StatectlError("changed while it was being opened; retry", path)
            os.set_blocking(fd, True)
            return os.fdopen(fd, "rb")
        except BaseException:
            os.close(fd)
            raise

    @_storage_errors
    def open_read(self, path: str) -> BinaryIO:
        """``path`` opened for reading in binary: on the local filesystem only a regular file,
        reached through no link out of the named directory; a missing file or a directory is
        a one-line error naming it."""
        if self.is_local:
            return self._open_local(path)
        try:
            return self.fs.open(path, "rb")
        except FileNotFoundError:
            raise MissingFileError("file does not exist", path) from None
        except IsADirectoryError:
            raise StatectlError("is a directory, expected a file", path) from None

    # -- reading ---------------------------------------------------------------------------
    @_storage_errors
    def exists(self, path: str) -> bool:
        return bool(self.fs.exists(path))

    @_storage_errors
    def is_dir(self, path: str) -> bool:
        return bool(self.fs.isdir(path))

    @_storage_errors
    def read_bytes(self, path: str) -> bytes:
        if self.is_local:
            with self._open_local(path) as f:
                return f.read()
        try:
            return self.fs.cat_file(path)
        except FileNotFoundError:
            raise MissingFileError("file does not exist", path) from None
        except IsADirectoryError:
            raise StatectlError("is a directory, expected a file", path) from None

    def iter_bytes(self, path: str, block: int) -> Iterator[bytes]:
        """The file's bytes ``block`` at a time (a large state file, never held at once)."""
        with self.open_read(path) as f:
            while chunk := f.read(block):
                yield chunk

    def read_bytes_if_exists(self, path: str) -> bytes | None:
        """The file's bytes, or None when it does not exist.

        ``exists`` first: on object stores it is answered from the listing cache when the
        directory was listed (as state directories are), so an absent checksum sidecar costs
        no request.
        """
        try:
            if not self.fs.exists(path):
                return None
            if self.is_local:
                if os.path.isdir(path):
                    return None
                with self._open_local(path) as f:  # a FIFO sidecar is refused, not awaited
                    return f.read()
            return self.fs.cat_file(path)
        except (FileNotFoundError, IsADirectoryError):
            return None

    def read_text(self, path: str) -> str:
        data = self.read_bytes(path)
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError:
            raise StatectlError("is not UTF-8 text; the file is corrupt", path) from None

    @_storage_errors
    def size(self, path: str) -> int:
        return int(self.fs.size(path))

    @_storage_errors
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
    @_storage_errors
    def write_atomic(
        self,
        path: str,
        data: bytes,
        *,
        overwrite: bool = False,
        overwrite_hint: str = "another writer got there first; write to a new directory",
    ) -> None:
        """Write ``data`` to a hidden temporary name beside ``path``, then rename it into place.

        On object stores the rename is a copy plus delete, which is still all-or-nothing for
        readers: the final key appears only once the copy completed. ``overwrite_hint`` tells the
        user how to overwrite (the flag that does it) when ``path`` exists.
        """

        def fill(tmp: str) -> None:
            with self.fs.open(tmp, "wb") as f:
                f.write(data)

        self._through_temp(path, fill, overwrite, overwrite_hint)

    def _through_temp(
        self, path: str, fill: Callable[[str], None], overwrite: bool = False, hint: str = ""
    ) -> None:
        """``fill(tmp)`` writes a hidden temporary sibling of ``path``, which is then renamed
        into place (removed on any failure); overwrites ``path`` only if ``overwrite``."""
        parent, name = posixpath.split(path)
        if not overwrite and self.exists(path):
            raise StatectlError("already exists; refusing to overwrite", path, hint or None)
        tmp = posixpath.join(parent, f".{name}.{uuid.uuid4()}.tmp")
        try:
            self.fs.makedirs(parent, exist_ok=True)
            fill(tmp)
            self.fs.mv(tmp, path)
        except BaseException as e:
            if self.fs.exists(tmp):
                self.fs.rm(tmp)
            if is_full(e):
                # Name the target, not the scratch file it was copied from (shutil puts the
                # source in the error's filename).
                raise StatectlError(
                    f"cannot write it: {os.strerror(e.errno or errno.ENOSPC)}",
                    path,
                    "free space there or write to another filesystem",
                ) from e
            raise

    @_storage_errors
    def put_atomic(
        self, local: str, path: str, *, overwrite: bool = False, overwrite_hint: str = ""
    ) -> None:
        """Upload the local file ``local`` to ``path`` like :meth:`write_atomic`, streamed (and
        in parts on object stores) rather than through memory; overwrites only if asked."""
        self._through_temp(
            path, lambda tmp: self.fs.put_file(local, tmp), overwrite, overwrite_hint
        )

    @_storage_errors
    def copy_atomic(self, src: str, path: str) -> None:
        """Copy ``src`` (on this filesystem; server-side on object stores) to ``path`` through a
        hidden temporary name, like :meth:`write_atomic`; never overwrites."""
        if self.is_local:
            self._open_local(src).close()  # a regular file, never a FIFO (no bytes read)
        self._through_temp(path, lambda tmp: self.fs.copy(src, tmp))

    @_storage_errors
    def makedirs(self, path: str) -> None:
        self.fs.makedirs(path, exist_ok=True)

    @_storage_errors
    def remove(self, path: str, recursive: bool = False) -> None:
        self.fs.rm(path, recursive=recursive)

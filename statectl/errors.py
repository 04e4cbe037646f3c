"""Errors statectl raises for bad input.

Every error a user can cause is a :class:`StatectlError`: the CLI prints it on one line
(naming the file and what to do) and exits with code 2. Anything else is a bug.
"""

from __future__ import annotations

from collections.abc import Callable

# Roots opened on remote filesystems, stripped ("lake/ckpt") -> the FileIO's url(). Paths in
# messages are the filesystem's stripped form; the user typed (and must see) the URL.
_URL_ROOTS: dict[str, Callable[[str], str]] = {}


def register_url_root(root: str, to_url: Callable[[str], str]) -> None:
    _URL_ROOTS[root.rstrip("/")] = to_url


def display_path(path: str) -> str:
    """``path`` as the user knows it: with its URL scheme when it lies under a remote root."""
    if "://" in path:
        return path
    best = ""
    for root in _URL_ROOTS:
        if len(root) > len(best) and (path == root or path.startswith(root + "/")):
            best = root
    return _URL_ROOTS[best](path) if best else path


class StatectlError(Exception):
    """Bad input: a one-line, user-facing message naming the file and what to do."""

    def __init__(self, message: str, path: str | None = None, hint: str | None = None) -> None:
        path = display_path(path) if path else path
        self.path = path
        self.hint = hint
        text = f"{path}: {message}" if path else message
        if hint:
            text = f"{text} ({hint})"
        super().__init__(text)


class NotACheckpointError(StatectlError):
    """The path is neither a Spark checkpoint nor a statectl savepoint."""


class CorruptFileError(StatectlError):
    """A file is truncated, fails a checksum, or does not parse."""


class MissingFileError(StatectlError):
    """A file that the format requires is absent."""


class UnsupportedError(StatectlError):
    """A format version, codec or type that statectl does not support (yet)."""

"""Errors statectl raises for bad input.

Every error a user can cause is a :class:`StatectlError`: the CLI prints it on one line
(naming the file and what to do) and exits with code 2. Anything else is a bug.
"""

from __future__ import annotations


class StatectlError(Exception):
    """Bad input: a one-line, user-facing message naming the file and what to do."""

    def __init__(self, message: str, path: str | None = None, hint: str | None = None) -> None:
        self.path = path
        self.hint = hint
        text = f"{path}: {message}" if path else message
        if hint:
            text = f"{text} ({hint})"
        # One line, always: messages may quote a library's multi-line error text.
        super().__init__(" ".join(text.split()) if "\n" in text else text)


class NotACheckpointError(StatectlError):
    """The path is neither a Spark checkpoint nor a statectl savepoint."""


class CorruptFileError(StatectlError):
    """A file is truncated, fails a checksum, or does not parse."""


class MissingFileError(StatectlError):
    """A file that the format requires is absent."""


class UnsupportedError(StatectlError):
    """A format version, codec or type that statectl does not support (yet)."""

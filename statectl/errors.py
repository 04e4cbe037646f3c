"""Errors statectl raises for bad input.

Every error a user can cause is a :class:`StatectlError`: the CLI prints it on one line
(naming the file and what to do) and exits with code 2. Anything else is a bug.
"""

from __future__ import annotations

import contextvars
import re
from collections.abc import Callable

# Roots the user named, in the form paths under them take in messages -> how the user wrote
# them: remote roots stripped ("lake/ckpt") -> the FileIO's url() ("s3://lake/ckpt"); local
# roots named by a relative path ("/home/me/ck") -> that path ("ck").
_URL_ROOTS: dict[str, Callable[[str], str]] = {}


def register_url_root(root: str, to_url: Callable[[str], str]) -> None:
    _URL_ROOTS[root.rstrip("/") or "/"] = to_url


def register_typed_root(root: str, typed: str) -> None:
    """Local directory ``root`` (absolute) was named ``typed`` (relative): paths under it are
    shown under ``typed``. The first name given wins (later ones are statectl's own)."""
    root = root.rstrip("/") or "/"
    typed = typed.rstrip("/") or typed
    if root not in _URL_ROOTS:
        _URL_ROOTS[root] = lambda path: typed + path[len(root) :]


def display_path(path: str) -> str:
    """``path`` as the user knows it: with its URL scheme when it lies under a remote root,
    relative when it lies under a local directory named relatively, never ``file://``."""
    if path.startswith("file:///"):
        path = path[len("file://") :]
    elif "://" in path:
        return path
    best = ""
    for root in _URL_ROOTS:
        if len(root) > len(best) and (path == root or path.startswith(root + "/")):
            best = root
    return _URL_ROOTS[best](path) if best else path


# A local path in a message: starts a word (not the rest of s3://bucket/x or a/b).
_LOCAL_PATH = re.compile(r"(?<![\w./:-])(?:file://)?(/[^\s'\"(),;]+)")


def display_paths_in(text: str) -> str:
    """``text`` with every local path in it (``/abs/ck/...``, ``file:///abs/ck/...``) as
    :func:`display_path` shows it: messages quote paths as well as name them."""
    if "/" not in text:
        return text
    return _LOCAL_PATH.sub(lambda m: _displayed(m.group(0), m.group(1)), text)


def _displayed(whole: str, path: str) -> str:
    shown = display_path(path.rstrip(":."))
    rest = path[len(path.rstrip(":.")) :]
    if shown == path.rstrip(":.") and whole.startswith("file://"):
        return path  # a local path outside any named root: without file://
    return shown + rest


# Who reads the messages: "api" (Python: ``overwrite=True``) or "cli" (``--overwrite``); the
# command line sets it before it runs a command.
_SURFACE: contextvars.ContextVar[str] = contextvars.ContextVar("statectl_surface", default="api")


def use_cli_wording() -> contextvars.Token[str]:
    """Messages name command-line options from now on (this context, and forked workers),
    until :func:`end_cli_wording` is given the token returned."""
    return _SURFACE.set("cli")


def end_cli_wording(token: contextvars.Token[str]) -> None:
    """The wording as it was before :func:`use_cli_wording`: a process that runs the CLI and
    then calls the API (a test, a warm-up) gets the API's wording back."""
    _SURFACE.reset(token)


def wording(cli: str, api: str) -> str:
    """``cli`` in a message the command line prints, else ``api`` (what a Python caller
    passes): a hint names the option of the surface the user is on."""
    return cli if _SURFACE.get() == "cli" else api


class StatectlError(Exception):
    """Bad input: a one-line, user-facing message naming the file and what to do."""

    def __init__(self, message: str, path: str | None = None, hint: str | None = None) -> None:
        path = display_path(path) if path else path
        message = display_paths_in(message)
        self.message = message  # without path and hint: what a Spark task sends to the driver
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


# Exceptions of libraries statectl drives, recognised by module so that none of them has to be
# imported (or installed) to classify a failure.
_STORAGE_MODULES = ("botocore", "aiobotocore", "s3fs", "aiohttp", "gcsfs", "adlfs", "pyarrow.fs")
_SPARK_MODULES = ("pyspark", "py4j")


def _module_of(exc: BaseException) -> str:
    return type(exc).__module__ or ""


def _first_line(text: str) -> str:
    lines = [ln.strip() for ln in str(text).splitlines() if ln.strip()]
    return lines[0] if lines else ""


def describe_failure(exc: BaseException) -> tuple[str, int]:
    """The one line the CLI prints for a failure, and its exit code.

    Exit 2: bad input, storage, or Spark errors (something the user can act on). Exit 3: a bug in
    statectl (an exception nobody anticipated): still one line, with the way to get the traceback.
    """
    for describe in _USER_FAILURES:
        line = describe(exc)
        if line is not None:
            return line, 2
    detail = _first_line(str(exc))
    return (
        f"internal error: {type(exc).__name__}{': ' + detail if detail else ''} "
        "(a bug in statectl; rerun with --debug for the traceback and report it)",
        3,
    )


def _statectl_failure(exc: BaseException) -> str | None:
    return f"error: {exc}" if isinstance(exc, StatectlError) else None


def _storage_failure(exc: BaseException) -> str | None:
    """An error of the storage libraries, raised directly or somewhere in the cause chain."""
    if any(_module_of(e).startswith(_STORAGE_MODULES) for e in [exc, *_causes(exc)]):
        return f"error: storage: {_storage_message(exc)}"
    return None


def _os_failure(exc: BaseException) -> str | None:
    if not isinstance(exc, OSError):
        return None
    where = f"{display_path(str(exc.filename))}: " if getattr(exc, "filename", None) else ""
    return f"error: {where}{exc.strerror or _first_line(str(exc)) or type(exc).__name__}"


def _spark_failure(exc: BaseException) -> str | None:
    if not _module_of(exc).startswith(_SPARK_MODULES):
        return None
    return f"error: Spark: {_first_line(str(exc)) or type(exc).__name__}"


def _memory_failure(exc: BaseException) -> str | None:
    if not isinstance(exc, MemoryError):
        return None
    return "error: out of memory (try a machine with more memory, or fewer workers)"


# The failures a user can act on (exit 2), in the order they are recognized: a storage error
# wrapped in an OSError is a storage error.
_USER_FAILURES: tuple[Callable[[BaseException], str | None], ...] = (
    _statectl_failure,
    _storage_failure,
    _os_failure,
    _spark_failure,
    _memory_failure,
)


def _causes(exc: BaseException) -> list[BaseException]:
    out: list[BaseException] = []
    seen = {id(exc)}
    cur = exc.__cause__ or exc.__context__
    while cur is not None and id(cur) not in seen and len(out) < 10:
        out.append(cur)
        seen.add(id(cur))
        cur = cur.__cause__ or cur.__context__
    return out


def _storage_message(exc: BaseException) -> str:
    name = type(exc).__name__
    text = _first_line(str(exc))
    if name == "NoCredentialsError":
        return (
            "no credentials found; pass --storage-option key=... --storage-option secret=..., "
            "set them in statectl.toml [storage], or set AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY"
        )
    if name in ("EndpointConnectionError", "ClientConnectorError", "ConnectTimeoutError"):
        return f"cannot reach the storage endpoint ({text}); check endpoint_url"
    return text or name

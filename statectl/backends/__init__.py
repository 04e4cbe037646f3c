"""State store backends and their registry.

Each backend is one module whose ``BACKEND`` object implements
:class:`~statectl.backends.base.Backend`: identity, versions, loading a partition, its entry
bytes, writers, health checks, capabilities. Callers look a backend up here (by name, or by the
provider class Spark recorded) and call it; nothing outside this package names a backend.
"""

from __future__ import annotations

from statectl.backends import hdfs, rocksdb
from statectl.backends.base import (
    Backend,
    Capabilities,
    RawState,
    ReadOptions,
    WriteOptions,
    empty_raw_state,
    version_chain,
)
from statectl.backends.entries import EntryCodec
from statectl.errors import StatectlError, UnsupportedError

__all__ = [
    "HDFS",
    "ROCKSDB",
    "Backend",
    "Capabilities",
    "EntryCodec",
    "RawState",
    "ReadOptions",
    "WriteOptions",
    "all_backends",
    "backend_for_provider",
    "empty_raw_state",
    "get_backend",
    "version_chain",
]

# One line per backend: the registry, in the order `list`/`--help` show them.
_BACKENDS: dict[str, Backend] = {b.name: b for b in (hdfs.BACKEND, rocksdb.BACKEND)}
HDFS = hdfs.BACKEND.name
ROCKSDB = rocksdb.BACKEND.name
# Spark's default provider when the conf was never pinned (very old checkpoints).
DEFAULT = HDFS


def all_backends() -> list[Backend]:
    return list(_BACKENDS.values())


def backend_names() -> list[str]:
    return list(_BACKENDS)


def get_backend(name: str) -> Backend:
    """The backend called ``name`` (``"hdfs"``, ``"rocksdb"``)."""
    try:
        return _BACKENDS[name]
    except KeyError:
        raise StatectlError(
            f"unknown state store backend {name!r} (known: {', '.join(_BACKENDS)})"
        ) from None


def backend_for_provider(provider_class: str | None, path: str | None = None) -> Backend:
    """The backend of the provider class Spark recorded (``None``: never pinned, Spark's
    default), or an error naming ``path``."""
    if provider_class is None:
        return _BACKENDS[DEFAULT]
    for backend in _BACKENDS.values():
        if backend.recognises(provider_class):
            return backend
    raise UnsupportedError(f"unsupported state store provider {provider_class}", path)


def provider_classes() -> dict[str, str]:
    """Backend name -> the provider class a restore pins for it."""
    return {b.name: b.provider_classes[0] for b in _BACKENDS.values()}

"""JSON read from a file, with every failure a :class:`CorruptFileError` naming that file.

Spark's metadata files (logs, operator metadata, RocksDB zip ``metadata``, schema strings) are
JSON. A damaged one can be invalid JSON, nested deeply enough to exhaust Python's recursion
limit, or valid JSON with a value of the wrong type; all three must be one clean error, not a
traceback from the first ``int()`` or ``.get()`` that meets them. :func:`loads` is the parse,
:class:`Fields` the typed getters the parsers use instead of ``obj.get(...)``.
"""

from __future__ import annotations

import builtins
import json
from typing import Any

from statectl.errors import CorruptFileError

_MISSING: Any = object()


def loads(text: str | bytes, path: str | None, what: str = "JSON", **kwargs: Any) -> Any:
    """``json.loads`` whose failures (bad syntax, too deep, bad UTF-8) name ``path``."""
    try:
        return json.loads(text, **kwargs)
    except json.JSONDecodeError as e:
        raise CorruptFileError(
            f"{what} is not valid JSON ({e.msg} at char {e.pos})", path
        ) from None
    except RecursionError:
        raise CorruptFileError(f"{what} is nested too deeply to be real metadata", path) from None
    except (ValueError, UnicodeDecodeError) as e:  # e.g. an integer of 5,000 digits
        raise CorruptFileError(f"{what} is not valid JSON ({e})", path) from None


def _type_name(v: Any) -> str:
    return {
        type(None): "null",
        bool: "a boolean",
        int: "a number",
        float: "a number",
        str: "a string",
        list: "an array",
        dict: "an object",
    }.get(type(v), type(v).__name__)


class Fields:
    """Typed getters over one JSON object of the file ``path`` (``where`` names the object)."""

    def __init__(self, obj: Any, path: str | None, where: str = "") -> None:
        if not isinstance(obj, dict):
            raise CorruptFileError(
                f"{where or 'metadata'} is {_type_name(obj)}, expected a JSON object", path
            )
        self.obj = obj
        self.path = path
        self.where = where

    def _name(self, key: str) -> str:
        return f"{self.where}.{key}" if self.where else key

    def _bad(self, key: str, value: Any, expected: str) -> CorruptFileError:
        return CorruptFileError(
            f"field {self._name(key)!r} is {_type_name(value)}, expected {expected}", self.path
        )

    def has(self, key: str) -> bool:
        return self.obj.get(key) is not None

    def raw(self, key: str, default: Any = None) -> Any:
        return self.obj.get(key, default)

    def _get(self, key: str, default: Any, expected: str) -> Any:
        value = self.obj.get(key)
        if value is None:
            if default is _MISSING:
                raise CorruptFileError(f"field {self._name(key)!r} is missing", self.path)
            return default
        return value

    def int(self, key: str, default: Any = _MISSING, *, minimum: int | None = None) -> Any:
        value = self._get(key, default, "an integer")
        if value is default and default is not _MISSING:
            return value
        if isinstance(value, bool) or not isinstance(value, int):
            raise self._bad(key, value, "an integer")
        if minimum is not None and value < minimum:
            raise CorruptFileError(
                f"field {self._name(key)!r} is {value}, expected at least {minimum}", self.path
            )
        return value

    # From here on ``str`` and ``list`` in this class body name the getters, not the builtins:
    # annotations spell the builtins out.
    def str(self, key: builtins.str, default: Any = _MISSING) -> Any:
        value = self._get(key, default, "a string")
        if value is default and default is not _MISSING:
            return value
        if not isinstance(value, str):
            raise self._bad(key, value, "a string")
        return value

    def list(self, key: builtins.str, default: Any = _MISSING) -> Any:
        value = self._get(key, default, "an array")
        if value is default and default is not _MISSING:
            return value
        if not isinstance(value, list):
            raise self._bad(key, value, "an array")
        return value

    def str_list(self, key: builtins.str, default: Any = _MISSING) -> Any:
        value = self.list(key, default)
        if value is default and default is not _MISSING:
            return value
        if not all(isinstance(v, str) for v in value):
            raise self._bad(key, value, "an array of strings")
        return value

    def obj_list(self, key: builtins.str, default: Any = _MISSING) -> builtins.list[Fields]:
        value = self.list(key, default)
        if value is default and default is not _MISSING:
            return value
        return [Fields(v, self.path, f"{self._name(key)}[{i}]") for i, v in enumerate(value)]

    def fields(self, key: builtins.str, default: Any = _MISSING) -> Any:
        value = self._get(key, default, "an object")
        if value is default and default is not _MISSING:
            return value
        return Fields(value, self.path, self._name(key))

    def str_map(self, key: builtins.str, default: Any = _MISSING) -> Any:
        """An object whose values are all strings (Spark's conf maps)."""
        f = self.fields(key, default)
        if f is default and default is not _MISSING:
            return f
        for k, v in f.obj.items():
            if not isinstance(v, str):
                raise f._bad(k, v, "a string")
        return dict(f.obj)

    def int_map(self, key: builtins.str, default: Any = _MISSING) -> Any:
        f = self.fields(key, default)
        if f is default and default is not _MISSING:
            return f
        return {k: f.int(k) for k in f.obj}

"""The user's code behind ``--query`` and ``--transform``: load ``MODULE:FUNCTION`` or
``FILE.py:FUNCTION``, and turn an exception it raises into one line naming the user's file.

Its own module because both query planning (query_plan.py) and state evolution
(evolution.py, ``--transform``) call the user's code, and neither should import the other.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import os
import sys
import traceback
from collections.abc import Iterator
from typing import Any

from statectl.errors import StatectlError


def load_query_function(spec: str) -> Any:
    """``package.module:function`` or ``path/to/file.py:function``."""
    module_name, sep, func_name = spec.rpartition(":")
    if not sep or not module_name or not func_name:
        raise StatectlError(f"--query wants MODULE:FUNCTION or FILE.py:FUNCTION, got {spec!r}")
    if module_name.endswith(".py"):
        if not os.path.isfile(module_name):
            raise StatectlError("--query names a file that does not exist", module_name)
        # As `python FILE.py` does: the file's folder is on the import path, so a job that
        # imports a module beside it loads.
        folder = os.path.dirname(os.path.abspath(module_name))
        if folder not in sys.path:
            sys.path.insert(0, folder)
        name = "_statectl_query_" + os.path.splitext(os.path.basename(module_name))[0]
        mod_spec = importlib.util.spec_from_file_location(name, module_name)
        assert mod_spec and mod_spec.loader
        module = importlib.util.module_from_spec(mod_spec)
        with user_errors(spec, module_name):
            mod_spec.loader.exec_module(module)
    else:
        if os.getcwd() not in sys.path:
            sys.path.insert(0, os.getcwd())
        try:
            with user_errors(spec, None, reraise=(ImportError,)):
                module = importlib.import_module(module_name)
        except ImportError as e:
            raise StatectlError(
                f"--query: cannot import {module_name!r} ({e}); run from the directory that "
                "holds it or give FILE.py:FUNCTION"
            ) from None
    func = getattr(module, func_name, None)
    if not callable(func):
        raise StatectlError(f"--query: {module_name} has no function {func_name!r}")
    return func


def _first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0] if text else ''}".rstrip(": ")


@contextlib.contextmanager
def user_errors(
    spec: str, user_file: str | None, reraise: tuple[type[BaseException], ...] = ()
) -> Iterator[None]:
    """An exception raised by the user's code becomes one line naming the user's file and line
    (the innermost frame in the user's file, else the innermost frame outside statectl,
    pyspark and py4j)."""
    try:
        yield
    except StatectlError:
        raise
    except reraise:
        raise
    except Exception as e:
        raise StatectlError(
            f"--query {spec} raised {_first_line(e)}", _where(e, spec, user_file)
        ) from None


def _where(e: Exception, spec: str, user_file: str | None) -> str:
    """``file:line`` of the user's code that raised ``e`` (``spec`` when none is found)."""
    if isinstance(e, SyntaxError) and e.filename:
        return f"{e.filename}:{e.lineno}"
    frames = traceback.extract_tb(e.__traceback__)
    mine = _in_file(frames, user_file) or [f for f in frames if not _is_library_frame(f.filename)]
    return f"{mine[-1].filename}:{mine[-1].lineno}" if mine else spec


def _in_file(frames: traceback.StackSummary, user_file: str | None) -> list[traceback.FrameSummary]:
    if not user_file:
        return []
    want = os.path.abspath(user_file)
    return [f for f in frames if os.path.abspath(f.filename) == want]


def _is_library_frame(filename: str) -> bool:
    return any(
        part in filename for part in (f"{os.sep}statectl{os.sep}", "pyspark", "py4j", "importlib")
    )

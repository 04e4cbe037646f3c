"""The ``statectl`` command line: parse, call one use case, render (rich for people, JSON for CI).

Known errors become one line on stderr and exit code 2; ``--debug`` shows the traceback.
Heavy modules (pyarrow, the backends) are imported inside the commands so ``--help`` is fast.

This module owns running the CLI (:func:`run`, :func:`main`) and reporting failures
(:func:`render_error`); :mod:`statectl.cli.app` holds the Typer app and its global and shared
options; the commands live by what they do in :mod:`~statectl.cli.reading`,
:mod:`~statectl.cli.savepoints` and :mod:`~statectl.cli.restoring`, and are registered below
in the order ``statectl --help`` lists them.
"""

from __future__ import annotations

import contextlib
import os
import sys

from statectl.cli import history, reading, restoring, savepoints
from statectl.cli.app import Command, app, print_json, state

# --debug's switch under the name it had in cli.py: bench/fuzz.py runs main() in-process and
# resets it between runs (the same dict the app's callback sets).
_state = state

__all__ = ["app", "json_requested", "main", "render_error", "run"]

for _name, _command in (
    ("inspect", reading.inspect),
    ("list", reading.list_),
    ("export", reading.export),
    ("savepoint", savepoints.savepoint),
    ("dispose", savepoints.dispose),
    ("relabel", savepoints.relabel),
    ("restore", restoring.restore),
    ("migrate", restoring.migrate),
    ("edit", savepoints.edit),
    ("diff", reading.diff),
    ("history", history.history),
    ("report", history.report),
):
    app.command(_name, cls=Command)(_command)


def json_requested(argv: list[str]) -> bool:
    """Whether the command line asks for JSON (``--json`` before any ``--``). Read from argv,
    not from parsed options, so that it is known even when the failure is in parsing."""
    for arg in argv:
        if arg == "--":
            return False
        if arg == "--json":
            return True
    return False


def render_error(exc: BaseException, as_json: bool) -> int:
    """Report a failure the way the command line asked; returns the exit code.

    People get one line on stderr, ``statectl: error: ...``. With ``--json``, stdout holds one
    JSON document whatever happens, so on failure it is the error object (nothing on stderr):
    ``{"error": "<the one line>", "path": <file or null>, "kind": "<exception class>",
    "exit_code": 2}``.
    """
    from statectl.errors import StatectlError, describe_failure

    message, code = describe_failure(exc)
    if not as_json:
        sys.stderr.write(f"statectl: {message}\n")
        return code
    if isinstance(exc, StatectlError):
        text, path = str(exc), exc.path
    else:
        text, path = message.removeprefix("error: "), getattr(exc, "filename", None)
    print_json(
        {
            "error": text,
            "path": None if path is None else str(path),
            "kind": type(exc).__name__,
            "exit_code": code,
        }
    )
    return code


def main() -> None:
    """Run the CLI: usage errors are Typer's (exit 2); every failure is one line, exit 2.

    Typer runs in standalone mode, so it prints usage errors itself and exits with code 2
    (typer vendors its own click: importing ``click`` here would fail without it installed).
    """
    from statectl.processes import exit_on_termination

    try:
        with exit_on_termination():
            app(prog_name="statectl")
    except KeyboardInterrupt:
        sys.stderr.write("statectl: interrupted\n")
        sys.exit(130)
    except Exception as e:
        if _state["debug"] or os.environ.get("STATECTL_DEBUG") == "1":
            raise
        sys.exit(render_error(e, json_requested(sys.argv[1:])))


def run() -> None:
    """The ``statectl`` executable: :func:`main`, then leave without interpreter teardown.

    A native library statectl loads (seen about once in 40 runs) can abort the process while
    its static threads are destroyed at exit ("terminate called without an active exception"),
    turning a finished command into exit code -6. Everything statectl writes is complete and
    flushed by then, so the process ends right away with the command's own exit code.
    """
    try:
        main()
        code = 0
    except SystemExit as e:
        if e.code is None or isinstance(e.code, int):
            code = e.code or 0
        else:
            sys.stderr.write(f"{e.code}\n")
            code = 1
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):
            stream.flush()
    os._exit(code)

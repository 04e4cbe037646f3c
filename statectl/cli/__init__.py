"""The ``statectl`` command line: parse, call one use case, render (rich for people, JSON for CI).

Known errors become one line on stderr and exit code 2; ``--debug`` shows the traceback.
Interrupted (Ctrl-C, SIGTERM, SIGHUP), a command says so and names the target it left marked;
every temporary file it or its worker processes made lives in one scratch directory that is
removed however the command ends (workers killed mid-way cannot clean up after themselves).
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
import re
import shutil
import signal
import sys
import tempfile
import traceback
from collections.abc import Iterator

from statectl.cli import history, operations, reading, restoring, savepoints
from statectl.cli.app import Command, StdoutFailed, app, guarded_stdout, print_json, state

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
    ("doctor", operations.doctor),
    ("gc", operations.gc),
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
    from statectl.errors import StatectlError, describe_failure, display_paths_in

    message, code = describe_failure(exc)
    message = display_paths_in(message)  # Spark's and the OS's messages quote paths too
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


# A reader that went away (``statectl list | head -1``): the conventional quiet exit of a
# process whose pipe closed, as if killed by SIGPIPE.
_CLOSED_PIPE_EXIT = 128 + signal.SIGPIPE

# Exit codes of a command stopped by a signal: exit_on_termination's 128 + the signal, and
# Typer's 130 for Ctrl-C (it turns KeyboardInterrupt into a silent exit 130).
_SIGNAL_EXITS = {
    128 + signal.SIGINT: "interrupted",
    128 + signal.SIGTERM: "terminated (SIGTERM)",
    128 + signal.SIGHUP: "hung up (SIGHUP)",
}


@contextlib.contextmanager
def _run_scratch() -> Iterator[None]:
    """Every temporary file of this command (its own and its forked workers', which inherit
    ``tempfile.tempdir``) under one ``statectl-run-*`` directory, removed at the end: a worker
    killed on Ctrl-C or SIGTERM never runs its own clean-up."""
    previous = tempfile.tempdir
    try:
        _remove_stale_runs(tempfile.gettempdir())
        scratch = tempfile.mkdtemp(prefix=f"statectl-run-{os.getpid()}-")
    except OSError:  # no writable temporary directory: each step reports its own failure
        yield
        return
    tempfile.tempdir = scratch
    try:
        yield
    finally:
        tempfile.tempdir = previous
        shutil.rmtree(scratch, ignore_errors=True)


_RUN_DIR = re.compile(r"statectl-run-(\d+)-")


def _remove_stale_runs(base: str) -> None:
    """Scratch directories of statectl runs killed with kill -9 (no clean-up ran), removed by
    the next run: those of this user whose process is gone."""
    with os.scandir(base) as entries:
        for e in entries:
            m = _RUN_DIR.match(e.name)
            if m is None or not e.is_dir(follow_symlinks=False):
                continue
            if e.stat(follow_symlinks=False).st_uid != os.getuid() or _alive(int(m.group(1))):
                continue
            shutil.rmtree(e.path, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # another user's process
        return True
    return True


def interrupted_message(what: str) -> str:
    """``statectl: interrupted``, naming each target this run left marked unfinished and how
    to redo it."""
    from statectl.errors import display_path
    from statectl.in_progress import marked_targets

    line = f"statectl: {what}"
    for command, target in marked_targets():
        line += (
            f"; {display_path(target)} is left marked as an unfinished {command} (Spark will not start from "
            f"it): run the {command} again with --overwrite to replace it"
        )
    return line + "\n"


_GLOBAL_WITH_VALUE = "--storage-option"
_GLOBAL_FLAG = "--debug"  # ``statectl inspect CKPT --debug`` as well as ``statectl --debug ...``


def global_options_first(argv: list[str]) -> list[str]:
    """``argv`` with every ``--storage-option VALUE`` and ``--debug`` written after the command
    moved before it, where Typer takes global options (``statectl list s3://x --storage-option
    k=v`` used to be a bare "No such option"). No command has an option of those names."""
    command_at = None
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg == _GLOBAL_WITH_VALUE:
            i += 2
            continue
        if not arg.startswith("-"):
            command_at = i
            break
        i += 1
    if command_at is None:
        return argv
    head, rest, moved = argv[:command_at], [], []
    tail = argv[command_at:]
    j = 0
    while j < len(tail):
        arg = tail[j]
        if arg == "--":
            rest += tail[j:]
            break
        if arg == _GLOBAL_WITH_VALUE and j + 1 < len(tail):
            moved += tail[j : j + 2]
            j += 2
        elif arg.startswith(_GLOBAL_WITH_VALUE + "=") or arg == _GLOBAL_FLAG:
            moved.append(arg)
            j += 1
        else:
            rest.append(arg)
            j += 1
    return head + moved + rest


def main() -> None:
    """Run the CLI: usage errors are Typer's (exit 2); every failure is one line, exit 2.

    Typer runs in standalone mode, so it prints usage errors itself and exits with code 2
    (typer vendors its own click: importing ``click`` here would fail without it installed).
    """
    from statectl.errors import end_cli_wording, use_cli_wording
    from statectl.native_memory import tune_for_bulk_work

    wording = use_cli_wording()
    tune_for_bulk_work()
    try:
        _main()
    finally:
        end_cli_wording(wording)


def _main() -> None:
    """The command, its failures rendered in the CLI's wording (``main`` restores the
    caller's wording after)."""
    from statectl.processes import exit_on_termination

    try:
        with _run_scratch(), exit_on_termination(), guarded_stdout():
            app(args=global_options_first(sys.argv[1:]), prog_name="statectl")
    except StdoutFailed as e:
        # Never to stdout again (it failed), even under --json: one line on stderr.
        if not e.closed:
            sys.stderr.write(f"statectl: error: {e}\n")
        sys.exit(_CLOSED_PIPE_EXIT if e.closed else 2)
    except KeyboardInterrupt:
        sys.stderr.write(interrupted_message("interrupted"))
        sys.exit(130)
    except SystemExit as e:
        if isinstance(e.code, int) and e.code in _SIGNAL_EXITS:
            sys.stderr.write(interrupted_message(_SIGNAL_EXITS[e.code]))
        raise
    except Exception as e:
        if _state["debug"] or os.environ.get("STATECTL_DEBUG") == "1":
            # The traceback, then the same report and exit code as without --debug.
            traceback.print_exc()
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

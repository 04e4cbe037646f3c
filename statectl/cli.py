"""The ``statectl`` command line: parse, call one use case, render (rich for people, JSON for CI).

Known errors become one line on stderr and exit code 2; ``--debug`` shows the traceback.
Heavy modules (pyarrow, the backends) are imported inside the commands so ``--help`` is fast.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Annotated, Any

import typer

app = typer.Typer(
    help="Savepoints for Spark Structured Streaming: inspect, export, savepoint and restore state.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

_state = {"debug": False}

JsonOpt = Annotated[bool, typer.Option("--json", help="Print machine-readable JSON.")]
BatchOpt = Annotated[
    int | None, typer.Option("--batch", "-b", help="Committed batch to read (default: latest).")
]


@app.callback()
def _main(
    debug: Annotated[bool, typer.Option("--debug", help="Show tracebacks for errors.")] = False,
) -> None:
    _state["debug"] = debug or os.environ.get("STATECTL_DEBUG") == "1"


def _print_json(obj: Any) -> None:
    sys.stdout.write(json.dumps(obj, indent=2, default=str) + "\n")


def _console():  # type: ignore[no-untyped-def]
    from rich.console import Console

    return Console()


@app.command()
def inspect(
    path: Annotated[str, typer.Argument(help="Checkpoint directory (local path or URL).")],
    batch: BatchOpt = None,
    as_json: JsonOpt = False,
    rows: Annotated[bool, typer.Option(help="Count state rows (reads all state files).")] = True,
) -> None:
    """Show a checkpoint: query, batches, watermark, offsets, pinned confs, operators and stores."""
    from statectl.checkpoint.model import Checkpoint
    from statectl.inspect import inspect_checkpoint

    info = inspect_checkpoint(Checkpoint.open(path), batch, rows=rows)
    if as_json:
        _print_json(info)
        return
    from statectl.render import render_inspect

    render_inspect(_console(), info)


@app.command("list")
def list_(
    directory: Annotated[str, typer.Argument(help="Directory to search for checkpoints.")],
    as_json: JsonOpt = False,
) -> None:
    """List every checkpoint under a directory with backend, batch, operators, size and health."""
    from statectl.inspect import list_dir

    entries = list_dir(directory)
    if as_json:
        _print_json(entries)
        return
    from statectl.render import render_list

    render_list(_console(), entries)


@app.command()
def export(
    path: Annotated[str, typer.Argument(help="Checkpoint directory (local path or URL).")],
    output: Annotated[
        str, typer.Option("--output", "-o", help="Output file: .parquet, .jsonl or .csv.")
    ],
    operator: Annotated[int, typer.Option("--operator", help="Stateful operator id.")] = 0,
    store: Annotated[
        str | None, typer.Option("--store", help="Store name (statestore storeName).")
    ] = None,
    join_side: Annotated[
        str | None, typer.Option("--join-side", help="left or right: a stream-stream join side.")
    ] = None,
    state_var: Annotated[
        str | None, typer.Option("--state-var", help="transformWithState variable name.")
    ] = None,
    timers: Annotated[
        bool, typer.Option("--timers", help="Read transformWithState timers.")
    ] = False,
    batch: BatchOpt = None,
    overwrite: Annotated[
        bool, typer.Option("--overwrite", help="Replace an existing output file.")
    ] = False,
    as_json: JsonOpt = False,
) -> None:
    """Export one operator's state: the table Spark's statestore reader returns."""
    from statectl.checkpoint.model import Checkpoint
    from statectl.errors import StatectlError
    from statectl.export import export_state
    from statectl.state import Selection

    if join_side not in (None, "left", "right"):
        raise StatectlError(f"--join-side must be left or right, not {join_side!r}")
    if sum(x is not None for x in (store, join_side, state_var)) + timers > 1:
        raise StatectlError("give at most one of --store, --join-side, --state-var, --timers")
    sel = Selection(operator, store, join_side, state_var, timers, batch)
    result = export_state(Checkpoint.open(path), sel, output, overwrite=overwrite)
    if as_json:
        _print_json(result)
    else:
        _console().print(f"Wrote {result['rows']} rows to {result['path']}")


def main() -> None:
    from statectl.errors import StatectlError

    try:
        app(standalone_mode=False)
    except StatectlError as e:
        if _state["debug"]:
            raise
        sys.stderr.write(f"statectl: error: {e}\n")
        sys.exit(2)
    except (FileNotFoundError, PermissionError, IsADirectoryError, NotADirectoryError) as e:
        if _state["debug"]:
            raise
        sys.stderr.write(f"statectl: error: {e.filename or ''}: {e.strerror or e}\n")
        sys.exit(2)
    except typer.Exit as e:
        sys.exit(e.exit_code)
    except typer.Abort:
        sys.stderr.write("Aborted.\n")
        sys.exit(1)
    except Exception as e:  # click usage errors
        import click

        if isinstance(e, click.ClickException):
            e.show()
            sys.exit(2)
        raise


if __name__ == "__main__":
    main()

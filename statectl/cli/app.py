"""The Typer application: its global options, the option types commands share, and the
helpers every command renders with (JSON on stdout, a rich console).

Only typer, rich's annotations and :mod:`statectl.errors` are imported here: the commands
import their use cases when they run, so ``statectl --help`` stays fast.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
from collections.abc import Iterator
from typing import TYPE_CHECKING, Annotated, Any, TextIO

import typer
from typer.core import TyperCommand, TyperGroup

from statectl.errors import StatectlError

if TYPE_CHECKING:
    from rich.console import Console


def _flags_without_type(params: list[Any]) -> list[Any]:
    """Typer's rich help prints ``<bool>`` after every flag (--json, --help, ...): a flag takes no
    value, so show none (an empty metavar is what Typer prints instead of the type)."""
    for p in params:
        if getattr(p, "is_flag", False) and getattr(p, "metavar", "") is None:
            p.metavar = ""
    return params


class Command(TyperCommand):
    """Every command's class: its flags render without a type placeholder."""

    def get_params(self, ctx: Any) -> list[Any]:
        return _flags_without_type(super().get_params(ctx))


class _Group(TyperGroup):
    def get_params(self, ctx: Any) -> list[Any]:
        return _flags_without_type(super().get_params(ctx))


app = typer.Typer(
    cls=_Group,
    help="Savepoints for Spark Structured Streaming: inspect, export, savepoint and restore state.",
    no_args_is_help=True,
    add_completion=True,
    pretty_exceptions_enable=False,
)

# Set by the global --debug option; read by statectl.cli.main when a command fails.
state = {"debug": False}

JsonOpt = Annotated[bool, typer.Option("--json", help="Print machine-readable JSON.")]
NoVerifyOpt = Annotated[
    bool,
    typer.Option(
        "--no-verify", help="Skip checksums over state files and the key placement check."
    ),
]
WideOpt = Annotated[
    bool,
    typer.Option(
        "--wide", help="Full schemas and names, however wide (default: fit the terminal)."
    ),
]
MemoryOpt = Annotated[
    str | None,
    typer.Option(
        "--memory",
        help="Memory budget of the local engine, e.g. 512M or 4G (default: a quarter of the "
        "machine's RAM up to 2G, or $STATECTL_MEMORY); state larger than it is spilled to temporary files.",
    ),
]
WorkersOpt = Annotated[
    int | None,
    typer.Option(
        "--workers",
        help="Parallel partition tasks (default: one per core, or $STATECTL_WORKERS).",
    ),
]
EngineOpt = Annotated[
    str,
    typer.Option(
        "--engine",
        help="local (this machine), spark (partitions as Spark tasks) or auto (spark for state "
        "of $STATECTL_SPARK_THRESHOLD, default 1G, or more when a session is at hand).",
    ),
]
SparkConfOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--spark-conf",
        help="KEY=VALUE for the Spark engine's session, repeatable (e.g. spark.master=yarn).",
    ),
]
BatchOpt = Annotated[
    int | None, typer.Option("--batch", "-b", help="Committed batch to read (default: latest).")
]
ChangelogOpt = Annotated[
    bool,
    typer.Option(
        "--changelog/--no-changelog",
        help="RocksDB target as changelog files instead of a zip+SST snapshot.",
    ),
]
JoinStateFormatOpt = Annotated[
    int | None,
    typer.Option(
        "--join-state-format",
        help="2, 3 or 4: convert stream-stream join state to this format (3 and 4: RocksDB "
        "only; default: the savepoint's where the backend runs it, else 2).",
    ),
]
AggregationStateFormatOpt = Annotated[
    int | None,
    typer.Option(
        "--aggregation-state-format",
        help="1 or 2: convert streaming aggregation state to this format "
        "(spark.sql.streaming.aggregation.stateFormatVersion; 1 repeats the grouping columns "
        "in the value; default: the savepoint's).",
    ),
]
GroupStateFormatOpt = Annotated[
    int | None,
    typer.Option(
        "--group-state-format",
        help="1 or 2: convert flatMapGroupsWithState / applyInPandasWithState state to this "
        "format (spark.sql.streaming.flatMapGroupsWithState.stateFormatVersion; 2 nests the "
        "state in groupState; state with timeouts does not convert; default: the savepoint's).",
    ),
]


def _show_version(value: bool) -> None:
    if value:
        from statectl import __version__

        print(f"statectl {__version__}")
        raise typer.Exit()


@app.callback()
def _main(
    debug: Annotated[bool, typer.Option("--debug", help="Show tracebacks for errors.")] = False,
    storage_option: Annotated[
        list[str] | None,
        typer.Option(
            "--storage-option",
            metavar="KEY=VALUE",
            help="fsspec storage option for every non-local path, repeatable, e.g. "
            "endpoint_url=http://minio:9000, anon=true, client_kwargs.region_name=eu-west-1 "
            '(also \\[storage."s3://bucket/"] in statectl.toml).',
        ),
    ] = None,
    version: Annotated[
        bool,
        typer.Option(
            "--version", callback=_show_version, is_eager=True, help="Print the version and exit."
        ),
    ] = False,
) -> None:
    from statectl.io import parse_storage_options, set_storage_options

    state["debug"] = debug or os.environ.get("STATECTL_DEBUG") == "1"
    set_storage_options(parse_storage_options(storage_option or []))


def engine_args(engine: str, spark_conf: list[str] | None) -> dict[str, Any]:
    """--engine and --spark-conf, checked, as the use cases' ``engine``/``spark_confs``."""
    from statectl.spark_engine import ENGINES, parse_spark_confs

    if engine not in ENGINES:
        raise StatectlError(f"--engine must be one of {', '.join(ENGINES)}, not {engine!r}")
    confs = parse_spark_confs(spark_conf or [])
    if confs and engine == "local":
        raise StatectlError("--spark-conf needs --engine spark (or auto)")
    return {"engine": engine, "spark_confs": confs}


def parse_pairs(pairs: list[str], what: str) -> dict[str, str]:
    """Repeated KEY=VALUE arguments (``what`` names them in the error) as a dict."""
    out = {}
    for p in pairs:
        k, sep, v = p.partition("=")
        if not sep or not k or not v:
            raise StatectlError(f"{what} must look like KEY=VALUE, got {p!r}")
        out[k] = v
    return out


def print_json(obj: Any) -> None:
    """One JSON document on stdout (what ``--json`` prints)."""
    sys.stdout.write(json.dumps(obj, indent=2, default=str) + "\n")


def console() -> Console:
    """A rich console on stdout (rich imported only when a command renders with it)."""
    from rich.console import Console

    return Console()


class StdoutFailed(Exception):
    """Writing to standard output failed (``closed``: the reader went away, as ``| head``
    does). Not an OSError, so no library on the way (click catches EPIPE) takes it for its
    own, and the error is never written to the stdout that failed."""

    def __init__(self, error: OSError) -> None:
        self.error = error
        self.closed = isinstance(error, BrokenPipeError)
        super().__init__(f"standard output: {error.strerror or error}")


class _GuardedStdout:
    """``sys.stdout`` whose failed writes raise :class:`StdoutFailed`; everything else is the
    real stream's (rich and print() see a text stream as before)."""

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream

    def write(self, text: str) -> int:
        try:
            return self._stream.write(text)
        except OSError as e:
            raise StdoutFailed(e) from None

    def flush(self) -> None:
        try:
            self._stream.flush()
        except OSError as e:
            raise StdoutFailed(e) from None

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


@contextlib.contextmanager
def guarded_stdout() -> Iterator[None]:
    """Standard output's failures as :class:`StdoutFailed` while the block runs, flushed at its
    end (a buffered write to a full disk fails only then)."""
    real = sys.stdout
    sys.stdout = _GuardedStdout(real)  # type: ignore[assignment]
    try:
        yield
    finally:
        try:
            sys.stdout.flush()
        finally:
            sys.stdout = real

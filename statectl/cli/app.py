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
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Annotated, Any, TextIO

import typer
from typer.core import TyperCommand, TyperGroup

from statectl.errors import StatectlError

if TYPE_CHECKING:
    from rich.console import Console


def _flags_without_type(params: list[Any]) -> list[Any]:
    """Typer's rich help prints ``<bool>`` after every flag (--json, --help, ...): a flag takes no
    value, so show none (an empty metavar is what Typer prints instead of the type). Arguments
    get their name in capitals as their metavar."""
    for p in params:
        if getattr(p, "is_flag", False) and getattr(p, "metavar", "") is None:
            p.metavar = ""
        # An argument is shown by its name in capitals (Typer's usage line showed {target}).
        if getattr(p, "param_type_name", "") == "argument" and p.metavar is None:
            p.metavar = p.name.upper()
        # An option without a metavar of its own: N for a number, else its name in capitals
        # (Typer showed the Python type: <int>, <list[str]>).
        if getattr(p, "param_type_name", "") == "option" and p.metavar is None:
            p.metavar = "N" if _takes_int(p) else _name_metavar(p)
    return params


def _takes_int(param: Any) -> bool:
    annotation = getattr(getattr(param, "type_descriptor", None), "annotation", None)
    return annotation is int or int in getattr(annotation, "__args__", ())


def _name_metavar(param: Any) -> str:
    longest = max(param.opts, key=len)
    return longest.lstrip("-").replace("-", "_").upper()


class Command(TyperCommand):
    """Every command's class: its flags render without a type placeholder, and its help is
    laid out for a terminal of any width (see :meth:`format_help`)."""

    def get_params(self, ctx: Any) -> list[Any]:
        return _flags_without_type(super().get_params(ctx))

    def collect_usage_pieces(self, ctx: Any) -> list[str]:
        """Required arguments as ``TARGET``, the convention of usage lines (Typer writes
        ``{TARGET}``); optional ones stay ``[TARGET]``."""
        pieces = super().collect_usage_pieces(ctx)
        return [p[1:].replace("}", "", 1) if p.startswith("{") else p for p in pieces]

    def format_help(self, ctx: Any, formatter: Any) -> None:
        """Usage, the docstring rewrapped, then one section per ``rich_help_panel`` (in the
        order the options come): an option's help goes under its name when the name is long.
        Typer's rich tables cut option names and broke words at 80 columns."""
        self.format_usage(ctx, formatter)
        self.format_help_text(ctx, formatter)
        sections: dict[str, list[tuple[str, str]]] = {}
        for param in self.get_params(ctx):
            record = _help_record(param, ctx)
            if record is not None:
                sections.setdefault(_panel_of(param), []).append(record)
        order = ["Arguments", *PANELS]
        for name, records in sorted(
            sections.items(),
            key=lambda kv: (kv[0] == "Options", order.index(kv[0]) if kv[0] in order else 99),
        ):
            with formatter.section(name):
                formatter.write_dl(records, col_max=_NAME_COLUMN)
        self.format_epilog(ctx, formatter)


# Option names longer than this put their help on the next line.
_NAME_COLUMN = 26


def _panel_of(param: Any) -> str:
    if getattr(param, "param_type_name", "") == "argument":
        return "Arguments"
    return getattr(param, "rich_help_panel", None) or "Options"


def _help_record(param: Any, ctx: Any) -> tuple[str, str] | None:
    """An option's (names and metavar, help); an argument's (its metavar, help)."""
    if getattr(param, "param_type_name", "") == "argument":
        name = param.metavar or param.name.upper()
        return name, " ".join((param.help or "").split())
    record = param.get_help_record(ctx)
    if record is None:
        return None
    names, text = record
    return names, " ".join(text.split())


class _Group(TyperGroup):
    def get_params(self, ctx: Any) -> list[Any]:
        return _flags_without_type(super().get_params(ctx))

    def parse_args(self, ctx: Any, args: list[str]) -> list[str]:
        # Typer's rich help printed itself while the no-arguments error was being built (and
        # the error then printed nothing); this help is returned as text, so print it here:
        # bare ``statectl`` shows the help and exits 2, as before.
        if not args and self.no_args_is_help and not ctx.resilient_parsing:
            typer.echo(ctx.get_help())
            ctx.exit(2)
        return list(super().parse_args(ctx, args))

    def format_help(self, ctx: Any, formatter: Any) -> None:
        """As :meth:`Command.format_help`; each command with its whole first paragraph,
        rewrapped (not cut to a line)."""
        self.format_usage(ctx, formatter)
        self.format_help_text(ctx, formatter)
        records = [r for r in (_help_record(p, ctx) for p in self.get_params(ctx)) if r]
        with formatter.section("Options"):
            formatter.write_dl(records, col_max=_NAME_COLUMN)
        commands = []
        for name in self.list_commands(ctx):
            cmd = self.get_command(ctx, name)
            if cmd is not None and not cmd.hidden:
                summary = (cmd.help or "").strip().split("\n\n")[0]
                commands.append((name, " ".join(summary.split())))
        with formatter.section("Commands"):
            formatter.write_dl(commands, col_max=_NAME_COLUMN)


app = typer.Typer(
    cls=_Group,
    help="Savepoints for Spark Structured Streaming: inspect, export, savepoint and restore state.",
    no_args_is_help=True,
    add_completion=True,
    pretty_exceptions_enable=False,
)

# Set by the global --debug option; read by statectl.cli.main when a command fails.
state = {"debug": False}

# Panels of restore's and migrate's --help (docs: every helper files its options under one).
WHAT, WHERE, CONVERSIONS, EVOLUTION, ENGINE, OUTPUT = (
    "What to restore",
    "Where",
    "Conversions",
    "Evolution",
    "Engine",
    "Output",
)


PANELS = (WHAT, WHERE, CONVERSIONS, EVOLUTION, ENGINE, OUTPUT)


def _choices(*values: str) -> Callable[[str], list[str]]:
    """Shell completion of an option's fixed values."""
    return lambda incomplete: [v for v in values if v.startswith(incomplete.lower())]


JsonOpt = Annotated[bool, typer.Option("--json", help="Print machine-readable JSON.")]
OutputJsonOpt = Annotated[
    bool, typer.Option("--json", help="Print machine-readable JSON.", rich_help_panel=OUTPUT)
]
_NO_VERIFY_HELP = "Skip checksums and the key placement check."
NoVerifyOpt = Annotated[bool, typer.Option("--no-verify", help=_NO_VERIFY_HELP)]
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
        metavar="SIZE",
        help="Memory budget, e.g. 512M (default: RAM/4, at most 2G).",
        rich_help_panel=ENGINE,
    ),
]
WorkersOpt = Annotated[
    int | None,
    typer.Option(
        "--workers",
        help="Parallel partition tasks (default: one per core).",
        rich_help_panel=ENGINE,
    ),
]
EngineOpt = Annotated[
    str,
    typer.Option(
        "--engine",
        metavar="ENGINE",
        help="local, spark (partitions as Spark tasks) or auto.",
        rich_help_panel=ENGINE,
        autocompletion=_choices("local", "spark", "auto"),
    ),
]
SparkConfOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--spark-conf",
        metavar="KEY=VALUE",
        help="A conf of the Spark engine's session, repeatable.",
        rich_help_panel=ENGINE,
    ),
]
BatchOpt = Annotated[
    int | None, typer.Option("--batch", "-b", help="Committed batch to read (default: latest).")
]
ChangelogOpt = Annotated[
    bool,
    typer.Option(
        "--changelog/--no-changelog",
        help="RocksDB as changelog files, not a zip+SST snapshot.",
        rich_help_panel=WHERE,
    ),
]
JoinStateFormatOpt = Annotated[
    int | None,
    typer.Option(
        "--join-state-format",
        metavar="2|3|4",
        help="Convert stream-stream join state to this format.",
        rich_help_panel=CONVERSIONS,
    ),
]
AggregationStateFormatOpt = Annotated[
    int | None,
    typer.Option(
        "--aggregation-state-format",
        metavar="1|2",
        help="Convert streaming aggregation state to this format.",
        rich_help_panel=CONVERSIONS,
    ),
]
GroupStateFormatOpt = Annotated[
    int | None,
    typer.Option(
        "--group-state-format",
        metavar="1|2",
        help="Convert flatMapGroupsWithState state to this format.",
        rich_help_panel=CONVERSIONS,
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
            '(also [storage."s3://bucket/"] in statectl.toml); before or after the command.',
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
    sys.stdout = _GuardedStdout(real)  # type: ignore[assignment,unused-ignore]
    try:
        yield
    finally:
        try:
            sys.stdout.flush()
        finally:
            sys.stdout = real

"""The commands that write a Spark checkpoint: ``restore`` (from a savepoint) and ``migrate``
(savepoint then restore in one step). Each builds its options object once
(:class:`~statectl.restoration.options.RestoreOptions` / ``MigrateOptions``), calls
:func:`statectl.api.restore_with` / ``migrate_with`` and renders the result; a refused plan is
printed like a result and exits 2."""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Annotated, Any

import typer

from statectl.cli.app import (
    EVOLUTION,
    OUTPUT,
    WHAT,
    WHERE,
    AggregationStateFormatOpt,
    ChangelogOpt,
    EngineOpt,
    GroupStateFormatOpt,
    JoinStateFormatOpt,
    MemoryOpt,
    OutputJsonOpt,
    SparkConfOpt,
    WorkersOpt,
    _choices,
    engine_args,
    parse_pairs,
    print_json,
)
from statectl.errors import StatectlError

if TYPE_CHECKING:
    from statectl.restoration.options import RestoreOptions
    from statectl.results import RestoreResult

# restore's own options, in the order its help lists them, each in its panel of --help.
TargetArg = Annotated[
    str, typer.Argument(help="New checkpoint directory (must not exist or be empty).")
]
SavepointOpt = Annotated[
    str,
    typer.Option(
        "--savepoint", "-s", metavar="DIR", help="Savepoint to restore.", rich_help_panel=WHAT
    ),
]
_BACKENDS = ("hdfs", "rocksdb")
BackendOpt = Annotated[
    str | None,
    typer.Option(
        "--backend",
        metavar="BACKEND",
        help="hdfs or rocksdb (default: the source's).",
        rich_help_panel=WHERE,
        autocompletion=_choices(*_BACKENDS),
    ),
]
PartitionsOpt = Annotated[
    int | None,
    typer.Option(
        "--partitions", help="State partitions (default: the source's).", rich_help_panel=WHERE
    ),
]
MapOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--map",
        metavar="UID=ID",
        help="Restore a uid at another operator id; repeatable.",
        rich_help_panel=WHAT,
    ),
]
DropOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--drop",
        metavar="UID",
        help="A uid whose state the new query does not have.",
        rich_help_panel=WHAT,
    ),
]
AllowNonRestoredOpt = Annotated[
    bool,
    typer.Option(
        "--allow-non-restored-state",
        "-n",
        help="Drop state no operator takes.",
        rich_help_panel=WHAT,
    ),
]
QueryOpt = Annotated[
    str | None,
    typer.Option(
        "--query",
        metavar="MODULE:FN",
        help="The new query (or FILE.py:FN), planned to match state.",
        rich_help_panel=EVOLUTION,
    ),
]
FromQueryOpt = Annotated[
    str | None,
    typer.Option(
        "--from-query",
        metavar="MODULE:FN",
        help="The savepoint's query: aggregates matched by identity.",
        rich_help_panel="Evolution",
    ),
]
OutputModeOpt = Annotated[
    str | None,
    typer.Option(
        "--output-mode",
        metavar="MODE",
        help="append, update or complete (default: what Spark takes).",
        rich_help_panel=EVOLUTION,
        autocompletion=_choices("append", "update", "complete"),
    ),
]
TransformOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--transform",
        metavar="UID=FILE.py:FN",
        help="FN(batch, store) turns a uid's rows into the query's.",
        rich_help_panel=EVOLUTION,
    ),
]
CheckpointFormatOpt = Annotated[
    int | None,
    typer.Option(
        "--checkpoint-format",
        metavar="1|2",
        help="RocksDB checkpoint format (default: the source's).",
        rich_help_panel=WHERE,
    ),
]
SourceOffsetsOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--source-offsets",
        metavar="NAME=JSON",
        help="Where a source starts (- for its own start); repeatable.",
        rich_help_panel=WHAT,
    ),
]
DryRunOpt = Annotated[
    bool,
    typer.Option(
        "--dry-run",
        help="Check all the restore checks (data too); write nothing.",
        rich_help_panel=OUTPUT,
    ),
]
RestoreOverwriteOpt = Annotated[
    bool,
    typer.Option(
        "--overwrite",
        help="Replace an interrupted restore (never a checkpoint).",
        rich_help_panel=WHERE,
    ),
]


# formats (issue 23): how the restored checkpoint goes on, and the log formats it is written in.
NewQueryIdOpt = Annotated[
    bool,
    typer.Option(
        "--new-query-id",
        help="Fork: a new query id, to run beside the original.",
        rich_help_panel="Where",
    ),
]
WatermarkOpt = Annotated[
    str | None,
    typer.Option(
        "--watermark",
        metavar="TIME",
        help="Event-time watermark to resume at (ISO or epoch ms).",
        rich_help_panel="Conversions",
    ),
]
OffsetLogOpt = Annotated[
    int | None,
    typer.Option(
        "--offset-log",
        metavar="1|2",
        help="Offset log version (default: the source's).",
        rich_help_panel="Conversions",
    ),
]
RowChecksumsOpt = Annotated[
    bool | None,
    typer.Option(
        "--row-checksums/--no-row-checksums",
        help="Spark 4.1+ row checksums in state (default: off).",
        rich_help_panel="Conversions",
    ),
]


def restore(
    target: TargetArg,
    savepoint_path: SavepointOpt,
    backend: BackendOpt = None,
    partitions: PartitionsOpt = None,
    map_: MapOpt = None,
    drop: DropOpt = None,
    allow_non_restored: AllowNonRestoredOpt = False,
    query: QueryOpt = None,
    from_query: FromQueryOpt = None,
    output_mode: OutputModeOpt = None,
    transform: TransformOpt = None,
    changelog: ChangelogOpt = False,
    checkpoint_format: CheckpointFormatOpt = None,
    join_state_format: JoinStateFormatOpt = None,
    aggregation_state_format: AggregationStateFormatOpt = None,
    group_state_format: GroupStateFormatOpt = None,
    source_offsets: SourceOffsetsOpt = None,
    dry_run: DryRunOpt = False,
    overwrite: RestoreOverwriteOpt = False,
    new_query_id: NewQueryIdOpt = False,
    watermark: WatermarkOpt = None,
    offset_log: OffsetLogOpt = None,
    row_checksums: RowChecksumsOpt = None,
    memory: MemoryOpt = None,
    workers: WorkersOpt = None,
    engine: EngineOpt = "local",
    spark_conf: SparkConfOpt = None,
    as_json: OutputJsonOpt = False,
) -> None:
    """Write a Spark checkpoint from a savepoint: either backend, any partition count.

    Exits 2 when the restore would fail (target not empty, unmatched state without -n,
    incompatible schemas, ...), so `--dry-run` is the check to run before deploying a changed
    query: it fails exactly when the restore would.
    """
    from statectl.api import restore_with

    options = _restore_options(
        engine_args(engine, spark_conf),
        map_=map_ or [],
        source_offsets=source_offsets or [],
        transform=transform or [],
        backend=backend.lower() if backend else None,  # RocksDB, HDFS too
        partitions=partitions,
        drop=tuple(drop or ()),
        allow_non_restored=allow_non_restored,
        query=query,
        from_query=from_query,
        output_mode=output_mode,
        changelog=changelog,
        checkpoint_format=checkpoint_format,
        dry_run=dry_run,
        overwrite=overwrite,
        join_state_format=join_state_format,
        aggregation_state_format=aggregation_state_format,
        group_state_format=group_state_format,
        new_query_id=new_query_id,
        watermark=watermark,
        offset_log=offset_log,
        row_checksums=row_checksums,
        memory=memory,
        workers=workers,
    )
    progress = _progress_printer(as_json)
    result = _result_or_plan(
        lambda: restore_with(savepoint_path, target, options, progress=progress)
    )
    verb = "Cannot restore" if not result.ok else "Would restore" if dry_run else "Restored"
    _report(result, as_json, lambda info: _print_restore(info, verb, (savepoint_path, target)))


def _progress_printer(as_json: bool) -> Callable[[str], None]:
    """restore's progress lines on stderr: always for people; with --json only on a terminal
    (a script reading the JSON gets a quiet stderr)."""

    def progress(msg: str) -> None:
        if not as_json or sys.stderr.isatty():
            sys.stderr.write(f"statectl: {msg}\n")
            sys.stderr.flush()

    return progress


def _result_or_plan(run: Callable[[], RestoreResult]) -> RestoreResult:
    """``run()``'s result, or the plan of a refused restore or migrate (RestoreError.result):
    the plan is the report, printed like a result."""
    from statectl.results import RestoreError

    try:
        return run()
    except RestoreError as e:
        return e.result


def _report(
    result: RestoreResult, as_json: bool, for_people: Callable[[dict[str, Any]], None]
) -> None:
    """The result as JSON or for people; exit 2 unless it is ok (a refused plan)."""
    info = result.to_dict()
    if as_json:
        print_json(info)
    else:
        for_people(info)
    if not result.ok:
        raise typer.Exit(2)


def _restore_options(
    engines: dict[str, Any],
    *,
    map_: list[str],
    source_offsets: list[str],
    transform: list[str],
    **choices: Any,
) -> RestoreOptions:
    """restore's command line as one RestoreOptions: the KEY=VALUE options parsed (in this
    order, so the first bad one is the one reported), every other choice as given."""
    from statectl.restoration.options import RestoreOptions
    from statectl.sources import parse_source_offsets

    mapping = {}
    for uid, op_id in parse_pairs(map_, "--map").items():
        if not op_id.isdigit():
            raise StatectlError(f"--map wants UID=OPERATOR_ID with a numeric id, got {op_id!r}")
        mapping[uid] = int(op_id)
    return RestoreOptions(
        mapping=mapping,
        source_offsets=parse_source_offsets(source_offsets),
        transforms=parse_pairs(transform, "--transform"),
        **choices,
        **engines,
    )


def _print_restore(info: dict[str, Any], verb: str, paths: tuple[str, str]) -> None:
    """A restore's document for people on stdout, with the paths as the user wrote them
    (``paths``; the document has URLs); dropped state and problems also on stderr."""
    from statectl.render import render_source

    print(
        f"{verb} {paths[0]} -> {paths[1]} ({info['backend']}, "
        f"{info['partitions']} partitions, resumes at batch {info['resumes_at_batch']})"
    )
    _print_continuation(info)
    for uid, op_id in info["restored"].items():
        print(f"  {uid} -> operator {op_id}")
    for note in info.get("conversions", []):
        print(f"  {note}")
    for note in info.get("evolved", []):
        print(f"  evolved: {note}")
    for uid in info["dropped"]:
        print(f"  {uid} dropped (-n)")
        sys.stderr.write(f"statectl: warning: the state of uid {uid} is not restored (-n)\n")
    for op_id, name in info["started_empty"].items():
        print(f"  operator {op_id} ({name}) starts with empty state")
    for src in info.get("sources", []):
        print(f"  {render_source(src)}")
    _print_problems(info["problems"])


def migrate(
    source: Annotated[
        str, typer.Argument(metavar="SOURCE", help="Checkpoint to migrate (left untouched).")
    ],
    target: Annotated[str, typer.Argument(metavar="TARGET", help="New checkpoint directory.")],
    backend: BackendOpt = None,
    partitions: PartitionsOpt = None,
    batch: Annotated[
        int | None,
        typer.Option(
            "--batch", "-b", help="Committed batch to read (default: latest).", rich_help_panel=WHAT
        ),
    ] = None,
    keep_savepoint: Annotated[
        str | None,
        typer.Option(
            "--keep-savepoint",
            metavar="DIR",
            help="Keep the intermediate savepoint under DIR.",
            rich_help_panel=OUTPUT,
        ),
    ] = None,
    changelog: ChangelogOpt = False,
    join_state_format: JoinStateFormatOpt = None,
    aggregation_state_format: AggregationStateFormatOpt = None,
    group_state_format: GroupStateFormatOpt = None,
    overwrite: Annotated[
        bool,
        typer.Option(
            "--overwrite",
            help="Replace an interrupted migrate (never a checkpoint).",
            rich_help_panel=WHERE,
        ),
    ] = False,
    checkpoint_format: CheckpointFormatOpt = None,
    new_query_id: NewQueryIdOpt = False,
    watermark: WatermarkOpt = None,
    offset_log: OffsetLogOpt = None,
    row_checksums: RowChecksumsOpt = None,
    memory: MemoryOpt = None,
    workers: WorkersOpt = None,
    engine: EngineOpt = "local",
    spark_conf: SparkConfOpt = None,
    as_json: OutputJsonOpt = False,
    no_verify: Annotated[
        bool,
        typer.Option(
            "--no-verify", help="Skip checksums and the key placement check.", rich_help_panel=WHAT
        ),
    ] = False,
) -> None:
    """Savepoint then restore in one step: change backend and/or partition count.

    The temporary savepoint lives inside the target until the target is complete."""
    from statectl.api import migrate_with
    from statectl.restoration.options import MigrateOptions

    options = MigrateOptions(
        backend=backend.lower() if backend else None,  # RocksDB, HDFS too
        partitions=partitions,
        batch=batch,
        keep_savepoint=keep_savepoint,
        changelog=changelog,
        overwrite=overwrite,
        verify=not no_verify,
        join_state_format=join_state_format,
        aggregation_state_format=aggregation_state_format,
        group_state_format=group_state_format,
        checkpoint_format=checkpoint_format,
        new_query_id=new_query_id,
        watermark=watermark,
        offset_log=offset_log,
        row_checksums=row_checksums,
        memory=memory,
        workers=workers,
        **engine_args(engine, spark_conf),
    )
    # A refused migrate's plan is a RestoreResult (RestoreError.result): both print alike.
    result = _result_or_plan(lambda: migrate_with(source, target, options))
    _report(result, as_json, lambda info: _print_migrate(source, target, info))


def _print_migrate(source: str, target: str, info: dict[str, Any]) -> None:
    """A migrate's document for people on stdout (the paths as the user wrote them); problems
    on stderr."""
    print(
        f"Migrated {source} -> {target} ({info['backend']}, {info['partitions']} partitions, "
        f"resumes at batch {info['resumes_at_batch']})"
    )
    _print_continuation(info)
    for note in info.get("conversions", []):
        print(f"  {note}")
    _print_problems(info["problems"])


def _print_problems(problems: list[str]) -> None:
    """A refused plan's problems on stderr, one line each, paths as the user wrote them (the
    document has URLs)."""
    from statectl.errors import display_paths_in

    for p in problems:
        sys.stderr.write(f"statectl: error: {display_paths_in(p)}\n")


def _print_continuation(info: dict[str, Any]) -> None:
    """Whether the new checkpoint continues the query or forks it (formats, issue 23)."""
    qid = info.get("query_id") or "-"
    if info.get("fork"):
        print(f"  fork: new query id {qid} (runs beside the original)")
    else:
        print(f"  continues query {qid} (same query id)")

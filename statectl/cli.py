"""The ``statectl`` command line: parse, call one use case, render (rich for people, JSON for CI).

Known errors become one line on stderr and exit code 2; ``--debug`` shows the traceback.
Heavy modules (pyarrow, the backends) are imported inside the commands so ``--help`` is fast.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
from typing import Annotated, Any

import typer
from typer.core import TyperCommand, TyperGroup


def _flags_without_type(params: list[Any]) -> list[Any]:
    """Typer's rich help prints ``<bool>`` after every flag (--json, --help, ...): a flag takes no
    value, so show none (an empty metavar is what Typer prints instead of the type)."""
    for p in params:
        if getattr(p, "is_flag", False) and getattr(p, "metavar", "") is None:
            p.metavar = ""
    return params


class _Command(TyperCommand):
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

_state = {"debug": False}

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


def _engine_args(engine: str, spark_conf: list[str] | None) -> dict[str, Any]:
    """--engine and --spark-conf, checked, as the use cases' ``engine``/``spark_confs``."""
    from statectl.errors import StatectlError
    from statectl.spark_engine import ENGINES, parse_spark_confs

    if engine not in ENGINES:
        raise StatectlError(f"--engine must be one of {', '.join(ENGINES)}, not {engine!r}")
    confs = parse_spark_confs(spark_conf or [])
    if confs and engine == "local":
        raise StatectlError("--spark-conf needs --engine spark (or auto)")
    return {"engine": engine, "spark_confs": confs}


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

    _state["debug"] = debug or os.environ.get("STATECTL_DEBUG") == "1"
    set_storage_options(parse_storage_options(storage_option or []))


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
    wide: WideOpt = False,
    rows: Annotated[
        bool, typer.Option("--rows/--no-rows", help="Count state rows (reads all state files).")
    ] = True,
    no_verify: NoVerifyOpt = False,
    stats: Annotated[
        bool,
        typer.Option("--stats", help="Rows and bytes per partition, skew, largest keys."),
    ] = False,
    top: Annotated[int, typer.Option("--top", help="Largest keys shown by --stats.")] = 10,
) -> None:
    """Show a checkpoint or savepoint: query, batch, watermark, offsets, confs, operators, stores."""
    from statectl.api import inspect as do_inspect

    if stats:
        _inspect_stats(path, batch, top, as_json, verify=not no_verify)
        return
    info = do_inspect(path, batch, rows=rows, verify=not no_verify).to_dict()
    if as_json:
        _print_json(info)
        return
    from statectl.render import render_inspect

    render_inspect(_console(), info, wide=wide)


@app.command("list")
def list_(
    directory: Annotated[str, typer.Argument(help="Directory to search for checkpoints.")],
    as_json: JsonOpt = False,
    wide: WideOpt = False,
) -> None:
    """List every checkpoint under a directory with backend, batch, operators, size and health."""
    from statectl.inspection import list_dir

    entries = list_dir(directory)
    if as_json:
        _print_json(entries)
        return
    from statectl.render import render_list

    render_list(_console(), entries, wide=wide)


@app.command()
def export(
    path: Annotated[str, typer.Argument(help="Checkpoint directory (local path or URL).")],
    output: Annotated[
        str, typer.Option("--output", "-o", help="Output file: .parquet, .jsonl or .csv.")
    ],
    operator: Annotated[
        str, typer.Option("--operator", help="Operator id (or uid, for a savepoint).")
    ] = "0",
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
    memory: MemoryOpt = None,
    as_json: JsonOpt = False,
    no_verify: NoVerifyOpt = False,
    engine: EngineOpt = "local",
    spark_conf: SparkConfOpt = None,
) -> None:
    """Export one operator's state: the table Spark's statestore reader returns."""
    from statectl.api import export as do_export

    result = do_export(
        path,
        output,
        operator,
        store=store,
        join_side=join_side,
        state_var=state_var,
        timers=timers,
        batch=batch,
        overwrite=overwrite,
        verify=not no_verify,
        **_engine_args(engine, spark_conf),
        memory=memory,
    )
    if as_json:
        _print_json(result)
    else:
        _console().print(f"Wrote {result['rows']} rows to {result['path']}")


def _parse_pairs(pairs: list[str], what: str) -> dict[str, str]:
    from statectl.errors import StatectlError

    out = {}
    for p in pairs:
        k, sep, v = p.partition("=")
        if not sep or not k or not v:
            raise StatectlError(f"{what} must look like KEY=VALUE, got {p!r}")
        out[k] = v
    return out


@app.command()
def savepoint(
    checkpoint: Annotated[str, typer.Argument(help="Checkpoint directory (local path or URL).")],
    target: Annotated[
        str | None,
        typer.Argument(
            help="Parent directory (default: $STATECTL_SAVEPOINT_DIR or statectl.toml)."
        ),
    ] = None,
    batch: BatchOpt = None,
    kind: Annotated[
        str, typer.Option("--type", help="canonical (Parquet) or native (backend files).")
    ] = "canonical",
    uid: Annotated[
        list[str] | None, typer.Option("--uid", help="OPERATOR_ID=UID, repeatable.")
    ] = None,
    workers: WorkersOpt = None,
    memory: MemoryOpt = None,
    as_json: JsonOpt = False,
    no_verify: NoVerifyOpt = False,
    engine: EngineOpt = "local",
    spark_conf: SparkConfOpt = None,
) -> None:
    """Take a savepoint of a committed batch (the latest by default), even while the query runs."""
    from statectl.api import savepoint as take_savepoint

    engine_args = _engine_args(engine, spark_conf)

    pairs = _parse_pairs(uid or [], "--uid")
    uids = {}
    for k, v in pairs.items():
        if not k.isdigit():
            from statectl.errors import StatectlError

            raise StatectlError(f"--uid wants OPERATOR_ID=UID with a numeric id, got {k!r}")
        uids[int(k)] = v
    if as_json or not sys.stderr.isatty():
        result = take_savepoint(
            checkpoint,
            target,
            batch=batch,
            uids=uids,
            kind=kind,
            verify=not no_verify,
            **engine_args,
            workers=workers,
            memory=memory,
        )
    else:
        from rich.console import Console
        from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

        with Progress(
            SpinnerColumn(),
            TextColumn("{task.description}"),
            TextColumn("{task.completed} tables"),
            TimeElapsedColumn(),
            console=Console(stderr=True),
            transient=True,
        ) as bar:
            task = bar.add_task("savepoint", total=None)

            def advance(what: str) -> None:
                bar.update(task, advance=1, description=f"savepoint: {what}")

            result = take_savepoint(
                checkpoint,
                target,
                batch=batch,
                uids=uids,
                progress=advance,
                kind=kind,
                verify=not no_verify,
                **engine_args,
                workers=workers,
                memory=memory,
            )
    if as_json:
        _print_json(result.to_dict())
    else:
        print(result.path)


@app.command()
def dispose(
    path: Annotated[str, typer.Argument(help="Savepoint directory.")],
    yes: Annotated[bool, typer.Option("--yes", "-y", help="Do not ask for confirmation.")] = False,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Show what would be deleted.")] = False,
    force: Annotated[
        bool,
        typer.Option(
            "--force",
            help="Delete the savepoint's own files even if other files are inside (those, "
            "nested checkpoints and symbolic links' targets are kept).",
        ),
    ] = False,
    as_json: JsonOpt = False,
) -> None:
    """Delete a savepoint: exactly the files its _metadata lists; refuses anything else."""
    from statectl.render import human_bytes
    from statectl.savepoints.dispose import dispose as do_dispose
    from statectl.savepoints.dispose import dispose_plan

    plan = dispose_plan(path, force=force)
    url = plan.io.url(plan.root)
    if dry_run:
        _print_json(plan.to_dict(deleted=False)) if as_json else print(
            f"Would delete {url}: {len(plan.delete)} files, {human_bytes(plan.bytes)}"
            + (f"; would keep {len(plan.keep)} other files" if plan.keep else "")
        )
        return
    if not yes:
        if not sys.stdin.isatty():
            from statectl.errors import StatectlError

            raise StatectlError("refusing to delete without confirmation; pass --yes", url)
        typer.confirm(
            f"Delete {url} ({len(plan.delete)} files, {human_bytes(plan.bytes)})?", abort=True
        )
    result = do_dispose(path, force=force)
    _print_json(result) if as_json else print(f"Deleted {result['path']}")


@app.command()
def relabel(
    path: Annotated[str, typer.Argument(help="Savepoint directory (left untouched).")],
    mapping: Annotated[list[str], typer.Argument(help="OLD_UID=NEW_UID, one or more.")],
    target: Annotated[
        str | None,
        typer.Option(
            "--target", "-t", help="Parent directory of the new savepoint (default: the source's)."
        ),
    ] = None,
    as_json: JsonOpt = False,
) -> None:
    """Write a copy of a savepoint with operator uids renamed (data folders follow the uids)."""
    from statectl.savepoints.relabel import relabel as do_relabel

    result = do_relabel(path, _parse_pairs(mapping, "mapping"), target)
    if as_json:
        _print_json(result)
        return
    print(result["path"])
    for a, b in result["relabelled"].items():
        print(f"  {a} -> {b}")


@app.command()
def restore(
    target: Annotated[
        str, typer.Argument(help="New checkpoint directory (must not exist or be empty).")
    ],
    savepoint_path: Annotated[str, typer.Option("--savepoint", "-s", help="Savepoint to restore.")],
    backend: Annotated[
        str | None, typer.Option("--backend", help="hdfs or rocksdb (default: the savepoint's).")
    ] = None,
    partitions: Annotated[
        int | None,
        typer.Option("--partitions", help="State partitions (default: the savepoint's)."),
    ] = None,
    map_: Annotated[
        list[str] | None,
        typer.Option("--map", help="UID=OPERATOR_ID for a changed query, repeatable."),
    ] = None,
    drop: Annotated[
        list[str] | None,
        typer.Option("--drop", help="UID whose state the new query does not have."),
    ] = None,
    allow_non_restored: Annotated[
        bool, typer.Option("--allow-non-restored-state", "-n", help="Drop state with no operator.")
    ] = False,
    query: Annotated[
        str | None,
        typer.Option(
            "--query",
            help="MODULE:FUNCTION (or FILE.py:FUNCTION) returning the new query's streaming "
            "DataFrame; it is planned, not run, to match state to operators and check schemas.",
        ),
    ] = None,
    output_mode: Annotated[
        str | None,
        typer.Option(
            "--output-mode",
            help="append, update or complete: the mode the new query runs in, checked with "
            "Spark's own rules (default: the first of these Spark accepts for the query).",
        ),
    ] = None,
    transform: Annotated[
        list[str] | None,
        typer.Option(
            "--transform",
            help="UID=FILE.py:FUNCTION (repeatable, with --query): FUNCTION(batch, store) turns "
            "the uid's pyarrow rows (columns key, value) into the query's.",
        ),
    ] = None,
    changelog: ChangelogOpt = False,
    checkpoint_format: Annotated[
        int | None,
        typer.Option(
            "--checkpoint-format",
            help="RocksDB state checkpoint format 1 or 2 (default: the savepoint source's).",
        ),
    ] = None,
    join_state_format: JoinStateFormatOpt = None,
    aggregation_state_format: AggregationStateFormatOpt = None,
    group_state_format: GroupStateFormatOpt = None,
    source_offsets: Annotated[
        list[str] | None,
        typer.Option(
            "--source-offsets",
            help="NAME=JSON: where a source starts (NAME: its index or description as the plan "
            "shows it; JSON: the source's offset, or - for its configured start). Repeatable.",
        ),
    ] = None,
    dry_run: Annotated[
        bool,
        typer.Option("--dry-run", help="Make every check the restore makes, write nothing."),
    ] = False,
    overwrite: Annotated[
        bool,
        typer.Option(
            "--overwrite", help="Replace an interrupted statectl restore (never a checkpoint)."
        ),
    ] = False,
    memory: MemoryOpt = None,
    workers: WorkersOpt = None,
    engine: EngineOpt = "local",
    spark_conf: SparkConfOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Write a Spark checkpoint from a savepoint: either backend, any partition count.

    Exits 2 when the restore would fail (target not empty, unmatched state without -n,
    incompatible schemas, ...), so `--dry-run` is the check to run before deploying a changed
    query: it fails exactly when the restore would.
    """
    from statectl.api import restore_with
    from statectl.errors import StatectlError
    from statectl.render import render_source
    from statectl.restoration.options import RestoreOptions
    from statectl.results import RestoreError, RestoreResult
    from statectl.sources import parse_source_offsets

    engine_args = _engine_args(engine, spark_conf)

    def progress(msg: str) -> None:
        if not as_json or sys.stderr.isatty():
            sys.stderr.write(f"statectl: {msg}\n")
            sys.stderr.flush()

    mapping = {}
    for uid, op_id in _parse_pairs(map_ or [], "--map").items():
        if not op_id.isdigit():
            raise StatectlError(f"--map wants UID=OPERATOR_ID with a numeric id, got {op_id!r}")
        mapping[uid] = int(op_id)
    options = RestoreOptions(
        backend=backend,
        partitions=partitions,
        mapping=mapping,
        drop=tuple(drop or ()),
        allow_non_restored=allow_non_restored,
        query=query,
        output_mode=output_mode,
        changelog=changelog,
        checkpoint_format=checkpoint_format,
        dry_run=dry_run,
        overwrite=overwrite,
        join_state_format=join_state_format,
        aggregation_state_format=aggregation_state_format,
        group_state_format=group_state_format,
        source_offsets=parse_source_offsets(source_offsets or []),
        transforms=_parse_pairs(transform or [], "--transform"),
        memory=memory,
        workers=workers,
        **engine_args,
    )
    result: RestoreResult
    try:
        result = restore_with(savepoint_path, target, options, progress=progress)
    except RestoreError as e:  # the plan is the report: print it, then exit 2
        result = e.result
    info = result.to_dict()
    if as_json:
        _print_json(info)
    else:
        verb = "Would restore" if dry_run or not result.ok else "Restored"
        print(
            f"{verb} {info['savepoint']} -> {info['target']} ({info['backend']}, "
            f"{info['partitions']} partitions, resumes at batch {info['resumes_at_batch']})"
        )
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
        for p in info["problems"]:
            sys.stderr.write(f"statectl: error: {p}\n")
    if not result.ok:
        raise typer.Exit(2)


@app.command()
def migrate(
    source: Annotated[str, typer.Argument(help="Checkpoint to migrate (left untouched).")],
    target: Annotated[str, typer.Argument(help="New checkpoint directory.")],
    backend: Annotated[str | None, typer.Option("--backend", help="hdfs or rocksdb.")] = None,
    partitions: Annotated[
        int | None, typer.Option("--partitions", help="State partitions.")
    ] = None,
    batch: BatchOpt = None,
    keep_savepoint: Annotated[
        str | None,
        typer.Option("--keep-savepoint", help="Keep the intermediate savepoint under DIR."),
    ] = None,
    changelog: ChangelogOpt = False,
    join_state_format: JoinStateFormatOpt = None,
    aggregation_state_format: AggregationStateFormatOpt = None,
    group_state_format: GroupStateFormatOpt = None,
    overwrite: Annotated[
        bool,
        typer.Option(
            "--overwrite", help="Replace an interrupted statectl migrate (never a checkpoint)."
        ),
    ] = False,
    memory: MemoryOpt = None,
    workers: WorkersOpt = None,
    engine: EngineOpt = "local",
    spark_conf: SparkConfOpt = None,
    as_json: JsonOpt = False,
    no_verify: NoVerifyOpt = False,
) -> None:
    """Savepoint then restore in one step: change backend and/or partition count.

    The temporary savepoint lives inside the target until the target is complete."""
    from statectl.api import migrate_with
    from statectl.restoration.options import MigrateOptions
    from statectl.results import RestoreError, RestoreResult

    engine_args = _engine_args(engine, spark_conf)
    options = MigrateOptions(
        backend=backend,
        partitions=partitions,
        batch=batch,
        keep_savepoint=keep_savepoint,
        changelog=changelog,
        overwrite=overwrite,
        verify=not no_verify,
        join_state_format=join_state_format,
        aggregation_state_format=aggregation_state_format,
        group_state_format=group_state_format,
        memory=memory,
        workers=workers,
        **engine_args,
    )
    # A refused migrate's plan is a RestoreResult (RestoreError.result): both print alike.
    result: RestoreResult
    try:
        result = migrate_with(source, target, options)
    except RestoreError as e:  # the plan is the report: print it, then exit 2
        result = e.result
    info = result.to_dict()
    if as_json:
        _print_json(info)
    else:
        print(
            f"Migrated {source} -> {info['target']} ({info['backend']}, {info['partitions']} partitions, "
            f"resumes at batch {info['resumes_at_batch']})"
        )
        for note in info.get("conversions", []):
            print(f"  {note}")
        for p in info["problems"]:
            sys.stderr.write(f"statectl: error: {p}\n")
    if not result.ok:
        raise typer.Exit(2)


@app.command()
def edit(
    source: Annotated[str, typer.Argument(help="Savepoint or checkpoint (left untouched).")],
    target: Annotated[
        str | None, typer.Argument(help="New savepoint directory (not needed with --dry-run).")
    ] = None,
    operator: Annotated[str, typer.Option("--operator", help="Operator uid or id.")] = "",
    delete_where: Annotated[
        str | None,
        typer.Option("--delete-where", help="Delete rows where this SQL condition is true."),
    ] = None,
    keep_where: Annotated[
        str | None,
        typer.Option("--keep-where", help="Keep only rows where this SQL condition is true."),
    ] = None,
    drop: Annotated[bool, typer.Option("--drop", help="Leave the operator out.")] = False,
    table: Annotated[
        str | None,
        typer.Option("--table", help="Only this store or state variable (default: all)."),
    ] = None,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Show the rows each table would keep; write nothing.")
    ] = False,
    batch: BatchOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Write a new savepoint with one operator's rows deleted or kept (a SQL WHERE subset over
    the state's columns, e.g. "key.k = 'k1'"), or the operator dropped."""
    from statectl.api import edit as do_edit
    from statectl.errors import StatectlError

    if not operator:
        raise StatectlError("--operator UID is required")
    result = do_edit(
        source,
        target,
        operator,
        delete_where=delete_where,
        keep_where=keep_where,
        drop=drop,
        table=table,
        dry_run=dry_run,
        batch=batch,
    )
    info = result.to_dict()
    if as_json:
        _print_json(info)
        return
    head = "Would write" if dry_run else f"Wrote {info['target']}:"
    print(f"{head} {info['operator']} " + ("dropped" if info["dropped"] else "edited"))
    for name, t in info["tables"].items():
        before = "?" if t["before"] is None else t["before"]
        removed = "?" if t["removed"] is None else t["removed"]
        print(f"  {name}: {before} rows -> {t['after']} ({removed} removed)")


@app.command()
def diff(
    a: Annotated[str, typer.Argument(help="Savepoint or checkpoint A (the old state).")],
    b: Annotated[str, typer.Argument(help="Savepoint or checkpoint B (the new state).")],
    operator: Annotated[
        str | None, typer.Option("--operator", help="Only this operator (uid or id in A).")
    ] = None,
    samples: Annotated[
        int, typer.Option("--samples", help="Example keys per kind of difference.")
    ] = 5,
    batch_a: Annotated[
        int | None, typer.Option("--batch-a", help="Committed batch of A (a checkpoint).")
    ] = None,
    batch_b: Annotated[
        int | None, typer.Option("--batch-b", help="Committed batch of B (a checkpoint).")
    ] = None,
    exit_code: Annotated[
        bool, typer.Option("--exit-code", help="Exit 1 when the state differs (like git diff).")
    ] = False,
    as_json: JsonOpt = False,
) -> None:
    """Compare the state of two savepoints or checkpoints: keys added, removed and changed per
    operator and table, with samples."""
    from statectl.api import diff as do_diff

    result = do_diff(a, b, operator=operator, samples=samples, batch_a=batch_a, batch_b=batch_b)
    info = result.to_dict()
    if as_json:
        _print_json(info)
    else:
        print(f"A {info['a']} (batch {info['batch_a']})")
        print(f"B {info['b']} (batch {info['batch_b']})")
        for uid, op in info["operators"].items():
            if op["status"] != "both":
                print(f"{uid}: {op['status']}")
                continue
            for name, t in op["tables"].items():
                if "status" in t:
                    print(f"{uid}/{name}: {t['status']}")
                    continue
                print(
                    f"{uid}/{name}: {t['added']} added, {t['removed']} removed, "
                    f"{t['changed']} changed, {t['unchanged']} unchanged"
                )
                for kind in ("added", "removed", "changed"):
                    for s in t["samples"][kind]:
                        rest = f"{s['a']} -> {s['b']}" if kind == "changed" else s.get("value", "")
                        print(
                            f"  {kind[0].upper() if kind != 'changed' else '~'} {s['key']} {rest}"
                        )
        print("differs" if info["differs"] else "no differences")
    if exit_code and result.differs:
        raise typer.Exit(1)


def _inspect_stats(path: str, batch: int | None, top: int, as_json: bool, verify: bool) -> None:
    from statectl.api import open_state

    doc = open_state(path, batch=batch, verify=verify).stats(top=top)
    if as_json:
        _print_json(doc)
        return
    print(f"{doc['path']} (batch {doc['batch']})")
    for uid, tables in doc["operators"].items():
        for name, t in tables.items():
            print(f"{uid}/{name}: {t['rows']} rows, skew {t['skew']} (max/mean rows per partition)")
            for p in t["partitions"]:
                print(f"  partition {p['partition']}: {p['rows']} rows, {p['bytes']} bytes")
            for k in t["largest_keys"]:
                print(f"  {k['bytes']:>8} B {k['rows']:>6} rows  {k['key']}")


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
    _print_json(
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


# Every command renders its flags without a type placeholder (see _flags_without_type).
for _info in app.registered_commands:
    if _info.cls in (None, TyperCommand):
        _info.cls = _Command


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


if __name__ == "__main__":
    run()

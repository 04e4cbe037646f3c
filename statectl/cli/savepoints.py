"""The commands that make and manage savepoints: ``savepoint``, ``dispose``, ``relabel`` and
``edit``. Each parses, calls one use case and renders its result (plain, or JSON with --json)."""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Annotated, Any

import typer

from statectl.cli.app import (
    BatchOpt,
    EngineOpt,
    JsonOpt,
    MemoryOpt,
    NoVerifyOpt,
    SparkConfOpt,
    WorkersOpt,
    engine_args,
    parse_pairs,
    print_json,
)
from statectl.errors import StatectlError


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
    from functools import partial

    from statectl.api import savepoint as take_savepoint

    engines = engine_args(engine, spark_conf)
    take = partial(
        take_savepoint,
        checkpoint,
        target,
        batch=batch,
        uids=_parse_uids(uid or []),
        kind=kind,
        verify=not no_verify,
        **engines,
        workers=workers,
        memory=memory,
    )
    # A spinner only for a person watching stderr; scripts and --json get none.
    result = take() if as_json or not sys.stderr.isatty() else _with_progress(take)
    if as_json:
        print_json(result.to_dict())
    else:
        print(result.path)


def _parse_uids(pairs: list[str]) -> dict[int, str]:
    """--uid OPERATOR_ID=UID arguments by numeric operator id."""
    uids = {}
    for k, v in parse_pairs(pairs, "--uid").items():
        if not k.isdigit():
            raise StatectlError(f"--uid wants OPERATOR_ID=UID with a numeric id, got {k!r}")
        uids[int(k)] = v
    return uids


def _with_progress(take: Callable[..., Any]) -> Any:
    """``take(progress=...)`` under a transient spinner on stderr counting the tables written."""
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

        return take(progress=advance)


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
        _print_json_or(
            as_json,
            plan.to_dict(deleted=False),
            f"Would delete {url}: {len(plan.delete)} files, {human_bytes(plan.bytes)}"
            + (f"; would keep {len(plan.keep)} other files" if plan.keep else ""),
        )
        return
    if not yes:
        if not sys.stdin.isatty():
            raise StatectlError("refusing to delete without confirmation; pass --yes", url)
        typer.confirm(
            f"Delete {url} ({len(plan.delete)} files, {human_bytes(plan.bytes)})?", abort=True
        )
    result = do_dispose(path, force=force)
    _print_json_or(as_json, result, f"Deleted {result['path']}")


def _print_json_or(as_json: bool, doc: Any, line: str) -> None:
    """``doc`` as JSON with --json, else the one line for people."""
    if as_json:
        print_json(doc)
    else:
        print(line)


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

    result = do_relabel(path, parse_pairs(mapping, "mapping"), target)
    if as_json:
        print_json(result)
        return
    print(result["path"])
    for a, b in result["relabelled"].items():
        print(f"  {a} -> {b}")


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
        print_json(info)
        return
    head = "Would write" if dry_run else f"Wrote {info['target']}:"
    print(f"{head} {info['operator']} " + ("dropped" if info["dropped"] else "edited"))
    for name, t in info["tables"].items():
        before = "?" if t["before"] is None else t["before"]
        removed = "?" if t["removed"] is None else t["removed"]
        print(f"  {name}: {before} rows -> {t['after']} ({removed} removed)")

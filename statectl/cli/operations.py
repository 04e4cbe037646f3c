"""Day-2 operations: ``doctor`` (what stops a checkpoint from restarting, and the command that
recovers it) and ``gc`` (savepoint retention, checkpoint clean-up). Each parses, calls one use
case and renders its result (plain, or JSON with --json)."""

from __future__ import annotations

import sys
from typing import Annotated

import typer

from statectl.cli.app import JsonOpt, print_json
from statectl.errors import StatectlError


def doctor(
    checkpoint: Annotated[str, typer.Argument(help="Checkpoint directory (left untouched).")],
    as_json: JsonOpt = False,
) -> None:
    """Find every problem Spark would hit restarting a checkpoint, the last batch every
    operator can be read at, and the command that recovers it.

    Exit code 0: healthy; 1: problems found; 2: not readable as a checkpoint."""
    from statectl.diagnosis import describe, diagnose

    diag = diagnose(checkpoint)
    if as_json:
        print_json(diag.to_dict())
    else:
        print("\n".join(describe(diag)))
    if diag.exit_code:
        raise typer.Exit(diag.exit_code)


def gc(
    path: Annotated[str, typer.Argument(help="A directory of savepoints, or a checkpoint.")],
    keep_last: Annotated[
        int | None,
        typer.Option("--keep-last", metavar="N", help="Savepoints: keep the newest N per query."),
    ] = None,
    max_age: Annotated[
        str | None,
        typer.Option("--max-age", metavar="AGE", help="Savepoints: delete older ones (e.g. 30d)."),
    ] = None,
    incomplete_after: Annotated[
        str,
        typer.Option(
            "--incomplete-after",
            metavar="AGE",
            help="Savepoints: drop unfinished ones idle this long.",
        ),
    ] = "1d",
    keep_batches: Annotated[
        int | None,
        typer.Option(
            "--keep-batches",
            metavar="N",
            help="Checkpoint: keep N batches before the latest (100).",
        ),
    ] = None,
    yes: Annotated[bool, typer.Option("--yes", "-y", help="Do not ask for confirmation.")] = False,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="List what would be deleted.")] = False,
    as_json: JsonOpt = False,
) -> None:
    """Delete old savepoints (never a query's newest) or the checkpoint files no kept restart
    needs; safe while the query runs."""
    from statectl.render import human_bytes
    from statectl.retention import gc_plan, run_gc

    plan = gc_plan(
        path,
        keep_last=keep_last,
        max_age=max_age,
        keep_batches=keep_batches,
        incomplete_after=incomplete_after,
    )
    if dry_run or not plan.delete:
        _show(
            plan.to_dict(deleted=False),
            as_json,
            "Would delete" if plan.delete else "Nothing to delete",
        )
        return
    if not yes:
        if not sys.stdin.isatty():
            raise StatectlError("refusing to delete without confirmation; pass --yes", plan.path)
        typer.confirm(
            f"Delete {len(plan.delete)} item(s) under {plan.path} ({human_bytes(plan.bytes)})?",
            abort=True,
        )
    _show(run_gc(plan), as_json, "Deleted")


def _show(doc: dict, as_json: bool, head: str) -> None:
    from statectl.render import human_bytes

    if as_json:
        print_json(doc)
        return
    print(f"{head}: {len(doc['delete'])} item(s), {human_bytes(doc['bytes'])} under {doc['path']}")
    for d in doc["delete"]:
        print(f"  {human_bytes(d['bytes']):>10}  {d['path']}  ({d['reason']})")
    for s in doc["skipped"]:
        print(f"  skipped {s['path']}: {s['reason']}")

"""The commands that read state and leave it as it is: ``inspect``, ``list``, ``export`` and
``diff``. Each parses, calls one use case and renders its result (rich, or JSON with --json)."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from statectl.cli.app import (
    BatchOpt,
    EngineOpt,
    JsonOpt,
    MemoryOpt,
    NoVerifyOpt,
    SparkConfOpt,
    WideOpt,
    WorkersOpt,
    console,
    engine_args,
    print_json,
)

PathArg = Annotated[
    str, typer.Argument(help="Checkpoint or savepoint directory (local path or URL).")
]


def inspect(
    path: PathArg,
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
        print_json(info)
        return
    from statectl.render import render_inspect

    render_inspect(console(), info, wide=wide)


def _inspect_stats(path: str, batch: int | None, top: int, as_json: bool, verify: bool) -> None:
    from statectl.api import open_state

    doc = open_state(path, batch=batch, verify=verify).stats(top=top)
    if as_json:
        print_json(doc)
        return
    from statectl.cli.history import render_stats

    render_stats(console(), doc)


def list_(
    directory: Annotated[str, typer.Argument(help="Directory to search for checkpoints.")],
    as_json: JsonOpt = False,
    wide: WideOpt = False,
) -> None:
    """List every checkpoint under a directory with backend, batch, operators, size and health."""
    from statectl.inspection import list_dir

    entries = list_dir(directory)
    if as_json:
        print_json(entries)
        return
    from statectl.render import render_list

    render_list(console(), entries, wide=wide)


def export(
    path: PathArg,
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
    workers: WorkersOpt = None,
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
        **engine_args(engine, spark_conf),
        memory=memory,
        workers=workers,
    )
    if as_json:
        print_json(result)
    else:
        console().print(f"Wrote {result['rows']} rows to {result['path']}")


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
        print_json(info)
    else:
        _print_diff(info)
    if exit_code and result.differs:
        raise typer.Exit(1)


def _print_diff(info: dict[str, Any]) -> None:
    """A diff's document for people: per operator and table, counts then sample keys."""
    from statectl.render import display_path

    print(f"A {display_path(info['a'])} (batch {info['batch_a']})")
    print(f"B {display_path(info['b'])} (batch {info['batch_b']})")
    for uid, op in info["operators"].items():
        if op["status"] != "both":
            print(f"{uid}: {op['status']}")
            continue
        for name, t in op["tables"].items():
            _print_table_diff(f"{uid}/{name}", t)
    print("differs" if info["differs"] else "no differences")


def _print_table_diff(where: str, t: dict[str, Any]) -> None:
    """One table of a diff: its status (missing on a side), or counts and samples."""
    if "status" in t:
        print(f"{where}: {t['status']}")
        return
    print(
        f"{where}: {t['added']} added, {t['removed']} removed, "
        f"{t['changed']} changed, {t['unchanged']} unchanged"
    )
    from statectl.render import value_text

    for kind in ("added", "removed", "changed"):
        for s in t["samples"][kind]:
            if kind == "changed":
                rest = f"{value_text(s['a'])} -> {value_text(s['b'])}"
            else:
                rest = value_text(s["value"]) if "value" in s else ""
            print(
                f"  {kind[0].upper() if kind != 'changed' else '~'} {value_text(s['key'])} {rest}"
            )

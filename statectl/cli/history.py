"""The commands that look at a checkpoint over time: ``history`` (a table and sparklines in the
terminal, or JSON) and ``report`` (one self-contained HTML file of charts); and the small
charts ``inspect --stats`` draws. Everything fits 80 columns."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any

import typer

from statectl.cli.app import JsonOpt, NoVerifyOpt, console, print_json

if TYPE_CHECKING:
    from rich.console import Console

PathArg = Annotated[str, typer.Argument(help="Checkpoint directory (local path or URL).")]
OperatorOpt = Annotated[
    str | None, typer.Option("--operator", metavar="ID", help="Only this operator (id or name).")
]
RowsOpt = Annotated[
    str,
    typer.Option(
        "--rows",
        metavar="MODE",
        help="sizes (names and sizes), counts (also increments' records) or exact (loads state).",
    ),
]
TopOpt = Annotated[
    int, typer.Option("--top", metavar="N", help="Largest keys per table (reads the state).")
]
SPARKS = "▁▂▃▄▅▆▇█"
CHART = 40  # characters a sparkline or bar takes


def escape(text: str) -> str:
    """``text`` shown as it is by rich (a key or a path may hold ``[...]``)."""
    from rich.markup import escape as rich_escape

    return rich_escape(text)


def sparkline(values: list[float | None], width: int = CHART) -> str:
    """``values`` as block characters, averaged into at most ``width`` buckets (gaps: space)."""
    if len(values) > width:
        step = len(values) / width
        buckets = [values[int(i * step) : int((i + 1) * step)] for i in range(width)]
        values = [
            None if not (known := [v for v in b if v is not None]) else sum(known) / len(known)
            for b in buckets
        ]
    known = [v for v in values if v is not None]
    if not known:
        return ""
    lo, hi = min(known), max(known)
    span = hi - lo or 1
    return "".join(
        " " if v is None else SPARKS[int((v - lo) / span * (len(SPARKS) - 1))] for v in values
    )


def bar(value: float, top: float, width: int = CHART) -> str:
    return "█" * (round(value / top * width) if top else 0)


def human(n: float | None) -> str:
    if n is None:
        return "?"
    for unit in ("", "k", "M", "G", "T"):
        if abs(n) < 1000:
            whole = unit == "" and float(n).is_integer()
            return f"{n:.0f}" if whole else f"{n:.1f}{unit}"
        n /= 1000
    return f"{n:.1f}P"


def history(
    path: PathArg,
    operator: OperatorOpt = None,
    rows: RowsOpt = "counts",
    top: TopOpt = 0,
    as_json: JsonOpt = False,
    no_verify: NoVerifyOpt = False,
) -> None:
    """Every batch the logs and state files still cover: time, watermark, source advance, state
    rows and bytes per operator; growth, skew and the cost of a restart."""
    from statectl.history import history as do_history

    doc = do_history(path, operator=operator, rows=rows, top=top, verify=not no_verify)
    if as_json:
        print_json(doc)
        return
    render_history(console(), doc)


def report(
    path: PathArg,
    output: Annotated[
        str, typer.Option("--output", "-o", metavar="FILE", help="The HTML file to write.")
    ],
    operator: OperatorOpt = None,
    rows: RowsOpt = "counts",
    top: TopOpt = 10,
    overwrite: Annotated[
        bool, typer.Option("--overwrite", help="Replace an existing output file.")
    ] = False,
    as_json: JsonOpt = False,
    no_verify: NoVerifyOpt = False,
) -> None:
    """Write one self-contained HTML file of charts: state rows and bytes, watermark and batch
    time, a partition x batch heat map, source advance, skew, restart cost and health."""
    from statectl.history import history as do_history
    from statectl.report import write_report

    doc = do_history(path, operator=operator, rows=rows, top=top, verify=not no_verify)
    written = write_report(doc, output, overwrite=overwrite)
    if as_json:
        print_json({"path": written, "batches": len(doc["batches"])})
    else:
        console().print(f"Wrote {written} ({len(doc['batches'])} batches)")


def render_history(con: Console, doc: dict[str, Any]) -> None:
    """The history for people: a header, the latest batches, then per operator its sparklines
    and summaries."""
    from rich.table import Table

    batches = doc["batches"]
    first, last = batches[0]["batch"], batches[-1]["batch"]
    con.print(f"[bold]{escape(doc['path'])}[/bold]")
    con.print(
        f"{doc['backend']}, batches {first}..{last} ({len(batches)}), health "
        f"{doc['health']['health']}, rows: {doc['rows_mode']}"
    )
    for p in doc["health"]["problems"]:
        con.print(f"  [red]{escape(p)}[/red]")
    table = Table(box=None, pad_edge=False)
    for name in ("batch", "time (UTC)", "watermark", "source", "rows", "bytes", "lag"):
        table.add_column(name, justify="right" if name != "source" else "left")
    for e in batches[-15:]:
        table.add_row(*_batch_row(e))
    con.print(table)
    for op in doc["operators"]:
        _render_operator(con, doc, op)


def _when(ms: int) -> str:
    import datetime as dt

    return dt.datetime.fromtimestamp(ms / 1000, dt.timezone.utc).strftime("%m-%d %H:%M:%S")


def _batch_row(e: dict[str, Any]) -> list[str]:
    adv = ", ".join(
        f"+{n} {unit}" for s in e["sources"] if s["advance"] for unit, n in s["advance"].items()
    )
    ops = list(e["operators"].values())
    rows = sum(o["rows"] or 0 for o in ops) if ops else None
    size = sum(o["bytes"] or 0 for o in ops) if ops else None
    lag = max((o["snapshot_lag_max"] or 0 for o in ops), default=0)
    mark = "" if e["committed"] else "*"
    return [
        f"{e['batch']}{mark}",
        _when(e["timestamp_ms"]),
        _when(e["watermark_ms"]) if e["watermark_ms"] else "-",
        adv[:18],
        human(rows),
        human(size) + "B",
        str(lag),
    ]


def _render_operator(con: Console, doc: dict[str, Any], op: dict[str, Any]) -> None:
    uid = str(op["id"])
    series = [e["operators"][uid] for e in doc["batches"] if e["committed"]]
    exact = "" if op["rows_exact"] else " (estimate)"
    con.print(
        f"\n[bold]operator {uid}[/bold] {escape(op['name'])} ({op['kind']}), {op['partitions']} partitions"
    )
    g = op["growth"]
    con.print(f"  rows   {sparkline([s['rows'] for s in series])} {human(op['rows'])}{exact}")
    con.print(f"  bytes  {sparkline([s['bytes'] for s in series])} {human(op['bytes'])}B")
    con.print(
        f"  growth {_rate(g['rows'], 'rows')}; {_rate(g['bytes'], 'B')}; "
        f"evicted {human(op['evicted_total'])}"
    )
    r = op["restart"]
    con.print(
        f"  restart reads {human(r['files'])} files, {human(r['bytes'])}B, replays "
        f"{human(r['increments_to_replay'])} increments (max lag {r['snapshot_lag_max']})"
    )
    _render_skew(con, op, series[-1]["partitions"] if series else [])
    for table, keys in (op["largest_keys"] or {}).items():
        con.print(f"  largest keys of {table}:")
        for k in keys[:5]:
            con.print(f"    {k['bytes']:>8} B {k['rows']:>5} rows  {escape(str(k['key'])[:50])}")


def _rate(g: dict[str, Any], unit: str) -> str:
    b, h = g["per_batch"], g["per_hour"]
    return f"{human(b)} {unit}/batch, {human(h)} {unit}/h"


def _render_skew(con: Console, op: dict[str, Any], parts: list[dict[str, Any]]) -> None:
    s = op["skew"]["rows"]
    flag = " [red]SKEWED[/red]" if op["skew"]["skewed"] else ""
    if s:
        con.print(f"  skew   rows max/median {s['ratio']} (partition {s['hot_partition']}){flag}")
    partition_bars(con, [p["rows"] or 0 for p in parts], "rows")


def partition_bars(con: Console, values: list[int], unit: str, limit: int = 16) -> None:
    """One bar per partition (the ``limit`` largest when there are more)."""
    top = max(values, default=0)
    order = sorted(range(len(values)), key=lambda i: -values[i])[:limit]
    for i in sorted(order):
        con.print(f"  {i:>5} {bar(values[i], top, 50):<50} {human(values[i])} {unit}")
    if len(values) > limit:
        con.print(f"  ... {len(values) - limit} more partitions")


def render_stats(con: Console, doc: dict[str, Any]) -> None:
    """``inspect --stats`` for people: rows per partition as bars, skew, largest keys."""
    from statectl.render import display_path, value_text

    con.print(f"{escape(display_path(doc['path']))} (batch {doc['batch']})")
    for uid, tables in doc["operators"].items():
        for name, t in tables.items():
            flag = " [red]SKEWED[/red]" if t.get("skewed") else ""
            con.print(
                f"{escape(uid)}/{escape(name)}: {t['rows']} rows, skew {t['skew']} (max/mean){flag}"
            )
            for p in t["partitions"]:
                rows, size = p["rows"], p["bytes"]
                top = max(q["rows"] for q in t["partitions"]) or 1
                con.print(
                    f"  partition {p['partition']:>3} {bar(rows, top, 30):<30} {rows} rows, "
                    f"{size} bytes"
                )
            for k in t["largest_keys"]:
                con.print(
                    f"  {k['bytes']:>8} B {k['rows']:>6} rows  {escape(value_text(k['key']))}"
                )

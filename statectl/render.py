"""Rich rendering of the dictionaries the use cases return (the JSON output shows the same data)."""

from __future__ import annotations

import datetime as dt
from typing import Any

from rich.console import Console
from rich.table import Table


def human_bytes(n: int | None) -> str:
    if n is None:
        return "-"
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if size < 1024 or unit == "TiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{n} B"


def human_ms(ms: int | None) -> str:
    if not ms:
        return "0 (none)"
    return f"{ms} ({dt.datetime.fromtimestamp(ms / 1000, dt.timezone.utc).isoformat()})"


def render_inspect(console: Console, info: dict[str, Any]) -> None:
    console.print(f"[bold]{info['kind'].capitalize()}[/bold] {info['path']}")
    head = Table.grid(padding=(0, 2))
    head.add_column(style="dim")
    head.add_column()
    rows = [
        ("query id", info.get("query_id") or "-"),
        ("batch", f"{info['batch']} (latest committed: {info.get('latest_committed_batch')})"),
        ("uncommitted", ", ".join(map(str, info.get("uncommitted_batches") or [])) or "none"),
        ("batch time", human_ms(info.get("batch_timestamp_ms"))),
        (
            "watermark",
            f"batch {human_ms(info.get('batch_watermark_ms'))}, "
            f"next {human_ms(info.get('next_batch_watermark_ms'))}",
        ),
        (
            "backend",
            f"{info['backend']}, {info['partitions']} partitions, "
            f"checkpoint format v{info.get('checkpoint_format_version')}",
        ),
    ]
    for source, offset in (info.get("source_offsets") or {}).items():
        rows.append((f"source {source}", str(offset)))
    for k, v in rows:
        head.add_row(k, str(v))
    console.print(head)
    confs = Table(title="Pinned confs", show_header=False, title_justify="left")
    confs.add_column(overflow="fold")
    confs.add_column(overflow="fold")
    for k, v in (info.get("pinned_confs") or {}).items():
        confs.add_row(k, v)
    console.print(confs)
    for op in info.get("operators", []):
        uid = f" uid {op['uid']}" if op.get("uid") else ""
        t = Table(
            title=f"Operator {op['id']}{uid}: {op['name']} ({op['partitions']} partitions, "
            f"{human_bytes(op.get('bytes'))})",
            title_justify="left",
        )
        t.add_column("store / variable")
        if any("kind" in s for s in op["stores"]):
            t.add_column("kind")
        t.add_column("key schema", overflow="fold")
        t.add_column("value schema", overflow="fold")
        t.add_column("rows", justify="right")
        for s in op["stores"]:
            cells = [s["name"]]
            if any("kind" in x for x in op["stores"]):
                cells.append(s.get("kind", ""))
            cells += [
                s["key_schema"],
                s["value_schema"],
                "-" if s["rows"] is None else str(s["rows"]),
            ]
            t.add_row(*cells)
        console.print(t)


def render_list(console: Console, entries: list[dict[str, Any]]) -> None:
    if not entries:
        console.print("No checkpoints found.")
        return
    t = Table()
    for col in ("path", "kind", "backend", "batch", "operators", "size", "health"):
        t.add_column(col, overflow="fold")
    for e in entries:
        health = e.get("health", "?")
        style = {"ok": "green", "uncommitted": "yellow", "incomplete": "yellow"}.get(health, "red")
        t.add_row(
            e["path"],
            e.get("kind", "checkpoint"),
            str(e.get("backend", "-")),
            str(e.get("latest_committed_batch", "-")),
            ", ".join(e.get("operators", [])),
            human_bytes(e.get("bytes")),
            f"[{style}]{health}[/{style}]",
        )
    console.print(t)
    for e in entries:
        for p in e.get("problems", []):
            console.print(f"[dim]{e['path']}[/dim]: {p}")

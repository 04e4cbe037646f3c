"""Rich rendering of the dictionaries the use cases return (the JSON output shows the same data).

Made for an 80-column terminal: schemas are compacted and elided at field boundaries, conf names
are never cut, and nothing is folded into narrow columns. ``--wide`` prints everything in full
(as ``--json`` does), however wide.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from rich import box
from rich.console import Console
from rich.measure import Measurement
from rich.table import Table
from rich.text import Text

from statectl import errors

INDENT = "    "


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
    when = dt.datetime.fromtimestamp(ms / 1000, dt.timezone.utc)
    return f"{ms} ({when.isoformat(timespec='milliseconds')})"


def json_text(value: Any) -> str:
    """A value as compact JSON (offsets are JSON in the log, so show them as JSON, not repr)."""
    if isinstance(value, str):
        return value
    return json.dumps(value, separators=(", ", ": "), default=str)


def _plain(value: Any) -> Any:
    """``value`` with what JSON lacks written as export writes it: timestamps and dates in ISO
    8601, bytes as hex, decimals and the rest as text."""
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if isinstance(value, dt.datetime | dt.date | dt.time):
        return value.isoformat()
    if isinstance(value, bytes):
        return value.hex()
    if value is None or isinstance(value, bool | int | float | str):
        return value
    return str(value)


def value_text(value: Any) -> str:
    """A state key or value for people: compact JSON (``{"k": "k2", "window": {"start":
    "2024-01-01T00:00:50+00:00", ...}}``), never a Python repr (``datetime.datetime(...)``)."""
    return json.dumps(_plain(value), separators=(", ", ": "), ensure_ascii=False)


def display_path(url: str) -> str:
    """A path as the user wrote it: local paths without the ``file://`` prefix fsspec gives
    them, relative where the user named the directory relatively (as errors show them)."""
    return errors.display_path(url)


# -- schemas -------------------------------------------------------------------------------
def split_top_level(text: str) -> list[str]:
    """``a:int,b:struct<x:int,y:int>,c:decimal(10,2)`` -> its three top-level fields."""
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        if ch in "<(":
            depth += 1
        elif ch in ">)":
            depth -= 1
        elif ch == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    parts.append(text[start:])
    return [p for p in parts if p]


def schema_fields(schema: str) -> list[str]:
    """The fields of a top-level ``struct<...>`` (the struct wrapper says nothing in a table)."""
    if schema.startswith("struct<") and schema.endswith(">"):
        return split_top_level(schema[len("struct<") : -1])
    return [schema] if schema else []


def compact_schema(schema: str, budget: int | None = None) -> str:
    """``struct<k:string,n:bigint>`` as ``k:string, n:bigint``, elided at a field boundary to fit
    ``budget`` characters (``… +N more`` says how many fields are not shown)."""
    fields = schema_fields(schema)
    full = ", ".join(fields)
    if budget is None or len(full) <= budget:
        return full
    shown: list[str] = []
    for i, f in enumerate(fields):
        rest = len(fields) - i - 1
        tail = f", … +{rest} more" if rest else ""
        candidate = ", ".join([*shown, f])
        if len(candidate) + len(tail) > budget:
            break
        shown.append(f)
    more = len(fields) - len(shown)
    if not shown:  # even the first field does not fit: cut inside it
        suffix = f" +{more - 1} more" if more > 1 else ""
        return fields[0][: max(budget - len(suffix) - 1, 1)] + "…" + suffix
    return ", ".join(shown) + (f", … +{more} more" if more else "")


def short_class(value: str) -> str:
    """``org.apache.spark.sql.execution.streaming.state.HDFSBackedStateStoreProvider`` ->
    ``….HDFSBackedStateStoreProvider`` (the class name is the part people read)."""
    parts = value.split(".")
    if len(parts) > 3 and " " not in value and all(p.isidentifier() for p in parts):
        return "…." + parts[-1]
    return value


# -- inspect -------------------------------------------------------------------------------
def _pairs(
    console: Console, rows: list[tuple[str, str]], *, wide: bool, style: str = "dim"
) -> None:
    """``name  value`` lines, names aligned and never cut; a value that does not fit beside its
    name goes on the next line, indented (and ellipsized unless ``wide``)."""
    if not rows:
        return
    width = console.width
    name_w = max(len(k) for k, _ in rows)
    for k, v in rows:
        line = Text(k.ljust(name_w), style=style)
        if wide or name_w + 2 + len(v) <= width:
            line.append("  " + v)
            console.print(line, soft_wrap=wide, no_wrap=not wide, overflow="ellipsis")
        else:
            console.print(Text(k, style=style), no_wrap=True, overflow="ellipsis")
            console.print(Text(INDENT + v), soft_wrap=False, no_wrap=True, overflow="ellipsis")


@contextmanager
def _unbounded(console: Console, wide: bool) -> Iterator[None]:
    """For ``--wide``: lines as long as their content (the terminal may wrap them, rich won't)."""
    if not wide:
        yield
        return
    width, console.width = console.width, 100_000
    try:
        yield
    finally:
        console.width = width


def render_inspect(console: Console, info: dict[str, Any], *, wide: bool = False) -> None:
    with _unbounded(console, wide):
        _render_inspect(console, info, wide=wide)


def _render_inspect(console: Console, info: dict[str, Any], *, wide: bool) -> None:
    console.print(
        Text(f"{info['kind'].capitalize()} ", style="bold") + Text(display_path(info["path"])),
        soft_wrap=True,
    )
    _pairs(console, _inspect_rows(info), wide=wide)
    confs = info.get("pinned_confs") or {}
    if confs:
        console.print()
        console.print(Text("Pinned confs", style="bold"))
        _pairs(
            console,
            [(k, str(v) if wide else short_class(str(v))) for k, v in confs.items()],
            wide=wide,
            style="",
        )
    for op in info.get("operators", []):
        _render_operator(console, op, wide=wide)


def _inspect_rows(info: dict[str, Any]) -> list[tuple[str, str]]:
    """The label/value lines under an inspect's title: batch, watermarks, backend, sources."""
    rows = [
        ("query id", info.get("query_id") or "-"),
        ("batch", f"{info['batch']} (latest committed: {info.get('latest_committed_batch')})"),
        ("uncommitted", ", ".join(map(str, info.get("uncommitted_batches") or [])) or "none"),
        ("batch time", human_ms(info.get("batch_timestamp_ms"))),
        ("watermark", human_ms(info.get("batch_watermark_ms"))),
        ("next watermark", human_ms(info.get("next_batch_watermark_ms"))),
        (
            "backend",
            f"{info['backend']}, {info['partitions']} partitions, "
            f"checkpoint format v{info.get('checkpoint_format_version')}",
        ),
    ]
    if info.get("sources") is not None:  # each source by kind (statectl/sources)
        rows += [(f"source {src['key']}", src["summary"]) for src in info["sources"]]
    else:
        for source, offset in (info.get("source_offsets") or {}).items():
            rows.append((f"source {source}", json_text(offset)))
    if info.get("storage_options"):
        rows.append(("storage", json_text(info["storage_options"])))
    if info.get("verification") == "unverifiable":  # issue 26: files without checksums
        rows.append(("verification", unverifiable_line(info["unverifiable_files"])))
    return [(k, str(v)) for k, v in rows]


def unverifiable_line(files: list[str]) -> str:
    return (
        f"unverifiable: {len(files)} file(s) without checksums, e.g. {files[0]} (--json lists them)"
    )


def _render_operator(console: Console, op: dict[str, Any], *, wide: bool) -> None:
    console.print()
    console.print(
        Text(f"Operator {op['id']}: {op['name']}", style="bold")
        + Text(f" ({op['partitions']} partitions, {human_bytes(op.get('bytes'))})")
    )
    if op.get("uid"):
        console.print(Text("  uid ", style="dim") + Text(op["uid"]), soft_wrap=True)
    if op.get("kind"):
        console.print(Text("  kind ", style="dim") + Text(_operator_kind(op)), soft_wrap=True)
        if op.get("refusal"):
            console.print(Text("  why  ", style="dim") + Text(op["refusal"]), soft_wrap=True)
    # One block per store / state variable: its schemas get the whole line, not a squeezed
    # table column.
    budget = None if wide else max(console.width - len(INDENT) - len("value  "), 20)
    for s in op["stores"]:
        _render_store(console, s, budget, wide=wide)


def _operator_kind(op: dict[str, Any]) -> str:
    """The operator's kind, with its state format and whether restore refuses it."""
    kind = str(op["kind"])
    if op.get("state_format") is not None and "state format" not in kind:
        kind += f", state format {op['state_format']}"
    if op.get("restorable") is False:
        kind += " (restore refuses it)"
    return kind


def _render_store(console: Console, s: dict[str, Any], budget: int | None, *, wide: bool) -> None:
    """A store or state variable: its name, kind and rows, then its key and value schemas."""
    head = Text("  " + s["name"], style="cyan")
    if s.get("kind"):
        head.append(f"  {s['kind']}", style="dim")
    rows = "-" if s.get("rows") is None else f"{s['rows']:,}"
    head.append(f"  {rows} rows")
    console.print(head, soft_wrap=True)
    for label in ("key", "value"):
        text = compact_schema(s.get(f"{label}_schema") or "", budget)
        console.print(
            Text(f"{INDENT}{label:<5}  ", style="dim") + Text(text),
            soft_wrap=wide,
            no_wrap=not wide,
            overflow="ellipsis",
        )


# -- list ----------------------------------------------------------------------------------
def common_parent(paths: list[str]) -> str:
    """The longest directory prefix shared by ``paths`` ("" when they share none)."""
    if not paths:
        return ""
    split = [p.split("/")[:-1] for p in paths]
    common: list[str] = []
    for parts in zip(*split, strict=False):
        if any(x != parts[0] for x in parts):
            break
        common.append(parts[0])
    return "/".join(common)


def render_list(console: Console, entries: list[dict[str, Any]], *, wide: bool = False) -> None:
    """One row per checkpoint or savepoint, named relative to the directory listed. At terminal
    width the operators go on a dim second line of the name cell (no column is squeezed);
    ``--wide`` gives them a column and prints full paths."""
    if not entries:
        console.print("No checkpoints found.")
        return
    parent = "" if wide else common_parent([e["path"] for e in entries])
    if parent:
        console.print(Text("Under ", style="dim") + Text(display_path(parent)), soft_wrap=True)
    t = _list_table(wide)
    for e in entries:
        t.add_row(*_list_row(e, parent, wide))
    if wide:
        _print_unwrapped(console, t)
    else:
        console.print(t)
    for e in entries:
        for p in e.get("problems", []):
            # Problems name whole files: word-wrapped at the terminal width, or not at all (--wide).
            console.print(
                Text(_entry_name(e, parent), style="dim") + Text(f": {p}"), soft_wrap=wide
            )


def _list_table(wide: bool) -> Table:
    t = Table(box=box.SIMPLE_HEAD, pad_edge=False)
    t.add_column("path" if wide else "name / operators", no_wrap=wide, overflow="fold")
    t.add_column("kind", no_wrap=True)
    t.add_column("batch", justify="right", no_wrap=True)
    if wide:
        t.add_column("operators", no_wrap=True)
    t.add_column("size", justify="right", no_wrap=True)
    t.add_column("health", no_wrap=True)
    return t


_HEALTH_STYLES = {
    "ok": "green",
    "ok, unverifiable": "yellow",
    "uncommitted": "yellow",
    "incomplete": "yellow",
}


def _list_row(e: dict[str, Any], parent: str, wide: bool) -> list[Any]:
    """The cells of one listed checkpoint or savepoint (see :func:`_list_table`)."""
    name = _entry_name(e, parent)
    batch = e.get("latest_committed_batch")
    ops = ", ".join(e.get("operators", []))
    cells: list[Any] = [Text(name), _entry_kind(e), "-" if batch is None else str(batch)]
    if wide:
        cells.append(ops or "-")
    elif ops:
        cells[0] = Text(name) + Text("\n  " + ops, style="dim")
    health = e.get("health", "?")
    if health == "ok" and e.get("verification") == "unverifiable":
        health = "ok, unverifiable"  # no checksums: see inspect
    return [
        *cells,
        human_bytes(e.get("bytes")),
        Text(health, style=_HEALTH_STYLES.get(health, "red")),
    ]


def _entry_name(e: dict[str, Any], parent: str) -> str:
    return e["path"][len(parent) + 1 :] if parent else display_path(e["path"])


def _entry_kind(e: dict[str, Any]) -> str:
    """A checkpoint's backend; ``savepoint``, or ``savepoint*`` for a native one."""
    if e.get("kind") == "savepoint":
        return "savepoint" if e.get("type", "canonical") == "canonical" else "savepoint*"
    return e.get("backend") or "-"


def _print_unwrapped(console: Console, t: Table) -> None:
    """``t`` at its natural width, however wide (the console widened for the print)."""
    natural = Measurement.get(console, console.options.update(width=100_000), t).maximum
    width, console.width = console.width, max(natural, console.width)
    try:
        console.print(t, crop=False)
    finally:
        console.width = width


def render_source(src: dict[str, Any]) -> str:
    """One line of a restore plan's sources: where the source starts."""
    offset = src.get("offset")
    at = "-" if offset is None else offset
    where = {
        "kept": f"kept at {at}",
        "new": "new, from its configured start",
        "given": f"starts at the given offset {at}",
        "dropped": f"dropped (-n), was at {at}",
    }.get(src.get("position", ""), str(src.get("position")))
    if src.get("from") is not None:
        where += f" (the savepoint's source {src['from']})"
    if src.get("replaces"):
        where += f", replacing {src['replaces']}"
    if src.get("note"):
        where += f"; {src['note']}"
    index = src.get("index")
    name = (
        f"source {index}" if index is not None else f"savepoint source {src.get('savepoint_index')}"
    )
    return f"{name} {src.get('description', '')}: {where}"

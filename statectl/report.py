"""``statectl report``: a history document (statectl/history/) as one self-contained HTML file.

Charts are plotly's (an optional dependency: ``pip install 'statectl[report]'``), with
plotly.js inlined once in the page, so the file opens offline and requests nothing. Each chart
is a ``div`` with a stable id (``chart-rows``, ``chart-bytes``, ``chart-time``,
``chart-heat-<operator>``, ``chart-sources``, ``chart-skew``), which the browser test reads.
"""

from __future__ import annotations

import html
import importlib.util
from typing import Any

from statectl.errors import StatectlError
from statectl.io import FileIO

CONFIG = {"displaylogo": False, "responsive": True}


def _plotly() -> Any:
    """plotly's graph objects, or a one-line error saying what to install."""
    if importlib.util.find_spec("plotly") is None:
        raise StatectlError(
            "statectl report draws its charts with plotly, which is not installed: "
            "pip install 'statectl[report]' (or pip install plotly)"
        )
    import plotly.graph_objects as go

    return go


def _committed(doc: dict[str, Any]) -> list[dict[str, Any]]:
    return [e for e in doc["batches"] if e["committed"]]


def _line_chart(go: Any, doc: dict[str, Any], key: str, title: str, unit: str) -> Any:
    """One line per operator of ``key`` (rows or bytes) over the committed batches."""
    batches = _committed(doc)
    fig = go.Figure()
    for op in doc["operators"]:
        uid = str(op["id"])
        fig.add_trace(
            go.Scatter(
                x=[e["batch"] for e in batches],
                y=[e["operators"][uid][key] for e in batches],
                name=f"{uid} {op['name']}",
                mode="lines+markers",
            )
        )
    fig.update_layout(title=title, xaxis_title="batch", yaxis_title=unit)
    _integer_axis(fig.update_xaxes, len(batches))
    return fig


def _integer_axis(update: Any, n: int) -> None:
    """Batch and partition axes: whole numbers, at most about ten ticks."""
    update(tickformat="d", dtick=max(1, n // 10))


def _time_chart(go: Any, doc: dict[str, Any]) -> Any:
    """Batch time and watermark (epoch ms as dates) over every batch."""
    batches = doc["batches"]
    xs = [e["batch"] for e in batches]
    fig = go.Figure()
    for key, name in (("timestamp_ms", "batch time"), ("watermark_ms", "watermark")):
        # A watermark of 0 is "none yet" (no event time seen): a gap, not 1970.
        ys = [_date(e[key]) if e[key] else None for e in batches]
        fig.add_trace(go.Scatter(x=xs, y=ys, name=name, mode="lines+markers"))
    fig.update_layout(title="Batch time and watermark", xaxis_title="batch", yaxis_type="date")
    _integer_axis(fig.update_xaxes, len(xs))
    return fig


def _date(ms: int) -> str:
    import datetime as dt

    return dt.datetime.fromtimestamp(ms / 1000, dt.timezone.utc).isoformat()


def _heat_map(go: Any, doc: dict[str, Any], op: dict[str, Any]) -> Any:
    """Partition x batch: rows per partition where known, else bytes on disk."""
    uid = str(op["id"])
    batches = _committed(doc)
    parts = [e["operators"][uid]["partitions"] for e in batches]
    use_rows = all(p["rows"] is not None for ps in parts for p in ps)
    key = "rows" if use_rows else "bytes"
    z = [[ps[i][key] for ps in parts] for i in range(op["partitions"])]
    fig = go.Figure(
        go.Heatmap(
            z=z,
            x=[e["batch"] for e in batches],
            y=list(range(op["partitions"])),
            colorscale="Viridis",
            name=key,
            colorbar={"title": key},
        )
    )
    fig.update_layout(
        title=f"Operator {uid} {op['name']}: {key} per partition",
        xaxis_title="batch",
        yaxis_title="partition",
    )
    _integer_axis(fig.update_xaxes, len(batches))
    _integer_axis(fig.update_yaxes, op["partitions"])
    return fig


def _sources_chart(go: Any, doc: dict[str, Any]) -> Any:
    """Each source's advance per batch (records, files, seconds or versions, as its offsets
    count), bars."""
    fig = go.Figure()
    batches = doc["batches"]
    for src in doc["sources"]:
        ys, unit = [], ""
        for e in batches:
            row = next((s for s in e["sources"] if s["key"] == src["key"]), None)
            adv = row["advance"] if row else None
            if adv:
                unit = next(iter(adv))
            ys.append(next(iter(adv.values())) if adv else None)
        fig.add_trace(
            go.Bar(
                x=[e["batch"] for e in batches],
                y=ys,
                name=f"source {src['key']} ({src['kind']}{', ' + unit if unit else ''})",
            )
        )
    fig.update_layout(title="Source advance per batch", xaxis_title="batch", barmode="group")
    _integer_axis(fig.update_xaxes, len(batches))
    return fig


def _skew_chart(go: Any, doc: dict[str, Any]) -> Any:
    """Rows per partition at the latest batch, one bar series per operator."""
    last = next(e for e in doc["batches"] if e["batch"] == doc["latest_committed_batch"])
    fig = go.Figure()
    for op in doc["operators"]:
        parts = last["operators"][str(op["id"])]["partitions"]
        fig.add_trace(
            go.Bar(
                x=[p["partition"] for p in parts],
                y=[p["rows"] for p in parts],
                name=f"{op['id']} {op['name']}",
            )
        )
    fig.update_layout(
        title=f"Rows per partition at batch {doc['latest_committed_batch']}",
        xaxis_title="partition",
        barmode="group",
    )
    _integer_axis(fig.update_xaxes, max((op["partitions"] for op in doc["operators"]), default=1))
    return fig


def _div(fig: Any, div_id: str) -> str:
    return str(fig.to_html(full_html=False, include_plotlyjs=False, div_id=div_id, config=CONFIG))


def _summary_table(doc: dict[str, Any]) -> str:
    """Skew and restart cost per operator, a plain table."""
    head = (
        "<tr><th>operator</th><th>rows</th><th>bytes</th><th>rows/batch</th><th>rows/hour</th>"
        "<th>skew (max/median rows)</th><th>skewed</th><th>restart files</th>"
        "<th>restart bytes</th><th>increments to replay</th></tr>"
    )
    rows = []
    for op in doc["operators"]:
        skew = op["skew"]["rows"] or {}
        g = op["growth"]["rows"]
        r = op["restart"]
        cells = [
            f"{op['id']} {op['name']} ({op['kind']})",
            f"{op['rows']}{'' if op['rows_exact'] else ' (estimate)'}",
            op["bytes"],
            g["per_batch"],
            g["per_hour"],
            f"{skew.get('ratio')} (partition {skew.get('hot_partition')})",
            "SKEWED" if op["skew"]["skewed"] else "no",
            r["files"],
            r["bytes"],
            r["increments_to_replay"],
        ]
        rows.append("<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in cells) + "</tr>")
    return f'<table id="summary">{head}{"".join(rows)}</table>'


def _largest_keys(doc: dict[str, Any]) -> str:
    """The largest keys per operator table (``--top``), as ``inspect --stats`` finds them."""
    out = []
    for op in doc["operators"]:
        for table, keys in (op["largest_keys"] or {}).items():
            rows = "".join(
                f"<tr><td>{k['bytes']}</td><td>{k['rows']}</td>"
                f"<td style='text-align:left'>{html.escape(str(k['key']))}</td></tr>"
                for k in keys
            )
            out.append(
                f"<h3>Operator {op['id']} {html.escape(op['name'])}, {html.escape(table)}</h3>"
                f"<table><tr><th>bytes</th><th>rows</th><th>key</th></tr>{rows}</table>"
            )
    return (
        '<section id="largest-keys"><h2>Largest keys</h2>' + "".join(out) + "</section>"
        if out
        else ""
    )


def _health(doc: dict[str, Any]) -> str:
    h = doc["health"]
    items = "".join(f"<li>{html.escape(p)}</li>" for p in h["problems"]) or "<li>no problems</li>"
    return f'<section id="health"><h2>Health: {html.escape(h["health"])}</h2><ul>{items}</ul></section>'


STYLE = (
    "body{font-family:system-ui,sans-serif;margin:1.5em;color:#222}"
    "table{border-collapse:collapse}td,th{border:1px solid #ccc;padding:.3em .6em;"
    "text-align:right}th{background:#f4f4f4}.chart{margin:1em 0}"
)


def render_html(doc: dict[str, Any]) -> str:
    """The report page: header, health, summaries, then the charts."""
    go = _plotly()
    from plotly.offline import get_plotlyjs

    charts = [
        (_line_chart(go, doc, "rows", "State rows per operator", "rows"), "chart-rows"),
        (_line_chart(go, doc, "bytes", "State bytes on disk per operator", "bytes"), "chart-bytes"),
        (_time_chart(go, doc), "chart-time"),
        *((_heat_map(go, doc, op), f"chart-heat-{op['id']}") for op in doc["operators"]),
        (_sources_chart(go, doc), "chart-sources"),
        (_skew_chart(go, doc), "chart-skew"),
    ]
    title = f"statectl report: {doc['path']}"
    body = "".join(f'<div class="chart">{_div(f, i)}</div>' for f, i in charts)
    first, last = doc["batches"][0]["batch"], doc["batches"][-1]["batch"]
    return (
        f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
        f"<style>{STYLE}</style><script>{get_plotlyjs()}</script></head><body>"
        f"<h1>{html.escape(title)}</h1><p>{html.escape(doc['backend'])}, batches {first}..{last}"
        f" ({len(doc['batches'])}), latest committed {doc['latest_committed_batch']}, rows: "
        f"{html.escape(doc['rows_mode'])}</p>{_health(doc)}<h2>Summary</h2>"
        f"{_summary_table(doc)}{body}{_largest_keys(doc)}</body></html>"
    )


def write_report(doc: dict[str, Any], output: str, *, overwrite: bool = False) -> str:
    """Write the report atomically to ``output`` (a path or URL); returns its URL."""
    io, path = FileIO.for_url(output)
    hint = "pass --overwrite to replace it"
    if not overwrite and io.exists(path):
        raise StatectlError("already exists; refusing to overwrite", path, hint)
    io.write_atomic(path, render_html(doc).encode("utf-8"), overwrite=True)
    return io.url(path)

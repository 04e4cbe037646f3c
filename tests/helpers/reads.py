"""One read of a fixture as the manifest records it: the statectl Selection it names and
``statectl export`` of it read back as rows."""

from __future__ import annotations

from typing import Any

import pyarrow.parquet as pq

from statectl.export import export_state
from statectl.state import Selection
from tests.helpers.rows import arrow_rows


def selection(read: dict[str, Any]) -> Selection:
    opts = read.get("options", {})
    return Selection(
        operator_id=int(read["operatorId"]),
        store=opts.get("storeName"),
        join_side=opts.get("joinSide"),
        state_var=opts.get("stateVarName"),
        registered_timers=str(opts.get("readRegisteredTimers", "false")).lower() == "true",
    )


def export_rows(path: str, read: dict[str, Any], tmp_path) -> list:
    """``statectl export`` of ``read`` to Parquet, read back as rows."""
    out = tmp_path / "state.parquet"
    sel = selection(read)
    export_state(
        path,
        sel.operator_id,
        sel.store,
        sel.join_side,
        sel.state_var,
        sel.registered_timers,
        None,
        str(out),
    )
    return arrow_rows(pq.read_table(out))

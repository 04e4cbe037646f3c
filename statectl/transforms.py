"""``restore --transform UID=FILE.py:FUNCTION``: the user's function that makes a store's rows
for the query instead of the schema evolution rules, loaded once per process and its output
checked against the query's schemas (a lossy or mistyped column is refused).

Apart from :mod:`statectl.evolution` (which decides *that* a store is transformed) because
loading the user's code is :mod:`statectl.user_code`'s.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pyarrow as pa

from statectl.codecs.sparktypes import to_arrow_field
from statectl.errors import StatectlError
from statectl.evolution import PartEvolution, TableEvolution
from statectl.user_code import load_query_function, user_errors

_TRANSFORMS: dict[str, Callable[..., Any]] = {}


def load_transform(spec: str) -> Callable[..., Any]:
    """The user's function of ``--transform UID=FILE.py:FUNCTION`` (loaded once per process)."""
    if spec not in _TRANSFORMS:
        try:
            _TRANSFORMS[spec] = load_query_function(spec)
        except StatectlError as e:
            raise StatectlError(str(e).replace("--query", "--transform")) from None
    return _TRANSFORMS[spec]


def apply_transform(evo: TableEvolution, store: str, rows: pa.Table) -> pa.Table:
    """``fn(batch: pa.RecordBatch, store: str) -> RecordBatch | Table`` with columns key and
    value; checked against the query's schemas (a lossy or mistyped column is refused)."""
    assert evo.transform and evo.key and evo.value
    fn = load_transform(evo.transform)
    batch = pa.RecordBatch.from_arrays(
        [rows.column("key").combine_chunks(), rows.column("value").combine_chunks()],
        ["key", "value"],
    )
    with user_errors(evo.transform, None):
        out = fn(batch, store)
    if not isinstance(out, (pa.RecordBatch, pa.Table)) or out.schema.names != ["key", "value"]:
        raise StatectlError(
            f"--transform {evo.transform} must return a pyarrow RecordBatch or Table with "
            f"columns key and value, got {type(out).__name__}"
        )
    return pa.table(
        {
            "key": _planned_column(evo.transform, out, "key", evo.key),
            "value": _planned_column(evo.transform, out, "value", evo.value),
        }
    )


def _planned_column(transform: str, out: Any, name: str, part: PartEvolution) -> pa.Array:
    """Column ``name`` of the function's output as the query plans it: a struct with the
    planned field names, cast to the planned types."""
    want = pa.struct([to_arrow_field(f) for f in json.loads(part.new_schema)["fields"]])
    col = out.column(name)
    col = col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col
    if not pa.types.is_struct(col.type) or [f.name for f in col.type] != [f.name for f in want]:
        raise StatectlError(
            f"--transform {transform} returned {name} {col.type}, the query plans {want}"
        )
    try:
        return col.cast(want)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as e:
        raise StatectlError(
            f"--transform {transform} returned {name} {col.type}, the query plans {want}: {e}"
        ) from None

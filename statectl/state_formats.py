"""Converting a store's rows between the state formats Spark pins per query: a streaming
aggregation's value (format 1 repeats the grouping columns, format 2 holds the buffers alone)
and a flatMapGroupsWithState / applyInPandasWithState value (format 2 nests the state in
``groupState``), as :class:`~statectl.evolution.PartEvolution` re-shapes.
"""

from __future__ import annotations

import json

from statectl.evolution import PartEvolution, Refused, Source, is_struct
from statectl.schema_compat import simple_string


def aggregation_format_conversion(
    key_schema: str, value_schema: str, source: int, target: int
) -> PartEvolution:
    """A streaming aggregation's value from state format ``source`` to ``target``: format 1's
    value is the grouping columns then the buffers, format 2's the buffers alone
    (``StreamingAggregationStateManagerImplV1``/``V2``). 1 -> 2 drops the grouping columns;
    2 -> 1 writes them from the key, with the key's types and nullability."""
    keys = json.loads(key_schema)["fields"]
    values = json.loads(value_schema)["fields"]
    n = len(keys)
    if (source, target) == (1, 2):
        if [f["name"] for f in values[:n]] != [f["name"] for f in keys]:
            raise Refused(
                f"the value {simple_string(json.loads(value_schema))} does not start with the "
                f"grouping columns {simple_string(json.loads(key_schema))} (state format 1)"
            )
        new, sources = values[n:], [Source(i) for i in range(n, len(values))]
    elif (source, target) == (2, 1):
        new = keys + values
        sources = [Source(i, from_key=True) for i in range(n)]
        sources += [Source(i) for i in range(len(values))]
    else:
        raise ValueError(f"no aggregation state format conversion {source} -> {target}")
    return PartEvolution(json.dumps({"type": "struct", "fields": new}), sources)


def group_state_format_conversion(value_schema: str, source: int, target: int) -> PartEvolution:
    """A flatMapGroupsWithState / applyInPandasWithState value from state format ``source``
    to ``target``: format 1's value is the state's fields, format 2's ``struct<groupState:
    struct<the fields>>`` (``StateManagerImplV1``/``V2``). Refused with timeouts: format 1
    keeps ``timeoutTimestamp`` as an int, format 2 as a long (Spark's reason for format 2)."""
    fields = json.loads(value_schema)["fields"]
    if any(f["name"] == "timeoutTimestamp" for f in fields):
        raise Refused(
            "the state has a timeout (timeoutTimestamp), which format 1 keeps as an int and "
            "format 2 as a long; only state without timeouts converts"
        )
    if (source, target) == (1, 2):
        inner = {"type": "struct", "fields": fields}
        wrap = PartEvolution(json.dumps(inner), [Source(i) for i in range(len(fields))])
        new = [{"name": "groupState", "type": inner, "nullable": True, "metadata": {}}]
        return PartEvolution(
            json.dumps({"type": "struct", "fields": new}), [Source(None, nested=wrap)]
        )
    if (source, target) == (2, 1):
        if [f["name"] for f in fields] != ["groupState"] or not is_struct(fields[0]["type"]):
            raise Refused(f"the value {simple_string(json.loads(value_schema))} is not format 2's")
        inner_fields = fields[0]["type"]["fields"]
        sources = [Source(0, member=i) for i in range(len(inner_fields))]
        return PartEvolution(json.dumps({"type": "struct", "fields": inner_fields}), sources)
    raise ValueError(f"no group state format conversion {source} -> {target}")

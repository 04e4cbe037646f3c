"""Schema evolution per operator kind, on the rules of :mod:`statectl.evolution`, and
:func:`evolve_table`, which picks them for a store:

- A TTL'd transformWithState value evolves inside Spark's ``struct<value, ttlExpirationMs>``
  wrapper, its expiry kept; UnsafeRow or Avro, the values are re-encoded in the query's
  schema. TTL added or dropped by the query is refused.
- streaming aggregation values: the buffers are matched by the aggregate that owns them.
  Spark names a buffer after its aggregate function (``count``, ``sum``, ``max``, avg's
  ``sum, count``), so a query aggregate's buffer run (names and types, from the planned
  physical plan) is looked up in the stored buffers: found exactly once, it is kept;
  not found, the aggregate is new and starts at the initial value Spark's own planned
  aggregate gives (``DeclarativeAggregate.initialValues``, evaluated in the planning JVM);
  found more than once, or overlapping another match, it is ambiguous and refused. Stored
  buffers no query aggregate owns are dropped. With the query the savepoint was taken with
  (``--from-query``), each aggregate is matched by its expression instead (``max(v)`` is not
  ``max(w)``), so repeated buffer names are no longer ambiguous. A session window's value (and an aggregation's
  at state format 1) is its grouping columns (by the positional rule) followed by such
  buffers, matched the same way;
- keys widened or renamed: every store's rows are converted before they are placed, so a
  widened key lands where Spark hashes it at the target partition count (a session by its
  grouping columns, a join's four stores by the join key, at state formats 2, 3 and 4);
  transformWithState's grouping key in every column family alike (state variables, row
  counters, timers, the TTL indexes that nest it in their element key), UnsafeRow or Avro.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from typing import Any

from statectl.codecs.sparktypes import canonical
from statectl.evolution import (
    PartEvolution,
    Refused,
    Source,
    TableEvolution,
    added_fields,
    field_change,
    positional,
    struct_of,
    widens,
)
from statectl.schema_compat import difference, simple_string


@dataclass
class AggregateBuffer:
    """One aggregate of the planned query: its SQL, its buffer fields (Spark struct fields, in
    the order the state value holds them) and the initial values Spark gives them (None:
    Spark's aggregate has no declarative initial values, so it cannot start mid-stream)."""

    expression: str
    fields: list[dict]
    initial: list[Any] | None


def _run_matches(stored: list[dict], buf: AggregateBuffer, at: int) -> bool:
    run = stored[at : at + len(buf.fields)]
    if len(run) != len(buf.fields):
        return False
    return all(
        a["name"] == b["name"]
        and (difference(a["type"], b["type"]) is None or widens(a["type"], b["type"]))
        for a, b in zip(run, buf.fields, strict=True)
    )


def aggregation_values(
    stored: str,
    new: str,
    buffers: list[AggregateBuffer] | None,
    offset: int = 0,
    savepoint_buffers: list[AggregateBuffer] | None = None,
) -> tuple[PartEvolution | None, list[str]]:
    """The query's aggregation buffers from the stored ones, matched by owning aggregate
    (``offset``: where the buffers start in the stored value, for the notes).
    ``savepoint_buffers``: the aggregates of the query the savepoint was taken with
    (``--from-query``), so each aggregate is matched by what it computes, not its buffer's
    name."""
    a, b = json.loads(stored)["fields"], json.loads(new)["fields"]
    if savepoint_buffers is not None:
        return _by_identity(stored, new, _planned_buffers(buffers, b), savepoint_buffers, offset)
    # Spark's own rule ignores names, but here the names say which aggregate owns a buffer:
    # (count, sum) -> (max, count) has the same types and another meaning.
    same_names = [f["name"] for f in a] == [f["name"] for f in b]
    if same_names and difference(json.loads(stored), json.loads(new)) is None:
        return None, []
    matching = _BufferMatching(a, b, offset)
    for buf in _planned_buffers(buffers, b):
        matching.add(buf)
    return PartEvolution(new, matching.sources), matching.notes + matching.dropped()


def _planned_buffers(
    buffers: list[AggregateBuffer] | None, value: list[dict]
) -> list[AggregateBuffer]:
    """The planned aggregates' buffers, checked to be the state value's fields ``value``."""
    if buffers is None:
        raise Refused(
            "value: Spark's planned aggregation did not say which aggregate owns which buffer, "
            "so added or removed aggregates cannot be told apart"
        )
    planned = [f for buf in buffers for f in buf.fields]
    # Spark's state schema marks every buffer nullable; the attributes may not be.
    if [(f["name"], canonical(f["type"])) for f in planned] != [
        (f["name"], canonical(f["type"])) for f in value
    ]:
        raise Refused("value: the planned aggregates' buffers are not the state value schema")
    return buffers


def _by_identity(
    stored: str,
    new: str,
    buffers: list[AggregateBuffer],
    savepoint_buffers: list[AggregateBuffer],
    offset: int,
) -> tuple[PartEvolution | None, list[str]]:
    """Each query aggregate continues the savepoint query's aggregate with the same expression
    (``max(v)``), wherever its buffer sits; one the savepoint's query does not have starts at
    Spark's initial value; the savepoint's aggregates the query lost are dropped."""
    a, b = json.loads(stored)["fields"], json.loads(new)["fields"]
    starts = _savepoint_runs(savepoint_buffers, a, offset)
    matching = _BufferMatching(a, b, offset)
    for buf in buffers:
        at = starts.get(buf.expression, [])
        if len(at) > 1:
            raise Refused(
                f"value: {buf.expression} is computed {len(at)} times by the savepoint's query "
                f"(buffers at fields {', '.join(str(i + offset) for i in at)}); which one it "
                "continues is ambiguous"
            )
        if at and not _run_matches(a, buf, at[0]):
            raise Refused(
                f"value: {buf.expression}'s buffer ({_types(buf.fields)}) cannot continue the "
                f"savepoint's ({_types(a[at[0] : at[0] + len(buf.fields)])}) at field "
                f"{at[0] + offset}"
            )
        if at:
            matching._kept(buf, at[0])
        else:
            matching._added(buf, ", ".join(f["name"] for f in buf.fields))
    unchanged = [s.index for s in matching.sources] == list(range(len(a)))
    if unchanged and difference(json.loads(stored), json.loads(new)) is None:
        return None, []
    return PartEvolution(new, matching.sources), matching.notes + matching.dropped()


def _savepoint_runs(
    savepoint_buffers: list[AggregateBuffer], stored: list[dict], offset: int
) -> dict[str, list[int]]:
    """Where each aggregate of the savepoint's query starts in the stored value, checked to be
    the stored buffers, field for field."""
    planned = [(f["name"], canonical(f["type"])) for buf in savepoint_buffers for f in buf.fields]
    if planned != [(f["name"], canonical(f["type"])) for f in stored]:
        raise Refused(
            f"value: --from-query's aggregates have the buffers ({_types(planned)}), the "
            f"savepoint holds ({_types(stored)}) from field {offset}: name the query the "
            "savepoint was taken with"
        )
    starts: dict[str, list[int]] = {}
    at = 0
    for buf in savepoint_buffers:
        starts.setdefault(buf.expression, []).append(at)
        at += len(buf.fields)
    return starts


def _types(fields: list[Any]) -> str:
    """``max: long, sum: double``: buffer fields (dicts, or (name, type) pairs) for a reason."""
    pairs = [(f["name"], f["type"]) if isinstance(f, dict) else f for f in fields]
    return ", ".join(f"{n}: {simple_string(t)}" for n, t in pairs)


_FROM_QUERY_HINT = (
    "; name the query the savepoint was taken with (--from-query FILE.py:FUNCTION) to match "
    "aggregates by what they compute"
)


@dataclass
class _BufferMatching:
    """The query's aggregation buffers matched, one aggregate at a time, to the stored fields
    ``stored`` (the query's value fields: ``new``); what each new field comes from, and notes."""

    stored: list[dict]
    new: list[dict]
    offset: int
    sources: list[Source] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    used: dict[int, str] = field(default_factory=dict)  # stored field -> its aggregate

    def add(self, buf: AggregateBuffer) -> None:
        names = ", ".join(f["name"] for f in buf.fields)
        found = [i for i in range(len(self.stored)) if _run_matches(self.stored, buf, i)]
        if len(found) > 1:
            raise Refused(
                f"value: the buffer ({names}) of {buf.expression} matches stored buffers at "
                f"fields {', '.join(str(i + self.offset) for i in found)}; which one it was is "
                f"ambiguous{_FROM_QUERY_HINT}"
            )
        if found:
            self._kept(buf, found[0])
        else:
            self._added(buf, names)

    def _added(self, buf: AggregateBuffer, names: str) -> None:
        """An aggregate the savepoint does not have: its buffer starts at Spark's initial
        values."""
        if buf.initial is None:
            raise Refused(
                f"value: {buf.expression} is added, and Spark gives its buffer ({names}) no "
                "declarative initial value to start from"
            )
        self.sources += [Source(None, v) for v in buf.initial]
        shown = ", ".join("null" if v is None else json.dumps(v, default=str) for v in buf.initial)
        self.notes.append(
            f"value: {buf.expression} added, starts at {shown} (Spark's initial value)"
        )

    def _kept(self, buf: AggregateBuffer, at: int) -> None:
        """An aggregate whose buffer is the stored fields from ``at``: they are its, alone."""
        a, width = self.stored, len(buf.fields)
        for i in range(at, at + width):
            if i in self.used:
                raise Refused(
                    f"value: stored field {i + self.offset} ({a[i]['name']}) matches both "
                    f"{self.used[i]} and {buf.expression}; which one owns it is ambiguous"
                    f"{_FROM_QUERY_HINT}"
                )
            self.used[i] = buf.expression
        # Nullability as the state schema records it (buffer attributes may say not null).
        start = len(self.sources)
        for j, f in enumerate(self.new[start : start + width]):
            self.notes += field_change(
                a[at + j], f, f"value field {a[at + j]['name']} of {buf.expression}"
            )
        self.sources += [Source(at + j) for j in range(width)]
        if at != start:
            self.notes.append(f"value: {buf.expression} kept, moved from field {at + self.offset}")

    def dropped(self) -> list[str]:
        """The note on stored buffer fields no aggregate of the query owns, if any."""
        a = self.stored
        dropped = [
            f"{i + self.offset} ({a[i]['name']})" for i in range(len(a)) if i not in self.used
        ]
        if not dropped:
            return []
        return [
            f"value: stored buffer field {', '.join(dropped)} dropped (no aggregate of the "
            "query owns it)"
        ]


def grouped_values(
    stored_key: str,
    stored: str,
    new_key: str,
    new: str,
    buffers: list[AggregateBuffer] | None,
    savepoint_buffers: list[AggregateBuffer] | None = None,
) -> tuple[PartEvolution | None, list[str]]:
    """A value that repeats the grouping columns before the aggregation buffers: a session
    window's (``session_window`` and the key's other columns: as many fields as the key has)
    and a streaming aggregation's at state format 1 (the key's columns). The grouping columns
    by the positional rule, then the buffers matched by owning aggregate as
    :func:`aggregation_values` does."""
    a, b = json.loads(stored)["fields"], json.loads(new)["fields"]
    n = _grouping_columns(stored_key, stored, new_key, new)
    head, head_notes = positional(struct_of(a[:n]), struct_of(b[:n]), "value")
    tail, tail_notes = aggregation_values(
        struct_of(a[n:]), struct_of(b[n:]), buffers, n, savepoint_buffers
    )
    notes = head_notes + tail_notes
    if head is None and tail is None:
        return None, notes
    sources = head.sources if head else [Source(i) for i in range(n)]
    rest = tail.sources if tail else [Source(i) for i in range(len(a) - n)]
    shifted = [s if s.index is None else dataclasses.replace(s, index=s.index + n) for s in rest]
    return PartEvolution(new, sources + shifted), notes


def _grouping_columns(stored_key: str, stored: str, new_key: str, new: str) -> int:
    """How many grouping columns both values start with (as many as the keys have)."""
    a, b = json.loads(stored)["fields"], json.loads(new)["fields"]
    na, nb = len(json.loads(stored_key)["fields"]), len(json.loads(new_key)["fields"])
    if na != nb or len(a) < na or len(b) < nb:
        raise Refused(
            f"value: {simple_string(json.loads(stored))} in the savepoint, "
            f"{simple_string(json.loads(new))} in the query do not both start with the "
            "grouping columns of the key"
        )
    return na


# Spark 4.3 wraps a TTL'd state variable's value (TransformWithStateKeyValueRowSchemaUtils.
# getValueSchemaWithTTL): struct<value: <the user's struct>, ttlExpirationMs: long>.
TTL_VALUE_FIELDS = ("value", "ttlExpirationMs")


def ttl_value(stored: str, new: str, part: str) -> tuple[PartEvolution | None, list[str]]:
    """A TTL'd state variable's value that gains fields: the user's struct inside Spark's TTL
    wrapper evolves as :func:`added_fields` evolves it (the notes name its fields, as the
    query's author sees them); ``ttlExpirationMs`` is kept as stored, so every restored value
    keeps its original expiry. Refused when either side is not the wrapper."""
    a, b = json.loads(stored), json.loads(new)
    for side, schema in (("savepoint", a), ("query", b)):
        if tuple(f["name"] for f in schema["fields"]) != TTL_VALUE_FIELDS:
            raise Refused(
                f"{part}: {simple_string(schema)} in the {side} is not Spark's TTL value "
                "struct<value, ttlExpirationMs>"
            )
    expiry_a, expiry_b = a["fields"][1], b["fields"][1]
    if difference(expiry_a["type"], expiry_b["type"]) is not None:
        raise Refused(f"{part}: ttlExpirationMs changed type")
    inner, notes = added_fields(
        json.dumps(a["fields"][0]["type"]), json.dumps(b["fields"][0]["type"]), part
    )
    if inner is None:
        return None, notes
    return PartEvolution(new, [Source(0, nested=inner), Source(1)]), notes


def state_variable_value(
    stored: str, new: str, stored_ttl: bool, query_ttl: bool
) -> tuple[PartEvolution | None, list[str]]:
    """A transformWithState state variable's value (or list element, or map value) as the
    query keeps it; ``stored_ttl``/``query_ttl``: whether the savepoint and the query keep it
    with TTL (a ``$ttl_`` index). TTL added or dropped is refused: an added TTL has no expiry
    for the restored values (Spark computes one only when a value is written), and a dropped
    one would keep values past the expiry they were written with."""
    if stored_ttl and not query_ttl:
        raise Refused(
            "value: the savepoint keeps it with TTL (each value has its ttlExpirationMs), the "
            "query without: restore does not drop expiries, so the restored values would "
            "outlive them"
        )
    if query_ttl and not stored_ttl:
        raise Refused(
            "value: the query adds TTL to it, and its restored values have no expiry to keep "
            "(Spark sets ttlExpirationMs only when a value is written)"
        )
    if stored_ttl:
        return ttl_value(stored, new, "value")
    return added_fields(stored, new, "value")


def _grouping_at(family: str, kinds: dict[str, str]) -> tuple[int, ...] | None:
    """Where a transformWithState column family's key holds the grouping key (Spark 4.3's
    layout), as a path of field indexes: ``()`` for the whole key (value and list state,
    ``$rowCounter_``, a TTL'd list's ``$min_``/``$count_``), ``(i,)`` for its field i (map state
    ``(key, userKey)``, timers ``(key, expiryTimestampMs)`` and ``(expiryTimestampMs, key)``),
    and in a TTL index ``(expirationMs, elementKey)`` the element key: the grouping key of a
    value or list (``(1,)``), a map's ``(key, userKey)`` (``(1, 0)``). None: not known."""
    kind = kinds.get(family)
    if kind in ("ValueState", "ListState"):
        return ()
    if kind == "MapState" or family.endswith("_keyToTimestamp"):
        return (0,)
    if family.endswith("_timestampToKey"):
        return (1,)
    if family.startswith(("$rowCounter_", "$min_", "$count_")):
        return ()
    if family.startswith("$ttl_"):
        owner = kinds.get(family[len("$ttl_") :])
        if owner in ("ValueState", "ListState"):
            return (1,)
        if owner == "MapState":
            return (1, 0)
    return None


def _grouping_part(schema: dict, at: tuple[int, ...]) -> dict:
    for i in at:
        schema = schema["fields"][i]["type"]
    return schema


def _with_grouping(schema: dict, at: tuple[int, ...], grouping: dict) -> dict:
    if not at:
        return grouping
    fields = list(schema["fields"])
    fields[at[0]] = {
        **fields[at[0]],
        "type": _with_grouping(fields[at[0]]["type"], at[1:], grouping),
    }
    return {**schema, "fields": fields}


def grouping_key(
    stored: dict[str, str], new: dict[str, str], kinds: dict[str, str]
) -> tuple[PartEvolution | None, list[str]]:
    """transformWithState's grouping key, read as the query's: every column family keeps it
    (state variables, timers, row counters, TTL indexes), so it changes for all alike, by
    :func:`positional`'s rule (widened, renamed by position). ``stored`` and ``new``: each
    column family's key schema (JSON) in the savepoint and in the query; ``kinds``: the state
    variables' kinds. None when the bytes stay (renamed or nullability widened only): Spark
    reads those keys as they are. Refused: the reason, with the family and field."""
    old, want = _grouping_keys(stored, new, kinds)
    if old is None or want is None:
        return None, []
    evo, notes = positional(json.dumps(old), json.dumps(want), "grouping key")
    # The rest of each family's key (a map's user key, a timer's expiry) stays as Spark's rule
    # wants it.
    for name, schema in stored.items():
        _check_rekeyed(name, schema, new.get(name), _grouping_at(name, kinds), want, evo)
    return evo, notes


def _grouping_keys(
    stored: dict[str, str], new: dict[str, str], kinds: dict[str, str]
) -> tuple[dict | None, dict | None]:
    """The grouping key's type in the savepoint and in the query, the same in every column
    family that holds it (None, None: no family of both holds one)."""
    olds: list[dict] = []
    news: list[dict] = []
    for name, schema in stored.items():
        at = _grouping_at(name, kinds)
        if at is None or name not in new:
            continue
        olds.append(_family_grouping(name, schema, at))
        news.append(_family_grouping(name, new[name], at))
    if not olds:
        return None, None
    if any(o != olds[0] for o in olds) or any(n != news[0] for n in news):
        raise Refused("the column families do not agree on the grouping key")
    return olds[0], news[0]


def _family_grouping(name: str, key_schema: str, at: tuple[int, ...]) -> dict:
    """The grouping key's type in column family ``name``'s key schema, at ``at``."""
    schema = json.loads(key_schema)
    try:
        return _grouping_part(schema, at)
    except (IndexError, KeyError, TypeError):
        raise Refused(
            f"column family {name}: key {simple_string(schema)} has no grouping key"
        ) from None


def _check_rekeyed(
    name: str,
    schema: str,
    new_schema: str | None,
    at: tuple[int, ...] | None,
    want: dict,
    evo: PartEvolution | None,
) -> None:
    """Refused unless column family ``name``'s stored key, its grouping key re-typed to
    ``want``, is the query's key of the family (``new_schema``; None: not in the query)."""
    if new_schema is None:
        if evo is None:
            return  # written as the savepoint has it
        raise Refused(f"column family {name} is not in the query, so cannot be re-keyed")
    if at is None and evo is not None:
        raise Refused(
            f"column family {name}: restore does not know where its key holds the grouping "
            "key, so cannot re-key it"
        )
    stored_key = json.loads(schema)
    rekeyed = stored_key if at is None else _with_grouping(stored_key, at, want)
    diff = difference(rekeyed, json.loads(new_schema))
    if diff:
        raise Refused(f"column family {name}: key {diff}")


def evolve_table(
    stored_key: str,
    stored_value: str,
    new_key: str,
    new_value: str,
    buffers: list[AggregateBuffer] | None = None,
    aggregation: bool = False,
    grouped: bool = False,
    savepoint_buffers: list[AggregateBuffer] | None = None,
) -> TableEvolution:
    """How a store's rows become the query's; Refused with the field-level reason.
    ``aggregation``: the value is aggregation buffers; ``grouped``: the grouping columns, then
    the buffers (a session window, an aggregation at state format 1); ``savepoint_buffers``:
    the aggregates of the query the savepoint was taken with, to match buffers by identity."""
    key, key_notes = positional(stored_key, new_key, "key")
    if grouped:
        value, value_notes = grouped_values(
            stored_key, stored_value, new_key, new_value, buffers, savepoint_buffers
        )
    elif aggregation:
        value, value_notes = aggregation_values(
            stored_value, new_value, buffers, savepoint_buffers=savepoint_buffers
        )
    else:
        value, value_notes = positional(stored_value, new_value, "value")
    return TableEvolution(key, value, key_notes + value_notes)

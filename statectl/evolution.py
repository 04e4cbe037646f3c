"""Schema evolution on restore: state written by one query, re-encoded for a changed query.

Spark itself reads stored state by position and accepts only renamed fields and widened
nullability (statectl/schema_compat.py). Restore re-encodes every row anyway, so it can do
more where the meaning is clear, and refuses (with the field) where it is not. This module
owns the general machinery: how a key or value struct is re-shaped (:class:`PartEvolution`,
its :class:`Source` per field, :class:`TableEvolution` per store) and the rules every part
follows:

- numeric widening (byte < short < int < long, float -> double, a decimal whose integer and
  fraction digits both grow) and nullability widening, in keys and values;
- renamed fields, matched by position and type (what Spark does; the plan says so);
- state structs (a transformWithState value, applyInPandasWithState's user state) that gain
  fields: matched by name when every stored name is still there in the same order (added
  fields anywhere start null), else by position with the added fields at the end; stored
  names in another order are refused.

The rules of each operator kind (aggregation buffers, session windows, transformWithState's
TTL values and grouping key) are :mod:`statectl.evolution_kinds`; converting between Spark's
state formats is :mod:`statectl.state_formats`.
"""

from __future__ import annotations

import decimal
import json
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from statectl.codecs.sparktypes import canonical, decimal_of, physical, to_arrow_field
from statectl.schema_compat import difference, simple_string

# Integral types in widening order: each may be read as any later one.
INTEGRAL = ("byte", "short", "integer", "long")
_WIDER = {"float": ("double",)}


class Refused(Exception):
    """Evolution is not clear: the field-level reason."""


@dataclass
class Source:
    """Where one field of the new schema comes from: ``index`` of the stored field (re-shaped
    by ``nested`` when it is a struct that changed), or (index None) the constant ``value``;
    ``from_key``: field ``index`` of the row's key instead (a value that repeats the grouping
    columns, written from a state format that did not); ``nested`` with index None: a struct
    made of the stored fields (a state format that nests them)."""

    index: int | None
    value: Any = None
    nested: PartEvolution | None = None
    from_key: bool = False
    # Field ``member`` of the stored struct field ``index`` (a nested struct flattened).
    member: int | None = None


@dataclass
class PartEvolution:
    """A key or value struct re-shaped from the stored schema to the query's."""

    new_schema: str
    sources: list[Source]

    def convert(self, arr: pa.StructArray, key: pa.StructArray | None = None) -> pa.StructArray:
        fields = [to_arrow_field(f) for f in json.loads(self.new_schema)["fields"]]
        children = [
            _source_column(src, f.type, arr, key)
            for f, src in zip(fields, self.sources, strict=True)
        ]
        mask = arr.is_null() if arr.null_count else None
        return pa.StructArray.from_arrays(children, fields=fields, mask=mask)


def _source_column(
    src: Source, t: pa.DataType, arr: pa.StructArray, key: pa.StructArray | None
) -> pa.Array:
    """The query's column of Arrow type ``t`` that ``src`` says how to build from the stored
    struct array ``arr`` (and its ``key``, for a value built from the key)."""
    if src.from_key:
        if key is None:
            raise ValueError("a value built from its key needs the key")
        return retyped(key.field(src.index), t)
    if src.index is None:
        if src.nested is not None:  # a struct the query nests, made of stored fields
            return src.nested.convert(arr, key)
        value = src.value  # a constant: the new field's default
        if value is not None and pa.types.is_decimal(t):
            value = decimal.Decimal(str(value))
        return pa.array([value] * len(arr), t)
    if src.member is not None:
        return retyped(arr.field(src.index).field(src.member), t)
    if src.nested is not None:
        return src.nested.convert(arr.field(src.index))
    return retyped(arr.field(src.index), t)


def retyped(arr: pa.Array, t: pa.DataType) -> pa.Array:
    """``arr`` as Arrow type ``t``, struct fields matched by position as Spark reads them:
    Arrow casts a struct by field name, which would turn a renamed nested field into nulls."""
    if (
        pa.types.is_struct(t)
        and pa.types.is_struct(arr.type)
        and arr.type.num_fields == t.num_fields
    ):
        children = [retyped(arr.field(i), t.field(i).type) for i in range(t.num_fields)]
        mask = arr.is_null() if arr.null_count else None
        return pa.StructArray.from_arrays(children, fields=list(t), mask=mask)
    return arr.cast(t)


@dataclass
class TableEvolution:
    """A store's evolution; None for a part that keeps its schema."""

    key: PartEvolution | None = None
    value: PartEvolution | None = None
    notes: list[str] = field(default_factory=list)
    transform: str | None = None  # --transform FILE.py:FUNCTION makes the rows instead


def widens(stored: Any, new: Any) -> bool:
    """A value of Spark type ``stored`` converts to ``new`` without loss."""
    a, b = canonical(physical(stored)), canonical(physical(new))
    if not isinstance(a, str) or not isinstance(b, str):
        return False
    if a in INTEGRAL and b in INTEGRAL:
        return INTEGRAL.index(a) < INTEGRAL.index(b)
    if b in _WIDER.get(a, ()):
        return True
    da, db = decimal_of(a), decimal_of(b)
    if da and db and da != db:
        return db[0] - db[1] >= da[0] - da[1] and db[1] >= da[1]
    return False


def field_change(old: dict, new: dict, where: str) -> list[str]:
    """Notes for reading stored field ``old`` as ``new``; Refused when it cannot be."""
    notes = []
    if difference(old["type"], new["type"]) is not None:
        if not widens(old["type"], new["type"]):
            raise Refused(
                f"{where}: {simple_string(old['type'])} in the savepoint, "
                f"{simple_string(new['type'])} in the query, which is not a widening"
            )
        notes.append(
            f"{where}: widened {simple_string(old['type'])} -> {simple_string(new['type'])}"
        )
    if old.get("nullable", True) and not new.get("nullable", True):
        raise Refused(f"{where} was nullable and is not nullable in the query")
    if old["name"] != new["name"]:
        notes.append(f"{where}: renamed {old['name']} -> {new['name']}, matched by position")
    return notes


def positional(stored: str, new: str, part: str) -> tuple[PartEvolution | None, list[str]]:
    """Field i of the query's struct is stored field i, renamed or widened; None when Spark
    reads it as it is (the same bytes)."""
    a, b = json.loads(stored)["fields"], json.loads(new)["fields"]
    if len(a) != len(b):
        raise Refused(
            f"{part} has {len(a)} fields in the savepoint ({simple_string(json.loads(stored))}), "
            f"{len(b)} in the query ({simple_string(json.loads(new))}); only aggregation "
            "buffers may be added or removed"
        )
    _refuse_moved_names(a, b, part)
    notes: list[str] = []
    sources = []
    bytes_change = False
    for i, (fa, fb) in enumerate(zip(a, b, strict=True)):
        src, changed, field_notes = _read_as(fa, fb, i, f"{part} field {i} ({fb['name']})")
        sources.append(src)
        bytes_change |= changed
        notes += field_notes
    if not bytes_change:
        return None, notes
    return PartEvolution(new, sources), notes


def _refuse_moved_names(a: list[dict], b: list[dict], part: str) -> None:
    """Refused when a query field carries the name of a stored field at another position.

    Matched by position (Spark's rule), field i would take stored field i's value; by name it
    would take the other one's. A reordered ``groupBy`` or struct would otherwise restore with
    its columns' values swapped, and only a "renamed" note to show for it."""
    # Only names that say which field is which: aggregation buffers repeat theirs (an avg's
    # ``sum, count`` beside a ``count``), and those stay matched by position.
    names_a, names_b = [f["name"] for f in a], [f["name"] for f in b]
    stored = {n: i for i, n in enumerate(names_a) if names_a.count(n) == 1}
    for j, f in enumerate(b):
        i = stored.get(f["name"])
        if i is not None and i != j and names_b.count(f["name"]) == 1:
            raise Refused(
                f"{part} field {j} ({f['name']}) is stored field {i} in the savepoint "
                f"({simple_string({'type': 'struct', 'fields': a})}); state is stored by "
                "position, so a reordered struct is ambiguous: keep the stored fields' order "
                "in the query"
            )


def _read_as(fa: dict, fb: dict, index: int, where: str) -> tuple[Source, bool, list[str]]:
    """Stored field ``fa`` (at ``index``) read as the query's ``fb``: its source, whether its
    bytes change (widened, or a nested struct re-shaped) and the notes; Refused when it cannot
    be read so."""
    if is_struct(fa["type"]) and is_struct(fb["type"]):
        # A nested struct (applyInPandasWithState's groupState) may itself gain fields.
        sub, sub_notes = added_fields(json.dumps(fa["type"]), json.dumps(fb["type"]), where)
        if _nullable_narrowed(fa, fb):
            raise Refused(f"{where} was nullable and is not nullable in the query")
        if fa["name"] != fb["name"]:
            sub_notes.append(f"{where}: renamed {fa['name']} -> {fb['name']}, matched by position")
        return Source(index, nested=sub), sub is not None, sub_notes
    changed = field_change(fa, fb, where)
    return Source(index), any("widened" in n for n in changed), changed


def is_struct(t: Any) -> bool:
    return isinstance(t, dict) and t.get("type") == "struct"


def _nullable_narrowed(old: dict, new: dict) -> bool:
    return bool(old.get("nullable", True)) and not new.get("nullable", True)


def struct_of(fields: list[dict]) -> str:
    return json.dumps({"type": "struct", "fields": fields})


def added_fields(stored: str, new: str, part: str) -> tuple[PartEvolution | None, list[str]]:
    """A state struct (a transformWithState value; the user state inside
    applyInPandasWithState's value) that gains fields. When every stored field's name is in the
    query's struct, in the same order, the stored fields are matched by name (widened or
    themselves grown) and the added ones, anywhere, start null; names that match in another
    order are refused (which field is which would be a guess). Otherwise fields are added at
    the end: the stored fields by position (renamed, widened or themselves grown), the new ones
    null."""
    a, b = json.loads(stored)["fields"], json.loads(new)["fields"]
    if len(b) <= len(a):
        return positional(stored, new, part)
    at = _by_name(a, b, part)
    if at is None:
        at = list(range(len(a)))  # by position: renamed fields, the new ones at the end
    notes: list[str] = []
    sources: list[Source | None] = [None] * len(b)
    for i, j in enumerate(at):
        src, _changed, field_notes = _read_as(a[i], b[j], i, f"{part} field {j} ({b[j]['name']})")
        sources[j] = src
        notes += field_notes
        if i != j:
            notes.append(f"{part} field {j} ({b[j]['name']}): stored field {i}, matched by name")
    for j, f in enumerate(b):
        if sources[j] is not None:
            continue
        if not f.get("nullable", True):
            raise Refused(
                f"{part} field {j} ({f['name']}) is added and not nullable: no value to start from"
            )
        notes.append(f"{part} field {j} ({f['name']}): added, starts null")
        sources[j] = Source(None)
    return PartEvolution(new, [s for s in sources if s is not None]), notes


def _by_name(a: list[dict], b: list[dict], part: str) -> list[int] | None:
    """Where each stored field is in the query's struct when all their names are there (and
    unique), else None (matched by position); Refused when the names are in another order."""
    names = [f["name"] for f in b]
    stored = [f["name"] for f in a]
    if not _unique(names) or not _unique(stored) or not set(stored) <= set(names):
        return None
    at = [names.index(n) for n in stored]
    if at != sorted(at):
        raise Refused(
            f"{part}: the savepoint's fields ({', '.join(stored)}) are in the query in another "
            f"order ({', '.join(n for n in names if n in stored)}); state is stored by "
            "position, so a reordered struct is ambiguous: add fields without moving the "
            "stored ones"
        )
    return at


def _unique(names: list[str]) -> bool:
    return len(set(names)) == len(names)

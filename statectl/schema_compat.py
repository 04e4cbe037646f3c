"""Is stored state readable by a (changed) query? Spark's rule, with a precise reason.

Spark 4.3 (``StateSchemaCompatibilityChecker``) accepts a new key or value schema when it equals
the stored one ignoring field names, with compatible nullability: its ``schemasCompatible(stored,
new)`` calls ``DataType.equalsIgnoreNameAndCompatibleNullability(new, stored)`` (javap), so a
stored field must be at least as nullable as the query's. The state is read by position, so a
renamed column is fine and a retyped or reordered one is not.

statectl's rule differs in nullability, both ways on purpose: a field nullable in the savepoint
and not in the query is refused (stored nulls would reach a non-nullable column, which Spark
lets through), and a stored non-nullable field the query plans nullable (which Spark refuses:
Spark 3.5's left semi join read by 4.3) is accepted, because a restore with ``--query`` writes
the query's schema for the same bytes (``RestorePlan.query_schemas``).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from statectl.codecs.sparktypes import canonical, canonical_name, physical


def simple_string(t: Any) -> str:
    """Spark's ``simpleString``: ``struct<k:string,n:bigint>``."""
    t = physical(t)
    if isinstance(t, str):
        return canonical_name(t)
    k = t.get("type")
    if k == "struct":
        return (
            "struct<"
            + ",".join(f"{f['name']}:{simple_string(f['type'])}" for f in t["fields"])
            + ">"
        )
    if k == "array":
        return f"array<{simple_string(t['elementType'])}>"
    if k == "map":
        return f"map<{simple_string(t['keyType'])},{simple_string(t['valueType'])}>"
    return json.dumps(t)


def _nullability(stored: bool, new: bool, where: str) -> str | None:
    if stored and not new:
        return f"{where} was nullable and is not nullable in the query"
    return None


def difference(stored: Any, new: Any, where: str = "") -> str | None:
    """None when state of type ``stored`` can be read as ``new``, else what differs."""
    stored, new = physical(stored), physical(new)
    if isinstance(stored, str) or isinstance(new, str) or stored.get("type") != new.get("type"):
        return _named_difference(stored, new, where)
    return _NESTED.get(stored.get("type"), _object_difference)(stored, new, where)


def _named_difference(stored: Any, new: Any, where: str) -> str | None:
    """Types of different kinds, or at least one a type string: equal type strings only."""
    if isinstance(stored, str) and isinstance(new, str) and canonical(stored) == canonical(new):
        return None
    return f"{where or 'type'}: {simple_string(stored)} in the savepoint, {simple_string(new)} in the query"


def _object_difference(stored: dict, new: dict, where: str) -> str | None:
    """Another kind written as an object (a UDT's own, an unknown one): the same object."""
    return None if stored == new else f"{where or 'type'} differs"


def _struct_difference(stored: dict, new: dict, where: str) -> str | None:
    """The same number of fields, each readable as the query's, none of them made non-null."""
    a, b = stored["fields"], new["fields"]
    if len(a) != len(b):
        return (
            f"{where or 'struct'} has {len(a)} fields in the savepoint "
            f"({simple_string(stored)}), {len(b)} in the query ({simple_string(new)})"
        )
    for i, (fa, fb) in enumerate(zip(a, b, strict=True)):
        at = f"{where}.{fa['name']}" if where else f"field {i} ({fa['name']})"
        diff = difference(fa["type"], fb["type"], at) or _nullability(
            fa.get("nullable", True), fb.get("nullable", True), at
        )
        if diff:
            return diff
    return None


def _array_difference(stored: dict, new: dict, where: str) -> str | None:
    return difference(stored["elementType"], new["elementType"], f"{where}[]") or _nullability(
        stored.get("containsNull", True), new.get("containsNull", True), f"{where}[]"
    )


def _map_difference(stored: dict, new: dict, where: str) -> str | None:
    return (
        difference(stored["keyType"], new["keyType"], f"{where}{{key}}")
        or difference(stored["valueType"], new["valueType"], f"{where}{{value}}")
        or _nullability(
            stored.get("valueContainsNull", True),
            new.get("valueContainsNull", True),
            f"{where}{{value}}",
        )
    )


# The nested kinds, compared part by part (both sides are of the kind).
_NESTED: dict[str, Callable[[dict, dict, str], str | None]] = {
    "struct": _struct_difference,
    "array": _array_difference,
    "map": _map_difference,
}

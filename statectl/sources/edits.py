"""What ``--source-offsets NAME=VALUE`` asks of a restore, and how a given offset is checked
against its source's kind and written as that source's Spark writer writes it.

VALUE is one of:

* ``JSON``: the source's new offset, checked against its kind (as the savepoint recorded it,
  or as ``--query`` plans it) and written the way its Spark writer writes it
  (:meth:`SourceKind.serialise`: a Kafka offset in ``JsonUtils.partitionOffsets``' order, a
  Python data source's as ``json.dumps``);
* ``KIND:JSON``: the source is swapped for a source of another kind (a file backfill handed
  over to Kafka, Kafka to Delta) that starts at JSON, checked against KIND; the old source's
  ``sources/`` files and seen-files log are not carried. KIND is one of :data:`SWAPPABLE`;
* ``-``: the source starts from its configured start (``startingOffsets``, its files, ...);
* ``drop``: a restore without ``--query``: the query no longer reads this source. Its
  position is dropped (so ``-n`` is needed) and, in offset log v1, the sources after it
  move up one index, as Spark numbers the remaining sources in plan order.
"""

from __future__ import annotations

import json
import re
from typing import Any

from statectl.errors import StatectlError
from statectl.sources.kinds import (
    DELTA,
    KAFKA,
    KINDS,
    PYTHON,
    RATE,
    RATE_MICRO_BATCH,
    SourceKind,
    offset_value,
)

START = "-"  # --source-offsets NAME=- : from the source's configured start
DROP = "drop"  # --source-offsets NAME=drop : the query no longer reads it (no --query)
# The kinds a source can be swapped to by offset: each has an offset one can give. A file
# source's position is its seen-files log (it starts from its files: NAME=-), and statectl
# cannot check an unknown kind's offset.
SWAPPABLE: dict[str, SourceKind] = {
    k.name: k for k in (KAFKA, DELTA, RATE, RATE_MICRO_BATCH, PYTHON)
}
_PREFIX = re.compile(r"([a-z][a-z-]*):(.*)", re.DOTALL)


def parse_source_offsets(pairs: list[str]) -> dict[str, str]:
    """``NAME=JSON`` options (repeatable) as a mapping; the JSON must at least be JSON."""
    out: dict[str, str] = {}
    for pair in pairs:
        name, sep, text = pair.partition("=")
        if not sep or not name:
            raise StatectlError(f"--source-offsets wants NAME=JSON (or NAME=-), got {pair!r}")
        if name in out:
            raise StatectlError(f"--source-offsets names source {name!r} twice")
        out[name] = normalize_offset(text, f"--source-offsets {name}", edits=True)
    return out


def normalize_offset(value: Any, what: str, edits: bool = False) -> str:
    """An offset as Spark's JSON text: a JSON string as given (checked), a dict or a number
    dumped, ``None``/``"-"`` as ``-`` (from the configured start). With ``edits`` (the
    restore CLI's ``--source-offsets``), ``drop`` and ``KIND:JSON`` (a swap) too, kept with
    their JSON checked."""
    if value is None or value == START:
        return START
    if edits and value == DROP:
        return DROP
    if isinstance(value, str):
        kind, text = _swap_prefix(value, what) if edits else (None, value)
        text = _json_text(text, what)
        return f"{kind}:{text}" if kind else text
    if isinstance(value, (dict, list, int, float)) and not isinstance(value, bool):
        return json.dumps(value, separators=(",", ":"))
    raise StatectlError(
        f"{what}: an offset is JSON text, a dict or None, not {type(value).__name__}"
    )


def _swap_prefix(value: str, what: str) -> tuple[str | None, str]:
    """``KIND:JSON`` -> (KIND, JSON); plain JSON -> (None, JSON). A kind that cannot be
    swapped to is refused with the reason."""
    m = _PREFIX.fullmatch(value.strip())
    if m is None or m.group(1) in ("true", "false", "null"):
        return None, value
    kind = m.group(1)
    if kind in SWAPPABLE:
        return kind, m.group(2)
    if kind == "file":
        why = (
            "a file source's position is its seen-files log, not an offset: to swap this "
            "source for a file source, pass NAME=- (it reads its directory from the start)"
        )
    elif kind in KINDS:
        why = "statectl cannot check an offset of a source whose kind it does not know"
    else:
        why = f"{kind!r} is not a source kind ({', '.join(SWAPPABLE)})"
    raise StatectlError(f"{what}: cannot swap to {kind}: {why}")


def _json_text(value: str, what: str) -> str:
    try:
        json.loads(value)
    except ValueError as e:
        raise StatectlError(f"{what}: {value[:60]!r} is not JSON ({e})") from None
    if "\n" in value:
        value = json.dumps(json.loads(value), separators=(",", ":"))
    return value.strip()


def split_swap(text: str) -> tuple[SourceKind | None, str]:
    """A normalised value as (the kind it swaps the source to, or None; its offset text)."""
    m = _PREFIX.fullmatch(text)
    if m is not None and m.group(1) in SWAPPABLE:
        return SWAPPABLE[m.group(1)], m.group(2)
    return None, text


def kind_problem(where: str, text: str, kind: SourceKind | None) -> str | None:
    """Why ``--source-offsets where=text`` is not an offset of the source's kind (None: it
    is, or the kind is not known: a savepoint older than the recorded kinds)."""
    if kind is None:
        return None
    why = kind.check(offset_value(text))
    if why is None:
        return None
    if not kind.editable:
        return f"--source-offsets {where}: refused: {why}"
    return f"--source-offsets {where}={text}: not a {kind.title} offset: {why}{_hint(text, kind)}"


def _hint(text: str, kind: SourceKind) -> str:
    """A given offset of another kind's shape: how to ask for the swap."""
    value = offset_value(text)
    other = next(
        (k for k in (DELTA, RATE_MICRO_BATCH, KAFKA) if k is not kind and k.check(value) is None),
        None,
    )
    if other is None:
        return ""
    return f"; to swap it for a {other.title} source, give it as {other.name}:{text}"


def swap_problem(where: str, swap: SourceKind, planned: SourceKind | None) -> str | None:
    """A swap the query contradicts: its source is of another kind than the one named."""
    if planned is None or planned is swap:
        return None
    return (
        f"--source-offsets {where}: the query's source is a {planned.title} source, not "
        f"{swap.title}; give its offset without '{swap.name}:'"
    )


def as_written(text: str, kind: SourceKind | None, problem: str | None) -> str:
    """A given offset as the source's Spark writer would write it (Kafka: JsonUtils' order;
    a Python data source: ``json.dumps``); as given when its kind is unknown or refused."""
    if kind is None or problem is not None:
        return text
    return kind.serialise(offset_value(text)) or text


def describe_change(old_offset: str | None, new_offset: str | None, kind: SourceKind | None) -> str:
    """The plan's note on a given position: where the source was, and what changed (Kafka:
    the topic-partitions added, e.g. a new partition at earliest, and those no longer read)."""
    change = kind.change(offset_value(old_offset), offset_value(new_offset)) if kind else ""
    was = f"was at {'-' if old_offset is None else old_offset}"
    return f"{was}; {change}" if change else was


def split_drops(
    given: dict[str, str], keys: list[str], with_query: bool
) -> tuple[dict[str, str], set[str], list[str]]:
    """``NAME=drop`` apart from the positions given: (the others, the keys of the savepoint's
    sources dropped, problems). With ``--query`` the query says which sources it reads."""
    drops: set[str] = set()
    problems = []
    for name, text in given.items():
        if text != DROP:
            continue
        if with_query:
            problems.append(
                f"--source-offsets {name}=drop: with --query the query says which sources it "
                "reads; remove the source from the query (and pass -n)"
            )
        elif name not in keys:
            problems.append(
                f"--source-offsets {name}=drop: the savepoint has no source {name!r} (its "
                f"sources: {', '.join(keys) or 'none'})"
            )
        else:
            drops.add(name)
    return {k: v for k, v in given.items() if v != DROP}, drops, problems


def unnamed_into_named(names: list[str]) -> list[str]:
    """An unnamed checkpoint (offset log v1) continued by a query naming its sources
    (``names``): Spark 4.3 refuses it, and statectl does not convert the offset log."""
    if not names:
        return []
    return [
        f"the query names its sources ({', '.join(names)}: readStream.name, offset log v2) "
        "but the savepoint's are unnamed (offset log v1): Spark refuses to turn on source "
        "evolution for an existing checkpoint (STREAMING_QUERY_EVOLUTION_ERROR."
        "CANNOT_ENABLE_ON_EXISTING_CHECKPOINT) and statectl does not convert offset log v1 "
        "to v2; restore into a query without source names"
    ]

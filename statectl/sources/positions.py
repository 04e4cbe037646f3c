"""Where each source of a restored query starts: the savepoint's sources matched to the
changed query's, and positions given with ``--source-offsets``.

Spark numbers a query's sources in plan order and restarts only when ``offsets/N`` has exactly
one line per source (``OffsetSeq.toStreamProgress``): a source added, removed or replaced makes
the old checkpoint unusable. A restore writes the offset log for the new query instead:

* kept: the old source's offset (and, for a file source, its seen-files log under the new
  index). A file source is matched by its directory (what its log's files are under), else
  by index (a moved directory; the plan notes it); any other source by its index;
* new: ``-``, Spark's "no offset yet", so the source starts from its configured start
  (``startingOffsets``, a file source's existing files, ...);
* given: ``--source-offsets NAME=JSON`` (NAME = the index or the description the plan shows),
  checked with the source's own parser where Spark can build the source at plan time;
* dropped: an old source the query no longer has (needs ``-n``).

Offset log v2 (named sources, Spark 4.2+'s ``queryEvolution.enableSourceEvolution``) is
matched by name instead: Spark itself lets named sources come and go, so a kept name keeps
its offset, a new name starts from its configured start (or takes ``--source-offsets``), and
a name the query dropped needs ``-n``.
"""

from __future__ import annotations

import json
import os
import posixpath
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import unquote, urlparse

from statectl.query_plan import PlannedSource
from statectl.sources.edits import (
    START,
    as_written,
    describe_change,
    kind_problem,
    split_drops,
    split_swap,
    swap_problem,
    unnamed_into_named,
)
from statectl.sources.kinds import SourceKind, kind_named, planned_kind


@dataclass
class SourcePositions:
    """The offset log and source logs a restore writes, and what the plan says about them."""

    offsets: dict[str, str | None]
    previous_offsets: dict[str, str | None] | None
    source_logs: dict[str, list[dict[str, Any]]]
    report: list[dict[str, Any]] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    # savepoint source key -> its key in the restored query, for every source that keeps its
    # position: where its carried sources/ files (statectl/sources/carry.py) are written back.
    carried: dict[str, str] = field(default_factory=dict)


def _local_dir(path: str) -> str:
    """A file source directory or file URI as a comparable local path."""
    u = urlparse(path)
    if u.scheme in ("", "file"):
        return os.path.normpath(os.path.abspath(unquote(u.path if u.scheme else path)))
    return path.rstrip("/")


def old_file_dir(entries: list[dict[str, Any]]) -> str | None:
    """The directory a file source read, from its log's file paths (None: no files, or files
    in several directories, e.g. a glob)."""
    dirs = {posixpath.dirname(_local_dir(str(e.get("path", "")))) for e in entries}
    return dirs.pop() if len(dirs) == 1 else None


def _is_file_offset(text: str | None) -> bool:
    try:
        v = json.loads(text or "null")
    except ValueError:
        return False
    return isinstance(v, dict) and set(v) == {"logOffset"}


@dataclass
class _Old:
    key: str
    offset: str | None
    previous: str | None
    entries: list[dict[str, Any]]
    is_file: bool
    directory: str | None
    kind: SourceKind | None = None  # as the savepoint recorded it (None: older savepoints)

    def describe(self) -> str:
        if self.is_file:
            return f"FileSource[{self.directory or '?'}]"
        return f"source {self.key}"


def _old_sources(m: Any) -> list[_Old]:
    prev = m.previous_offsets or {}
    recorded = {
        e.get("key"): kind_named(e.get("kind"))
        for e in getattr(m, "sources", None) or []
        if isinstance(e, dict)
    }
    out = []
    for key, offset in m.offsets.items():
        entries = (m.source_logs or {}).get(key, [])
        is_file = bool(entries) or _is_file_offset(offset)
        directory = old_file_dir(entries)
        out.append(
            _Old(key, offset, prev.get(key, offset), entries, is_file, directory, recorded.get(key))
        )
    return out


def _old_position(
    entry: dict[str, Any], old: _Old | None, kind: SourceKind | None, swap: SourceKind | None
) -> None:
    """The plan of a given offset says where the source was and what changed; a swap
    replaces the old source (whose sources/ files are then not carried)."""
    if old is None:
        return
    entry["old_offset"] = old.offset
    entry["note"] = describe_change(old.offset, entry["offset"], kind if swap is None else None)
    was = old.kind.title if old.kind is not None else "file" if old.is_file else None
    if swap is not None and was != swap.title:
        entry["replaces"] = f"{old.describe()} ({was or 'kind not recorded'})"
        entry["note"] += f"; swapped for a {swap.title} source, its sources/ files not carried"


def _kind_of(s: PlannedSource | None, old: _Old | None, unchanged_query: bool) -> SourceKind | None:
    """The kind a given offset is checked against: the query's source's (from Spark's
    description), else, for the savepoint's own sources, the recorded one."""
    planned = planned_kind(s.description) if s is not None and not unchanged_query else None
    if planned is not None:
        return planned
    return old.kind if old is not None and (unchanged_query or s is None) else None


def _resolve(given: dict[str, str], new: list[PlannedSource]) -> tuple[dict[int, str], list[str]]:
    """Given positions by new source index; NAME is an index or a description."""
    out: dict[int, str] = {}
    problems = []
    names = ", ".join(f"{s.index} {s.description}" for s in new) or "none"
    for name, text in given.items():
        hits = _named_by(name, new)
        if len(hits) != 1:
            why = "matches no source" if not hits else "matches several sources (use the index)"
            problems.append(f"--source-offsets {name}: {why} of the query (its sources: {names})")
            continue
        out[hits[0].index] = text
    return out, problems


def _named_by(name: str, new: list[PlannedSource]) -> list[PlannedSource]:
    """The query's sources ``name`` means: an index, or a description / file path."""
    if name.isdigit():
        return [s for s in new if s.index == int(name)]
    return [s for s in new if name in (s.description, s.file_path)]


def _file_offset_refused(where: str, description: str, keeps: str) -> str:
    """``--source-offsets`` for a file source: its position is its seen-files log."""
    return (
        f"--source-offsets {where}: {description} is a file source, whose position is its "
        f"seen-files log, not an offset; {keeps} or starts from its files ({where}=-)"
    )


def _unparsable(where: str, text: str, s: PlannedSource | None) -> str | None:
    """Why the query's source ``s`` cannot read ``--source-offsets where=text``, if it can say."""
    err = s.parse_offset(text) if s is not None and s.parse_offset is not None else None
    if not err or s is None:
        return None
    return f"--source-offsets {where}={text}: {s.description} cannot parse this offset: {err}"


def _dropped(o: _Old, label: str | int, allow: bool, hint: str = "") -> tuple[dict, str | None]:
    """A savepoint source the query does not continue: its report entry, and the problem
    unless ``-n`` allows dropping it."""
    entry = {
        "index": None,
        "savepoint_index": label,
        "description": o.describe(),
        "position": "dropped",
        "offset": o.offset,
    }
    if allow:
        return entry, None
    return entry, (
        f"source {label!r} of the savepoint ({o.describe()}, offset {o.offset}) is not in the "
        f"query; pass -n (--allow-non-restored-state) to drop its position{hint}"
    )


@dataclass
class _Acc:
    """What :func:`plan_positions` builds up, source by source."""

    problems: list[str]
    offsets: dict[str, str | None] = field(default_factory=dict)
    previous: dict[str, str | None] = field(default_factory=dict)
    logs: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    report: list[dict[str, Any]] = field(default_factory=list)
    used: set[str] = field(default_factory=set)
    carried: dict[str, str] = field(default_factory=dict)

    def result(self, previous: dict[str, str | None] | None) -> SourcePositions:
        return SourcePositions(
            self.offsets, previous, self.logs, self.report, self.problems, self.carried
        )

    def keep(self, key: str, o: _Old) -> None:
        """The new source ``key`` continues the savepoint's source ``o``."""
        self.offsets[key], self.previous[key] = o.offset, o.previous
        if o.entries:
            self.logs[key] = o.entries
        self.carried[o.key] = key


def _same_sources(old: list[_Old], renumber: bool) -> list[PlannedSource]:
    """No ``--query``: the savepoint's own sources (less those dropped: the rest numbered
    again in order, as Spark numbers them), positions replaceable by index."""
    return [
        PlannedSource(
            int(o.key) if o.key.isdigit() and not renumber else i,
            o.describe(),
            (o.directory or "?") if o.is_file else None,
        )
        for i, o in enumerate(old)
    ]


def plan_positions(
    m: Any,
    new: list[PlannedSource] | None,
    given: dict[str, str],
    allow_non_restored: bool,
) -> SourcePositions:
    """Match the savepoint's sources (``m``: its metadata) to the query's (``new``: planned,
    None without ``--query``: the same sources as before, less those ``given`` as
    ``drop``) and apply ``given``."""
    old = _old_sources(m)
    given, drops, problems = split_drops(given, [o.key for o in old], new is not None)
    if m.offset_log_version != 1:
        return _named_positions(m, old, new, given, allow_non_restored, drops, problems)
    problems += unnamed_into_named([s.name for s in new or [] if s.name is not None])
    unchanged_query = new is None
    kept = [o for o in old if o.key not in drops]
    if new is None:
        new = _same_sources(kept, renumber=bool(drops))
        at = {s.index: o for s, o in zip(new, kept, strict=True)}
        # without --query, NAME is the savepoint's index, whatever a drop renumbered
        index = {o.key: str(i) for i, o in at.items()}
        given = {index.get(k, k): v for k, v in given.items()}
    else:
        at = {int(o.key): o for o in old if o.key.isdigit()}
    by_index, more = _resolve(given, new)
    acc = _Acc(problems + more)
    match = _matches(new, old, by_index, acc.problems, at if unchanged_query else None)
    acc.used.update(o.key for o in match.values())
    for s in new:
        _place(acc, s, by_index, match, at.get(s.index), unchanged_query)
    _drop_unused(acc, [o for o in old if o.key not in acc.used], allow_non_restored, True)
    return acc.result(acc.previous)


def _matches(
    new: list[PlannedSource],
    old: list[_Old],
    by_index: dict[int, str],
    problems: list[str],
    same: dict[int, _Old] | None,
) -> dict[int, _Old]:
    """New source index -> the savepoint source it continues (given ones excepted).
    ``same``: no ``--query``, the savepoint's own sources by their (new) index."""
    if same is not None:
        return {s.index: same[s.index] for s in new if s.index not in by_index}
    return _match(new, old, by_index, problems)


def _place(
    acc: _Acc,
    s: PlannedSource,
    by_index: dict[int, str],
    match: dict[int, _Old],
    at_index: _Old | None,
    unchanged_query: bool,
) -> None:
    """Where the query's source ``s`` starts: given, kept (``match``) or new."""
    entry: dict[str, Any] = {"index": s.index, "description": s.description}
    if s.index in by_index:
        if not _given(acc, s, by_index[s.index], at_index, unchanged_query, entry):
            return
    elif s.index in match:
        _kept(acc, s, match[s.index], entry)
    else:
        entry.update(position="new", offset=None)
        acc.offsets[str(s.index)] = acc.previous[str(s.index)] = None
    acc.report.append(entry)


def _drop_unused(acc: _Acc, dropped: list[_Old], allow: bool, by_index: bool = False) -> None:
    """Savepoint sources the query does not continue: reported, a problem without ``-n``.
    ``by_index``: offset log v1, whose sources are numbered (and may go to a new source)."""
    hint = ", or --source-offsets to hand it to a new source" if by_index else ""
    for o in dropped:
        label: str | int = int(o.key) if by_index and o.key.isdigit() else o.key
        entry, problem = _dropped(o, label, allow, hint)
        acc.report.append(entry)
        acc.problems += [problem] if problem else []


def _given(
    acc: _Acc,
    s: PlannedSource,
    text: str,
    replaced: _Old | None,
    unchanged_query: bool,
    entry: dict[str, Any],
) -> bool:
    """``--source-offsets`` for the new source ``s``; False when it is refused (no entry)."""
    key = str(s.index)
    swap, _ = split_swap(text)
    if text == START:
        entry.update(position="new", offset=None)
        acc.offsets[key] = acc.previous[key] = None
    elif s.is_file and (swap is None or not unchanged_query):
        if replaced is not None:
            acc.used.add(replaced.key)  # refused here; not "dropped" as well
        acc.problems.append(
            _file_offset_refused(
                key,
                s.description,
                "it keeps the log of the savepoint's source of the same directory",
            )
        )
        return False
    else:
        text = _checked(acc, key, text, s, replaced, unchanged_query, entry)
        acc.offsets[key] = acc.previous[key] = text
        _carry_if_same_kind(acc, key, replaced, entry)
    if replaced is not None:
        _replaced(acc, replaced, unchanged_query, entry)
    return True


def _carry_if_same_kind(acc: _Acc, key: str, old: _Old | None, entry: dict[str, Any]) -> None:
    """A new position for the same source keeps its ``sources/`` files (a rate source's
    creation time, Kafka's initial offsets): only its offset changed. A swap or a start
    from the configured start does not (Kafka would read its initial offsets again)."""
    if old is not None and old.kind is not None and entry.get("kind") == old.kind.name:
        acc.carried[old.key] = key


def _checked(
    acc: _Acc,
    where: str,
    text: str,
    s: PlannedSource | None,
    old: _Old | None,
    unchanged_query: bool,
    entry: dict[str, Any],
) -> str:
    """A given offset (``JSON`` or ``KIND:JSON``, a swap) checked against the kind it is
    for; its entry (old and new position) filled; the text to write returned."""
    swap, text = split_swap(text)
    kind = _kind_of(s, old, unchanged_query)
    planned = planned_kind(s.description) if s is not None and not unchanged_query else None
    problem = (
        (swap_problem(where, swap, planned) if swap is not None else None)
        or _unparsable(where, text, s)
        or kind_problem(where, text, swap or kind)
    )
    if problem is not None:
        acc.problems.append(problem)
    chosen = swap or kind
    text = as_written(text, chosen, problem)
    entry.update(position="given", offset=text)
    if chosen is not None:
        entry["kind"] = chosen.name
    _old_position(entry, old, kind, swap)
    return text


def _replaced(acc: _Acc, replaced: _Old, unchanged_query: bool, entry: dict[str, Any]) -> None:
    """The savepoint's source at a given source's index: replaced by it (a changed query
    says so), never also reported as dropped."""
    if not unchanged_query and replaced.key not in acc.used:
        entry.setdefault("replaces", replaced.describe())
    acc.used.add(replaced.key)


def _kept(acc: _Acc, s: PlannedSource, o: _Old, entry: dict[str, Any]) -> None:
    """The new source ``s`` continues the savepoint's source ``o``."""
    key = str(s.index)
    # a source the savepoint has no offset for yet starts from its configured start
    entry.update(position="kept" if o.offset is not None else "new", offset=o.offset)
    if o.key != key:
        entry["from"] = int(o.key) if o.key.isdigit() else o.key
    if s.is_file and o.directory and o.directory != _local_dir(s.file_path or ""):
        entry["note"] = (
            f"matched by index: the savepoint's files were under {o.directory}; pass "
            f"--source-offsets {s.index}=- to read the new directory from its start"
        )
    acc.keep(key, o)


def _match(
    new: list[PlannedSource], old: list[_Old], by_index: dict[int, str], problems: list[str]
) -> dict[int, _Old]:
    """New source index -> the old source it continues: a file source the old source of its
    directory, else (any source) the old source at its index, if of the same kind and (where
    the new source can check it) its offset is one the new source can read."""
    match = _match_by_directory(new, old, by_index)
    used = {o.key for o in match.values()}
    olds = {o.key: o for o in old}
    for s in new:
        if s.index in match or s.index in by_index:
            continue
        o = olds.get(str(s.index))
        if o is None or o.key in used or not _continues(s, o, problems):
            continue
        match[s.index] = o
        used.add(o.key)
    return match


def _match_by_directory(
    new: list[PlannedSource], old: list[_Old], by_index: dict[int, str]
) -> dict[int, _Old]:
    """File sources: the savepoint's file source that read the same directory."""
    used: set[str] = set()
    match: dict[int, _Old] = {}
    for s in new:
        if s.is_file and s.index not in by_index:
            want = _local_dir(s.file_path or "")
            hit = next((o for o in old if o.directory == want and o.key not in used), None)
            if hit is not None:
                match[s.index] = hit
                used.add(hit.key)
    return match


def _continues(s: PlannedSource, o: _Old, problems: list[str]) -> bool:
    """The new source at the old source's index continues it: the same kind, and (where the
    new source can check it) an offset it can read."""
    if s.is_file != o.is_file:
        return False
    if s.is_file:
        # Same place, same kind, another (or no known) directory: Spark continues it with
        # its seen-files log (a moved directory, another URI spelling); the plan says so.
        return True
    if s.parse_offset is not None and o.offset is not None:
        err = s.parse_offset(o.offset)
        if err:
            problems.append(
                f"source {s.index} ({s.description}) is not the savepoint's source "
                f"{o.key}: it cannot read its offset {o.offset} ({err}); pass "
                f"--source-offsets {s.index}=JSON, or {s.index}=- to start it from its "
                "configured start"
            )
            return False
    return True


def _planned_names(new: list[PlannedSource], problems: list[str]) -> dict[str, PlannedSource]:
    """The query's sources by name; an unnamed or twice-named source is a problem."""
    planned: dict[str, PlannedSource] = {}
    for s in new:
        if s.name is None:
            problems.append(
                f"source {s.index} ({s.description}) of the query has no name; the "
                "savepoint's sources are named (offset log v2): name every source with "
                "readStream.name(...)"
            )
        elif s.name in planned:
            problems.append(f"the query names two sources {s.name!r}")
        else:
            planned[s.name] = s
    return planned


def _named_positions(
    m: Any,
    old: list[_Old],
    new: list[PlannedSource] | None,
    given: dict[str, str],
    allow_non_restored: bool,
    drops: set[str],
    problems: list[str],
) -> SourcePositions:
    """Offset log v2: sources keyed by the names the query gives them (``readStream.name``).

    Spark 4.3 itself lets a named source come and go between runs (a new name starts from
    its configured start, a missing one is forgotten), so a restore matches by name: a kept
    name keeps its offset and seen-files log, a new one starts (or takes ``--source-offsets
    NAME=JSON``), a dropped one needs ``-n``."""
    acc = _Acc(problems)
    olds = {o.key: o for o in old}
    planned = _planned_names(new, acc.problems) if new is not None else {}
    names = [k for k in m.offsets if k not in drops] if new is None else list(planned)
    acc.problems += [
        f"--source-offsets {name}: the query has no source of that name (it has "
        f"{', '.join(names) or 'none'})"
        for name in given
        if name not in names
    ]
    for name in names:
        _named_entry(acc, name, olds.get(name), planned.get(name), given)
    _drop_unused(acc, [o for o in old if o.key not in names], allow_non_restored)
    return acc.result(_named_previous(m.previous_offsets, acc.offsets, given))


def _named_previous(
    before: dict[str, str | None] | None, offsets: dict[str, str | None], given: dict[str, str]
) -> dict[str, str | None] | None:
    """The previous batch's offsets to write: the savepoint's, a given one where given."""
    if before is None:
        return None
    return {k: (offsets[k] if k in given else before.get(k, offsets[k])) for k in offsets}


def _named_entry(
    acc: _Acc, name: str, o: _Old | None, s: PlannedSource | None, given: dict[str, str]
) -> None:
    """Where the named source ``name`` starts (``o``: the savepoint's, ``s``: the query's)."""
    description = s.description if s is not None else o.describe() if o else name
    entry: dict[str, Any] = {"index": name, "description": description}
    if name in given:
        if not _named_given(acc, name, given[name], o, s, entry):
            return
    elif o is not None:
        if s is not None and _other_kind(s, o):
            acc.problems.append(
                f"source {name!r} of the query ({description}) is not the savepoint's "
                f"source of that name ({o.describe()}, offset {o.offset}); pass "
                f"--source-offsets {name}=JSON, or {name}=- to start it from its "
                "configured start"
            )
            return
        entry.update(position="kept" if o.offset is not None else "new", offset=o.offset)
        acc.offsets[name] = o.offset
        if o.entries:
            acc.logs[name] = o.entries
        acc.carried[o.key] = name
    else:
        # Spark's own way for a name it has not seen: no line, the source starts from its
        # configured start at the next batch.
        entry.update(position="new", offset=None)
    acc.report.append(entry)


def _named_given(
    acc: _Acc,
    name: str,
    text: str,
    o: _Old | None,
    s: PlannedSource | None,
    entry: dict[str, Any],
) -> bool:
    """``--source-offsets NAME=...`` for a named source; False when it is refused."""
    if s is not None and s.is_file and text != START:
        acc.problems.append(
            _file_offset_refused(
                name, entry["description"], "it keeps the savepoint's log of that name"
            )
        )
        return False
    if text == START:
        entry.update(position="given", offset=None)
    else:
        _checked(acc, name, text, s, o, s is None, entry)
        _carry_if_same_kind(acc, name, o, entry)
    if o is not None:
        entry.setdefault("replaces", o.describe())
    acc.offsets[name] = entry["offset"]
    return True


def _other_kind(s: PlannedSource, o: _Old) -> bool:
    """The query's source cannot continue from the savepoint's: a file source for another
    kind (or the reverse), or an offset the new source's own parser rejects."""
    if s.is_file != o.is_file:
        return True
    if not s.is_file and s.parse_offset is not None and o.offset is not None:
        return s.parse_offset(o.offset) is not None
    return False

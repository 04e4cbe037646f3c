"""Typed results of the Python API, each exactly what the CLI prints with ``--json``.

A result keeps the JSON document the use case produced and exposes its main facts as typed,
read-only attributes. ``to_dict()`` returns (a copy of) that document, and the CLI prints
``to_dict()`` of the same result, so the API and ``--json`` cannot disagree: there is one
source of truth, the document. No heavy imports here: ``import statectl`` stays fast.
"""

from __future__ import annotations

import copy
import dataclasses
from dataclasses import dataclass, field
from typing import Any

from statectl.errors import StatectlError

# Version of the JSON documents of inspect, savepoint, restore and migrate (``schema_version``).
# It increases when a key is removed or changes meaning; new keys do not change it.
SCHEMA_VERSION = 1


@dataclass(frozen=True)
class _Result:
    document: dict[str, Any] = field(repr=False)

    def to_dict(self) -> dict[str, Any]:
        """The JSON document the CLI prints with ``--json`` (a copy: mutate it freely)."""
        return copy.deepcopy(self.document)


def _with_version(doc: dict[str, Any]) -> dict[str, Any]:
    return {"schema_version": SCHEMA_VERSION, **doc}


@dataclass(frozen=True)
class StoreInfo:
    """One store of an operator (or a transformWithState variable / column family)."""

    name: str
    key_schema: str
    value_schema: str
    rows: int | None
    kind: str | None = None


@dataclass(frozen=True)
class OperatorInfo:
    id: int
    name: str
    partitions: int | None
    stores: tuple[StoreInfo, ...]
    uid: str | None = None  # savepoints only
    bytes: int | None = None
    kind: str | None = None  # the operator kind statectl's registry gives it
    state_format: int | None = None  # its pinned state format version, where the kind has one


@dataclass(frozen=True)
class InspectResult(_Result):
    """``statectl inspect``: a checkpoint (``kind == "checkpoint"``) or a savepoint."""

    kind: str = ""
    path: str = ""
    query_id: str | None = None
    batch: int = -1
    backend: str | None = None
    partitions: int | None = None
    operators: tuple[OperatorInfo, ...] = ()

    @classmethod
    def from_document(cls, doc: dict[str, Any]) -> InspectResult:
        doc = _with_version(doc)
        ops = tuple(
            OperatorInfo(
                id=op["id"],
                name=op["name"],
                partitions=op.get("partitions"),
                stores=tuple(
                    StoreInfo(
                        s["name"], s["key_schema"], s["value_schema"], s.get("rows"), s.get("kind")
                    )
                    for s in op.get("stores", [])
                ),
                uid=op.get("uid"),
                bytes=op.get("bytes"),
                kind=op.get("kind"),
                state_format=op.get("state_format"),
            )
            for op in doc.get("operators", [])
        )
        return cls(
            document=doc,
            kind=doc["kind"],
            path=doc["path"],
            query_id=doc.get("query_id"),
            batch=doc["batch"],
            backend=doc.get("backend"),
            partitions=doc.get("partitions"),
            operators=ops,
        )


@dataclass(frozen=True)
class SavepointResult(_Result):
    """``statectl savepoint``. ``str(result)`` and ``os.fspath(result)`` are its URL, so code
    that passed the ``str`` earlier versions returned on to statectl or fsspec keeps working."""

    path: str = ""
    batch: int = -1
    query_id: str | None = None
    type: str = "canonical"
    operators: dict[str, int] = field(default_factory=dict)  # uid -> rows

    @classmethod
    def from_document(cls, doc: dict[str, Any]) -> SavepointResult:
        doc = _with_version(doc)
        return cls(
            document=doc,
            path=doc["path"],
            batch=doc["batch"],
            query_id=doc.get("query_id"),
            type=doc.get("type", "canonical"),
            operators=dict(doc.get("operators", {})),
        )

    def __str__(self) -> str:
        return self.path

    def __fspath__(self) -> str:
        return self.path


@dataclass(frozen=True)
class RestoreResult(_Result):
    """``statectl restore``: the plan, and whether it was written (``ok and not dry_run``)."""

    savepoint: str | None = ""  # migrate: None unless the savepoint was kept
    target: str = ""
    backend: str = ""
    partitions: int = 0
    resumes_at_batch: int = 0
    restored: dict[str, int] = field(default_factory=dict)  # uid -> operator id
    dropped: tuple[str, ...] = ()
    started_empty: dict[int, str] = field(default_factory=dict)  # operator id -> name
    problems: tuple[str, ...] = ()
    ok: bool = True
    dry_run: bool = False
    join_state_format: int | None = None  # stream-stream joins: the format written
    # streaming aggregations: the format written when --aggregation-state-format asked
    aggregation_state_format: int | None = None
    group_state_format: int | None = None  # flatMapGroupsWithState, likewise
    conversions: tuple[str, ...] = ()  # what the restore converts (state formats)
    # every source's position: index, description, position (kept/new/given/dropped), offset
    sources: tuple[dict[str, Any], ...] = ()
    evolved: tuple[str, ...] = ()  # schema evolution: one line per evolved field

    @classmethod
    def from_document(cls, doc: dict[str, Any]) -> RestoreResult:
        doc = _with_version(doc)
        return cls(
            document=doc,
            savepoint=doc["savepoint"],
            target=doc["target"],
            backend=doc["backend"],
            partitions=doc["partitions"],
            resumes_at_batch=doc["resumes_at_batch"],
            restored=dict(doc.get("restored", {})),
            dropped=tuple(doc.get("dropped", ())),
            started_empty={int(k): v for k, v in doc.get("started_empty", {}).items()},
            problems=tuple(doc.get("problems", ())),
            ok=doc.get("ok", not doc.get("problems")),
            dry_run=doc.get("dry_run", False),
            join_state_format=doc.get("join_state_format"),
            aggregation_state_format=doc.get("aggregation_state_format"),
            group_state_format=doc.get("group_state_format"),
            conversions=tuple(doc.get("conversions", ())),
            sources=tuple(doc.get("sources", ())),
            evolved=tuple(doc.get("evolved", ())),
        )


@dataclass(frozen=True)
class MigrateResult(RestoreResult):
    """``statectl migrate``: the restore plan and the source; ``savepoint`` is the kept
    intermediate savepoint (``keep_savepoint=``), else None."""

    source: str = ""

    @classmethod
    def from_document(cls, doc: dict[str, Any]) -> MigrateResult:
        base = RestoreResult.from_document(doc)
        fields = {f.name: getattr(base, f.name) for f in dataclasses.fields(RestoreResult)}
        return cls(**fields, source=base.document.get("source", ""))


class RestoreError(StatectlError):
    """A restore (or migrate) that would fail; nothing was written. ``.result`` is the plan."""

    def __init__(self, result: RestoreResult) -> None:
        self.result = result
        super().__init__("; ".join(result.problems) or "restore failed", result.target)


@dataclass(frozen=True)
class EditResult(_Result):
    """``statectl edit``: rows per table of the edited operator before and after; ``target``
    is the new savepoint (None with ``dry_run``)."""

    source: str = ""
    target: str | None = None
    operator: str = ""
    dropped: bool = False
    tables: dict[str, dict[str, int]] = field(default_factory=dict)  # name -> before/after/removed
    dry_run: bool = False

    @classmethod
    def from_document(cls, doc: dict[str, Any]) -> EditResult:
        doc = _with_version(doc)
        return cls(
            document=doc,
            source=doc["source"],
            target=doc.get("target"),
            operator=doc["operator"],
            dropped=doc.get("dropped", False),
            tables={k: dict(v) for k, v in doc.get("tables", {}).items()},
            dry_run=doc.get("dry_run", False),
        )

    def __str__(self) -> str:
        return self.target or ""


@dataclass(frozen=True)
class DiffResult(_Result):
    """``statectl diff``: per operator and table, keys added, removed, changed and unchanged
    (``to_dict()["operators"]`` has the samples)."""

    a: str = ""
    b: str = ""
    differs: bool = False
    # uid -> table -> {"added": n, "removed": n, "changed": n, "unchanged": n}
    counts: dict[str, dict[str, dict[str, int]]] = field(default_factory=dict)

    @classmethod
    def from_document(cls, doc: dict[str, Any]) -> DiffResult:
        doc = _with_version(doc)
        counts = {
            uid: {
                name: {k: t[k] for k in ("added", "removed", "changed", "unchanged") if k in t}
                for name, t in op.get("tables", {}).items()
            }
            for uid, op in doc.get("operators", {}).items()
        }
        return cls(document=doc, a=doc["a"], b=doc["b"], differs=doc["differs"], counts=counts)

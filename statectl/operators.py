"""One spec per stateful operator kind: what its state is, and which key columns place a key.

Spark names an operator in its metadata (``stateStoreSave``, ``symmetricHashJoin`` …) but the
same name can hide layouts that must be restored differently (a join at state format 2 keeps
four stores, at format 3 or 4 one store with column families). :func:`classify` turns what a
checkpoint or savepoint records — name, physical stores, column families, prefix key columns,
key schemas — into an :class:`OperatorKind`. Restore asks the kind how to place keys and refuses,
at plan time, every kind (or state format) that has no spec here: a guessed layout would put
keys where Spark will not look, and the query would silently lose state.

Adding an operator kind is adding one spec here (and its fixtures).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa

from statectl.checkpoint.logs import PINNED_CONF_LEGACY_DEFAULTS
from statectl.codecs.murmur3 import pmod, spark_hash
from statectl.errors import UnsupportedError

UNKNOWN = "unknown"  # Spark < 4 writes no operator metadata
TWS_NAMES = (
    "transformWithStateExec",
    "transformWithStateInPandasExec",
    "transformWithStateInPySparkExec",
)
JOIN_STORES = tuple(
    f"{side}-{kind}"
    for side in ("left", "right")
    for kind in ("keyToNumValues", "keyWithIndexToValue")
)
# Join state formats 3 and 4: one RocksDB store, these column families (statectl/join_state.py).
JOIN_V3_FAMILIES = JOIN_STORES
JOIN_V4_FAMILIES = tuple(
    f"{side}-{kind}" for side in ("left", "right") for kind in ("keyWithTsToValues", "tsWithKey")
)
# Key suffixes that do not take part in a join key's placement: format 2/3's value index,
# format 4's event time.
_JOIN_KEY_SUFFIXED = ("keyWithIndexToValue", "keyWithTsToValues", "tsWithKey")

PartitionKey = Callable[[str, pa.StructArray], pa.StructArray]
# numColsPrefixKey of a store, from its key schema (Spark JSON).
PrefixColumns = Callable[[str], int]
SESSION_START = "sessionStartTime"


def whole_key(_table: str, key: pa.StructArray) -> pa.StructArray:
    """Spark hash-partitions these operators by every column of the state key."""
    return key


def join_key(table: str, key: pa.StructArray) -> pa.StructArray:
    """A join store is partitioned by the join key: ``keyWithIndexToValue`` keys end with the
    value's ``index`` within that key, format 4's ``keyWithTsToValues`` and ``tsWithKey`` keys
    with ``__event_time``; neither takes part in placement."""
    if not table.endswith(_JOIN_KEY_SUFFIXED):
        return key
    n = key.type.num_fields - 1
    return pa.StructArray.from_arrays(
        [key.field(i) for i in range(n)], fields=[key.type.field(i) for i in range(n)]
    )


def no_prefix(_key_schema: str) -> int:
    return 0


def _key_fields(key_schema: str) -> list:
    try:
        fields = json.loads(key_schema or "{}").get("fields")
    except (ValueError, AttributeError):
        return []
    return fields if isinstance(fields, list) else []


def session_prefix(key_schema: str) -> int:
    """A session window's key is (grouping columns..., sessionStartTime): every column but the
    last is the prefix (``StreamingSessionWindowStateManagerImplV1``)."""
    return max(len(_key_fields(key_schema)) - 1, 0)


def session_grouping_key(_table: str, key: pa.StructArray) -> pa.StructArray:
    """Spark places a session by its grouping columns (the key without ``sessionStartTime``),
    so all sessions of a key share a partition and merge there."""
    n = key.type.num_fields - 1
    return pa.StructArray.from_arrays(
        [key.field(i) for i in range(n)], fields=[key.type.field(i) for i in range(n)]
    )


def is_session_key(key_schema: str) -> bool:
    """A key that ends with the session start (``sessionStartTime: timestamp``)."""
    fields = _key_fields(key_schema)
    return (
        len(fields) >= 2
        and isinstance(fields[-1], dict)
        and fields[-1].get("name") == SESSION_START
        and fields[-1].get("type") == "timestamp"
    )


@dataclass(frozen=True)
class OperatorKind:
    """What statectl knows of one kind of stateful operator at one state layout."""

    kind: str  # shown by inspect and in restore plans
    layout: str  # "stores" (one physical store per name) or "column-families"
    stores: tuple[str, ...] = ()  # the physical stores, for layout "stores"
    restorable: bool = True
    reason: str = ""  # why restore refuses it (when not restorable)
    partition_key: PartitionKey = field(default=whole_key, compare=False)
    prefix_columns: PrefixColumns = field(default=no_prefix, compare=False)
    # The operator runs in one task (StreamingGlobalLimitExec): its state is in partition 0
    # only, whatever the partition count, and Spark never creates the other partitions.
    single_partition: bool = False
    # The SQL conf that pins this kind's state format in the offset log.
    format_conf: str = ""
    fixed_format: int | None = None  # the format this spec is (join formats 3 and 4)

    def state_format(self, confs: dict[str, str]) -> int | None:
        """The state format version this operator's state is in (None: the kind has one).
        An old checkpoint that does not pin it has Spark's legacy default."""
        if self.fixed_format is not None:
            return self.fixed_format
        if not self.format_conf:
            return None
        raw = str(confs.get(self.format_conf, PINNED_CONF_LEGACY_DEFAULTS[self.format_conf]))
        return int(raw) if raw.isdigit() else None

    def partitions_of(self, table: str, key: pa.StructArray, partitions: int) -> np.ndarray:
        """The partition Spark keeps each key of ``table`` in, at ``partitions`` partitions."""
        return self.placements(table, key, (partitions,))[0]

    def placements(
        self, table: str, key: pa.StructArray, counts: tuple[int, ...]
    ) -> list[np.ndarray]:
        """:meth:`partitions_of` at each of ``counts`` partitions, the keys hashed once."""
        if self.single_partition:
            return [np.zeros(len(key), dtype=np.int32) for _ in counts]
        hashes = spark_hash(self.partition_key(table, key))
        return [pmod(hashes, n) for n in counts]

    def partition_may_be_absent(self, partition: int) -> bool:
        """A missing partition directory is empty state for this kind (and only this kind)."""
        return self.single_partition and partition > 0

    def refusal(self, what: str) -> str | None:
        """The plan-time reason restore refuses ``what`` (None for a kind with a spec)."""
        if self.restorable:
            return None
        return (
            f"{what} is {'an' if self.kind[:1] in 'aeiou' else 'a'} {self.kind} operator, "
            "which statectl cannot restore yet: "
            f"{self.reason}; keep the original checkpoint, or leave this state behind with "
            "--drop UID / -n if the new query no longer has the operator"
        )

    def require_restorable(self, what: str) -> None:
        message = self.refusal(what)
        if message:
            raise UnsupportedError(message)


AGG_FORMAT_CONF = "spark.sql.streaming.aggregation.stateFormatVersion"
AGGREGATION = OperatorKind("aggregation", "stores", ("default",), format_conf=AGG_FORMAT_CONF)
DEDUPLICATE = OperatorKind("deduplicate", "stores", ("default",))
DEDUPLICATE_WITHIN_WATERMARK = OperatorKind("deduplicate within watermark", "stores", ("default",))
GROUP_STATE_FORMAT_CONF = "spark.sql.streaming.flatMapGroupsWithState.stateFormatVersion"
GROUP_STATE = OperatorKind(
    "flatMapGroupsWithState", "stores", ("default",), format_conf=GROUP_STATE_FORMAT_CONF
)
JOIN_V2 = OperatorKind(
    "stream-stream join",
    "stores",
    JOIN_STORES,
    partition_key=join_key,
    format_conf="spark.sql.streaming.join.stateFormatVersion",
)
# Formats 3 and 4 (RocksDB only): savepoints hold them as format 2's four tables, restore writes
# any of 2, 3, 4 (statectl/join_state.py owns the layouts and the conversions).
JOIN_V3 = OperatorKind(
    "stream-stream join (state format 3)",
    "column-families",
    JOIN_V3_FAMILIES,
    partition_key=join_key,
    fixed_format=3,
)
JOIN_V4 = OperatorKind(
    "stream-stream join (state format 4)",
    "column-families",
    JOIN_V4_FAMILIES,
    partition_key=join_key,
    fixed_format=4,
)
# A stream-stream join at any state format statectl models: savepoints hold each as format 2's
# four stores, which restore writes at any of 2, 3, 4. Spark 3.5's joins (no operator name)
# are known by those stores, so a join is a kind, never a name check.
JOIN_KINDS = (JOIN_V2, JOIN_V3, JOIN_V4)
TRANSFORM_WITH_STATE = OperatorKind("transformWithState", "column-families")

SESSION_WINDOW = OperatorKind(
    "session window aggregation",
    "stores",
    ("default",),
    partition_key=session_grouping_key,
    prefix_columns=session_prefix,
)
GLOBAL_LIMIT = OperatorKind("streaming limit", "stores", ("default",), single_partition=True)
# Real-time mode's aggregation (StatefulStreamlineAggregateExec, Spark 4.1+) keeps its state
# through the same StreamingAggregationStateManager as stateStoreSave: key = grouping columns,
# value = aggregation buffers, placed by the whole key. Spark runs it on RocksDB only.
STREAMLINE_AGGREGATE = OperatorKind(
    "real-time mode aggregation", "stores", ("default",), format_conf=AGG_FORMAT_CONF
)

# Kinds Spark writes that have no spec yet: inspect and export read them generically, restore
# refuses them with these reasons.
JOIN_VCF = OperatorKind(
    "stream-stream join (column families)",
    "column-families",
    restorable=False,
    reason="its column families are neither join state format 3's nor format 4's",
)

_BY_NAME: dict[str, OperatorKind] = {
    "stateStoreSave": AGGREGATION,
    "dedupe": DEDUPLICATE,
    "dedupeWithinWatermark": DEDUPLICATE_WITHIN_WATERMARK,
    "flatMapGroupsWithState": GROUP_STATE,
    "applyInPandasWithState": GROUP_STATE,
    "sessionWindowStateStoreSaveExec": SESSION_WINDOW,
    "globalLimit": GLOBAL_LIMIT,
    "StatefulStreamlineAggregate": STREAMLINE_AGGREGATE,
    **{name: TRANSFORM_WITH_STATE for name in TWS_NAMES},
}


def _unmodelled(name: str, why: str) -> OperatorKind:
    return OperatorKind(name or UNKNOWN, "stores", restorable=False, reason=why)


def is_global_limit_key(key_schema: str | None) -> bool:
    """StreamingGlobalLimitExec's key, ``struct<key: void>`` (always null), which no other
    operator writes: how a Spark < 4 limit, which records no operator name, is recognised."""
    fields = _key_fields(key_schema or "")
    return (
        len(fields) == 1
        and isinstance(fields[0], dict)
        and fields[0].get("name") == "key"
        and fields[0].get("type") in ("void", "null")
    )


def _has_session_window(key_schema: str | None) -> bool:
    fields = _key_fields(key_schema or "")
    return any(isinstance(f, dict) and f.get("name") == "session_window" for f in fields) or (
        is_session_key(key_schema or "")
    )


def single_partition(name: str) -> bool:
    """Whether Spark operator ``name`` keeps its state in partition 0 only."""
    kind = _BY_NAME.get(name)
    return kind is not None and kind.single_partition


def classify(
    name: str,
    store_names: Sequence[str],
    *,
    column_families: bool,
    prefix_columns: Sequence[int] = (),
    key_schemas: Sequence[str] = (),
    families: Sequence[str] = (),
) -> OperatorKind:
    """The kind of an operator from what its metadata records (never a guess that restores).

    ``prefix_columns`` are the stores' ``numColsPrefixKey`` where known. Spark < 4 records no
    operator name ("unknown"): such state is recognised by its stores, and a key schema with a
    ``session_window`` column is refused rather than restored as a plain aggregation.
    ``families`` are the column families of a column-family operator (a join's tell its format).
    """
    stores = tuple(store_names)
    if name == "symmetricHashJoin":
        return _join_kind(stores, column_families, families)
    if name == UNKNOWN:
        return _unknown_kind(name, stores, column_families, key_schemas)
    kind = _BY_NAME.get(name)
    if kind is None:
        return _unmodelled(name, f"no spec for Spark operator {name!r}")
    return _checked_kind(kind, name, stores, column_families, prefix_columns, key_schemas)


def _checked_kind(
    kind: OperatorKind,
    name: str,
    stores: tuple[str, ...],
    column_families: bool,
    prefix_columns: Sequence[int],
    key_schemas: Sequence[str],
) -> OperatorKind:
    """The spec of a named operator, if its recorded stores and keys are the spec's."""
    if kind.layout == "column-families":
        if not column_families:
            return _unmodelled(name, "expected column families, found plain stores")
        return kind
    if column_families or stores != kind.stores:
        return _unmodelled(
            name, f"unexpected stores {list(stores)} (the spec has {list(kind.stores)})"
        )
    if kind is SESSION_WINDOW:
        return _session_kind(name, prefix_columns, key_schemas)
    if kind.restorable and any(int(n or 0) for n in prefix_columns):
        return _unmodelled(name, "its stores use a prefix key (numColsPrefixKey > 0)")
    return kind


def _join_kind(
    stores: tuple[str, ...], column_families: bool, families: Sequence[str]
) -> OperatorKind:
    """A stream-stream join's state format, from its stores or column families."""
    if stores == JOIN_STORES and not column_families:
        return JOIN_V2
    if column_families and sorted(families) == sorted(JOIN_V3_FAMILIES):
        return JOIN_V3
    if column_families and sorted(families) == sorted(JOIN_V4_FAMILIES):
        return JOIN_V4
    return JOIN_VCF


def _unknown_kind(
    name: str, stores: tuple[str, ...], column_families: bool, key_schemas: Sequence[str]
) -> OperatorKind:
    """Spark < 4's operators, which record no name: known by their stores and key schemas."""
    if stores == JOIN_STORES:
        return JOIN_V2
    if any(_has_session_window(k) for k in key_schemas):
        return _unmodelled(
            name,
            "a session window (its key ends with the session start and Spark places it by "
            "the grouping keys), but Spark < 4 recorded no operator metadata to confirm it: "
            "restore with --query, whose plan confirms it",
        )
    if not column_families and key_schemas and all(map(is_global_limit_key, key_schemas)):
        if stores == ("default",):
            return GLOBAL_LIMIT
        return _unmodelled(name, f"a streaming limit's key in stores {list(stores)}")
    if stores == ("default",) and not column_families:
        return OperatorKind("unknown (Spark < 4, no operator metadata)", "stores", ("default",))
    return _unmodelled(name, "Spark < 4 wrote no operator metadata for this store layout")


def _session_kind(
    name: str, prefix_columns: Sequence[int], key_schemas: Sequence[str]
) -> OperatorKind:
    """A session window, when its keys end with the session start and the recorded prefix
    columns are its grouping keys."""
    if not key_schemas or not all(is_session_key(k) for k in key_schemas):
        return _unmodelled(name, f"a session window key must end with {SESSION_START}: timestamp")
    expected = [session_prefix(k) for k in key_schemas]
    if prefix_columns and [int(n or 0) for n in prefix_columns] != expected:
        return _unmodelled(
            name,
            f"numColsPrefixKey {list(prefix_columns)} is not the number of grouping keys "
            f"{expected}",
        )
    return SESSION_WINDOW

"""The canonical savepoint format, version 1: ``_metadata`` (JSON) plus Parquet data files.

See docs/format.md for the specification. Every path in ``_metadata`` is relative to the
savepoint directory, so a savepoint can be copied anywhere.
"""

from __future__ import annotations

import hashlib
import json
import re
import types
import typing
from dataclasses import asdict, dataclass, field, fields, is_dataclass
from typing import Any

from statectl.errors import CorruptFileError, NotACheckpointError, UnsupportedError
from statectl.io import relative_inside
from statectl.operators import TWS_NAMES, OperatorKind, classify

FORMAT_NAME = "statectl-savepoint"
FORMAT_VERSION = 1
METADATA_FILE = "_metadata"
# Tables of column-family operators (transformWithState): state variables and timers.
CF_TABLE_KINDS = ("ValueState", "ListState", "MapState", "timers")


@dataclass
class DataFile:
    path: str  # relative to the savepoint directory
    rows: int
    bytes: int
    sha256: str


@dataclass
class StateTable:
    """One store or state variable of an operator: its schemas and its data files."""

    name: str  # "default", a join store, a transformWithState variable, or "$timers"
    kind: str  # "store" | "join-store" | "ValueState" | "ListState" | "MapState" | "timers"
    key_schema: str  # Spark JSON schema of the key
    value_schema: str  # Spark JSON schema of the value (or element, or user map value)
    columns: list[str]  # column names of the data files, in order
    rows: int
    files: list[DataFile]
    user_key_schema: str | None = None  # MapState user key
    encoder: dict[str, Any] = field(default_factory=dict)  # key encoder spec, schema ids


@dataclass
class OperatorState:
    uid: str
    operator_id: int
    name: str
    partitions: int
    properties: dict[str, Any]
    store_names: list[str]
    metadata_version: int | None
    tables: list[StateTable]
    # What the operator is (name, stores, key schemas), independent of its uid and position:
    # restore --query matches savepoint state to a changed query's operators by it.
    fingerprint: str | None = None
    # Column-family operators (transformWithState): every family of Spark's schema file,
    # internal ones included (timers, list row counters), so restore can rewrite it verbatim.
    column_families: list[dict[str, Any]] | None = None
    # Stream-stream joins: the state format the source checkpoint kept them in
    # (spark.sql.streaming.join.stateFormatVersion). The tables are format 2's whatever it was.
    state_format: int | None = None

    @property
    def rows(self) -> int:
        return sum(t.rows for t in self.tables)

    @property
    def kind(self) -> OperatorKind:
        """The operator kind spec (statectl/operators.py) this state matches."""
        cf = self.column_families is not None or any(t.kind in CF_TABLE_KINDS for t in self.tables)
        return classify(
            self.name,
            self.store_names,
            column_families=cf,
            key_schemas=[] if cf else [t.key_schema for t in self.tables],
        )


def operator_fingerprint(
    name: str, store_names: list[str], key_schemas: list[tuple[str, str]]
) -> str:
    """``<name>-<8 hex of sha1>``: the default uid of an operator (docs/format.md)."""
    ident = json.dumps([name, sorted(store_names), sorted(key_schemas)], sort_keys=True)
    return f"{name}-{hashlib.sha1(ident.encode()).hexdigest()[:8]}"


def fingerprint_of(op: OperatorState) -> str:
    """The recorded fingerprint; for savepoints older than the field, derived from the tables
    (exact for every operator whose tables are its stores, i.e. all but transformWithState)."""
    if op.fingerprint:
        return op.fingerprint
    return operator_fingerprint(
        op.name, op.store_names, [(t.name, t.key_schema) for t in op.tables]
    )


@dataclass
class SavepointMetadata:
    query_id: str | None
    batch_id: int
    batch_timestamp_ms: int
    batch_watermark_ms: int
    next_batch_watermark_ms: int
    offsets: dict[str, str | None]  # the batch's source offsets, verbatim (Spark's JSON text)
    offset_log_version: int
    offset_metadata_extra: dict[str, Any]
    pinned_confs: dict[str, str]
    source_logs: dict[str, list[dict[str, Any]]]  # source -> entries a restart needs
    source_checkpoint: dict[str, Any]  # backend, partitions, format versions (informational)
    operators: list[OperatorState]
    created_at: str
    statectl_version: str
    spark_version: str | None
    previous_offsets: dict[str, str | None] | None = None  # offsets of batch_id - 1, if any
    native_logs: list[DataFile] | None = None  # native savepoints: the copied log files
    savepoint_type: str = "canonical"
    # Every source: key, name, kind, offset, position and its carried sources/ files (path,
    # bytes, sha256); None in savepoints older than the field (statectl/sources/carry.py).
    sources: list[dict[str, Any]] | None = None
    format: str = FORMAT_NAME
    format_version: int = FORMAT_VERSION

    def operator(self, uid: str) -> OperatorState:
        for op in self.operators:
            if op.uid == uid:
                return op
        raise KeyError(uid)

    def to_json(self) -> str:
        return json.dumps(seal(asdict(self)), indent=1, sort_keys=False) + "\n"


SEAL = "metadata_sha256"


def _digest(obj: dict[str, Any]) -> str:
    body = {k: v for k, v in obj.items() if k != SEAL}
    text = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(text.encode()).hexdigest()


def seal(obj: dict[str, Any]) -> dict[str, Any]:
    """``obj`` with its own checksum: the sha256 of its canonical JSON without the seal.

    It catches what no cross-check can, e.g. a damaged digit in ``batch_id``. A savepoint written
    before the seal existed has none and is read as before; a deliberately edited one must be
    sealed again (``statectl.savepoints.format.seal``)."""
    return {**{k: v for k, v in obj.items() if k != SEAL}, SEAL: _digest(obj)}


def check_seal(obj: dict[str, Any], path: str) -> None:
    recorded = obj.get(SEAL)
    if recorded is not None and recorded != _digest(obj):
        raise CorruptFileError(
            f"does not match its own checksum ({SEAL}); the savepoint metadata was damaged or "
            "edited",
            path,
        )


def _build(cls: type, obj: dict[str, Any]) -> Any:
    if not isinstance(obj, dict):
        raise TypeError(f"a {cls.__name__} entry is {type(obj).__name__}, not an object")
    names = {f.name for f in fields(cls)}
    return cls(**{k: v for k, v in obj.items() if k in names})


def parse_metadata(text: str, path: str) -> SavepointMetadata:
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as e:
        raise CorruptFileError(f"savepoint metadata is not valid JSON ({e.msg})", path) from None
    except RecursionError:
        raise CorruptFileError("savepoint metadata JSON is nested too deeply", path) from None
    _check_header(obj, path)
    check_seal(obj, path)
    check_types(SavepointMetadata, obj, path, "")
    meta = _metadata_of(obj, path)
    validate_metadata(meta, path)
    return meta


def _check_header(obj: Any, path: str) -> None:
    """A statectl savepoint's ``_metadata`` at a format version this statectl reads."""
    if not isinstance(obj, dict) or obj.get("format") != FORMAT_NAME:
        raise NotACheckpointError("not a statectl savepoint metadata file", path)
    version = obj.get("format_version")
    if not isinstance(version, int) or version > FORMAT_VERSION or version < 1:
        raise UnsupportedError(
            f"savepoint format version {version!r} is not supported (this statectl reads up to "
            f"{FORMAT_VERSION})",
            path,
            "upgrade statectl",
        )


def _metadata_of(obj: dict[str, Any], path: str) -> SavepointMetadata:
    """The dataclass tree of a type-checked ``_metadata`` object."""
    try:
        ops = []
        if not isinstance(obj.get("operators"), list):
            raise TypeError("operators is not a list")
        for o in obj["operators"]:
            if not isinstance(o, dict) or not isinstance(o.get("tables"), list):
                raise TypeError("an operators entry is not an object with a tables list")
            tables = [
                _build(StateTable, {**t, "files": [_build(DataFile, f) for f in t["files"]]})
                for t in o["tables"]
            ]
            ops.append(_build(OperatorState, {**o, "tables": tables}))
        logs = obj.get("native_logs")
        if logs is not None:
            logs = [_build(DataFile, f) for f in logs]
        meta: SavepointMetadata = _build(
            SavepointMetadata, {**obj, "operators": ops, "native_logs": logs}
        )
    except (KeyError, TypeError, AttributeError) as e:
        raise CorruptFileError(f"savepoint metadata is incomplete ({e})", path) from None
    return meta


_SHA256 = re.compile(r"^[0-9a-f]{64}$")
# Store names (default, left-keyToNumValues, ...), state variable names and $timers.
_TABLE_NAME = re.compile(r"^[A-Za-z0-9_$][A-Za-z0-9_$.=-]*$")


def _check(ok: bool, what: str, path: str) -> None:
    if not ok:
        raise CorruptFileError(f"savepoint metadata is invalid: {what}", path)


def _is_int(v: object, minimum: int = 0) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= minimum


def _check_file(f: DataFile, path: str, native: bool) -> None:
    _check(isinstance(f.path, str), f"data file path {f.path!r}", path)
    relative_inside(f.path, path)
    _check(_is_int(f.rows, -1 if native else 0), f"rows {f.rows!r} of {f.path}", path)
    _check(_is_int(f.bytes), f"bytes {f.bytes!r} of {f.path}", path)
    _check(isinstance(f.sha256, str) and bool(_SHA256.match(f.sha256)), f"sha256 of {f.path}", path)


def _check_table(
    op: OperatorState, t: StateTable, path: str, native: bool, seen_paths: set[str]
) -> None:
    """One table's name, files (each listed once) and, for a canonical savepoint, one file per
    partition whose rows add up to the table's."""
    _check(
        isinstance(t.name, str) and bool(_TABLE_NAME.match(t.name)) and ".." not in t.name,
        f"table name {t.name!r} (a store or state variable name)",
        path,
    )
    _check(isinstance(t.files, list), f"files of {op.uid}/{t.name}", path)
    for f in t.files:
        _check_file(f, path, native)
        _check(f.path not in seen_paths, f"data file {f.path} listed twice", path)
        seen_paths.add(f.path)
    if native:
        return
    _check(_is_int(t.rows), f"rows {t.rows!r} of {op.uid}/{t.name}", path)
    _check(
        len(t.files) == op.partitions,
        f"{op.uid}/{t.name} lists {len(t.files)} data files for {op.partitions} "
        "partitions (an entry was removed?)",
        path,
    )
    _check(
        sum(f.rows for f in t.files) == t.rows,
        f"{op.uid}/{t.name} has {t.rows} rows but its files add up to "
        f"{sum(f.rows for f in t.files)}",
        path,
    )


def uid_problem(uid: object) -> str | None:
    """Why ``uid`` cannot name an operator (it names its data directory), or None: the rule
    every reader applies, and so relabel before it writes one."""
    if not isinstance(uid, str) or not uid:
        return "a uid is a non-empty name"
    if any(c in uid for c in "/\\\0") or uid in (".", ".."):
        return f"uid {uid!r} is a path, not a name (no '/', '\\', NUL, '.' or '..')"
    return None


def _check_type_contents(meta: SavepointMetadata, path: str) -> None:
    """A native savepoint holds Spark's files under its embedded ``checkpoint/`` and lists its
    logs; a canonical one holds Parquet files and no logs. A ``type`` that contradicts the
    contents is damage, named as such (not as the first path that does not fit)."""
    native = meta.savepoint_type == "native"
    embedded = [
        f.path.startswith("checkpoint/")
        for op in meta.operators
        if isinstance(op.tables, list)
        for t in op.tables
        if isinstance(t.files, list)
        for f in t.files
        if isinstance(f.path, str)
    ]
    if native:
        _check(
            meta.native_logs is not None and all(embedded),
            "type is 'native' but the contents are a canonical savepoint's (data files "
            "outside checkpoint/, or no native_logs)",
            path,
        )
    else:
        _check(
            meta.native_logs is None and not any(embedded),
            f"type is {meta.savepoint_type!r} but the contents are a native savepoint's "
            "(native_logs, or data files under checkpoint/)",
            path,
        )


def _check_sources(meta: SavepointMetadata, path: str) -> None:
    """Every source named in ``source_logs`` and ``sources`` is one of the batch's
    ``offsets`` (a savepoint records the sources of one batch)."""
    keys = set(meta.offsets)
    for what, named in (
        ("source log name", list(meta.source_logs)),
        ("sources entry", [e.get("key") for e in meta.sources or [] if isinstance(e, dict)]),
    ):
        extra = [k for k in named if k not in keys]
        if extra:
            raise CorruptFileError(
                f"savepoint metadata is invalid: {what} {extra[0]!r} names no source of the "
                f"batch's offsets (offsets: {', '.join(sorted(keys)) or 'none'})",
                path,
            )


_STORE_KINDS = ("store", "join-store")
# The data file columns of each table kind (savepoints/tables.py builds their types).
_KIND_COLUMNS = {
    "MapState": ["key", "user_map_key", "user_map_value", "partition_id"],
    "ListState": ["key", "list_element", "partition_id"],
    "timers": ["key", "expiration_timestamp_ms", "partition_id"],
}
_PLAIN_COLUMNS = ["key", "value", "partition_id"]


def _check_table_kinds(op: OperatorState, path: str) -> None:
    """An operator's tables are its stores (``store``; a join's ``join-store``, named as its
    stores) or its state variables and ``$timers`` (column families), never a mix: the kind
    decides how a table's rows are typed, so one that contradicts the rest is damage."""
    kinds = [t.kind for t in op.tables]
    families = op.column_families is not None or any(k in CF_TABLE_KINDS for k in kinds)
    allowed = CF_TABLE_KINDS if families else _STORE_KINDS
    _check(
        len({k for k in kinds if k in _STORE_KINDS}) <= 1,
        f"operator {op.uid} mixes store kinds {sorted(set(kinds))}",
        path,
    )
    _check(
        not kinds or families == (op.name in TWS_NAMES),
        f"operator {op.uid} ({op.name}) has tables of kinds {sorted(set(kinds))}",
        path,
    )
    for t in op.tables:
        where = f"table {op.uid}/{t.name}"
        _check(t.kind in allowed, f"{where} has kind {t.kind!r}, not one of {allowed}", path)
        _check(
            (t.kind == "timers") == (t.name == "$timers"),
            f"{where}: only $timers has kind 'timers'",
            path,
        )
        _check(
            t.kind != "MapState" or bool(t.user_key_schema),
            f"{where} is a MapState without user_key_schema",
            path,
        )
        columns = _KIND_COLUMNS.get(t.kind, _PLAIN_COLUMNS)
        _check(
            list(t.columns) == columns,
            f"{where} lists columns {t.columns}, its kind {t.kind!r} has {columns}",
            path,
        )
        _check(
            families or t.name in op.store_names,
            f"{where} is not one of the operator's stores {op.store_names}",
            path,
        )
        _check(
            t.kind != "join-store" or op.name == "symmetricHashJoin",
            f"{where} is a join store of a {op.name!r} operator",
            path,
        )


def validate_metadata(meta: SavepointMetadata, path: str) -> None:
    """Types and cross-checked counts of a parsed ``_metadata``: nothing in it is trusted.

    Every data file path stays inside the savepoint; the canonical writer puts one file per
    partition in every table, and a table's rows are the sum of its files' rows, so a dropped
    ``files`` entry is detected instead of silently losing rows.
    """
    native = meta.savepoint_type == "native"
    _check(meta.savepoint_type in ("canonical", "native"), f"type {meta.savepoint_type!r}", path)
    _check(_is_int(meta.batch_id), f"batch_id {meta.batch_id!r}", path)
    _check(isinstance(meta.operators, list), "operators is not a list", path)
    _check(isinstance(meta.offsets, dict), "offsets is not an object", path)
    _check(isinstance(meta.pinned_confs, dict), "pinned_confs is not an object", path)
    _check(isinstance(meta.source_logs, dict), "source_logs is not an object", path)
    _check(isinstance(meta.source_checkpoint, dict), "source_checkpoint is not an object", path)
    seen_uids: set[str] = set()
    seen_paths: set[str] = set()
    _check_type_contents(meta, path)
    _check_sources(meta, path)
    for op in meta.operators:
        _check(uid_problem(op.uid) is None, f"uid {op.uid!r} (a name, not a path)", path)
        _check(op.uid not in seen_uids, f"uid {op.uid!r} appears twice", path)
        seen_uids.add(op.uid)
        _check(
            _is_int(op.operator_id) and op.operator_id < 2**31,  # Spark's operator ids are ints
            f"operator_id {op.operator_id!r} of {op.uid}",
            path,
        )
        _check(_is_int(op.partitions, 1), f"partitions {op.partitions!r} of {op.uid}", path)
        _check(isinstance(op.tables, list), f"tables of {op.uid}", path)
        for t in op.tables:
            _check_table(op, t, path, native, seen_paths)
        if not native:
            _check_table_kinds(op, path)
    for f in meta.native_logs or []:
        _check_file(f, path, True)


# Ids: a negative value is damage, not a savepoint.
_NON_NEGATIVE = {"batch_id", "operator_id", "offset_log_version"}  # rows: -1 = unknown (native)


def check_types(cls: Any, obj: Any, path: str, where: str) -> None:
    """Every present field of ``obj`` has the type its dataclass declares (recursively), so a
    damaged ``_metadata`` is one CorruptFileError naming the field, not a TypeError later."""
    if not isinstance(obj, dict):
        raise CorruptFileError(f"savepoint metadata {where or 'root'} is not a JSON object", path)
    hints = typing.get_type_hints(cls)
    for f in fields(cls):
        if f.name in obj:
            _check_value(hints[f.name], obj[f.name], path, f"{where}{f.name}")


def _check_value(t: Any, v: Any, path: str, where: str) -> None:
    if t is Any:
        return
    origin, args = typing.get_origin(t), typing.get_args(t)
    if origin in (typing.Union, types.UnionType):
        _check_union(args, v, path, where)
    elif is_dataclass(t):
        check_types(t, v, path, f"{where}.")
    elif origin in (list, dict):
        _check_container(origin, args, v, path, where)
    else:
        _check_scalar(t, v, path, where)


def _wrong_type(where: str, path: str) -> CorruptFileError:
    return CorruptFileError(f"savepoint metadata field {where!r} has a wrong type", path)


def _check_union(args: tuple[Any, ...], v: Any, path: str, where: str) -> None:
    """``v`` has one of the types ``args``."""
    for a in args:
        try:
            _check_value(a, v, path, where)
            return
        except CorruptFileError:
            continue
    raise _wrong_type(where, path)


def _check_container(origin: Any, args: tuple[Any, ...], v: Any, path: str, where: str) -> None:
    """A list of ``args[0]``, or a dict of ``args[1]`` values."""
    if not isinstance(v, origin):
        raise _wrong_type(where, path)
    if origin is list:
        for i, item in enumerate(v):
            _check_value(args[0], item, path, f"{where}[{i}]")
    else:
        for k, item in v.items():
            _check_value(args[1], item, path, f"{where}.{k}")


def _check_int(v: Any, path: str, where: str) -> None:
    if isinstance(v, bool) or not isinstance(v, int):
        raise _wrong_type(where, path)
    if where.rsplit(".", 1)[-1] in _NON_NEGATIVE and v < 0:
        raise CorruptFileError(f"savepoint metadata field {where!r} is negative", path)


def _check_scalar(t: Any, v: Any, path: str, where: str) -> None:
    """None, an int (not a bool; not negative where an id), a str, bool or float."""
    if t is type(None):
        if v is not None:
            raise _wrong_type(where, path)
    elif t is int:
        _check_int(v, path, where)
    elif t in (str, bool, float) and (
        not isinstance(v, t) or (t is not bool and isinstance(v, bool))
    ):
        raise _wrong_type(where, path)

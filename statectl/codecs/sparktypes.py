"""Spark's JSON data types (``StructType.json``) and their Arrow equivalents.

A Spark type stays the parsed JSON it came from: a ``str`` for atomic types (``"long"``,
``"decimal(38,3)"``, ``"interval day to second"`` …) and a ``dict`` for ``struct``, ``array``,
``map`` and ``udt``. That is what state schema files hold, other modules already index it like
JSON, and :func:`to_json` writes it back byte for byte as Spark's ``DataType.json`` does.

Arrow mapping (``to_arrow_type``): boolean→bool, byte→int8, short→int16, integer→int32,
long→int64, float→float32, double→float64, string/char/varchar→string, binary→binary,
date→date32, timestamp→timestamp[us, UTC], timestamp_ntz→timestamp[us], time(p)→time64[ns],
decimal(p,s)→decimal128(p,s), void→null, year-month interval→int32 (months), day-time
interval→duration[us], interval (CalendarIntervalType)→struct<months: int32, days: int32,
microseconds: int64>, struct→struct, array→list<element>, map→map<key, value>.
Field metadata is kept as JSON under :data:`METADATA_KEY`; where Arrow cannot tell two Spark
types apart (intervals, char/varchar, udt …) the Spark type is kept under :data:`TYPE_KEY` so
``from_arrow_schema(to_arrow_schema(s)) == s``.
"""

from __future__ import annotations

import decimal
import json
import re
from collections.abc import Callable
from typing import Any, Union

import pyarrow as pa

from statectl.codecs import jsonfields
from statectl.errors import CorruptFileError, UnsupportedError

SparkType = Union[str, dict[str, Any]]  # noqa: UP007 (runtime alias; the project targets 3.10)

METADATA_KEY = b"spark.metadata"
TYPE_KEY = b"spark.type"

# Spark type kinds every codec dispatches on (see `kind`).
FIXED_KINDS: dict[str, int] = {  # kind -> UnsafeArrayData element size (= DataType.defaultSize)
    "boolean": 1,
    "byte": 1,
    "short": 2,
    "integer": 4,
    "date": 4,
    "float": 4,
    "interval_ym": 4,
    "long": 8,
    "timestamp": 8,
    "timestamp_ntz": 8,
    "double": 8,
    "interval_dt": 8,
    "time": 8,
}

_SIMPLE_KINDS = {
    "boolean", "byte", "short", "integer", "long", "float", "double", "string", "binary",
    "date", "timestamp", "timestamp_ntz", "void",
}  # fmt: skip
_ALIASES = {"timestamp_ltz": "timestamp", "calendarinterval": "interval", "null": "void"}
_DECIMAL = re.compile(r"decimal\(\s*(\d+)\s*,\s*(-?\d+)\s*\)")
_CHAR = re.compile(r"(?:var)?char\(\d+\)")
_TIME = re.compile(r"time\((\d)\)")
_UNIT = "(year|month|day|hour|minute|second)"
_INTERVAL = re.compile(rf"interval {_UNIT}(?: to {_UNIT})?")
_YM_UNITS = ("year", "month")

ARROW_CALENDAR_INTERVAL = pa.struct(
    [
        pa.field("months", pa.int32(), False),
        pa.field("days", pa.int32(), False),
        pa.field("microseconds", pa.int64(), False),
    ]
)
_ARROW_SIMPLE: dict[str, pa.DataType] = {
    "boolean": pa.bool_(),
    "byte": pa.int8(),
    "short": pa.int16(),
    "integer": pa.int32(),
    "long": pa.int64(),
    "float": pa.float32(),
    "double": pa.float64(),
    "string": pa.string(),
    "binary": pa.binary(),
    "date": pa.date32(),
    "timestamp": pa.timestamp("us", tz="UTC"),
    "timestamp_ntz": pa.timestamp("us"),
    "void": pa.null(),
    "interval_ym": pa.int32(),
    "interval_dt": pa.duration("us"),
    "time": pa.time64("ns"),
    "calendarinterval": ARROW_CALENDAR_INTERVAL,
}


# -- parsing -------------------------------------------------------------------------------
class JsonFloat(float):
    """A JSON number with a fraction or exponent that remembers its text.

    Spark writes doubles in field metadata the Java way (``1.0E10``); keeping the text lets
    :func:`to_json` reproduce Spark's bytes after a parse.
    """

    text: str

    def __new__(cls, text: str) -> JsonFloat:
        obj = super().__new__(cls, text)
        obj.text = text
        return obj


def loads(text: str | bytes) -> Any:
    """``json.loads`` that keeps the original text of floating-point numbers."""
    return json.loads(text, parse_float=JsonFloat)


def parse_schema(schema: str | bytes | dict, path: str | None = None) -> dict:
    """A Spark struct schema from JSON text or an already parsed object."""
    if isinstance(schema, (str, bytes)):
        schema = jsonfields.loads(schema, path, "schema", parse_float=JsonFloat)
    if not isinstance(schema, dict) or schema.get("type") != "struct":
        raise UnsupportedError("state schema is not a Spark struct type", path)
    try:
        _check_shape(schema, path)
    except RecursionError:
        raise CorruptFileError("schema is nested too deeply to be real", path) from None
    return schema


def _check_shape(t: Any, path: str | None) -> None:
    """Malformed JSON (as opposed to an unknown type) means a damaged schema file."""
    if isinstance(t, str):
        return
    if not isinstance(t, dict) or not isinstance(t.get("type"), str):
        raise CorruptFileError(f"malformed Spark type in schema: {_short(t)}", path)
    needs = _NEEDS.get(t["type"], ())
    if any(k not in t for k in needs):
        raise CorruptFileError(f"malformed Spark {t['type']} type in schema: {_short(t)}", path)
    if t["type"] == "struct":
        _check_fields(t, path)
    for k in needs:
        if k != "fields":
            _check_shape(t[k], path)


# The members each kind of type object must have.
_NEEDS = {
    "struct": ("fields",),
    "array": ("elementType",),
    "map": ("keyType", "valueType"),
    "udt": ("sqlType",),
}


def _check_fields(t: dict, path: str | None) -> None:
    if not isinstance(t["fields"], list):
        raise CorruptFileError(f"malformed Spark struct in schema: {_short(t)}", path)
    for f in t["fields"]:
        if not isinstance(f, dict) or not isinstance(f.get("name"), str) or "type" not in f:
            raise CorruptFileError(f"malformed struct field in schema: {_short(f)}", path)
        _check_shape(f["type"], path)


def _short(t: Any) -> str:
    text = json.dumps(t) if not isinstance(t, str) else repr(t)
    return text if len(text) <= 80 else text[:77] + "..."


# -- classification ------------------------------------------------------------------------
def kind(t: SparkType) -> str:
    """The physical kind of a Spark type: a key of FIXED_KINDS, or string, binary, void,
    decimal, calendarinterval, struct, array, map. Unknown or unsupported types raise."""
    if isinstance(t, str):
        return _kind_of_name(t)
    if isinstance(t, dict):
        k = t.get("type")
        if k in ("struct", "array", "map"):
            return k
        if k == "udt":
            return kind(t["sqlType"])
    raise UnsupportedError(f"Spark type {_short(t)} is not supported by statectl")


def _kind_of_name(t: str) -> str:
    name = _ALIASES.get(t, t)
    if name in _SIMPLE_KINDS:
        return name
    if name == "interval":
        return "calendarinterval"
    if name == "decimal" or _DECIMAL.fullmatch(name):
        return "decimal"
    if _CHAR.fullmatch(name) or name.startswith("string collate "):
        return "string"  # stored as UTF-8 bytes, like a plain string
    if _TIME.fullmatch(name):
        return "time"
    m = _INTERVAL.fullmatch(name)
    if m:
        return "interval_ym" if m.group(1) in _YM_UNITS else "interval_dt"
    raise UnsupportedError(f"Spark type {t!r} is not supported by statectl")


def physical(t: SparkType) -> SparkType:
    """The type a value is stored as: a user-defined type's sqlType, else the type itself."""
    while isinstance(t, dict) and t.get("type") == "udt":
        t = t["sqlType"]
    return t


def nested(t: SparkType) -> dict[str, Any]:
    """The JSON object of a struct, array or map type (after its user-defined type, if any):
    the types whose :func:`kind` is struct, array or map are objects, never type strings."""
    t = physical(t)
    if isinstance(t, str):
        raise UnsupportedError(f"type {t!r} has no fields, elements or entries")
    return t


def decimal_of(t: SparkType) -> tuple[int, int] | None:
    """(precision, scale) of a decimal type, else None."""
    t = physical(t)
    if t == "decimal":
        return 10, 0  # DecimalType.USER_DEFAULT
    m = _DECIMAL.fullmatch(t) if isinstance(t, str) else None
    return (int(m.group(1)), int(m.group(2))) if m else None


def canonical(t: SparkType) -> SparkType:
    """A type string the way Spark prints it (``decimal`` → ``decimal(10,0)`` …); a nested
    type as it is."""
    return canonical_name(t) if isinstance(t, str) else t


def canonical_name(name: str) -> str:
    """A type string the way Spark prints it (``decimal`` → ``decimal(10,0)`` …)."""
    dec = decimal_of(name)
    if dec:
        return f"decimal({dec[0]},{dec[1]})"
    return _ALIASES.get(name, name)


# -- Spark → Arrow -------------------------------------------------------------------------
def to_arrow_type(t: SparkType) -> pa.DataType:
    k = kind(t)
    if k in _ARROW_SIMPLE:
        return _ARROW_SIMPLE[k]
    if k == "decimal":
        precision, scale = decimal_of(t)  # type: ignore[misc]
        if not 1 <= precision <= 38:
            raise UnsupportedError(f"Spark type {t!r}: precision must be 1 to 38")
        return pa.decimal128(precision, scale)
    t = physical(t)
    assert isinstance(t, dict)
    if k == "struct":
        return pa.struct([to_arrow_field(f) for f in t["fields"]])
    if k == "array":
        element = to_arrow_type(t["elementType"])
        return pa.list_(pa.field("element", element, _nullable(element, t.get("containsNull"))))
    # map: Arrow map keys are never null, and neither are Spark's.
    item = to_arrow_type(t["valueType"])
    return pa.map_(
        pa.field("key", to_arrow_type(t["keyType"]), False),
        pa.field("value", item, _nullable(item, t.get("valueContainsNull"))),
    )


def _nullable(arrow: pa.DataType, flag: Any) -> bool:
    # Arrow has no non-nullable null type; Spark has (`array()` is array<void> without nulls).
    return bool(flag is None or flag) or pa.types.is_null(arrow)


def to_arrow_field(f: dict) -> pa.Field:
    t = f["type"]
    arrow = to_arrow_type(t)
    meta: dict[bytes, bytes] = {}
    if f.get("metadata"):
        meta[METADATA_KEY] = to_json(f["metadata"]).encode()
    if _from_arrow(arrow) != canonical_type(t):
        meta[TYPE_KEY] = to_json(t).encode()
    return pa.field(f["name"], arrow, _nullable(arrow, f.get("nullable")), meta or None)


def to_arrow_schema(struct: str | bytes | dict) -> pa.Schema:
    return pa.schema([to_arrow_field(f) for f in parse_schema(struct)["fields"]])


def canonical_type(t: SparkType) -> SparkType:
    """``t`` with every type string canonical and without field metadata (for comparisons)."""
    if isinstance(t, str):
        return canonical(t)
    k = t.get("type")
    if k == "struct":
        return {
            "type": "struct",
            "fields": [
                {
                    "name": f["name"],
                    "type": canonical_type(f["type"]),
                    "nullable": bool(f.get("nullable", True)),
                }
                for f in t["fields"]
            ],
        }
    if k == "array":
        return {
            "type": "array",
            "elementType": canonical_type(t["elementType"]),
            "containsNull": bool(t.get("containsNull", True)),
        }
    if k == "map":
        return {
            "type": "map",
            "keyType": canonical_type(t["keyType"]),
            "valueType": canonical_type(t["valueType"]),
            "valueContainsNull": bool(t.get("valueContainsNull", True)),
        }
    return t


# -- Arrow → Spark -------------------------------------------------------------------------
def from_arrow_type(t: pa.DataType) -> SparkType:
    """The Spark type that stores Arrow type ``t`` (for writers)."""
    return _from_arrow(t, keep_metadata=True)


def _from_arrow(t: pa.DataType, keep_metadata: bool = False) -> SparkType:
    if pa.types.is_dictionary(t):
        return _from_arrow(t.value_type, keep_metadata)
    nested = _nested_from_arrow(t, keep_metadata)
    return nested if nested is not None else _name_from_arrow(t)


def _nested_from_arrow(t: pa.DataType, keep_metadata: bool) -> SparkType | None:
    """A struct, list or map type as Spark's; None for any other type."""
    types = pa.types
    if types.is_struct(t):
        fields = [t.field(i) for i in range(t.num_fields)]
        if not keep_metadata:
            return {
                "type": "struct",
                "fields": [
                    {"name": f.name, "type": _from_arrow(f.type), "nullable": f.nullable}
                    for f in fields
                ],
            }
        return {"type": "struct", "fields": [from_arrow_field(f) for f in fields]}
    if types.is_list(t) or types.is_large_list(t) or types.is_list_view(t):
        return {
            "type": "array",
            "elementType": _from_arrow(t.value_type, keep_metadata),
            "containsNull": t.value_field.nullable,
        }
    if types.is_map(t):
        return {
            "type": "map",
            "keyType": _from_arrow(t.key_type, keep_metadata),
            "valueType": _from_arrow(t.item_type, keep_metadata),
            "valueContainsNull": t.item_field.nullable,
        }
    return None


def _name_from_arrow(t: pa.DataType) -> str:
    """A non-nested Arrow type's Spark type string."""
    for matches, name in _ARROW_NAMES:
        if matches(t):
            return name(t)
    for simple, arrow in _ARROW_SIMPLE.items():
        if simple in _SIMPLE_KINDS and t == arrow:
            return simple
    raise UnsupportedError(f"Arrow type {t} has no Spark equivalent")


def _any_type(*predicates: Callable[[pa.DataType], bool]) -> Callable[[pa.DataType], bool]:
    return lambda t: any(p(t) for p in predicates)


_T = pa.types
# Arrow types with a Spark type string besides _ARROW_SIMPLE's, in the order tried.
_ARROW_NAMES: tuple[tuple[Callable[[pa.DataType], bool], Callable[[pa.DataType], str]], ...] = (
    (
        lambda t: _T.is_decimal(t) and t.precision <= 38,
        lambda t: f"decimal({t.precision},{t.scale})",
    ),
    (_T.is_timestamp, lambda t: "timestamp" if t.tz is not None else "timestamp_ntz"),
    (_T.is_time, lambda t: "time(6)"),  # TimeType's default precision (microseconds)
    (_T.is_duration, lambda t: "interval day to second"),
    (_T.is_date, lambda t: "date"),
    (_any_type(_T.is_string, _T.is_large_string, _T.is_string_view), lambda t: "string"),
    (_any_type(_T.is_binary, _T.is_large_binary, _T.is_binary_view), lambda t: "binary"),
)


def from_arrow_field(f: pa.Field) -> dict:
    meta = f.metadata or {}
    hint = meta.get(TYPE_KEY)
    spark_type: SparkType | None = None
    if hint is not None:
        try:
            candidate = loads(hint)
            # Trust the hint only if it still describes the Arrow type (it may be stale).
            if to_arrow_type(candidate).equals(f.type):
                spark_type = candidate
        except (ValueError, UnsupportedError, KeyError, TypeError):
            spark_type = None
    return {
        "name": f.name,
        "type": spark_type if spark_type is not None else from_arrow_type(f.type),
        "nullable": f.nullable,
        "metadata": loads(meta[METADATA_KEY]) if METADATA_KEY in meta else {},
    }


def from_arrow_schema(schema: pa.Schema) -> dict:
    return {"type": "struct", "fields": [from_arrow_field(f) for f in schema]}


# -- Spark's JSON --------------------------------------------------------------------------
_KEY_ORDER = {
    "struct": ("type", "fields"),
    "array": ("type", "elementType", "containsNull"),
    "map": ("type", "keyType", "valueType", "valueContainsNull"),
}
_FIELD_ORDER = ("name", "type", "nullable", "metadata")
_ESCAPE = re.compile(r'[\x00-\x1f"\\]')
_SHORT_ESCAPES = {'"': '\\"', "\\": "\\\\", "\b": "\\b", "\f": "\\f", "\n": "\\n", "\r": "\\r", "\t": "\\t"}  # fmt: skip


def to_json(value: Any) -> str:
    """Compact JSON exactly as Spark writes it (``StructType.json``; json4s ``compact``).

    Struct/field/array/map keys come in Spark's order; type strings are canonical; metadata
    keeps its own key order (Spark's map order, as parsed) and numbers keep their text.
    """
    out: list[str] = []
    _write_type(value, out) if _is_type(value) else _write_value(value, out)
    return "".join(out)


def _is_type(v: Any) -> bool:
    return isinstance(v, dict) and v.get("type") in _KEY_ORDER


def _write_type(t: SparkType, out: list[str]) -> None:
    if isinstance(t, str):
        out.append(_quote(canonical_name(t)))
        return
    k = t.get("type")
    if k not in _KEY_ORDER:  # udt and unknown kinds: as parsed
        _write_value(t, out, types=True)
        return
    out.append("{")
    for i, key in enumerate(_KEY_ORDER[k]):
        if i:
            out.append(",")
        out.append(_quote(key) + ":")
        _write_type_entry(key, t.get(key, True) if key in _NULLABLE_KEYS else t[key], out)
    out.append("}")


_NULLABLE_KEYS = ("containsNull", "valueContainsNull")


def _write_type_entry(key: str, v: Any, out: list[str]) -> None:
    """The value of ``key`` in a struct, array or map type's object."""
    if key == "fields":
        out.append("[")
        for j, f in enumerate(v):
            if j:
                out.append(",")
            _write_field(f, out)
        out.append("]")
    elif key == "type":
        out.append(_quote(v))
    elif isinstance(v, bool):
        out.append("true" if v else "false")
    else:
        _write_type(v, out)


def _write_field(f: dict, out: list[str]) -> None:
    values = {"nullable": True, "metadata": {}, **f}
    out.append("{")
    for i, key in enumerate(_FIELD_ORDER):
        if i:
            out.append(",")
        out.append(_quote(key) + ":")
        if key == "type":
            _write_type(values[key], out)
        else:
            _write_value(values[key], out)
    out.append("}")


def _write_value(v: Any, out: list[str], types: bool = False) -> None:
    if isinstance(v, (list, tuple)):
        _write_array(v, out, types)
    elif isinstance(v, dict):
        _write_object(v, out, types)
    else:
        out.append(_scalar_json(v))


def _scalar_json(v: Any) -> str:
    if v is None:
        return "null"
    if v is True or v is False:
        return "true" if v else "false"
    if isinstance(v, JsonFloat):
        return v.text
    if isinstance(v, float):
        return _java_double(v)
    if isinstance(v, int):
        return str(v)
    if isinstance(v, str):
        return _quote(v)
    raise TypeError(f"cannot write {type(v).__name__} as JSON")


def _write_array(v: list | tuple, out: list[str], types: bool) -> None:
    out.append("[")
    for i, x in enumerate(v):
        if i:
            out.append(",")
        _write_value(x, out, types)
    out.append("]")


def _write_object(v: dict, out: list[str], types: bool) -> None:
    """An object in its own key order (``types``: a UDT's, whose ``sqlType`` is a type)."""
    out.append("{")
    for i, (key, x) in enumerate(v.items()):
        if i:
            out.append(",")
        out.append(_quote(str(key)) + ":")
        if types and key == "sqlType":
            _write_type(x, out)
        else:
            _write_value(x, out, types)
    out.append("}")


def _quote(s: str) -> str:
    # json4s escapes only quote, backslash and control characters (as \u00XX, upper case).
    def esc(m: re.Match[str]) -> str:
        c = m.group(0)
        return _SHORT_ESCAPES.get(c) or f"\\u{ord(c):04X}"

    return '"' + _ESCAPE.sub(esc, s) + '"'


def _java_double(x: float) -> str:
    """Java's ``Double.toString`` (what json4s writes for a double) for finite values."""
    if x != x or x in (float("inf"), float("-inf")):
        raise ValueError("JSON has no NaN or infinity")
    if x == 0:
        return "-0.0" if str(x).startswith("-") else "0.0"
    digits, exp = _shortest_digits(abs(x))
    sign = "-" if x < 0 else ""
    if 1e-3 <= abs(x) < 1e7:
        point = exp + 1  # digits before the decimal point
        if point <= 0:
            return f"{sign}0.{'0' * -point}{digits}"
        whole, frac = digits[:point].ljust(point, "0"), digits[point:]
        return f"{sign}{whole}.{frac or '0'}"
    return f"{sign}{digits[0]}.{digits[1:] or '0'}E{exp}"


def _shortest_digits(x: float) -> tuple[str, int]:
    """Shortest round-trip digits of ``x`` > 0 and the decimal exponent of the first one."""
    t = decimal.Decimal(repr(x)).as_tuple()
    digits = "".join(map(str, t.digits))
    exp10 = len(digits) + int(t.exponent) - 1
    return digits.rstrip("0") or "0", exp10

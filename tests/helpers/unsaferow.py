"""UnsafeRows from Python values, one row at a time (through the vectorized encoder), and Arrow
values by position in the shape that takes: how tests write rows by hand."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pyarrow as pa

from statectl.codecs.sparktypes import SparkType, kind, nested, physical, to_arrow_type
from statectl.codecs.unsaferow_encode import encode_unsafe_rows


def encode_row(fields: Sequence[dict], values: Sequence[Any] | dict) -> bytes:
    """One UnsafeRow from Python values (a list by position, or a dict by field name)."""
    struct = {"type": "struct", "fields": list(fields)}
    if isinstance(values, dict):
        values = [values.get(f["name"]) for f in fields]
    row = py_struct(struct, values)
    arr = pa.array([row], type=to_arrow_type(struct))
    return encode_unsafe_rows(arr, struct)[0].as_py()


def py_struct(t: SparkType, v: Any) -> Any:
    """Python values in the shape pa.array wants (structs as tuples: names may repeat)."""
    if v is None:
        return None
    k = kind(t)
    t = physical(t)
    if k == "struct":
        fields = nested(t)["fields"]
        if isinstance(v, dict):
            v = [v.get(f["name"]) for f in fields]
        return tuple(py_struct(f["type"], x) for f, x in zip(fields, v, strict=True))
    if k == "array":
        elem = nested(t)["elementType"]
        return [py_struct(elem, x) for x in v]
    if k == "map":
        items = v.items() if isinstance(v, dict) else v
        key_t, value_t = nested(t)["keyType"], nested(t)["valueType"]
        return [(py_struct(key_t, a), py_struct(value_t, b)) for a, b in items]
    return v


def positional(arr: pa.Array) -> list[Any]:
    """Python values by position (structs as lists, so duplicate field names survive);
    timestamps, dates and durations as their integer storage. encode_row accepts these."""
    if pa.types.is_struct(arr.type):
        children = [positional(arr.field(i)) for i in range(arr.type.num_fields)]
        valid = arr.is_valid().to_pylist()
        return [[c[r] for c in children] if valid[r] else None for r in range(len(arr))]
    if pa.types.is_timestamp(arr.type) or pa.types.is_duration(arr.type):
        return arr.view(pa.int64()).to_pylist()
    if pa.types.is_date32(arr.type):
        return arr.view(pa.int32()).to_pylist()
    if pa.types.is_map(arr.type):
        return [None if m is None else list(m) for m in arr.to_pylist()]
    return arr.to_pylist()

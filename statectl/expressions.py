"""``edit --delete-where/--keep-where``: a SQL ``WHERE`` subset, translated to pyarrow.compute.

The text is parsed by sqlglot (a pure-Python SQL parser: it only builds a syntax tree, it runs
nothing) and every node is translated by hand from a short whitelist: column references
(``key.k``, nested struct fields — a unique trailing path such as ``window.end`` may stand for
``key.window.end`` — back-quoted names), string/number/boolean/NULL literals, typed literals
(``TIMESTAMP '…'``, ``DATE '…'``, ``CAST('…' AS type)`` of a literal), ``+ - * /`` and unary
minus, comparisons, ``AND``/``OR``/``NOT``, ``IN (literals)``, ``BETWEEN``, ``IS [NOT] NULL``,
``[NOT] LIKE``. Anything else (functions, subqueries, casts of columns, several statements) is
refused with one line naming the construct, so an expression can never read a file or call a
function. Filtering is Arrow's, vectorized, one partition at a time.

A literal compared with a column takes the column's type, as Spark's implicit casts would give
it (``key.window.end < '2024-01-01 00:10:00'`` compares timestamps): a timestamp literal without
a zone is UTC, the zone statectl shows timestamps in. A literal that cannot take the column's
type, and any expression whose types do not combine, is refused at parse time in the
expression's own terms, before a file is read. docs/guide.md documents the language.
"""

from __future__ import annotations

import datetime as dt
import decimal
import re
from collections.abc import Callable
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import sqlglot
from sqlglot import exp
from sqlglot.errors import ParseError, TokenError

from statectl.errors import StatectlError

_COMPARE = {"EQ": "equal", "NEQ": "not_equal", "GT": "greater", "GTE": "greater_equal",
            "LT": "less", "LTE": "less_equal"}  # fmt: skip
_ARITH = {"Add": "add_checked", "Sub": "subtract_checked", "Mul": "multiply_checked",
          "Div": "divide_checked"}  # fmt: skip


class ExpressionError(StatectlError):
    """An expression statectl cannot or will not evaluate."""


def parse(text: str, schema: pa.Schema) -> pc.Expression:
    """``text`` as a boolean pyarrow.compute expression over ``schema``'s columns (nulls stay
    null: SQL's three-valued logic; :func:`keep_where`/:func:`delete_where` decide)."""
    if not text.strip():
        raise ExpressionError("the expression is empty")
    try:
        tree = sqlglot.parse_one(text, read="spark")
    except (ParseError, TokenError) as e:
        first = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise ExpressionError(f"cannot parse expression {text!r}: {first}") from None
    if not isinstance(tree, exp.Expression):
        raise ExpressionError(f"cannot parse expression {text!r}")
    expression = _Translator(schema, text).boolean(tree)
    _type_check(expression, schema, text)
    return expression


def _type_check(expression: pc.Expression, schema: pa.Schema, text: str) -> None:
    """Evaluate on an empty table of ``schema``, so a type mismatch the translator did not
    catch is a parse-time error naming the expression, not Arrow's kernel text mid-write."""
    try:
        schema.empty_table().filter(expression)
    except (pa.ArrowNotImplementedError, pa.ArrowInvalid, pa.ArrowTypeError) as e:
        detail = str(e).splitlines()[0]
        kinds = re.search(r"input types \((.*)\)", detail)
        why = f"it combines {kinds.group(1)}" if kinds else detail
        raise ExpressionError(
            f"the types in {text!r} do not match ({why}); compare each column with a literal "
            "of its own type"
        ) from None


def keep_where(text: str, schema: pa.Schema) -> pc.Expression:
    """Rows to keep for ``--keep-where``: where the expression is true (not null)."""
    return pc.coalesce(parse(text, schema), pa.scalar(False))


def delete_where(text: str, schema: pa.Schema) -> pc.Expression:
    """Rows to keep for ``--delete-where``: all but those where the expression is true."""
    return pc.invert(pc.coalesce(parse(text, schema), pa.scalar(False)))


def leaf_columns(schema: pa.Schema) -> list[str]:
    """Every addressable column, dotted (``key.k``, ``value.count``)."""
    out: list[str] = []

    def walk(prefix: str, t: pa.DataType) -> None:
        if pa.types.is_struct(t):
            for i in range(t.num_fields):
                walk(f"{prefix}.{t.field(i).name}", t.field(i).type)
        else:
            out.append(prefix)

    for f in schema:
        walk(f.name, f.type)
    return out


class _Translator:
    def __init__(self, schema: pa.Schema, text: str) -> None:
        self.schema = schema
        self.text = text

    def refuse(self, node: Any, why: str = "") -> ExpressionError:
        name = type(node).__name__
        sql = node.sql(dialect="spark") if hasattr(node, "sql") else str(node)
        return ExpressionError(
            f"unsupported in an edit expression: {name} ({sql}){': ' + why if why else ''}; "
            "use columns, literals, + - * /, comparisons, AND/OR/NOT, IN, BETWEEN, IS NULL, LIKE"
        )

    def _only(self, node: Any, allowed: set[str]) -> None:
        extra = [k for k, v in node.args.items() if v not in (None, False, []) and k not in allowed]
        if extra:
            raise self.refuse(node, f"{', '.join(extra)} is not supported")

    def boolean(self, node: Any) -> pc.Expression:
        name = type(node).__name__
        if name in _COMPARE:
            self._only(node, {"this", "expression"})
            left, right = self.operands(node.this, node.expression)
            return getattr(pc, _COMPARE[name])(left, right)
        for kinds, translate in self._BOOLEAN:
            if isinstance(node, kinds):
                return translate(self, node)
        raise self.refuse(node)

    def _paren(self, node: Any) -> pc.Expression:
        return self.boolean(node.this)

    def _and_or(self, node: Any) -> pc.Expression:
        self._only(node, {"this", "expression"})
        f = pc.and_kleene if isinstance(node, exp.And) else pc.or_kleene
        return f(self.boolean(node.this), self.boolean(node.expression))

    def _not(self, node: Any) -> pc.Expression:
        return pc.invert(self.boolean(node.this))

    def _is_null(self, node: Any) -> pc.Expression:
        self._only(node, {"this", "expression"})
        if not isinstance(node.expression, exp.Null):
            raise self.refuse(node, "only IS NULL / IS NOT NULL")
        return pc.is_null(self.value(node.this))

    def _in_list(self, node: Any) -> pc.Expression:
        self._only(node, {"this", "expressions"})
        if not node.expressions:
            raise self.refuse(node, "IN needs at least one value")
        column = self.column_type(node.this)
        values = [self.literal(v) for v in node.expressions]
        if column is not None:
            path, t = column
            values = [
                _coerce(v, t, path, node_sql(e))
                for v, e in zip(values, node.expressions, strict=True)
            ]
            present = [x for x in values if x is not None]
            value_set = pa.array(present, type=t)
            return self._in(self.value(node.this), values, value_set)
        return self._in(self.value(node.this), values)

    def _between(self, node: Any) -> pc.Expression:
        self._only(node, {"this", "low", "high"})
        v, low = self.operands(node.this, node.args["low"])
        _, high = self.operands(node.this, node.args["high"])
        return pc.and_kleene(pc.greater_equal(v, low), pc.less_equal(v, high))

    def _like(self, node: Any) -> pc.Expression:
        self._only(node, {"this", "expression", "negate"})
        pattern = self.literal(node.expression)
        if not isinstance(pattern, str):
            raise self.refuse(node, "the LIKE pattern must be a string literal")
        e = pc.match_like(self.value(node.this), pattern)
        return pc.invert(e) if node.args.get("negate") else e

    def _boolean_value(self, node: Any) -> pc.Expression:
        return self.value(node)  # a boolean column or TRUE / FALSE

    # The boolean constructs besides comparisons, by sqlglot node class: the whitelist.
    _BOOLEAN: tuple[tuple[Any, Callable[..., pc.Expression]], ...] = (
        (exp.Paren, _paren),
        ((exp.And, exp.Or), _and_or),
        (exp.Not, _not),
        (exp.Is, _is_null),
        (exp.In, _in_list),
        (exp.Between, _between),
        (exp.Like, _like),
        ((exp.Column, exp.Dot, exp.Boolean), _boolean_value),
    )

    def _in(
        self, v: pc.Expression, values: list[Any], value_set: pa.Array | None = None
    ) -> pc.Expression:
        # SQL: x IN (a, NULL) is true on a match, else NULL; without NULL, false.
        present = [x for x in values if x is not None]
        if value_set is None and present:
            value_set = pa.array(present)
        matched = pc.is_in(v, value_set=value_set) if present else pa.scalar(False)
        if len(present) != len(values):
            return pc.if_else(matched, pa.scalar(True), pa.scalar(None, pa.bool_()))
        return pc.if_else(pc.is_null(v), pa.scalar(None, pa.bool_()), matched)

    def value(self, node: Any) -> pc.Expression:
        if isinstance(node, exp.Paren):
            return self.value(node.this)
        if isinstance(node, exp.Column | exp.Dot):
            return self.column(node)
        name = type(node).__name__
        if name in _ARITH:
            self._only(node, {"this", "expression", "typed", "safe"})
            left, right = self.value(node.this), self.value(node.expression)
            if name == "Div":  # SQL's / is a fractional division, also of integers
                left, right = left.cast(pa.float64()), right.cast(pa.float64())
            return getattr(pc, _ARITH[name])(left, right)
        if isinstance(node, exp.Neg):
            return pc.negate_checked(self.value(node.this))
        if isinstance(node, exp.Literal | exp.Boolean | exp.Null | exp.Cast):
            v = self.literal(node)
            return pc.scalar(v) if v is not None else pc.scalar(pa.scalar(None))
        if name in _COMPARE or isinstance(
            node, exp.And | exp.Or | exp.Not | exp.Is | exp.In | exp.Like
        ):
            return self.boolean(node)
        raise self.refuse(node)

    def literal(self, node: Any) -> Any:
        if isinstance(node, exp.Neg):
            v = self.literal(node.this)
            if isinstance(v, int | float) and not isinstance(v, bool):
                return -v
            raise self.refuse(node)
        if isinstance(node, exp.Null):
            return None
        if isinstance(node, exp.Cast):  # also TryCast: CAST('…' AS T), TIMESTAMP '…', DATE '…'
            return self.cast_literal(node)
        if isinstance(node, exp.Boolean):
            return bool(node.this)
        if isinstance(node, exp.Literal):
            if node.is_string:
                return str(node.this)
            text = str(node.this)
            try:
                return int(text)
            except ValueError:
                try:
                    return float(text)
                except ValueError:
                    raise self.refuse(node) from None
        raise self.refuse(node, "a literal is expected here")

    def cast_literal(self, node: Any) -> Any:
        if not _is_literal(node.this):
            raise self.refuse(node, "only a literal can be cast")
        return _typed_literal(self.literal(node.this), node.to, node_sql(node))

    def operands(self, a: Any, b: Any) -> tuple[pc.Expression, pc.Expression]:
        """Both sides of a comparison; a literal facing a column takes the column's type."""
        for column, other, swap in ((a, b, False), (b, a, True)):
            typed = self.column_type(column)
            if typed is not None and _is_literal(other):
                path, t = typed
                v = _coerce(self.literal(other), t, path, node_sql(other))
                pair = (self.column(column), pc.scalar(pa.scalar(v, type=t)))
                return (pair[1], pair[0]) if swap else pair
        return self.value(a), self.value(b)

    def column_type(self, node: Any) -> tuple[str, pa.DataType] | None:
        """``(dotted path, type)`` of a column reference, ``None`` for anything else."""
        if isinstance(node, exp.Paren):
            return self.column_type(node.this)
        if not isinstance(node, exp.Column | exp.Dot):
            return None
        parts = self.column_parts(node)
        t: Any = self.schema
        for p in parts:
            t = t.field(p).type
        return ".".join(parts), t

    def column(self, node: Any) -> pc.Expression:
        return pc.field(*self.column_parts(node))

    def column_parts(self, node: Any) -> list[str]:
        parts: list[str] = []
        while isinstance(node, exp.Dot):
            if not isinstance(node.expression, exp.Identifier):
                raise self.refuse(node)
            parts.insert(0, node.expression.this)
            node = node.this
        if not isinstance(node, exp.Column):
            raise self.refuse(node)
        parts = [p.this for p in node.parts] + parts
        return self.resolve(parts)

    def resolve(self, parts: list[str]) -> list[str]:
        """A dotted path checked against the schema; a single name that is not a column may
        name a unique nested field (``k`` for ``key.k``)."""
        known = leaf_columns(self.schema)
        dotted = ".".join(parts)
        t: Any = self.schema
        ok = True
        for p in parts:
            names = _field_names(t)
            if p not in names:
                ok = False
                break
            t = t.field(names.index(p)).type if isinstance(t, pa.Schema) else t.field(p).type
        if ok:
            return parts
        # A unique trailing path: ``k`` for ``key.k``, ``window.end`` for ``key.window.end``.
        hits = [c for c in _paths(self.schema) if c.endswith("." + dotted)]
        if len(hits) == 1:
            return hits[0].split(".")
        if len(hits) > 1:
            raise ExpressionError(
                f"column {dotted!r} is ambiguous ({', '.join(hits)}); write the full path"
            )
        raise ExpressionError(f"no column {dotted!r}; the table has {', '.join(known)}")


def _field_names(t: Any) -> list[str]:
    if isinstance(t, pa.Schema):
        return list(t.names)
    if pa.types.is_struct(t):
        return [t.field(i).name for i in range(t.num_fields)]
    return []


def _paths(schema: pa.Schema) -> list[str]:
    """Every addressable path, struct fields included (``key``, ``key.window``, …)."""
    out: list[str] = []

    def walk(prefix: str, t: pa.DataType) -> None:
        out.append(prefix)
        if pa.types.is_struct(t):
            for i in range(t.num_fields):
                walk(f"{prefix}.{t.field(i).name}", t.field(i).type)

    for f in schema:
        walk(f.name, f.type)
    return out


def node_sql(node: Any) -> str:
    return str(node.sql(dialect="spark")) if hasattr(node, "sql") else str(node)


def _is_literal(node: Any) -> bool:
    if isinstance(node, exp.Paren):
        return _is_literal(node.this)
    if isinstance(node, exp.Neg):
        return _is_literal(node.this)
    if isinstance(node, exp.Cast):
        return _is_literal(node.this)
    return isinstance(node, exp.Literal | exp.Boolean | exp.Null)


# Spark's timestamp and date literal forms: 2024, 2024-01, 2024-01-01, then a time after a
# space or T, fractional seconds, and a zone (Z, UTC, +01:00). No zone means UTC.
_DATETIME = re.compile(
    r"\s*(\d{4})(?:-(\d{1,2})(?:-(\d{1,2})"
    r"(?:[ T](\d{1,2})(?::(\d{1,2})(?::(\d{1,2})(?:\.(\d{1,9}))?)?)?)?)?)?"
    r"\s*(Z|UTC|[+-]\d{1,2}(?::?\d{2})?)?\s*$"
)


def _parse_datetime(text: str) -> dt.datetime | None:
    m = _DATETIME.fullmatch(text)
    if m is None:
        return None
    year, month, day, hour, minute, second, frac, zone = m.groups()
    tz = dt.timezone.utc
    if zone and zone not in ("Z", "UTC"):
        sign = -1 if zone[0] == "-" else 1
        digits = zone[1:].replace(":", "")
        hours, minutes = (int(digits[:-2]), int(digits[-2:])) if len(digits) > 2 else (
            int(digits), 0)  # fmt: skip
        tz = dt.timezone(sign * dt.timedelta(hours=hours, minutes=minutes))
    try:
        return dt.datetime(
            int(year), int(month or 1), int(day or 1), int(hour or 0), int(minute or 0),
            int(second or 0), int((frac or "0")[:6].ljust(6, "0")), tzinfo=tz,
        )  # fmt: skip
    except ValueError:
        return None


# A cast's target type, as the Arrow type whose conversion rules (:func:`_convert`) apply.
_CAST_TYPES: dict[str, pa.DataType] = {
    **dict.fromkeys(("TIMESTAMP", "TIMESTAMPTZ", "TIMESTAMPLTZ", "DATETIME"), pa.timestamp("us", "UTC")),
    "TIMESTAMPNTZ": pa.timestamp("us"),
    "DATE": pa.date32(),
    **dict.fromkeys(("TINYINT", "SMALLINT", "INT", "BIGINT"), pa.int64()),
    **dict.fromkeys(("FLOAT", "DOUBLE"), pa.float64()),
    "DECIMAL": pa.decimal128(38, 18),
    **dict.fromkeys(("VARCHAR", "TEXT", "CHAR", "NVARCHAR"), pa.string()),
}  # fmt: skip


def _typed_literal(value: Any, to: Any, sql: str) -> Any:
    """``CAST(literal AS type)``, ``TIMESTAMP '…'``, ``DATE '…'``: the literal as that type."""
    kind = to.this.name if hasattr(to.this, "name") else str(to.this)
    target = _CAST_TYPES.get(kind)
    if target is None:
        raise ExpressionError(
            f"unsupported in an edit expression: {sql}: a cast to {kind.lower()}; cast a "
            "literal to timestamp, date, a number, decimal or string"
        )
    if value is None:
        return None
    converted = _convert(value, target)
    if converted is _NO:
        example = _EXAMPLES.get(_type_name(target), f"write a {kind.lower()}")
        raise ExpressionError(f"{sql}: {str(value)!r} is not a {kind.lower()}; {example}")
    return converted


def _type_name(t: pa.DataType) -> str:
    if pa.types.is_timestamp(t):
        return "timestamp" if t.tz else "timestamp_ntz"
    if pa.types.is_date(t):
        return "date"
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        return "string"
    return str(t)


def _coerce(value: Any, t: pa.DataType, path: str, sql: str) -> Any:
    """``value`` (a literal compared with column ``path`` of type ``t``) as a value of ``t``, or
    a one-line refusal in the expression's terms."""
    if value is None:
        return None
    converted = _convert(value, t)
    if converted is _NO:
        raise ExpressionError(
            f"cannot compare {path} ({_type_name(t)}) with {sql}; "
            f"{_EXAMPLES.get(_type_name(t), 'write a literal of the same type')}"
        )
    return converted


_NO = object()
_EXAMPLES = {
    "timestamp": "write a timestamp, e.g. TIMESTAMP '2024-01-01 00:10:00' (UTC unless a zone is given)",
    "timestamp_ntz": "write a timestamp, e.g. TIMESTAMP '2024-01-01 00:10:00'",
    "date": "write a date, e.g. DATE '2024-01-01'",
    "string": "write a string in quotes, e.g. 'k1'",
}  # fmt: skip


def _convert(value: Any, t: pa.DataType) -> Any:  # noqa: C901 - one branch per type family
    if pa.types.is_timestamp(t):
        if isinstance(value, str):
            value = _parse_datetime(value)
        elif isinstance(value, dt.date) and not isinstance(value, dt.datetime):
            value = dt.datetime(value.year, value.month, value.day, tzinfo=dt.timezone.utc)
        if not isinstance(value, dt.datetime):
            return _NO
        if t.tz is None:  # timestamp_ntz: the wall time as written
            return value.replace(tzinfo=None)
        return value.astimezone(dt.timezone.utc)
    if pa.types.is_date(t):
        if isinstance(value, str):
            value = _parse_datetime(value)
        if isinstance(value, dt.datetime):
            return value.date() if value.time() == dt.time(0) else _NO
        return value if isinstance(value, dt.date) else _NO
    if isinstance(value, bool):
        return value if pa.types.is_boolean(t) else _NO
    if pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_decimal(t):
        return _number(value, t)
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        return value if isinstance(value, str) else _NO
    if pa.types.is_boolean(t):
        return _NO
    return value  # other types: let Arrow's own casts (checked at parse time) decide


def _number(value: Any, t: pa.DataType) -> Any:
    if isinstance(value, dt.date):
        return _NO
    try:
        if pa.types.is_decimal(t):
            return decimal.Decimal(str(value))
        if pa.types.is_integer(t):
            if isinstance(value, float) and not value.is_integer():
                return _NO
            return int(str(value)) if isinstance(value, str) else int(value)
        return float(value)
    except (ValueError, decimal.InvalidOperation):
        return _NO

"""``edit --delete-where/--keep-where``: a SQL ``WHERE`` subset, translated to pyarrow.compute.

The text is parsed by sqlglot (a pure-Python SQL parser: it only builds a syntax tree, it runs
nothing) and every node is translated by hand from a short whitelist: column references
(``key.k``, nested struct fields, back-quoted names), string/number/boolean/NULL literals,
``+ - * /`` and unary minus, comparisons, ``AND``/``OR``/``NOT``, ``IN (literals)``,
``BETWEEN``, ``IS [NOT] NULL``, ``[NOT] LIKE``. Anything else (functions, subqueries, casts,
several statements) is refused with one line naming the construct, so an expression can never
read a file or call a function. Filtering is Arrow's, vectorized, one partition at a time.
docs/guide.md documents the language.
"""

from __future__ import annotations

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
    return _Translator(schema, text).boolean(tree)


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
            return getattr(pc, _COMPARE[name])(self.value(node.this), self.value(node.expression))
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
        values = [self.literal(v) for v in node.expressions]
        if not values:
            raise self.refuse(node, "IN needs at least one value")
        return self._in(self.value(node.this), values)

    def _between(self, node: Any) -> pc.Expression:
        self._only(node, {"this", "low", "high"})
        v = self.value(node.this)
        return pc.and_kleene(
            pc.greater_equal(v, self.value(node.args["low"])),
            pc.less_equal(v, self.value(node.args["high"])),
        )

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

    def _in(self, v: pc.Expression, values: list[Any]) -> pc.Expression:
        # SQL: x IN (a, NULL) is true on a match, else NULL; without NULL, false.
        present = [x for x in values if x is not None]
        matched = pc.is_in(v, value_set=pa.array(present)) if present else pa.scalar(False)
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
        if isinstance(node, exp.Literal | exp.Boolean | exp.Null):
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

    def column(self, node: Any) -> pc.Expression:
        parts: list[str] = []
        while isinstance(node, exp.Dot):
            if not isinstance(node.expression, exp.Identifier):
                raise self.refuse(node)
            parts.insert(0, node.expression.this)
            node = node.this
        if not isinstance(node, exp.Column):
            raise self.refuse(node)
        parts = [p.this for p in node.parts] + parts
        return pc.field(*self.resolve(parts))

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
        if len(parts) == 1:
            hits = [c for c in known if c.rsplit(".", 1)[-1] == parts[0]]
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

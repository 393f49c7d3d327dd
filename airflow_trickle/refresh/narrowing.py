"""Leave out, in Arrow, the rows of a change or of a lookup that a block's filter rejects.

``dvm/conjuncts.item_conditions`` gives, per FROM item, what its rows must satisfy to meet an
output row (a line item shipped in a given month, say).  Before the refresh looks further by a
change's keys and hands its rows to Spark, :func:`narrowed` keeps only the rows that may pass,
and the rows they look up shrink with them (benchmarks/README.md, "TPC-H at SF 3, all 22:
changes narrowed by the query's filter before they look anything up").

Arrow evaluates only what it evaluates as Spark does: comparisons of a column with a literal
of the column's kind (or with another column of the same type), ``BETWEEN``, ``IN`` lists of
literals, ``IS [NOT] NULL``, and the fixed parts of a ``LIKE`` pattern.  Anything else is
treated as true: an AND keeps the parts it can test, an OR only when it can test each
disjunct.  So the rows kept are always a superset of those the filter keeps -- Spark still
applies the whole filter -- and a refresh is exactly as correct without this.

Strings are tested as a ``CHAR(n)`` column would be too (Spark pads its values with spaces
when it reads them, delta-rs does not): only for equality, ``IN`` and ``LIKE``, with trailing
spaces ignored on both sides -- weaker than Spark's test on a ``STRING``, the same on a
``CHAR`` -- and never by order.
"""
from __future__ import annotations

import datetime
import decimal
import functools
import logging
import operator
import re

import pyarrow as pa
import pyarrow.compute as pc
from sqlglot import exp

from airflow_trickle.dvm.conjuncts import item_conditions
from airflow_trickle.dvm.scan import Scan

log = logging.getLogger(__name__)

_COMPARISONS = {exp.EQ: operator.eq, exp.NEQ: operator.ne, exp.GT: operator.gt, exp.GTE: operator.ge,
                exp.LT: operator.lt, exp.LTE: operator.le}
#: The comparison with its sides swapped (``5 < x`` is ``x > 5``).
_SWAPPED = {exp.EQ: exp.EQ, exp.NEQ: exp.NEQ, exp.GT: exp.LT, exp.GTE: exp.LTE, exp.LT: exp.GT, exp.LTE: exp.GTE}


def scan_conditions(block) -> dict:
    """What the rows of each FROM item of ``block`` that is a scan must satisfy to meet an
    output row (``dvm/conjuncts.item_conditions``; an aggregate's condition names its own
    columns, not its table's, so its rows found are kept whole)."""
    return {i: condition for i, condition in item_conditions(block).items() if isinstance(block.items[i][1], Scan)}


def narrowed(rows: pa.Table, condition: exp.Expression | None) -> pa.Table:
    """``rows`` without those ``condition`` (an item's condition, its columns named as the
    columns of ``rows``) surely rejects; ``rows`` itself when Arrow can test none of it."""
    if condition is None or not rows.num_rows:
        return rows
    test = arrow_condition(condition, rows.schema)
    if test is None:
        return rows
    plain = _plain(rows)
    try:
        return plain.filter(test)
    except (pa.ArrowException, TypeError, ValueError) as err:  # an optimisation: Spark filters
        log.info("rows kept whole, Arrow could not filter them by %s: %s", condition.sql(), err)
        return rows


def arrow_condition(condition: exp.Expression, schema: pa.Schema) -> pc.Expression | None:
    """An Arrow expression true on every row of ``schema`` on which ``condition`` is (SQL's
    three-valued logic: a row the filter keeps); None when nothing can be tested.

    >>> schema = pa.schema([("d", pa.date32()), ("m", pa.string()), ("q", pa.decimal128(12, 2))])
    >>> from sqlglot import parse_one
    >>> str(arrow_condition(parse_one("t.d >= CAST('1995-09-01' AS DATE) AND t.m LIKE 'AIR%' AND f(t.q)"), schema))
    '((d >= 1995-09-01) and starts_with(m, {pattern="AIR", ignore_case=false}))'
    >>> arrow_condition(parse_one("t.d > CAST('1995-09-01' AS DATE) OR g(t.m)"), schema) is None
    True
    """
    while isinstance(condition, exp.Paren):
        condition = condition.this
    if isinstance(condition, exp.And):
        parts = [part for part in (arrow_condition(c, schema) for c in condition.flatten()) if part is not None]
        return functools.reduce(operator.and_, parts) if parts else None  # Arrow's & and | are Kleene's
    if isinstance(condition, exp.Or):
        parts = [arrow_condition(c, schema) for c in condition.flatten()]
        return None if any(part is None for part in parts) else functools.reduce(operator.or_, parts)
    try:
        return _leaf(condition, schema)
    except (ValueError, TypeError, ArithmeticError, decimal.InvalidOperation):
        return None


def _leaf(condition: exp.Expression, schema: pa.Schema) -> pc.Expression | None:
    if condition.args.get("negate"):  # sqlglot writes ``NOT LIKE`` as a negated LIKE
        return None
    kind = type(condition)
    if kind in _COMPARISONS:
        left, right = condition.this, condition.expression
        if not isinstance(left, exp.Column):
            left, right, kind = right, left, _SWAPPED[kind]
        field = _field(left, schema)
        if field is None:
            return None
        other = _field(right, schema) if isinstance(right, exp.Column) else None
        if other is not None:  # two columns of one row: only of the same type, not strings
            kind_of = schema.field(field).type
            if kind_of != schema.field(other).type or _is_string(kind_of) or pa.types.is_floating(kind_of):
                return None
            return _COMPARISONS[kind](pc.field(field), pc.field(other))
        value = _literal(right, schema.field(field).type)
        if value is None:
            return None
        if _is_string(schema.field(field).type):
            return _trimmed(field) == pa.scalar(value.as_py().rstrip(" ")) if kind is exp.EQ else None
        return _COMPARISONS[kind](pc.field(field), value)
    if isinstance(condition, exp.Between):
        field = _field(condition.this, schema)
        if field is None:
            return None
        kind = schema.field(field).type
        low, high = _literal(condition.args.get("low"), kind), _literal(condition.args.get("high"), kind)
        if low is None or high is None or _is_string(kind):
            return None
        return (pc.field(field) >= low) & (pc.field(field) <= high)
    if isinstance(condition, exp.In) and not condition.args.get("query") and not condition.args.get("unnest"):
        field = _field(condition.this, schema)
        if field is None:
            return None
        values = [_literal(v, schema.field(field).type) for v in condition.expressions]
        if not values or any(v is None for v in values):
            return None
        if _is_string(schema.field(field).type):
            return _trimmed(field).isin(pa.array([v.as_py().rstrip(" ") for v in values], type=pa.string()))
        return pc.field(field).isin(pa.array([v.as_py() for v in values], type=values[0].type))
    if isinstance(condition, exp.Is) and isinstance(condition.expression, exp.Null):
        field = _field(condition.this, schema)
        return None if field is None else pc.field(field).is_null()
    if isinstance(condition, exp.Not) and isinstance(condition.this, exp.Is) \
            and isinstance(condition.this.expression, exp.Null):
        field = _field(condition.this.this, schema)
        return None if field is None else pc.field(field).is_valid()
    if isinstance(condition, exp.Like) and not condition.args.get("escape"):
        return _like(condition, schema)
    return None


def _like(condition: exp.Like, schema: pa.Schema) -> pc.Expression | None:
    """What every string matching the pattern holds: its fixed start, end and middle pieces
    (``'%special%requests%'``: contains both words, in any order -- a superset), each without
    its trailing spaces, and the end tested on the value without its own (a ``CHAR``'s padding)."""
    field = _field(condition.this, schema)
    pattern = condition.expression
    if field is None or not (isinstance(pattern, exp.Literal) and pattern.is_string) \
            or not _is_string(schema.field(field).type):
        return None
    text = pattern.this
    if "_" in text or "\\" in text:
        return None
    pieces = [piece.rstrip(" ") for piece in text.split("%")]
    if len(pieces) == 1:
        return _trimmed(field) == pa.scalar(pieces[0])
    tests = []
    if pieces[0]:
        tests.append(pc.starts_with(pc.field(field), pattern=pieces[0]))
    if pieces[-1]:
        tests.append(pc.ends_with(_trimmed(field), pattern=pieces[-1]))
    tests += [pc.match_substring(pc.field(field), pattern=piece) for piece in pieces[1:-1] if piece]
    return functools.reduce(operator.and_, tests) if tests else None


def _trimmed(field: str) -> pc.Expression:
    """The string column ``field`` without trailing spaces."""
    return pc.utf8_rtrim(pc.field(field), characters=" ")


def _field(column: exp.Expression, schema: pa.Schema) -> str | None:
    if not isinstance(column, exp.Column) or isinstance(column.this, exp.Star):
        return None
    return column.name if column.name in schema.names else None


def _literal(value: exp.Expression | None, kind: pa.DataType) -> pa.Scalar | None:
    """The literal ``value`` as a scalar compared with a column of type ``kind`` exactly as
    Spark compares them; None for any other pairing."""
    if isinstance(value, exp.Neg) and isinstance(value.this, exp.Literal) and not value.this.is_string:
        positive = _literal(value.this, kind)
        return None if positive is None else pa.scalar(-positive.as_py(), type=positive.type)
    if isinstance(value, exp.Cast) and isinstance(value.this, exp.Literal) and value.this.is_string \
            and value.to.is_type(exp.DataType.Type.DATE) and pa.types.is_date32(kind):
        if not re.fullmatch(r"\d{4}-\d{2}-\d{2}", value.this.this):  # the one form both read alike
            return None
        return pa.scalar(datetime.date.fromisoformat(value.this.this), type=pa.date32())
    if not isinstance(value, exp.Literal):
        return None
    if value.is_string:
        return pa.scalar(value.this, type=pa.string()) if _is_string(kind) else None
    text = value.this
    if pa.types.is_integer(kind):
        return pa.scalar(int(text), type=pa.int64()) if text.lstrip("-").isdigit() else None
    if pa.types.is_decimal(kind):  # an exponent makes Spark's literal a double: compared as doubles
        if "e" in text.lower():
            return None
        number = decimal.Decimal(text)
        return pa.scalar(number) if number.is_finite() else None
    # not floats: Spark orders NaN above every number and equal to itself, Arrow's comparisons
    # are false on it
    return None


def _is_string(kind: pa.DataType) -> bool:
    return pa.types.is_string(kind) or pa.types.is_large_string(kind) or pa.types.is_string_view(kind)


def _plain(rows: pa.Table) -> pa.Table:
    """``rows`` with view columns as plain ones (Arrow's filter has no kernel for views)."""
    if not any(pa.types.is_string_view(f.type) or pa.types.is_binary_view(f.type) for f in rows.schema):
        return rows
    fields = [pa.field(f.name, pa.string() if pa.types.is_string_view(f.type)
                       else pa.binary() if pa.types.is_binary_view(f.type) else f.type, f.nullable)
              for f in rows.schema]
    return rows.cast(pa.schema(fields))

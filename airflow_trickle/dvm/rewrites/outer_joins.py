"""Outer joins that the WHERE clause makes inner."""
from __future__ import annotations

from sqlglot import exp

from airflow_trickle.sql.parse import conjuncts


def null_rejecting_outer_joins_to_inner(query: exp.Expression) -> exp.Expression:
    """A LEFT JOIN whose right item the WHERE clause rejects when NULL is an inner join.

    ``FROM o LEFT JOIN u ON u.k = o.k WHERE NOT u.k IS NULL`` ->
    ``FROM o JOIN u ON u.k = o.k WHERE NOT u.k IS NULL``.  The rows the outer join pads (every
    column of ``u`` NULL) are exactly rows such a condition drops, so both mean the same; but
    an inner join is linear in both inputs, where a LEFT join's right input needs its padding
    transitions (the rows of its changed keys recomputed before and after).
    :func:`subqueries_to_joins` writes ``IN`` and ``EXISTS`` as such LEFT joins, and compares
    scalar subqueries' values in WHERE, so most of them become inner joins here.  A condition
    rejects NULL when it is an AND-ed ``x IS NOT NULL`` or a comparison (``=``, ``<>``, ``<``,
    ``<=``, ``>``, ``>=``, ``LIKE``, ``IN`` (values)) with the column ``x`` itself as an operand.

    >>> from sqlglot import parse_one
    >>> def rewrite(sql): return null_rejecting_outer_joins_to_inner(parse_one(sql, read="spark")).sql("spark")
    >>> rewrite("SELECT o.id FROM s.o AS o LEFT JOIN s.u AS u ON u.k = o.k WHERE NOT u.k IS NULL")
    'SELECT o.id FROM s.o AS o JOIN s.u AS u ON u.k = o.k WHERE NOT u.k IS NULL'
    """
    def swap(node):
        if not isinstance(node, exp.Select) or not node.args.get("joins") or node.args.get("where") is None:
            return node
        rejected = _null_rejected_tables(node.args["where"].this)
        for join in node.args["joins"]:
            if join.side.upper() == "LEFT" and join.kind.upper() in ("", "OUTER") \
                    and join.this.alias_or_name in rejected:
                join.set("side", None)
                join.set("kind", None)
        return node

    return query.transform(swap)


def _null_rejected_tables(condition: exp.Expression) -> set[str]:
    """The tables (aliases) of columns that ``condition``, a WHERE clause, rejects when NULL."""
    found = set()
    for conjunct in conjuncts(condition):
        if isinstance(conjunct, exp.Not) and isinstance(conjunct.this, exp.Is) \
                and isinstance(conjunct.this.expression, exp.Null):
            operands = [conjunct.this.this]
        elif isinstance(conjunct, (exp.EQ, exp.NEQ, exp.GT, exp.GTE, exp.LT, exp.LTE, exp.Like)):
            operands = [conjunct.this, conjunct.expression]
        elif isinstance(conjunct, exp.In) and not conjunct.args.get("query"):
            operands = [conjunct.this]
        else:
            continue
        found |= {o.table for o in operands if isinstance(o, exp.Column) and o.table}
    return found


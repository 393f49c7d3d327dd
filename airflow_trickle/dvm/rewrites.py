"""Auto-rewrite passes: normalise a qualified defining query into the shapes the planner knows.

Each pass is a pure function from a sqlglot expression to a new expression; they run in the
order of :data:`PASSES`.
"""
from __future__ import annotations

from sqlglot import exp


def inline_ctes(query: exp.Expression) -> exp.Expression:
    """Replace references to non-recursive CTEs by the CTE's query as a derived table.

    ``WITH b AS (SELECT x FROM t) SELECT b.x FROM b`` -> ``SELECT b.x FROM (SELECT x FROM t) AS b``
    """
    query = query.copy()
    with_ = query.args.get("with_") or query.args.get("with")
    if not with_:
        return query
    if with_.args.get("recursive"):
        raise ValueError("WITH RECURSIVE")
    definitions = {}
    for cte in with_.expressions:
        body = cte.this
        for name, inner in definitions.items():  # earlier CTEs may be used by later ones
            body = _replace_refs(body, name, inner)
        definitions[cte.alias_or_name] = body
    query.set("with_" if "with_" in query.args else "with", None)
    for name, body in definitions.items():
        query = _replace_refs(query, name, body)
    return query


def _replace_refs(tree: exp.Expression, name: str, body: exp.Expression) -> exp.Expression:
    def swap(node):
        if isinstance(node, exp.Table) and not node.db and node.name == name:
            return exp.Subquery(this=body.copy(), alias=exp.TableAlias(this=exp.to_identifier(node.alias_or_name)))
        return node

    return tree.transform(swap)


def union_to_distinct(query: exp.Expression) -> exp.Expression:
    """``A UNION B`` -> ``SELECT DISTINCT * FROM (A UNION ALL B) AS __trickle_union``.

    Columns of a set operation take the names of its left side.
    """
    def swap(node):
        if isinstance(node, exp.Union) and node.args.get("distinct"):
            left_names = _output_names(node.left)
            inner = exp.union(node.left.copy(), node.right.copy(), distinct=False)
            alias = "__trickle_union"
            select = exp.select(*[exp.column(n, table=alias, quoted=True).as_(n, quoted=True) for n in left_names])
            return select.from_(inner.subquery(alias)).distinct()
        return node

    return query.transform(swap)


def distinct_to_group_by(query: exp.Expression) -> exp.Expression:
    """``SELECT DISTINCT a, b FROM t`` -> ``SELECT a, b FROM t GROUP BY a, b`` (no aggregates).

    A GROUP BY block is maintained with a count per group, which is exactly what DISTINCT needs.
    """
    def swap(node):
        if isinstance(node, exp.Select) and node.args.get("distinct") and not node.args.get("group"):
            if node.args["distinct"].args.get("on"):
                return node
            if any(e.find(exp.AggFunc) for e in node.expressions):
                return node
            rewritten = node.copy()
            rewritten.set("distinct", None)
            rewritten.set("group", exp.Group(expressions=[e.unalias().copy() for e in node.expressions]))
            return rewritten
        return node

    return query.transform(swap)


def _output_names(query: exp.Expression) -> list[str]:
    if isinstance(query, exp.Union):
        return _output_names(query.left)
    return [e.alias_or_name for e in query.expressions]


#: The passes, in the order they run.
PASSES = (inline_ctes, union_to_distinct, distinct_to_group_by)


def normalize(query: exp.Expression) -> exp.Expression:
    for rewrite in PASSES:
        query = rewrite(query)
    return query

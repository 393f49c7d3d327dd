"""Non-recursive CTEs inlined as derived tables."""
from __future__ import annotations

from sqlglot import exp


def inline_ctes(query: exp.Expression) -> exp.Expression:
    """Replace references to non-recursive CTEs by the CTE's query as a derived table.

    ``WITH b AS (SELECT x FROM t) SELECT b.x FROM b`` -> ``SELECT b.x FROM (SELECT x FROM t) AS b``

    >>> from sqlglot import parse_one
    >>> def rewrite(sql): return inline_ctes(parse_one(sql, read="spark")).sql("spark")
    >>> rewrite("WITH b AS (SELECT x FROM t) SELECT b.x FROM b")
    'SELECT b.x FROM (SELECT x FROM t) AS b'
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

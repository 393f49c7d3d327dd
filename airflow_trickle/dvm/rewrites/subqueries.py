"""Subqueries in WHERE and SELECT as joins, where the join means the same in SQL's three-valued logic."""
from __future__ import annotations

from sqlglot import exp
from sqlglot.optimizer.unnest_subqueries import unnest_subqueries as _unnest

from airflow_trickle.dvm.rewrites.refused import SubqueryRefused


def subqueries_to_joins(query: exp.Expression) -> exp.Expression:
    """Subqueries in WHERE and SELECT as LEFT JOINs against grouped derived tables.

    ``WHERE EXISTS (SELECT … FROM c WHERE c.k = o.k)`` ->
    ``LEFT JOIN (SELECT c.k AS _u_1 FROM c GROUP BY c.k) AS _u_0 ON _u_0._u_1 = o.k
    WHERE NOT _u_0._u_1 IS NULL``; ``IN (subquery)`` alike; a correlated scalar aggregate
    ``(SELECT SUM(…) FROM c WHERE c.k = o.k)`` becomes a LEFT JOIN to the sums per key (COUNT
    wrapped in COALESCE(…, 0)), an uncorrelated one in WHERE a CROSS JOIN to its one row.  The
    outer join and the aggregate then have delta rules of their own.  This is sqlglot's
    ``unnest_subqueries``, used only where its result means the same in SQL's three-valued logic:

    * ``EXISTS`` / ``IN`` / ``= ANY`` as a condition of WHERE, joined by AND / OR (``NOT EXISTS``
      too): there, NULL and FALSE both drop the row, so a join that yields FALSE for SQL's
      NULL is exact.  Under any other operator (``NOT IN``, a CASE, the SELECT list) it is not.
    * scalar subqueries only over one aggregate without GROUP BY: exactly one row per key
      (others may return several rows, where SQL raises an error).

    ``NOT IN`` (uncorrelated, one column) is rewritten first by :func:`not_in_to_joins`.
    Subqueries left in place are refused by the planner, naming them.

    >>> from sqlglot import parse_one
    >>> def rewrite(sql): return subqueries_to_joins(parse_one(sql, read="spark")).sql("spark")
    >>> rewrite("SELECT o.id FROM s.o AS o WHERE EXISTS(SELECT 1 FROM s.c AS c WHERE c.k = o.k)")
    'SELECT o.id FROM s.o AS o LEFT JOIN (SELECT c.k AS _u_1 FROM s.c AS c WHERE TRUE GROUP BY c.k) AS _u_0 ON _u_0._u_1 = o.k WHERE NOT _u_0._u_1 IS NULL'
    """
    query = scalars_in_select_to_cross_joins(not_in_to_joins(query))
    for node in query.find_all(exp.Exists, exp.In, exp.Any, exp.Subquery):
        if isinstance(node, exp.Subquery) and isinstance(node.parent, (exp.From, exp.Join, exp.SetOperation)):
            continue  # a table in FROM or JOIN, or a parenthesized operand of UNION / EXCEPT / INTERSECT
        if isinstance(node, exp.In) and not node.args.get("query"):
            continue
        if isinstance(node, exp.Subquery) and not isinstance(node.parent, (exp.In, exp.Any)):
            if not _one_row_aggregate(node.this):
                raise SubqueryRefused("scalar subquery without a single aggregate, or with GROUP BY, HAVING or "
                                      "LIMIT (it may return several rows, or none)")
            continue
        if isinstance(node, exp.Subquery):
            continue  # the query of an IN / ANY: judged with it
        if not _a_where_condition(node):
            kind = "EXISTS" if isinstance(node, exp.Exists) else "IN" if isinstance(node, exp.In) else "ANY"
            raise SubqueryRefused(f"{kind} subquery outside a WHERE condition (or under NOT, except NOT EXISTS)")
    return _unnest(query.copy())


def scalars_in_select_to_cross_joins(query: exp.Expression) -> exp.Expression:
    """An uncorrelated scalar aggregate in the SELECT list -> a CROSS JOIN to its one row.

    ``SELECT o.id, (SELECT MAX(c.id) FROM c) AS m FROM o`` ->
    ``SELECT o.id, __trickle_scalar_0.__trickle_value AS m FROM o CROSS JOIN (SELECT MAX(c.id)
    AS __trickle_value FROM c) AS __trickle_scalar_0``: an aggregate without GROUP BY has exactly
    one row, so the join neither drops nor repeats a row.  (Correlated ones are left to
    ``unnest_subqueries``; sqlglot leaves uncorrelated ones in the SELECT list in place.)

    >>> from sqlglot import parse_one
    >>> def rewrite(sql): return scalars_in_select_to_cross_joins(parse_one(sql, read="spark")).sql("spark")
    >>> rewrite("SELECT o.id, (SELECT MAX(c.id) FROM s.c AS c) AS m FROM s.o AS o")
    'SELECT o.id, __trickle_scalar_0.__trickle_value AS m FROM s.o AS o CROSS JOIN (SELECT MAX(c.id) AS __trickle_value FROM s.c AS c) AS __trickle_scalar_0'
    """
    query = query.copy()
    for index, node in enumerate(list(query.find_all(exp.Subquery))):
        select = node.find_ancestor(exp.Select)
        body = node.this
        if (select is None or isinstance(node.parent, (exp.From, exp.Join, exp.In, exp.Any))
                or not any(node in projection.find_all(exp.Subquery) for projection in select.expressions)
                or not _one_row_aggregate(body) or _is_correlated(body) or select.args.get("group")
                or any(e.find(exp.AggFunc) for e in select.expressions if not e.find(exp.Subquery))):
            continue
        alias, value = f"__trickle_scalar_{index}", "__trickle_value"
        one_row = body.copy()
        one_row.set("expressions", [body.expressions[0].unalias().copy().as_(value)])
        select.join(one_row.subquery(alias), join_type="CROSS", copy=False)
        node.replace(exp.column(value, table=alias))
    return query


def not_in_to_joins(query: exp.Expression) -> exp.Expression:
    """``x NOT IN (SELECT y FROM …)`` as a WHERE condition -> joins with SQL's NULL rules kept.

    NOT IN is TRUE when the subquery is empty, or when x is not NULL, no y is NULL and no y
    equals x; otherwise FALSE or NULL, and WHERE (through AND / OR) keeps the row only when
    TRUE.  So: ``LEFT JOIN (SELECT y FROM … GROUP BY y) AS m ON x = m.y`` and ``CROSS JOIN
    (SELECT COUNT(*) AS n, COUNT(y) AS nn FROM …) AS s``, with the condition
    ``s.n = 0 OR (x IS NOT NULL AND s.nn = s.n AND m.y IS NULL)``.  The subquery must not read
    the outer query's columns (a correlated NOT IN is refused).

    >>> from sqlglot import parse_one
    >>> def rewrite(sql): return not_in_to_joins(parse_one(sql, read="spark")).sql("spark")
    >>> rewritten = rewrite("SELECT o.id FROM s.o AS o WHERE o.k NOT IN (SELECT c.id FROM s.c AS c)")
    >>> rewritten.split(" WHERE ")[-1]
    '(__trickle_notin_stats_0.__trickle_n = 0 OR (NOT o.k IS NULL AND __trickle_notin_stats_0.__trickle_nn = __trickle_notin_stats_0.__trickle_n AND __trickle_notin_0.__trickle_value IS NULL))'
    """
    query = query.copy()
    for index, node in enumerate(list(query.find_all(exp.Not))):
        inner = node.this.unnest() if isinstance(node.this, exp.Paren) else node.this
        if not (isinstance(inner, exp.In) and inner.args.get("query") and _a_where_condition(node)):
            continue
        subquery = inner.args["query"]
        body = subquery.this if isinstance(subquery, exp.Subquery) else subquery
        if isinstance(inner.this, exp.Tuple) or len(body.selects) != 1:
            raise SubqueryRefused("NOT IN over several columns")
        if _is_correlated(body):
            raise SubqueryRefused("correlated NOT IN subquery")
        select = node.find_ancestor(exp.Select)
        column = body.selects[0].alias_or_name
        matches, stats, value = f"__trickle_notin_{index}", f"__trickle_notin_stats_{index}", "__trickle_value"
        rows = body.copy().subquery("__trickle_sub")
        sub_value = exp.column(column, table="__trickle_sub", quoted=True)
        distinct_values = exp.select(sub_value.as_(value)).from_(rows).group_by(sub_value.copy())
        counts = exp.select(exp.func("COUNT", exp.Star()).as_("__trickle_n"),
                            exp.func("COUNT", sub_value.copy()).as_("__trickle_nn")).from_(rows.copy())
        select.join(distinct_values.subquery(matches), join_type="LEFT",
                    on=exp.EQ(this=inner.this.copy(), expression=exp.column(value, table=matches)), copy=False)
        select.join(counts.subquery(stats), join_type="CROSS", copy=False)
        n, nn = exp.column("__trickle_n", table=stats), exp.column("__trickle_nn", table=stats)
        condition = exp.or_(
            exp.EQ(this=n, expression=exp.Literal.number(0)),
            exp.and_(exp.Not(this=exp.Is(this=inner.this.copy(), expression=exp.Null())),
                     exp.EQ(this=nn.copy(), expression=n.copy()),
                     exp.Is(this=exp.column(value, table=matches), expression=exp.Null())))
        node.replace(exp.Paren(this=condition))
    return query


def _one_row_aggregate(body: exp.Expression) -> bool:
    """Whether a subquery is one aggregate without GROUP BY, HAVING or LIMIT: exactly one row."""
    return (isinstance(body, exp.Select) and len(body.expressions) == 1 and body.expressions[0].find(exp.AggFunc)
            is not None and not any(body.args.get(k) for k in ("group", "having", "limit", "offset", "qualify")))


def _is_correlated(body: exp.Expression) -> bool:
    """Whether a (qualified) subquery reads a column of a table it does not itself name."""
    defined = {t.alias_or_name for t in body.find_all(exp.Table)} | \
              {q.alias_or_name for q in body.find_all(exp.Subquery)}
    return any(c.table and c.table not in defined for c in body.find_all(exp.Column))


def _a_where_condition(node: exp.Expression) -> bool:
    """Whether ``node`` is a WHERE condition reached only through AND, OR and parentheses
    (and, for EXISTS, one NOT right above it)."""
    parent = node.parent
    if isinstance(node, exp.Exists) and isinstance(parent, exp.Not):
        node, parent = parent, parent.parent
    while isinstance(parent, (exp.And, exp.Or, exp.Paren)):
        node, parent = parent, parent.parent
    return isinstance(parent, exp.Where)

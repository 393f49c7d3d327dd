"""Auto-rewrite passes: normalise a qualified defining query into the shapes the planner knows.

Each pass is a pure function from a sqlglot expression to a new expression; they run in the
order of :data:`PASSES`.
"""
from __future__ import annotations

from sqlglot import exp
from sqlglot.optimizer.unnest_subqueries import unnest_subqueries as _unnest


class SubqueryRefused(ValueError):
    """A construct a rewrite cannot turn into one of the same meaning; the message names it."""


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

    Columns of a set operation take the names of its left side.  Unions nested in a UNION
    (``A UNION B UNION ALL C``) are flattened into the one DISTINCT: it removes their duplicates
    too, and one aggregate is maintained instead of one per level.
    """
    def swap(node):
        if isinstance(node, exp.Union) and node.args.get("distinct"):
            left_names = _output_names(node.left)
            inputs = [q.copy() for q in _union_inputs(node)]  # nested DISTINCTs: normalize's next round
            inner = inputs[0]
            for other in inputs[1:]:
                inner = exp.union(inner, other, distinct=False)
            alias = "__trickle_union"
            select = exp.select(*[exp.column(n, table=alias, quoted=True).as_(n, quoted=True) for n in left_names])
            return select.from_(inner.subquery(alias)).distinct()
        return node

    return query.transform(swap)


def _union_inputs(node: exp.Expression) -> list[exp.Expression]:
    """The inputs of nested UNION / UNION ALL operations, left to right."""
    if isinstance(node, exp.Union):
        return _union_inputs(node.left) + _union_inputs(node.right)
    return [node]


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
    """
    query = scalars_in_select_to_cross_joins(not_in_to_joins(query))
    for node in query.find_all(exp.Exists, exp.In, exp.Any, exp.Subquery):
        if isinstance(node, exp.Subquery) and isinstance(node.parent, (exp.From, exp.Join)):
            continue
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


#: The input a row of a rewritten INTERSECT / EXCEPT comes from (0: the first).
_INPUT = "__trickle_input"


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
    for conjunct in _conjuncts(condition):
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


def _conjuncts(condition: exp.Expression) -> list[exp.Expression]:
    """The AND-ed terms of ``condition``, parentheses removed."""
    condition = condition.unnest()
    if isinstance(condition, exp.And):
        return _conjuncts(condition.this) + _conjuncts(condition.expression)
    return [condition]


def set_operations_to_group_by(query: exp.Expression) -> exp.Expression:
    """``A INTERSECT B`` / ``A EXCEPT B`` -> a GROUP BY over the inputs, counting each one's copies.

    ``SELECT c FROM (SELECT c, 0 AS i FROM A UNION ALL SELECT c, 1 FROM B) GROUP BY c
    HAVING COUNT_IF(i = 0) > 0 AND COUNT_IF(i = 1) > 0`` (EXCEPT: ``= 0``); a chain of one
    operator (``A EXCEPT B EXCEPT C``) is one GROUP BY over all its inputs.  Set operations
    compare rows with NULLs as equal, as GROUP BY does; their columns take the names of the
    first input.  A row comes and goes exactly with its last copy on either side.
    ``INTERSECT ALL`` / ``EXCEPT ALL`` keep min(l, r) / l − r copies of a row, which a GROUP BY
    cannot emit: they are refused.
    """
    def swap(node):
        if not isinstance(node, (exp.Intersect, exp.Except)):
            return node
        label = "INTERSECT" if isinstance(node, exp.Intersect) else "EXCEPT"
        if not node.args.get("distinct"):
            raise SubqueryRefused(f"{label} ALL")
        inputs = [node.right]
        first = node.left
        while type(first) is type(node) and first.args.get("distinct"):  # a left-deep chain of one operator
            inputs.insert(0, first.right)
            first = first.left
        inputs.insert(0, first)
        names = _output_names(first)
        sides = []
        for index, side in enumerate(inputs):
            side_names = _output_names(side)
            if len(side_names) != len(names) or len(set(side_names)) != len(side_names):
                raise SubqueryRefused(f"{label} of queries with different or repeated column names")
            sides.append(exp.select(
                *[exp.column(n, table="__trickle_side", quoted=True).as_(m, quoted=True)
                  for n, m in zip(side_names, names)],
                exp.Literal.number(index).as_(_INPUT),
            ).from_(side.copy().subquery("__trickle_side")))  # a nested set operation: normalize's next round
        alias = "__trickle_set"
        keys = [exp.column(n, table=alias, quoted=True) for n in names]

        def copies(index: int) -> exp.Expression:
            from_input = exp.EQ(this=exp.column(_INPUT, table=alias), expression=exp.Literal.number(index))
            return exp.func("COUNT_IF", from_input)

        others = exp.GT if label == "INTERSECT" else exp.EQ
        having = exp.and_(exp.GT(this=copies(0), expression=exp.Literal.number(0)),
                          *[others(this=copies(i), expression=exp.Literal.number(0)) for i in range(1, len(inputs))])
        union = sides[0]
        for side in sides[1:]:
            union = exp.union(union, side, distinct=False)
        return (exp.select(*[k.copy().as_(n, quoted=True) for k, n in zip(keys, names)])
                .from_(union.subquery(alias)).group_by(*keys).having(having))

    return query.transform(swap)


def _output_names(query: exp.Expression) -> list[str]:
    if isinstance(query, exp.SetOperation):
        return _output_names(query.left)
    return [e.alias_or_name for e in query.expressions]


#: The passes, in the order they run.
PASSES = (inline_ctes, subqueries_to_joins, null_rejecting_outer_joins_to_inner, set_operations_to_group_by,
          union_to_distinct, distinct_to_group_by)


def normalize(query: exp.Expression) -> exp.Expression:
    """Every pass, each until nothing changes (``transform`` does not revisit what it replaced,
    so a DISTINCT nested in a rewritten UNION needs a second round)."""
    for rewrite in PASSES:
        for _ in range(10):
            rewritten = rewrite(query)
            if rewritten == query:
                break
            query = rewritten
    return query

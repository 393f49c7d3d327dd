"""UNION, DISTINCT, INTERSECT and EXCEPT as GROUP BY: a count per group is what each needs."""
from __future__ import annotations

from sqlglot import exp

from airflow_trickle.dvm.rewrites.refused import SubqueryRefused

#: The input a row of a rewritten INTERSECT / EXCEPT comes from (0: the first).
_INPUT = "__trickle_input"


def union_to_distinct(query: exp.Expression) -> exp.Expression:
    """``A UNION B`` -> ``SELECT DISTINCT * FROM (A UNION ALL B) AS __trickle_union``.

    Columns of a set operation take the names of its left side.  Unions nested in a UNION
    (``A UNION B UNION ALL C``) are flattened into the one DISTINCT: it removes their duplicates
    too, and one aggregate is maintained instead of one per level.

    >>> from sqlglot import parse_one
    >>> def rewrite(sql): return union_to_distinct(parse_one(sql, read="spark")).sql("spark")
    >>> rewrite("SELECT a FROM s.t UNION SELECT b FROM s.u")
    'SELECT DISTINCT `__trickle_union`.`a` AS `a` FROM (SELECT a FROM s.t UNION ALL SELECT b FROM s.u) AS __trickle_union'
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


def unwrap_set_operands(query: exp.Expression) -> exp.Expression:
    """``A UNION ALL (SELECT ...)`` -> ``A UNION ALL SELECT ...``: a parenthesized SELECT operand
    of a set operation, without its own ORDER BY or LIMIT, is the SELECT itself.

    The other passes and the planner read a set operation's operands as SELECTs; a nested set
    operation keeps its parentheses (they decide what it means).

    >>> from sqlglot import parse_one
    >>> def rewrite(sql): return unwrap_set_operands(parse_one(sql, read="spark")).sql("spark")
    >>> rewrite("(SELECT a FROM s.t) INTERSECT (SELECT b FROM s.u)")
    'SELECT a FROM s.t INTERSECT SELECT b FROM s.u'
    >>> rewrite("SELECT a FROM s.t UNION ALL (SELECT b FROM s.u ORDER BY b LIMIT 3)")
    'SELECT a FROM s.t UNION ALL (SELECT b FROM s.u ORDER BY b LIMIT 3)'
    """
    def unwrap(node):
        if (isinstance(node, exp.Subquery) and isinstance(node.parent, exp.SetOperation) and not node.alias
                and isinstance(node.this, exp.Select)
                and not any(node.this.args.get(k) for k in ("order", "limit", "offset"))):
            return node.this.copy()
        return node

    return query.transform(unwrap)


def distinct_to_group_by(query: exp.Expression) -> exp.Expression:
    """``SELECT DISTINCT a, b FROM t`` -> ``SELECT a, b FROM t GROUP BY a, b`` (no aggregates).

    A GROUP BY block is maintained with a count per group, which is exactly what DISTINCT needs.

    >>> from sqlglot import parse_one
    >>> def rewrite(sql): return distinct_to_group_by(parse_one(sql, read="spark")).sql("spark")
    >>> rewrite("SELECT DISTINCT a, b FROM s.t")
    'SELECT a, b FROM s.t GROUP BY a, b'

    Over window functions, which a GROUP BY cannot hold, the windows are computed in a derived
    table and the DISTINCT taken over its rows:

    >>> rewrite("SELECT DISTINCT a, MIN(b) OVER (PARTITION BY a) AS m FROM s.t")
    'SELECT __trickle_distinct.a AS a, __trickle_distinct.m AS m FROM (SELECT a, MIN(b) OVER (PARTITION BY a) AS m FROM s.t) AS __trickle_distinct GROUP BY __trickle_distinct.a, __trickle_distinct.m'
    """
    def swap(node):
        if isinstance(node, exp.Select) and node.args.get("distinct") and not node.args.get("group"):
            if node.args["distinct"].args.get("on"):
                return node
            if any(e.find(exp.Window) for e in node.expressions):
                return _distinct_over_windows(node)
            if any(e.find(exp.AggFunc) for e in node.expressions):
                return node
            rewritten = node.copy()
            rewritten.set("distinct", None)
            rewritten.set("group", exp.Group(expressions=[e.unalias().copy() for e in node.expressions]))
            return rewritten
        return node

    return query.transform(swap)


def _distinct_over_windows(select: exp.Select) -> exp.Select:
    """``SELECT DISTINCT <windows> FROM ...`` as a GROUP BY over a derived table of the windows;
    as it is when an output has no name, or an aggregate stands outside the windows."""
    names = [e.alias_or_name for e in select.expressions]
    if not all(names) or len({n.lower() for n in names}) < len(names) or any(
            a.find_ancestor(exp.Window) is None for e in select.expressions for a in e.find_all(exp.AggFunc)):
        return select
    inner = select.copy()
    inner.set("distinct", None)
    alias = "__trickle_distinct"
    columns = [exp.column(name, table=alias) for name in names]
    return (exp.select(*[exp.alias_(c, name) for c, name in zip(columns, names)])
            .from_(inner.subquery(alias)).group_by(*[c.copy() for c in columns]))


def set_operations_to_group_by(query: exp.Expression) -> exp.Expression:
    """``A INTERSECT B`` / ``A EXCEPT B`` -> a GROUP BY over the inputs, counting each one's copies.

    ``SELECT c FROM (SELECT c, 0 AS i FROM A UNION ALL SELECT c, 1 FROM B) GROUP BY c
    HAVING COUNT_IF(i = 0) > 0 AND COUNT_IF(i = 1) > 0`` (EXCEPT: ``= 0``); a chain of one
    operator (``A EXCEPT B EXCEPT C``) is one GROUP BY over all its inputs.  Set operations
    compare rows with NULLs as equal, as GROUP BY does; their columns take the names of the
    first input.  A row comes and goes exactly with its last copy on either side.
    ``INTERSECT ALL`` / ``EXCEPT ALL`` keep min(l, r) / l − r copies of a row, which a GROUP BY
    cannot emit: they are left to their own operator (``set_all.py``).

    >>> from sqlglot import parse_one
    >>> def rewrite(sql): return set_operations_to_group_by(parse_one(sql, read="spark")).sql("spark")
    >>> rewritten = rewrite("SELECT a FROM s.t INTERSECT SELECT b FROM s.u")
    >>> rewritten.split(" HAVING ")[1]
    'COUNT_IF(__trickle_set.__trickle_input = 0) > 0 AND COUNT_IF(__trickle_set.__trickle_input = 1) > 0'
    >>> rewrite("SELECT a FROM s.t INTERSECT ALL SELECT b FROM s.u")  # left to its own operator
    'SELECT a FROM s.t INTERSECT ALL SELECT b FROM s.u'
    """
    def swap(node):
        if not isinstance(node, (exp.Intersect, exp.Except)) or not node.args.get("distinct"):
            return node
        label = "INTERSECT" if isinstance(node, exp.Intersect) else "EXCEPT"
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

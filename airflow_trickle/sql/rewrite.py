"""Rewrites of a whole defining query that every refresh mode needs."""
from __future__ import annotations

import re

from sqlglot import exp

from airflow_trickle.names import DEFAULT_DATABASE
from airflow_trickle.sql.parse import source_tables, table_name


def pin_sources(
    query: exp.Query,
    versions: dict[str, int | None],
    visible_columns: dict[str, list[str]] | None = None,
    *,
    database: str = DEFAULT_DATABASE,
) -> exp.Query:
    """Read every source at a fixed Delta version, and hide ``__trickle_*`` columns of stream tables.

    ``versions`` maps qualified source names to a version (``None``: latest).  A source named in
    ``visible_columns`` (an upstream stream table) is replaced by a subquery that selects only
    those columns, so ``SELECT *`` over a stream table never sees its hidden columns.

    ``SELECT * FROM shop.orders o`` with ``{"shop.orders": 7}`` ->
    ``SELECT * FROM shop.orders VERSION AS OF 7 AS o``
    """
    pinned = query.copy()
    visible_columns = visible_columns or {}
    for node in source_tables(pinned):
        name = table_name(node, database=database)
        version = versions.get(name)
        alias = node.alias or node.name
        bare = exp.Table(this=exp.to_identifier(node.name), db=exp.to_identifier(node.db or database))
        if version is not None:
            bare.set("version", exp.Version(this="VERSION", kind="AS OF", expression=exp.Literal.number(version)))
        if name in visible_columns:
            inner = exp.select(*[exp.column(c, quoted=True) for c in visible_columns[name]]).from_(bare)
            node.replace(inner.subquery(exp.to_identifier(alias)))
        else:
            bare.set("alias", exp.TableAlias(this=exp.to_identifier(alias)))
            node.replace(bare)
    return pinned


def name_outputs(query: exp.Query, names: list[str]) -> exp.Query:
    """Give every unnamed output expression of ``query`` the name Spark gives it.

    Spark names an unaliased expression by its text (``SUM(l_quantity)`` -> ``sum(l_quantity)``);
    the incremental plan needs every output column named in the query itself, so the stored query
    carries Spark's names as aliases.  ``names`` are the output columns as Spark analysed them,
    in order.  A projection list with a ``*`` is left as it is (its positions are not known
    before expansion); so is anything already named as Spark names it.

    ``SELECT cid, SUM(amount) FROM s.o GROUP BY cid`` with ``["cid", "sum(amount)"]`` ->
    ``SELECT cid, SUM(amount) AS `sum(amount)` FROM s.o GROUP BY cid``
    """
    named = query.copy()
    select = named
    while isinstance(select, exp.SetOperation):  # a UNION takes its column names from its first input
        select = select.this
    if isinstance(select, exp.Subquery):
        select = select.unnest()
    if not isinstance(select, exp.Select):
        return named
    projections = select.expressions
    if len(projections) != len(names) or any(isinstance(p, exp.Star) or p.is_star for p in projections):
        return named
    for projection, name in zip(list(projections), names):
        if projection.alias_or_name != name:
            target = projection.this if isinstance(projection, exp.Alias) else projection
            projection.replace(exp.alias_(target.copy(), exp.to_identifier(name, quoted=True)))
    return named


def restored_names(query: exp.Query, names: list[str]) -> exp.Query:
    """After sqlglot's ``qualify``, the output names Spark gave ``query`` before it: a name that
    differs only in case (``AS Revenue`` became ``revenue``) or that ``qualify`` made up for an
    unnamed expression (``_col_2``) is given back.  Any other difference is left for the caller's
    schema check to refuse: renaming by position could swap two columns of one type.

    >>> from sqlglot import parse_one
    >>> restored_names(parse_one("SELECT k AS revenue, SUM(v) AS _col_1, a AS b FROM t"),
    ...                ["Revenue", "sum(v)", "c"]).sql()
    'SELECT k AS "Revenue", SUM(v) AS "sum(v)", a AS b FROM t'
    """
    named = query.copy()
    select = named
    while isinstance(select, exp.SetOperation):  # a UNION takes its column names from its first input
        select = select.this
    select = select.unnest() if isinstance(select, exp.Subquery) else select
    if not isinstance(select, exp.Select) or len(select.expressions) != len(names):
        return named
    for projection, name in zip(list(select.expressions), names):
        current = projection.alias_or_name
        if current != name and (current.lower() == name.lower() or re.fullmatch(r"_col_\d+", current)):
            target = projection.this if isinstance(projection, exp.Alias) else projection
            projection.replace(exp.alias_(target.copy(), exp.to_identifier(name, quoted=True)))
    return named


def ordered_outputs(query: exp.Query, names: list[str]) -> exp.Query:
    """``query``'s output expressions put in the order of ``names`` (each named once, any case).

    Why: sqlglot expands ``t.*`` in ``t``'s own column order, where Spark puts the key of a
    ``JOIN ... USING (k)`` first; the stored query must give the columns Spark gave.  A query
    whose outputs are not exactly ``names``, or that is a set operation (its inputs line up by
    position), is returned as it is.

    >>> from sqlglot import parse_one
    >>> ordered_outputs(parse_one("SELECT a, b AS k, c FROM t"), ["k", "a", "c"]).sql()
    'SELECT b AS k, a, c FROM t'
    """
    ordered = query.copy()
    select = ordered.unnest() if isinstance(ordered, exp.Subquery) else ordered
    if not isinstance(select, exp.Select):
        return ordered
    by_name = {p.alias_or_name.lower(): p for p in select.expressions}
    if len(by_name) != len(select.expressions) or sorted(by_name) != sorted(n.lower() for n in names):
        return ordered
    select.set("expressions", [by_name[n.lower()] for n in names])
    return ordered


def row_hash_sql(columns: list[str], *, qualifier: str | None = None) -> str:
    """A NULL-safe, position-aware 64-bit hash of ``columns`` in Spark SQL (runs in the JVM).

    Spark's ``xxhash64(a, b)`` skips NULL arguments, so ``(1, NULL)`` and ``(NULL, 1)`` would
    collide.  Interleaving a never-NULL ``isnull`` flag before each value anchors every value
    to its position: ``xxhash64(isnull(a), a, isnull(b), b)``.
    """
    prefix = f"{qualifier}." if qualifier else ""
    args = []
    for column in columns:
        ref = f"{prefix}`{column}`"
        args.extend([f"isnull({ref})", ref])
    return f"xxhash64({', '.join(args)})"


def hoist_nested_ctes(statement: str) -> str:
    """``statement`` with every CTE defined inside its query moved up into the query's own
    WITH (before the CTE that used it), identical definitions kept once.

    Spark 4.2 cannot plan a WITH nested inside a CTE's definition (``InlineCTE``: "key not
    found"); the delta of a recursive CTE is such a WITH once an applier wraps it in its own
    CTE.  Only statements with ``WITH RECURSIVE`` need this, so the others are returned as they
    are, unparsed.

    ``WITH h AS (SELECT * FROM (WITH RECURSIVE r AS (...) SELECT * FROM r) AS x) SELECT * FROM h``
    -> ``WITH RECURSIVE r AS (...), h AS (SELECT * FROM (SELECT * FROM r) AS x) SELECT * FROM h``
    """
    if "WITH RECURSIVE" not in statement.upper():
        return statement
    import sqlglot
    from sqlglot.transforms import move_ctes_to_top_level

    from airflow_trickle.sql.parse import DIALECT

    tree = sqlglot.parse_one(statement, read=DIALECT)
    if isinstance(tree, exp.Merge):
        using = tree.args.get("using")
        root = using.this if isinstance(using, exp.Subquery) else None
    elif isinstance(tree, exp.Insert):
        root = tree.expression
    else:
        root = tree
    if not isinstance(root, exp.Query) or not any(w.parent is not root for w in root.find_all(exp.With)):
        return statement
    move_ctes_to_top_level(root)
    top = root.args.get("with_") or root.args.get("with")
    kept: dict[str, exp.CTE] = {}
    for cte in top.expressions:
        name = cte.alias_or_name
        if name in kept and kept[name] != cte:
            raise ValueError(f"two different CTEs named {name} in one statement")
        kept.setdefault(name, cte)
    top.set("expressions", list(kept.values()))
    return tree.sql(DIALECT)

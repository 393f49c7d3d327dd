"""The planner: a qualified defining query -> an operator tree, or :class:`Unsupported`.

The query is normalised first (``rewrites/``: CTEs inlined, DISTINCT and UNION as GROUP BY),
then each SELECT becomes a :class:`~airflow_trickle.dvm.block.Block` over its FROM items (a
:class:`~airflow_trickle.dvm.scan.Scan` or a nested query), and ``UNION ALL`` a
:class:`~airflow_trickle.dvm.union.UnionAll`; an outermost ``ORDER BY … LIMIT`` wraps the tree
in a :class:`~airflow_trickle.dvm.topk.TopK`; a ``WITH RECURSIVE`` CTE becomes a
:class:`~airflow_trickle.dvm.recursive.Recursive` that the query reads like a table.  Anything
else is refused with its name.
"""
from __future__ import annotations

from sqlglot import exp

from airflow_trickle.dvm.base import ITEM, Node, Unsupported
from airflow_trickle.dvm.block import Block, JoinKind, JoinStep
from airflow_trickle.dvm.generator import has_generators
from airflow_trickle.dvm.join_plan import join_kind, join_step
from airflow_trickle.dvm.rewrites import SubqueryRefused, normalize
from airflow_trickle.dvm.set_all import SetAll
from airflow_trickle.dvm.scan import Scan
from airflow_trickle.dvm.topk import SortKey, TopK
from airflow_trickle.dvm.union import UnionAll
from airflow_trickle.names import DEFAULT_DATABASE
from airflow_trickle.sql.parse import DIALECT, parse_query, source_names, table_name


_UNSUPPORTED_NODES = {
    exp.Qualify: "QUALIFY",
    exp.Pivot: "PIVOT",
    exp.TableSample: "TABLESAMPLE",
    exp.Rollup: "ROLLUP",
    exp.Cube: "CUBE",
    exp.GroupingSets: "GROUPING SETS",
    exp.Limit: "LIMIT inside a subquery (only the outermost query may end in ORDER BY ... LIMIT)",
    exp.Offset: "OFFSET inside a subquery (only the outermost query may end in ORDER BY ... LIMIT)",
}


def plan(defining_query: str, columns: dict[str, list[str]], *, database: str = DEFAULT_DATABASE) -> Node:
    """Build the operator tree of a qualified defining query; raise :class:`Unsupported`.

    ``columns`` maps each source to its visible columns.
    """
    query = parse_query(defining_query)
    with_ = query.args.get("with_") or query.args.get("with")  # the key's name differs across sqlglot versions
    ctes: dict[str, Node] = {}
    if with_ is not None and with_.args.get("recursive"):
        query, ctes = _plan_recursive(query, with_, columns, database)
    query, top_k = _split_top_k(query)
    for node_type, label in _UNSUPPORTED_NODES.items():
        if query.find(node_type):
            raise Unsupported(label)
    try:
        query = normalize(query)
    except SubqueryRefused as err:
        raise Unsupported(str(err)) from None
    if isinstance(query, (exp.Select, exp.Union)) and query.args.get("order"):
        query.set("order", None)  # row order of a stored table is not kept anyway
    node = _plan_query(query, columns, database, ctes)
    if top_k is None:
        return node
    order, limit, offset = top_k
    return TopK(child=node, order=order, limit=limit, offset=offset)


def is_top_k(defining_query: str) -> bool:
    """Whether the query ends in ``ORDER BY … LIMIT k`` (or OFFSET): kept as a :class:`TopK`.

    >>> is_top_k("SELECT a FROM t ORDER BY a LIMIT 3"), is_top_k("SELECT a FROM (SELECT a FROM t LIMIT 3) s")
    (True, False)
    """
    query = parse_query(defining_query)
    return query.args.get("limit") is not None or query.args.get("offset") is not None


def _split_top_k(query: exp.Expression) -> tuple[exp.Expression, tuple[list[SortKey], int, int] | None]:
    """The query without its outermost ``ORDER BY … LIMIT k OFFSET m``, and those (or None).

    ``SELECT a, b FROM t ORDER BY b DESC LIMIT 3`` -> ``SELECT a, b FROM t``, ([b DESC NULLS LAST], 3, 0)
    """
    limit, offset, order = (query.args.get(k) for k in ("limit", "offset", "order"))
    if limit is None and offset is None:
        return query, None
    if order is None:
        raise Unsupported("LIMIT without ORDER BY (which rows it keeps is not deterministic: add an ORDER BY)")
    first = query
    while isinstance(first, (exp.Union, exp.Subquery)):
        first = first.this
    projections = first.expressions if isinstance(first, exp.Select) else []
    names = [p.alias_or_name for p in projections]
    keys = [_sort_key(ordered, projections, names) for ordered in order.expressions]
    rest = query.copy()
    for key in ("limit", "offset", "order"):
        rest.set(key, None)
    return rest, (keys, _count(limit, "LIMIT"), _count(offset, "OFFSET") if offset is not None else 0)


def _sort_key(ordered: exp.Ordered, projections: list[exp.Expression], names: list[str]) -> SortKey:
    """An ORDER BY term of a top-K as an output column (by name, position or expression)."""
    term = ordered.this
    descending = bool(ordered.args.get("desc"))
    nulls_first = ordered.args.get("nulls_first")
    nulls_first = (not descending) if nulls_first is None else bool(nulls_first)  # Spark's default
    name = None
    if isinstance(term, exp.Literal) and not term.is_string and term.name.isdigit():
        position = int(term.name)
        if 1 <= position <= len(names):
            name = names[position - 1]
    elif isinstance(term, exp.Column) and not term.table and term.name in names:
        name = term.name
    else:
        for projection, projected in zip(projections, names):
            if (projection.this if isinstance(projection, exp.Alias) else projection) == term:
                name = projected
                break
    if name is None:
        raise Unsupported(f"ORDER BY {term.sql(DIALECT)} with LIMIT: a top-K may only be ordered by its "
                          "output columns (add the expression to the SELECT list)")
    return SortKey(column=name, descending=descending, nulls_first=nulls_first)


def _count(clause: exp.Expression, label: str) -> int:
    value = clause.expression
    if not (isinstance(value, exp.Literal) and not value.is_string and value.name.isdigit()):
        raise Unsupported(f"{label} {value.sql(DIALECT) if value else ''} that is not a constant whole number")
    return int(value.name)


def _plan_query(query: exp.Expression, columns, database, ctes: dict[str, Node] | None = None) -> Node:
    """``ctes``: the recursive CTEs the query may read, by name (planned by :func:`_plan_recursive`)."""
    if isinstance(query, exp.Union):
        if query.args.get("distinct"):
            raise Unsupported("UNION")  # rewritten before; defensive
        left, right = (_plan_query(query.left, columns, database, ctes),
                       _plan_query(query.right, columns, database, ctes))
        inputs = (left.inputs if isinstance(left, UnionAll) else [left]) + [right]
        if any(len(c.columns) != len(left.columns) for c in inputs):
            raise Unsupported("UNION ALL of different column counts")
        return UnionAll(inputs=inputs, columns=list(left.columns))
    if isinstance(query, (exp.Intersect, exp.Except)):
        if query.args.get("distinct"):
            raise Unsupported(query.key.upper())  # rewritten before; defensive
        left, right = (_plan_query(query.left, columns, database, ctes),
                       _plan_query(query.right, columns, database, ctes))
        if len(left.columns) != len(right.columns):
            raise Unsupported(f"{query.key.upper()} ALL of different column counts")
        return SetAll(left=left, right=right, intersect=isinstance(query, exp.Intersect))
    if isinstance(query, exp.Subquery):
        return _plan_query(query.this, columns, database, ctes)
    if not isinstance(query, exp.Select):
        raise Unsupported(f"{query.key.upper()} query")
    return _plan_select(query, columns, database, ctes or {})


def _plan_select(select: exp.Select, columns, database, ctes: dict[str, Node]) -> Block:
    if select.args.get("distinct"):
        windows = any(e.find(exp.Window) for e in select.expressions)
        raise Unsupported(f"SELECT DISTINCT {'over window functions and aggregates together' if windows else 'with aggregates'}")
    for key in ("where", "having"):
        clause = select.args.get(key)
        if clause is not None and clause.find(exp.Subquery, exp.Exists, exp.Select):
            raise Unsupported(f"subquery in {key.upper()}")
    for projection in select.expressions:
        if projection.find(exp.Subquery, exp.Select):
            raise Unsupported("scalar subquery in the SELECT list")
        if isinstance(projection, exp.Star) or (projection.find(exp.Star) and not projection.find(exp.Count)):
            raise Unsupported("unexpanded *")
    for lateral in select.args.get("laterals") or []:
        if lateral.find(exp.Select):
            raise Unsupported("LATERAL VIEW over a subquery")
    for clause in [select.args.get("from_") or select.args.get("from")] + (select.args.get("joins") or []):
        if clause is not None and clause.find(exp.Lateral):
            raise Unsupported("LATERAL (subquery)")
    template = select.copy()
    from_ = template.args.get("from_") or template.args.get("from")
    if from_ is None:
        raise Unsupported("SELECT without FROM")
    slots: list[exp.Expression] = [from_]
    kinds = [JoinKind.INNER]
    for index, join in enumerate(template.args.get("joins") or [], start=1):
        kinds.append(join_kind(join, index, from_))
        slots.append(join)
    items: list[tuple[str, Node]] = []
    for index, slot in enumerate(slots):
        source = slot.this
        alias = source.alias_or_name
        if isinstance(source, exp.Table) and not source.db and source.name.lower() in ctes:
            node: Node = ctes[source.name.lower()]
        elif isinstance(source, exp.Table):
            name = table_name(source, database=database)
            if name not in columns:
                raise Unsupported(f"table {name} without known columns")
            node = Scan(name=name, columns=list(columns[name]))
        elif isinstance(source, exp.Subquery):
            node = _plan_query(source.this, columns, database, ctes)
        else:
            raise Unsupported(f"FROM item {source.key}")
        items.append((alias, node))
        slot.set("this", exp.Table(this=exp.to_identifier(ITEM.format(index)),
                                   alias=exp.TableAlias(this=exp.to_identifier(alias))))
    for alias, node in items:  # the FROM items are placeholders now: only this SELECT's reads are seen
        if isinstance(node, Scan):
            node.columns = read_columns(template, alias, node.columns)
    aliases = [alias for alias, _ in items]
    steps = [JoinStep()] + [join_step(slot, kind, aliases[:i], aliases[i]) for i, (slot, kind)
                            in enumerate(zip(slots[1:], kinds[1:]), start=1)]
    names = [e.alias_or_name for e in select.expressions]
    group = select.args.get("group")
    aggregates = list(dict.fromkeys(a for e in select.expressions for a in e.find_all(exp.AggFunc)
                                    if not a.find_ancestor(exp.Window)))
    having = select.args.get("having")
    if having is not None:
        aggregates += [a for a in having.find_all(exp.AggFunc) if a not in aggregates]
    if (group is not None or aggregates) and has_generators(select):
        raise Unsupported("generator function in the SELECT list of an aggregate")
    windows = [w for e in select.expressions for w in e.find_all(exp.Window)]
    if windows:
        if group is not None or aggregates:
            raise Unsupported("window function over an aggregate (GROUP BY and windows in one SELECT)")
        return Block(template=template, items=items, columns=names, steps=steps, window_keys=_window_keys(windows))
    if group is None and not aggregates:
        return Block(template=template, items=items, columns=names, steps=steps)
    group_exprs = [g.copy() for g in (group.expressions if group else [])]
    return Block(template=template, items=items, columns=names, group=group_exprs, aggregates=aggregates, steps=steps)


def read_columns(select: exp.Select, alias: str, columns: list[str]) -> list[str]:
    """The columns of the table ``alias`` names in ``select`` that the SELECT reads, in the
    table's order; all of them when that cannot be told (an unqualified column or ``alias.*``).

    Why: a scan reads only what it needs, but the change of a table read once and handed to
    Spark (``refresh/changes_once.py``) carries every column its scans list -- a wide table's
    change would travel whole to feed a join that reads four of its columns (benchmarks/README.md,
    "TPC-H at SF 3, all 22: scans read only the columns they use").  Projecting a
    weighted change is exact: the rows that differ only in columns not read sum their weights.
    A table no column of which is read (``COUNT(*)``) keeps its first, to stay a valid SELECT.

    >>> from sqlglot import parse_one
    >>> select = parse_one("SELECT t.a, COUNT(*) AS n FROM s.t AS t WHERE t.c > 0 GROUP BY t.a")
    >>> read_columns(select, "t", ["a", "b", "c"]), read_columns(select, "u", ["x", "y"])
    (['a', 'c'], ['x'])
    >>> read_columns(parse_one("SELECT a FROM s.t AS t"), "t", ["a", "b"])
    ['a', 'b']
    """
    wanted, known = set(), {c.lower() for c in columns}
    for column in select.find_all(exp.Column):
        if isinstance(column.this, exp.Star) or column.args.get("db") or (
                not column.table and column.name.lower() in known):
            if column.table in ("", alias):
                return list(columns)
        elif column.table == alias:
            wanted.add(column.name.lower())
    read = [c for c in columns if c.lower() in wanted]
    return read or list(columns[:1])


def _plan_recursive(query: exp.Query, with_: exp.With, columns, database) -> tuple[exp.Query, dict[str, Node]]:
    """The query without its ``WITH RECURSIVE`` clause, and its recursive CTE planned as a
    :class:`~airflow_trickle.dvm.recursive.Recursive` (see there for what is maintained).

    ``WITH RECURSIVE r(a, b) AS (SELECT a, b FROM t UNION ALL SELECT r.a, e.b FROM r JOIN e ON
    r.b = e.a) SELECT a, b FROM r`` -> ``SELECT a, b FROM r``, {"r": Recursive(r, base t, step
    through e)}
    """
    from airflow_trickle.dvm.recursive import Recursive, reads_cte
    from airflow_trickle.sql.parse import non_monotone_constructs

    if len(with_.expressions) != 1:
        raise Unsupported("WITH RECURSIVE with more than one CTE (a single recursive CTE is maintained)")
    cte = with_.expressions[0]
    name = cte.alias_or_name.lower()

    def reads_itself(node: exp.Expression) -> list[exp.Table]:
        return [t for t in node.find_all(exp.Table) if reads_cte(t, name)]

    body = cte.this
    if not reads_itself(body):
        raise Unsupported("WITH RECURSIVE whose CTE does not read itself (write it without RECURSIVE)")
    if not isinstance(body, exp.Union) or body.args.get("distinct") or not isinstance(body.expression, exp.Select):
        raise Unsupported("a recursive CTE that is not `base UNION ALL recursive SELECT`")
    base, step = body.this, body.expression
    if reads_itself(base):
        raise Unsupported(f"a recursive CTE {name} whose base query reads {name} (only the last term may)")
    if step.find(exp.Subquery) or any(s is not step for s in step.find_all(exp.Select)):
        raise Unsupported("a subquery in the recursive term")
    blocking = non_monotone_constructs(step) + (["LATERAL VIEW"] if step.args.get("laterals") else [])
    if blocking:
        raise Unsupported(f"a recursive term with {blocking[0]} (not monotone: recomputed instead)")
    selves = reads_itself(step)
    if len(selves) != 1:
        raise Unsupported(f"a recursive term that reads {name} {len(selves)} times (only linear recursion "
                          "is maintained)")
    others = [t for t in step.find_all(exp.Table) if t is not selves[0]]
    if len(others) > 1:
        raise Unsupported("a recursive term that joins more than one other table")
    other = None
    if others:
        other_name = table_name(others[0], database=database)
        if other_name not in columns:
            raise Unsupported(f"table {other_name} without known columns")
        other = Scan(name=other_name, columns=list(columns[other_name]))
    base_node = _plan_query(normalize(base.copy()), columns, database)
    alias = cte.args.get("alias")
    names = [c.name for c in alias.columns] if alias is not None and alias.columns else list(base_node.columns)
    if len(names) != len(base_node.columns) or len(step.expressions) != len(names):
        raise Unsupported(f"a recursive CTE {name} whose terms have different column counts")
    node = Recursive(name=name, columns=names, base=base_node, step=step.copy(),
                     self_alias=selves[0].alias_or_name, other=other,
                     other_alias=others[0].alias_or_name if others else None)
    rest = query.copy()
    rest.set("with_" if "with_" in rest.args else "with", None)
    return rest, {name: node}


def _window_keys(windows: list[exp.Window]) -> list[exp.Expression]:
    """The PARTITION BY expressions every window shares (empty: none in common)."""
    shared = None
    for window in windows:
        if window.find(exp.Select):
            raise Unsupported("subquery in a window function")
        keys = {e.sql(DIALECT): e for e in window.args.get("partition_by") or []}
        shared = keys if shared is None else {k: e for k, e in shared.items() if k in keys}
    return [e.copy() for e in (shared or {}).values()]


def unsupported_constructs(defining_query: str, columns: dict[str, list[str]] | None = None) -> list[str]:
    """Why DIFFERENTIAL cannot maintain ``defining_query`` (empty when it can)."""
    try:
        if columns is None:
            columns = {name: [] for name in source_names(parse_query(defining_query))}
        plan(defining_query, {k: v or ["__any"] for k, v in columns.items()})
    except Unsupported as err:
        return [str(err)]
    except ValueError as err:
        return [str(err)]
    return []

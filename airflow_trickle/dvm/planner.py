"""The planner: a qualified defining query -> an operator tree, or :class:`Unsupported`.

The query is normalised first (``rewrites.py``: CTEs inlined, DISTINCT and UNION as GROUP BY),
then each SELECT becomes a :class:`~airflow_trickle.dvm.block.Block` over its FROM items (a
:class:`~airflow_trickle.dvm.scan.Scan` or a nested query), and ``UNION ALL`` a
:class:`~airflow_trickle.dvm.union.UnionAll`.  Anything else is refused with its name.
"""
from __future__ import annotations

from sqlglot import exp

from airflow_trickle.dvm.base import ITEM, Node, Unsupported
from airflow_trickle.dvm.block import Block
from airflow_trickle.dvm.rewrites import normalize
from airflow_trickle.dvm.scan import Scan
from airflow_trickle.dvm.union import UnionAll
from airflow_trickle.names import DEFAULT_DATABASE
from airflow_trickle.sql.parse import parse_query, table_name


_UNSUPPORTED_NODES = {
    exp.Intersect: "INTERSECT",
    exp.Except: "EXCEPT",
    exp.Window: "window function",
    exp.Lateral: "LATERAL / LATERAL VIEW",
    exp.Pivot: "PIVOT",
    exp.TableSample: "TABLESAMPLE",
    exp.Rollup: "ROLLUP",
    exp.Cube: "CUBE",
    exp.GroupingSets: "GROUPING SETS",
    exp.Limit: "LIMIT",
    exp.Offset: "OFFSET",
    exp.Explode: "explode / generator in the SELECT list",
    exp.Posexplode: "posexplode",
    exp.Inline: "inline",
}


def plan(defining_query: str, columns: dict[str, list[str]], *, database: str = DEFAULT_DATABASE) -> Node:
    """Build the operator tree of a qualified defining query; raise :class:`Unsupported`.

    ``columns`` maps each source to its visible columns.
    """
    query = parse_query(defining_query)
    with_ = query.args.get("with_") or query.args.get("with")  # the key's name differs across sqlglot versions
    if with_ is not None and with_.args.get("recursive"):
        raise Unsupported("WITH RECURSIVE")
    for node_type, label in _UNSUPPORTED_NODES.items():
        if query.find(node_type):
            raise Unsupported(label)
    query = normalize(query)
    if isinstance(query, exp.Select) and query.args.get("order"):
        query.set("order", None)  # row order of a stored table is not kept anyway
    return _plan_query(query, columns, database)


def _plan_query(query: exp.Expression, columns, database) -> Node:
    if isinstance(query, exp.Union):
        if query.args.get("distinct"):
            raise Unsupported("UNION")  # rewritten before; defensive
        left, right = _plan_query(query.left, columns, database), _plan_query(query.right, columns, database)
        children = (left.children if isinstance(left, UnionAll) else [left]) + [right]
        if any(len(c.columns) != len(left.columns) for c in children):
            raise Unsupported("UNION ALL of different column counts")
        return UnionAll(children=children, columns=list(left.columns))
    if isinstance(query, exp.Subquery):
        return _plan_query(query.this, columns, database)
    if not isinstance(query, exp.Select):
        raise Unsupported(f"{query.key.upper()} query")
    return _plan_select(query, columns, database)


def _plan_select(select: exp.Select, columns, database) -> Block:
    if select.args.get("distinct"):
        raise Unsupported("SELECT DISTINCT with aggregates")
    for key in ("where", "having"):
        clause = select.args.get(key)
        if clause is not None and clause.find(exp.Subquery, exp.Exists, exp.Select):
            raise Unsupported(f"subquery in {key.upper()}")
    for projection in select.expressions:
        if projection.find(exp.Subquery, exp.Select):
            raise Unsupported("scalar subquery in the SELECT list")
        if isinstance(projection, exp.Star) or (projection.find(exp.Star) and not projection.find(exp.Count)):
            raise Unsupported("unexpanded *")
    template = select.copy()
    from_ = template.args.get("from_") or template.args.get("from")
    if from_ is None:
        raise Unsupported("SELECT without FROM")
    slots = [from_]
    for join in template.args.get("joins") or []:
        side, kind = (join.side or "").upper(), (join.kind or "").upper()
        if side or kind not in ("", "INNER", "CROSS"):
            raise Unsupported(f"{' '.join(p for p in (side, kind) if p)} JOIN".strip())
        if join.args.get("using"):
            raise Unsupported("JOIN ... USING")
        slots.append(join)
    items: list[tuple[str, Node]] = []
    for index, slot in enumerate(slots):
        source = slot.this
        alias = source.alias_or_name
        if isinstance(source, exp.Table):
            name = table_name(source, database=database)
            if name not in columns:
                raise Unsupported(f"table {name} without known columns")
            node: Node = Scan(name=name, columns=list(columns[name]))
        elif isinstance(source, exp.Subquery):
            node = _plan_query(source.this, columns, database)
        else:
            raise Unsupported(f"FROM item {source.key}")
        items.append((alias, node))
        slot.set("this", exp.Table(this=exp.to_identifier(ITEM.format(index)),
                                   alias=exp.TableAlias(this=exp.to_identifier(alias))))
    names = [e.alias_or_name for e in select.expressions]
    group = select.args.get("group")
    aggregates = list(dict.fromkeys(a for e in select.expressions for a in e.find_all(exp.AggFunc)))
    having = select.args.get("having")
    if having is not None:
        aggregates += [a for a in having.find_all(exp.AggFunc) if a not in aggregates]
    if group is None and not aggregates:
        return Block(template=template, items=items, columns=names)
    group_exprs = [g.copy() for g in (group.expressions if group else [])]
    return Block(template=template, items=items, columns=names, group=group_exprs, aggregates=aggregates)


def unsupported_constructs(defining_query: str, columns: dict[str, list[str]] | None = None) -> list[str]:
    """Why DIFFERENTIAL cannot maintain ``defining_query`` (empty when it can)."""
    try:
        from airflow_trickle.sql.parse import source_names

        if columns is None:
            columns = {name: [] for name in source_names(parse_query(defining_query))}
        plan(defining_query, {k: v or ["__any"] for k, v in columns.items()})
    except Unsupported as err:
        return [str(err)]
    except ValueError as err:
        return [str(err)]
    return []

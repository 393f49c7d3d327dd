"""Defining query -> operator tree, each operator with its delta rule as Spark SQL.

Deltas are Z-sets: the operator's output columns plus ``__trickle_w``, a signed multiplicity
(+n: n copies appear, -n: n copies vanish).  Delta Lake's time travel gives every source
*exactly* at the old frontier and at the new one, so each rule can use true old and new states.

Operators and their rules:

* ``Scan``      ΔR = net Change Data Feed of R over (old, new]  (or new − old by snapshot)
* ``Filter``    Δσ(R) = σ(ΔR)
* ``Project``   Δπ(R) = π(ΔR)          (multiplicities carried, no DISTINCT)
* ``Join``      Δ(R1 ⋈ … ⋈ Rn) = Σi R1,new ⋈ … ⋈ Ri−1,new ⋈ ΔRi ⋈ Ri+1,old ⋈ … ⋈ Rn,old
                (for two inputs: ΔA ⋈ B_old + A_new ⋈ ΔB, which includes ΔA ⋈ ΔB)
* ``Aggregate`` affected groups K = groups of Δinput;  Δγ = −γ(old input | K) + γ(new input | K);
                at the top of a stream table, COUNT/SUM/AVG are maintained algebraically from
                state kept in hidden columns (new = old + Σ Δ), others recompute only K
* ``UnionAll``  Δ(A ⊎ B) = ΔA ⊎ ΔB
* ``Distinct``/``UNION`` are rewritten to GROUP BY (a group with count > 0 is present)

A FROM clause with its WHERE, SELECT list and GROUP BY is planned as one *block*:
Project/Aggregate over Filter over Join over its inputs, the way SQL writes it.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from sqlglot import exp

from airflow_trickle.dvm.rewrites import normalize
from airflow_trickle.names import DEFAULT_DATABASE
from airflow_trickle.sql.parse import DIALECT, parse_query, table_name

W = "__trickle_w"
ITEM = "__trickle_item_{}"

#: Aggregates maintained from state at the top of a stream table: COUNT, SUM and AVG (on exact
#: numeric types) as new = old + ΣΔ; MIN and MAX as least/greatest(old, inserted), rescanning
#: a group only when a deletion reaches its extreme.
ALGEBRAIC = {"count", "sum", "avg", "min", "max"}


class Unsupported(Exception):
    """A construct DIFFERENTIAL refresh cannot maintain; the message names it."""


@dataclass
class Versions:
    """Source versions a delta is computed between, and how to read each source's changes."""

    old: dict[str, int]
    new: dict[str, int]
    columns: dict[str, list[str]]  # visible columns of each source
    use_cdf: dict[str, bool] = field(default_factory=dict)
    #: Consolidate each source's change rows (a GROUP BY per source); the appliers do not need it.
    consolidate: bool = True

    def changed(self, name: str) -> bool:
        return self.old.get(name) != self.new.get(name)

    def at(self, which: str) -> dict[str, int]:
        return self.old if which == "old" else self.new


class Node:
    columns: list[str]

    def sources(self) -> set[str]:
        raise NotImplementedError

    def changed(self, v: Versions) -> bool:
        return any(v.changed(s) for s in self.sources())

    def state_sql(self, v: Versions, which: str) -> str:
        raise NotImplementedError

    def delta_sql(self, v: Versions) -> str:
        raise NotImplementedError

    def explain(self, depth: int = 0) -> list[str]:
        raise NotImplementedError


@dataclass
class Scan(Node):
    """A stored source table (a base table or an upstream stream table)."""

    name: str
    columns: list[str]

    def sources(self) -> set[str]:
        return {self.name}

    def _cols(self, prefix: str = "") -> str:
        return ", ".join(f"{prefix}`{c}`" for c in self.columns)

    def state_sql(self, v: Versions, which: str) -> str:
        db, table = self.name.split(".", 1)
        version = v.at(which).get(self.name)
        pinned = f" VERSION AS OF {version}" if version is not None else ""
        return f"SELECT {self._cols()} FROM `{db}`.`{table}`{pinned}"

    def delta_sql(self, v: Versions) -> str:
        # ΔR: the net change of R in (old, new]; several changes to one row collapse, an
        # insert then delete of a row vanishes (the weights sum to zero).
        if v.use_cdf.get(self.name, True):
            weight = "CASE WHEN _change_type IN ('insert', 'update_postimage') THEN 1 ELSE -1 END"
            changes = (f"SELECT {self._cols()}, {weight} AS {W} FROM "
                       f"table_changes('{self.name}', {v.old[self.name] + 1}, {v.new[self.name]})")
        else:
            changes = (f"SELECT {self._cols()}, 1 AS {W} FROM ({self.state_sql(v, 'new')}) "
                       f"UNION ALL SELECT {self._cols()}, -1 AS {W} FROM ({self.state_sql(v, 'old')})")
        if not v.consolidate:
            # Every consumer is linear in the weights (sums, joins, unions) or consolidates its
            # own input (the bag MERGE, MIN/MAX): a pre- and post-image of an unchanged row
            # cancel there, and the shuffle that would cancel them here is saved.
            return changes
        return (f"SELECT {self._cols()}, SUM({W}) AS {W} FROM ({changes}) AS __c "
                f"GROUP BY {self._cols()} HAVING SUM({W}) <> 0")

    def explain(self, depth: int = 0) -> list[str]:
        return ["  " * depth + f"Scan {self.name}  [delta: net change feed]"]


@dataclass
class Block(Node):
    """One SELECT: its FROM items joined, filtered by WHERE, projected or aggregated.

    ``template`` is the SELECT with FROM item *i* renamed ``__trickle_item_i`` (aliases kept),
    so an item can be swapped for its old state, new state or delta by text substitution.
    """

    template: exp.Select
    items: list[tuple[str, Node]]
    columns: list[str]
    group: list[exp.Expression] | None = None  # None: no aggregation
    aggregates: list[exp.AggFunc] = field(default_factory=list)

    @property
    def is_aggregate(self) -> bool:
        return self.group is not None

    def sources(self) -> set[str]:
        return set().union(*(node.sources() for _, node in self.items))

    # -- SQL --------------------------------------------------------------------------------

    def _fill(self, template_sql: str, parts: list[str]) -> str:
        for index in reversed(range(len(parts))):  # item_10 before item_1, whose name it contains
            template_sql = template_sql.replace(ITEM.format(index), f"({parts[index]})")
        return template_sql

    def render(self, select: exp.Select, parts: list[str]) -> str:
        return self._fill(select.sql(DIALECT), parts)

    def state_sql(self, v: Versions, which: str) -> str:
        return self.render(self.template, [node.state_sql(v, which) for _, node in self.items])

    def input_delta_sql(self, v: Versions, expressions: list[exp.Expression]) -> str:
        """Δ of this block's join + filter, projected to ``expressions`` (plus the weight).

        Δ(R1 ⋈ … ⋈ Rn) = Σi R1,new ⋈ … ⋈ ΔRi ⋈ … ⋈ Rn,old over the inputs that changed.
        """
        select = self.template.copy()
        select.set("expressions", [e.copy() for e in expressions])
        for key in ("group", "having", "order", "limit", "distinct"):
            select.set(key, None)
        terms = []
        for i, (alias, node) in enumerate(self.items):
            if not node.changed(v):
                continue
            parts = [other.state_sql(v, "new" if j < i else "old") for j, (_, other) in enumerate(self.items[:i])]
            parts.append(node.delta_sql(v))
            parts += [other.state_sql(v, "old") for _, other in self.items[i + 1:]]
            term = select.copy()
            term.append("expressions", exp.column(W, table=alias, quoted=True).as_(W))
            terms.append(self.render(term, parts))
        if not terms:
            names = ", ".join(f"CAST(NULL AS STRING) AS `{e.alias_or_name}`" for e in expressions)
            return f"SELECT {names}, CAST(0 AS BIGINT) AS {W} WHERE false"
        return " UNION ALL ".join(terms)

    def group_hash_sql(self) -> str:
        """Identity of a group: NULL-safe, position-aware hash of the GROUP BY expressions."""
        return group_hash([g.sql(DIALECT) for g in self.group or []])

    def affected_groups_sql(self, v: Versions) -> str:
        return (f"SELECT DISTINCT __g AS __trickle_row_id FROM ("
                f"{self.input_delta_sql(v, [_hash_expression(self).as_('__g')])}) AS __d")

    def restricted(self, keys_sql: str, select: exp.Select | None = None, *, scalar_too: bool = False) -> exp.Select:
        """The block (or ``select`` over its FROM) limited to the groups whose hash is in ``keys_sql``.

        A scalar aggregate has one group; it is restricted only with ``scalar_too``.
        """
        select = (select or self.template).copy()
        if self.group or scalar_too:
            condition = exp.maybe_parse(f"{self.group_hash_sql()} IN (SELECT __trickle_row_id FROM ({keys_sql}))",
                                        dialect=DIALECT)
            select = select.where(condition, copy=False)
        return select

    def delta_sql(self, v: Versions) -> str:
        projected = [exp.column(c, quoted=True) for c in self.columns]
        if not self.is_aggregate:
            # Δπσ(⋈) = πσ(Δ⋈): the SELECT list applied to the join delta, weights carried.
            return self.input_delta_sql(v, [e.copy() for e in self.template.expressions])
        # Δγ = −γ(old input | K) + γ(new input | K), K the groups the input delta touches.
        keys = self.affected_groups_sql(v)
        old = self.render(self.restricted(keys), [n.state_sql(v, "old") for _, n in self.items])
        new = self.render(self.restricted(keys), [n.state_sql(v, "new") for _, n in self.items])
        cols = ", ".join(p.sql(DIALECT) for p in projected)
        return (f"SELECT {cols}, CAST(-1 AS BIGINT) AS {W} FROM ({old}) AS __old "
                f"UNION ALL SELECT {cols}, CAST(1 AS BIGINT) AS {W} FROM ({new}) AS __new")

    def explain(self, depth: int = 0) -> list[str]:
        pad = "  " * depth
        lines = []
        if self.is_aggregate:
            keys = ", ".join(g.sql(DIALECT) for g in self.group) or "(scalar)"
            aggs = ", ".join(a.sql(DIALECT) for a in self.aggregates)
            lines.append(f"{pad}Aggregate group by {keys}: {aggs}")
            if self.template.args.get("having"):
                lines.append(f"{pad}  having {self.template.args['having'].this.sql(DIALECT)}")
        else:
            lines.append(f"{pad}Project {', '.join(self.columns)}")
        depth += 1
        pad = "  " * depth
        where = self.template.args.get("where")
        if where:
            lines.append(f"{pad}Filter {where.this.sql(DIALECT)}")
            depth += 1
        if len(self.items) > 1:
            joins = [j.args.get('on') for j in self.template.args.get("joins") or []]
            conditions = " AND ".join(c.sql(DIALECT) for c in joins if c is not None) or "cross"
            lines.append("  " * depth + f"Join [{len(self.items)}-way, on {conditions}]")
            depth += 1
        for alias, node in self.items:
            sub = node.explain(depth)
            sub[0] = sub[0] + f" AS {alias}"
            lines += sub
        return lines


@dataclass
class UnionAll(Node):
    children: list[Node]
    columns: list[str]

    def sources(self) -> set[str]:
        return set().union(*(c.sources() for c in self.children))

    def _aligned(self, child: Node, sql: str, weight: bool) -> str:
        names = [f"`{src}` AS `{dst}`" for src, dst in zip(child.columns, self.columns)]
        if weight:
            names.append(W)
        return f"SELECT {', '.join(names)} FROM ({sql}) AS __u"

    def state_sql(self, v: Versions, which: str) -> str:
        return " UNION ALL ".join(self._aligned(c, c.state_sql(v, which), False) for c in self.children)

    def delta_sql(self, v: Versions) -> str:
        # Δ(A ⊎ B) = ΔA ⊎ ΔB
        parts = [self._aligned(c, c.delta_sql(v), True) for c in self.children if c.changed(v)]
        return " UNION ALL ".join(parts) if parts else self._aligned(self.children[0], self.children[0].delta_sql(v), True)

    def explain(self, depth: int = 0) -> list[str]:
        lines = ["  " * depth + "UnionAll"]
        for child in self.children:
            lines += child.explain(depth + 1)
        return lines


def group_hash(expressions: list[str]) -> str:
    if not expressions:
        return "xxhash64(0)"
    args = []
    for e in expressions:
        args.extend([f"isnull({e})", e])
    return f"xxhash64({', '.join(args)})"


def _hash_expression(block: Block) -> exp.Expression:
    return exp.maybe_parse(block.group_hash_sql(), dialect=DIALECT)


# -- planning ----------------------------------------------------------------------------------

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
    if (query.args.get("with_") or query.args.get("with")) and (query.args.get("with_") or query.args.get("with")).args.get("recursive"):
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
        if isinstance(projection, exp.Star) or projection.find(exp.Star) and not projection.find(exp.Count):
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

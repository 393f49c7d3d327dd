"""``Block``: one SELECT -- its FROM items joined, filtered by WHERE, projected or aggregated.

A FROM clause with its WHERE, SELECT list and GROUP BY is planned as one block, the way SQL
writes it: Project/Aggregate over Filter over Join over its inputs.  Its rules:

* Filter     Δσ(R) = σ(ΔR)
* Project    Δπ(R) = π(ΔR)          (multiplicities carried, no DISTINCT)
* Join       Δ(R1 ⋈ … ⋈ Rn) = Σi R1,new ⋈ … ⋈ Ri−1,new ⋈ ΔRi ⋈ Ri+1,old ⋈ … ⋈ Rn,old
             (for two inputs: ΔA ⋈ B_old + A_new ⋈ ΔB, which includes ΔA ⋈ ΔB)
* Aggregate  affected groups K = groups of Δinput;  Δγ = −γ(old input | K) + γ(new input | K);
             at the top of a stream table the appliers do better (``algebraic.py``, ``recompute.py``)

The block keeps its SELECT as a template whose FROM item *i* is the placeholder table
``__trickle_item_i``; rendering replaces each placeholder *node* in the tree by the subquery
for the item's old state, new state or delta.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from sqlglot import exp

from airflow_trickle.dvm.base import ITEM, W, Node, Versions, group_hash, parse_sql, union_all
from airflow_trickle.model import ROW_ID
from airflow_trickle.sql.parse import DIALECT


@dataclass


class Block(Node):
    """One SELECT: its FROM items joined, filtered by WHERE, projected or aggregated.

    ``template`` is the SELECT with FROM item *i* replaced by the placeholder table
    ``__trickle_item_i`` (aliases kept); :meth:`render` swaps each placeholder for a subquery.
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

    # -- trees ------------------------------------------------------------------------------

    def render(self, select: exp.Select, parts: list[exp.Query]) -> exp.Select:
        """``select`` with each placeholder FROM item *i* replaced by the subquery ``parts[i]``."""
        tree = select.copy()
        placeholders = {ITEM.format(i): part for i, part in enumerate(parts)}
        for table in list(tree.find_all(exp.Table)):
            part = placeholders.get(table.name) if not table.args.get("db") else None
            if part is not None:
                alias = table.args.get("alias")
                table.replace(exp.Subquery(this=part.copy(), alias=alias.copy() if alias else None))
        return tree

    def state(self, v: Versions, which: str) -> exp.Query:
        return self.render(self.template, [node.state(v, which) for _, node in self.items])

    def input_delta(self, v: Versions, expressions: list[exp.Expression]) -> exp.Query:
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
            parts = [other.state(v, "new" if j < i else "old") for j, (_, other) in enumerate(self.items[:i])]
            parts.append(node.delta(v))
            parts += [other.state(v, "old") for _, other in self.items[i + 1:]]
            term = select.copy()
            term.append("expressions", exp.column(W, table=alias, quoted=True).as_(W))
            terms.append(self.render(term, parts))
        if not terms:
            names = ", ".join(f"CAST(NULL AS STRING) AS `{e.alias_or_name}`" for e in expressions)
            return parse_sql(f"SELECT {names}, CAST(0 AS BIGINT) AS {W} WHERE false")
        return union_all(terms)

    def input_delta_sql(self, v: Versions, expressions: list[exp.Expression]) -> str:
        return self.input_delta(v, expressions).sql(DIALECT)

    def group_hash_sql(self) -> str:
        """Identity of a group: NULL-safe, position-aware hash of the GROUP BY expressions."""
        return group_hash([g.sql(DIALECT) for g in self.group or []])

    def affected_groups(self, v: Versions) -> exp.Query:
        """K: the hashes of the groups the input delta touches, as ``__trickle_row_id``."""
        delta = self.input_delta(v, [_hash_expression(self).as_("__g")])
        return exp.select(exp.column("__g").as_(ROW_ID)).distinct().from_(delta.subquery("__d"))

    def affected_groups_sql(self, v: Versions) -> str:
        return self.affected_groups(v).sql(DIALECT)

    def restricted(self, keys: exp.Query | str, select: exp.Select | None = None, *,
                   scalar_too: bool = False) -> exp.Select:
        """The block (or ``select`` over its FROM) limited to the groups whose hash is in ``keys``.

        A scalar aggregate has one group; it is restricted only with ``scalar_too``.
        """
        select = (select or self.template).copy()
        if self.group or scalar_too:
            keys = keys if isinstance(keys, exp.Expression) else parse_sql(keys)
            wanted = exp.select(ROW_ID).from_(keys.subquery())
            select = select.where(exp.In(this=_hash_expression(self), query=wanted.subquery()), copy=False)
        return select

    def delta(self, v: Versions) -> exp.Query:
        projected = [exp.column(c, quoted=True) for c in self.columns]
        if not self.is_aggregate:
            # Δπσ(⋈) = πσ(Δ⋈): the SELECT list applied to the join delta, weights carried.
            return self.input_delta(v, [e.copy() for e in self.template.expressions])
        # Δγ = −γ(old input | K) + γ(new input | K), K the groups the input delta touches.
        keys = self.affected_groups(v)
        sides = []
        for which, sign, alias in (("old", -1, "__old"), ("new", 1, "__new")):
            rows = self.render(self.restricted(keys), [n.state(v, which) for _, n in self.items])
            weight = exp.cast(exp.Literal.number(sign), "BIGINT").as_(W)
            sides.append(exp.select(*[p.copy() for p in projected], weight).from_(rows.subquery(alias)))
        return union_all(sides)

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


def _hash_expression(block: Block) -> exp.Expression:
    return exp.maybe_parse(block.group_hash_sql(), dialect=DIALECT)

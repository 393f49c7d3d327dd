"""``Block``: one SELECT -- its FROM items joined, filtered by WHERE, projected or aggregated.

A FROM clause with its WHERE, SELECT list and GROUP BY is planned as one block, the way SQL
writes it: Project/Aggregate over Filter over Join over its inputs.  Its rules, each in the
module that implements it:

* Filter, project             linear: Δσ(R) = σ(ΔR), Δπ(R) = π(ΔR), weights carried (in every
                              term of the join's delta)
* Generator                   ``generator.py``: linear, Δgen(R) = gen(ΔR)
* Join                        ``join.py``: Δ(R1 ⋈ … ⋈ Rn) = Σi R1,new ⋈ … ⋈ ΔRi ⋈ … ⋈ Rn,old
* Outer join                  ``outer_join.py``: a null-supplying side recomputed for its changed keys
* Window                      ``window.py``: the partitions of changed rows, before and after
* Aggregate                   ``aggregate.py``: the groups the input delta touches, before and after

The block keeps its SELECT as a template whose FROM item *i* is the placeholder table
``__trickle_item_i``; rendering replaces each placeholder *node* in the tree by the subquery
for the item's old state, new state or delta.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from sqlglot import exp

from airflow_trickle.dvm import aggregate, generator
from airflow_trickle.dvm.base import ITEM, Node, Versions, group_hash
from airflow_trickle.dvm.keyed import Keyed, keyed_block
from airflow_trickle.dvm.join import KEY, JoinKind, JoinStep, join_delta
from airflow_trickle.dvm.outer_join import outer_join_terms
from airflow_trickle.dvm.window import window_delta
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
    #: One per item (the first item's is INNER); empty means all INNER.
    steps: list[JoinStep] = field(default_factory=list)
    #: Window functions in the SELECT list: the PARTITION BY expressions all of them share
    #: (empty: one partition); None: no window functions.
    window_keys: list[exp.Expression] | None = None

    def step(self, i: int) -> JoinStep:
        return self.steps[i] if i < len(self.steps) else JoinStep()

    def is_linear_in(self, i: int) -> bool:
        """Whether the join chain is linear in item *i* (its delta can stand in for it)."""
        if self.step(i).kind is JoinKind.LEFT:
            return False
        return not (i <= 1 and self.step(1).kind is JoinKind.FULL)

    @property
    def is_aggregate(self) -> bool:
        return self.group is not None

    def sources(self) -> set[str]:
        return set().union(*(node.sources() for _, node in self.items))

    def keyed(self) -> Keyed | None:
        return keyed_block(self)

    def children(self) -> list[Node]:
        return [node for _, node in self.items]

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
        """Δ of this block's join + filter, projected to ``expressions`` (plus the weight): ``join.py``."""
        return join_delta(self, v, expressions, outer_join_terms)

    def input_delta_sql(self, v: Versions, expressions: list[exp.Expression]) -> str:
        return self.input_delta(v, expressions).sql(DIALECT)

    def group_hash_sql(self) -> str:
        """Identity of a group: NULL-safe, position-aware hash of the GROUP BY expressions."""
        return group_hash([g.sql(DIALECT) for g in self.group or []])

    def affected_groups(self, v: Versions) -> exp.Query:
        """K: the hashes of the groups the input delta touches, as ``__trickle_row_id`` (``aggregate.py``)."""
        return aggregate.affected_groups(self, v)

    def affected_groups_with_values(self, v: Versions, *, values: bool = False) -> exp.Select:
        """K as ``__trickle_row_id`` (and, with ``values``, each GROUP BY expression's value)."""
        return aggregate.affected_groups_with_values(self, v, values=values)

    def affected_groups_sql(self, v: Versions) -> str:
        return self.affected_groups(v).sql(DIALECT)

    def restricted(self, v: Versions, keys: exp.Query | str, select: exp.Select | None = None, *,
                   scalar_too: bool = False) -> exp.Select:
        """The block (or ``select`` over its FROM) limited to the groups whose hash is in ``keys``."""
        return aggregate.restricted(self, v, keys, select, scalar_too=scalar_too)

    def delta(self, v: Versions) -> exp.Query:
        if self.window_keys is not None:
            return window_delta(self, v)
        if not self.is_aggregate:
            # Δπσ(⋈) = πσ(Δ⋈): the SELECT list applied to the join delta, weights carried.
            return self.input_delta(v, [e.copy() for e in self.template.expressions])
        return aggregate.aggregate_delta(self, v)

    def changed_input_keys(self, v: Versions, key_exprs: list[exp.Expression]) -> exp.Select:
        """The distinct values of ``key_exprs`` (over this block's FROM items) in Δinput, as ``KEY`` columns."""
        names = [KEY.format(n) for n in range(len(key_exprs))]
        delta = self.input_delta(v, [k.copy().as_(name) for k, name in zip(key_exprs, names)])
        return exp.select(*names).distinct().from_(delta.subquery("__trickle_changed"))

    def explain(self, depth: int = 0) -> list[str]:
        pad = "  " * depth
        lines = []
        if self.window_keys is not None:
            keys = ", ".join(k.sql(DIALECT) for k in self.window_keys)
            lines.append(f"{pad}Window [partitions of changed rows recomputed, by {keys}]" if keys else
                         f"{pad}Window [no PARTITION BY common to every window: recomputed whole]")
            pad = "  " * (depth := depth + 1)
        if self.is_aggregate:
            keys = ", ".join(g.sql(DIALECT) for g in self.group) or "(scalar)"
            aggs = ", ".join(a.sql(DIALECT) for a in self.aggregates) or "(distinct keys)"
            lines.append(f"{pad}Aggregate group by {keys}: {aggs}  [groups touched by the input's delta, "
                         "before and after]")
            if self.template.args.get("having"):
                lines.append(f"{pad}  having {self.template.args['having'].this.sql(DIALECT)}")
        else:
            lines.append(f"{pad}Project {', '.join(self.columns)}  [linear: π(Δ)]")
        depth += 1
        pad = "  " * depth
        lines += generator.explain_lines(self.template, pad)
        where = self.template.args.get("where")
        if where:
            lines.append(f"{pad}Filter {where.this.sql(DIALECT)}  [linear: σ(Δ)]")
            depth += 1
        if len(self.items) > 1:
            joins = self.template.args.get("joins") or []
            conditions = " AND ".join(j.args["on"].sql(DIALECT) for j in joins if j.args.get("on")) or "cross"
            kinds = [" ".join(p for p in (j.side, j.kind) if p).upper() or "INNER" for j in joins]
            shown = "" if set(kinds) <= {"INNER", "CROSS"} else f" {', '.join(kinds)}"
            keyed = [alias for i, (alias, _) in enumerate(self.items) if not self.is_linear_in(i)]
            rule = ("padding transitions" if keyed else "each input's delta joined with the others' states")
            lines.append("  " * depth + f"Join [{len(self.items)}-way{shown}, on {conditions}]  [{rule}]")
            if keyed:
                lines.append("  " * depth + f"  [delta of {', '.join(keyed)}: rows of the changed join keys, "
                                            "recomputed before and after]")
            depth += 1
        for alias, node in self.items:
            sub = node.explain(depth)
            sub[0] = sub[0] + f" AS {alias}"
            lines += sub
        return lines

"""``UnionAll``: the bag union of its children's rows.

    Δ(A ⊎ B) = ΔA ⊎ ΔB

(``UNION`` and ``DISTINCT`` are rewritten to GROUP BY before planning: a group with a positive
count is present.)
"""
from __future__ import annotations

from dataclasses import dataclass

from sqlglot import exp

from airflow_trickle.dvm.base import W, Node, Versions, union_all


@dataclass


class UnionAll(Node):
    """``UNION ALL`` of two or more queries with the same number of columns."""

    inputs: list[Node]
    columns: list[str]

    def children(self) -> list[Node]:
        return list(self.inputs)

    def sources(self) -> set[str]:
        return set().union(*(c.sources() for c in self.inputs))

    def _aligned(self, child: Node, rows: exp.Query, weight: bool) -> exp.Select:
        """``rows`` of ``child`` with the union's column names (and the weight)."""
        names = [exp.column(src, quoted=True).as_(dst, quoted=True) for src, dst in zip(child.columns, self.columns)]
        if weight:
            names.append(exp.column(W))
        return exp.select(*names).from_(rows.subquery("__u"))

    def state(self, v: Versions, which: str) -> exp.Query:
        return union_all([self._aligned(c, c.state(v, which), False) for c in self.inputs])

    def delta(self, v: Versions) -> exp.Query:
        # Δ(A ⊎ B) = ΔA ⊎ ΔB  (an unchanged child contributes nothing)
        changed = [c for c in self.inputs if c.changed(v)] or self.inputs[:1]
        return union_all([self._aligned(c, c.delta(v), True) for c in changed])

    def explain(self, depth: int = 0) -> list[str]:
        lines = ["  " * depth + "UnionAll  [linear: the inputs' deltas, concatenated]"]
        for child in self.inputs:
            lines += child.explain(depth + 1)
        return lines

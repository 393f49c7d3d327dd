"""What every operator shares: Z-set deltas, the versions a delta spans, the operator interface.

Deltas are Z-sets: the operator's output columns plus ``__trickle_w``, a signed multiplicity
(+n: n copies appear, -n: n copies vanish).  Delta Lake's time travel gives every source
*exactly* at the old frontier and at the new one, so each rule can use true old and new states.

Operators build sqlglot expression trees (:meth:`Node.state` and :meth:`Node.delta`); the
appliers embed them in the MERGE or INSERT that applies a delta (``state_sql``/``delta_sql``
render them as Spark SQL).
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace

import sqlglot
from sqlglot import exp

from airflow_trickle.model import WEIGHT
from airflow_trickle.sql.parse import DIALECT


#: The weight column of a delta.
W = WEIGHT


#: FROM item *i* of a block's template (a placeholder table, replaced when rendering).
ITEM = "__trickle_item_{}"


#: Aggregates maintained from state at the top of a stream table: COUNT, SUM and AVG (on exact
#: numeric types) as new = old + ΣΔ; MIN and MAX as least/greatest(old, inserted), rescanning
#: a group only when a deletion reaches its extreme.
ALGEBRAIC = {"count", "sum", "avg", "min", "max"}


class Unsupported(Exception):
    """A construct DIFFERENTIAL refresh cannot maintain; the message names it."""


@dataclass


class Versions:
    """Source versions a delta is computed between, how to read each source's changes, and what
    a refresh has computed already of the delta (``bound``)."""

    old: dict[str, int]
    new: dict[str, int]
    columns: dict[str, list[str]]  # visible columns of each source
    use_cdf: dict[str, bool] = field(default_factory=dict)
    #: Consolidate each source's change rows (a GROUP BY per source); the appliers do not need it.
    consolidate: bool = True
    #: Facts a refresh computed before its applying statement (``refresh/differential.py``),
    #: keyed by the operator they belong to: the groups an aggregate's input delta touches
    #: (:meth:`known_groups`), the views holding parts of a recursive CTE's delta
    #: (:meth:`view_of`) and the inputs a join-delta term probed (:meth:`probed`), or a
    #: recompute of touched groups (:meth:`group_probed`).  The operator tree itself is never changed after planning.
    bound: dict = field(default_factory=dict, compare=False)

    def bind(self, node: "Node", what: str, value) -> "Versions":
        """These versions with ``value`` known for ``what`` of ``node`` (a new object)."""
        return replace(self, bound={**self.bound, (id(node), what): value})

    def known_groups(self, node: "Node") -> list[tuple] | None:
        """The groups an aggregate's input delta touches, as ``(hash, value of each GROUP BY
        expression)``, when a refresh counted them and found them few; None: not known."""
        return self.bound.get((id(node), "groups"))

    def view_of(self, node: "Node", part: str) -> str | None:
        """The view a refresh computed ``part`` of ``node``'s delta into, if it did."""
        return self.bound.get((id(node), part))

    def probed(self, node: "Node", changed: int) -> dict[int, tuple[str, tuple[str, ...]]] | None:
        """The relations a refresh probed for the term of ``node``'s join delta that joins the
        change of FROM item ``changed`` (``dvm/probes.py``): FROM item -> (view, its columns);
        the changed item's view holds its change rows with their weights."""
        return self.bound.get((id(node), f"probed {changed}"))

    def group_probed(self, node: "Node", which: str) -> dict[int, tuple[str, tuple[str, ...]]] | None:
        """The relations a refresh probed to recompute ``node``'s touched groups at the ``which``
        versions (``dvm/probes.py``'s :func:`group_probes`): FROM item -> (view, its columns)."""
        return self.bound.get((id(node), f"groups {which}"))

    def outer_probed(self, node: "Node", changed: int, which: str) -> dict[int, tuple[str, tuple[str, ...]]]:
        """The relations a refresh probed for the outer term of ``node``'s FROM item ``changed``
        at the ``which`` side (``dvm/probes.py``'s :class:`OuterTerm`): FROM item -> (view, its
        columns); empty when it probed none."""
        return {**self.bound.get((id(node), f"outer {changed}"), {}),
                **self.bound.get((id(node), f"outer {changed} {which}"), {})}

    def groups_probed_whole(self, node: "Node") -> bool:
        """Whether the relations bound for ``node``'s touched groups (:meth:`group_probed`) hold
        every row of a superset of those groups and nothing else: the recompute then needs no
        filter by the groups the input delta touches -- an unchanged group's rows come out alike
        before and after and cancel -- and the input delta is not computed at all."""
        return bool(self.bound.get((id(node), "groups whole")))

    def null_group_rows(self, node: "Node") -> str | None:
        """The column whose NULL rows a refresh left out of ``node``'s probed touched groups (an
        arrangement holds no NULL key): the recompute reads those rows from the table itself."""
        return self.bound.get((id(node), "groups nulls"))

    def changed(self, name: str) -> bool:
        return self.old.get(name) != self.new.get(name)

    def at(self, which: str) -> dict[str, int]:
        return self.old if which == "old" else self.new


class Node:
    """An operator: its output columns, its state at a version, and its delta between two."""

    columns: list[str]

    def sources(self) -> set[str]:
        raise NotImplementedError

    def changed(self, v: Versions) -> bool:
        return any(v.changed(s) for s in self.sources())

    def state(self, v: Versions, which: str) -> exp.Query:
        """The operator's rows at version ``which`` (``old`` or ``new``)."""
        raise NotImplementedError

    def delta(self, v: Versions) -> exp.Query:
        """The operator's delta (output columns plus the weight ``W``) from ``old`` to ``new``."""
        raise NotImplementedError

    def state_sql(self, v: Versions, which: str) -> str:
        return self.state(v, which).sql(DIALECT)

    def delta_sql(self, v: Versions) -> str:
        return self.delta(v).sql(DIALECT)

    def children(self) -> list["Node"]:
        """The operators this one reads (walked by :func:`operators`)."""
        raise NotImplementedError

    def explain(self, depth: int = 0) -> list[str]:
        raise NotImplementedError


def operators(node: Node):
    """``node`` and every operator under it, outermost first."""
    yield node
    for child in node.children():
        yield from operators(child)


def parse_sql(sql: str) -> exp.Query:
    """A query tree from Spark SQL text (operators write their small fixed shapes as text)."""
    return sqlglot.parse_one(sql, read=DIALECT)


def union_all(queries: list[exp.Query]) -> exp.Query:
    """``q1 UNION ALL q2 UNION ALL ...``"""
    result = queries[0]
    for query in queries[1:]:
        result = exp.union(result, query, distinct=False)
    return result


def group_hash(expressions: list[str]) -> str:
    """Identity of a group: a NULL-safe, position-aware hash of its key expressions (SQL text)."""
    if not expressions:
        return "xxhash64(0)"
    args = []
    for e in expressions:
        args.extend([f"isnull({e})", e])
    return f"xxhash64({', '.join(args)})"

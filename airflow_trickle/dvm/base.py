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

from airflow_trickle.dvm.bindings import Bindings
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
    a refresh has computed already of the delta (``bindings``)."""

    old: dict[str, int]
    new: dict[str, int]
    columns: dict[str, list[str]]  # visible columns of each source
    use_cdf: dict[str, bool] = field(default_factory=dict)
    #: Consolidate each source's change rows (a GROUP BY per source); the appliers do not need it.
    consolidate: bool = True
    #: What a refresh computed before its applying statement (``refresh/differential.py``),
    #: for the operators to read instead of computing it; never the operator tree itself.
    bindings: Bindings = field(default_factory=Bindings, compare=False)

    def bound(self, bindings: Bindings) -> "Versions":
        """These versions with ``bindings`` instead of their own (a new object)."""
        return replace(self, bindings=bindings)

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

    def keyed(self):
        """This operator as an aggregate of one stored table grouped by its columns
        (``dvm/keyed.Keyed``), looked up through that table; None for any other operator."""
        return None


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

"""What the next refresh recomputes, counted: the scopes of the pending change.

Two operators recompute a part of their input rather than deriving their delta row by row: a
window recomputes the partitions that hold a changed row, an aggregate the groups its input's
delta touches (before and after).  Their rules are fixed (``explain`` names them); how much
work a refresh does depends on how many partitions or groups the change touches.  Each
:class:`Scope` pairs an operator with the query listing those partitions or groups for a
change (the same SQL the refresh uses to find them); ``explain`` counts its rows.

    >>> from airflow_trickle.dvm.base import Versions
    >>> from airflow_trickle.dvm.planner import plan
    >>> tree = plan("SELECT cid, SUM(amount) AS s FROM s.o GROUP BY cid", {"s.o": ["id", "cid", "amount"]})
    >>> v = Versions(old={"s.o": 3}, new={"s.o": 5}, columns={"s.o": ["id", "cid", "amount"]})
    >>> [(s.operator, s.unit) for s in scopes(tree, v)]
    [('Aggregate group by cid', 'groups')]
    >>> scopes(tree, Versions(old={"s.o": 5}, new={"s.o": 5}, columns={"s.o": ["id", "cid", "amount"]}))
    []
"""
from __future__ import annotations

from dataclasses import dataclass

from sqlglot import exp

from airflow_trickle.dvm.base import Node, Versions
from airflow_trickle.sql.parse import DIALECT


@dataclass(frozen=True)
class Scope:
    """One operator's share of a refresh: ``query`` lists the ``unit``\\s it recomputes."""

    operator: str  # as explain's tree names it, e.g. "Window by cid"
    unit: str  # "partitions" or "groups"
    query: exp.Query | None  # None: the whole input is one unit (a window without PARTITION BY)

    def count_sql(self) -> str | None:
        return None if self.query is None else f"SELECT COUNT(*) FROM ({self.query.sql(DIALECT)}) AS __trickle_scope"


def scopes(node: Node, v: Versions) -> list[Scope]:
    """The scopes of every operator under ``node`` that the change from ``v.old`` to ``v.new``
    reaches, outermost first (an operator whose sources did not change recomputes nothing)."""
    from airflow_trickle.dvm.base import operators
    from airflow_trickle.dvm.block import Block

    found: list[Scope] = []
    for block in operators(node):
        if not (isinstance(block, Block) and block.changed(v)):
            continue
        if block.window_keys is not None:
            keys = ", ".join(k.sql(DIALECT) for k in block.window_keys)
            found.append(Scope(f"Window by {keys}", "partitions", block.changed_input_keys(v, block.window_keys))
                         if keys else Scope("Window without a common PARTITION BY", "partitions", None))
        elif block.is_aggregate:
            keys = ", ".join(g.sql(DIALECT) for g in block.group) or "(scalar)"
            found.append(Scope(f"Aggregate group by {keys}", "groups", block.affected_groups_with_values(v)))
    return found

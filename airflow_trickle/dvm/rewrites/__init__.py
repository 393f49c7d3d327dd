"""Auto-rewrite passes: normalise a qualified defining query into the shapes the planner knows.

Each pass is a pure function from a sqlglot expression to a new expression, in a module of its
kind with its example as a doctest; they run in the order of :data:`PASSES` (data, not hidden
control flow), each until nothing changes (:func:`normalize`).
"""
from __future__ import annotations

from sqlglot import exp

from airflow_trickle.dvm.rewrites.ctes import inline_ctes
from airflow_trickle.dvm.rewrites.outer_joins import null_rejecting_outer_joins_to_inner
from airflow_trickle.dvm.rewrites.refused import SubqueryRefused
from airflow_trickle.dvm.rewrites.set_operations import (distinct_to_group_by, set_operations_to_group_by,
                                                          union_to_distinct, unwrap_set_operands)
from airflow_trickle.dvm.rewrites.subqueries import (not_in_to_joins, scalars_in_select_to_cross_joins,
                                                      subqueries_to_joins)

__all__ = ["PASSES", "SubqueryRefused", "distinct_to_group_by", "inline_ctes", "normalize", "not_in_to_joins",
           "null_rejecting_outer_joins_to_inner", "scalars_in_select_to_cross_joins", "set_operations_to_group_by",
           "subqueries_to_joins", "union_to_distinct", "unwrap_set_operands"]

#: The passes, in the order they run.
PASSES = (inline_ctes, unwrap_set_operands, subqueries_to_joins, null_rejecting_outer_joins_to_inner, set_operations_to_group_by,
          union_to_distinct, distinct_to_group_by)


def normalize(query: exp.Expression) -> exp.Expression:
    """Every pass, each until nothing changes (``transform`` does not revisit what it replaced,
    so a DISTINCT nested in a rewritten UNION needs a second round)."""
    for rewrite in PASSES:
        for _ in range(10):
            rewritten = rewrite(query)
            if rewritten == query:
                break
            query = rewritten
    return query

"""Differential view maintenance: operator trees, delta rules, and the plan of a refresh.

Pure: nothing here runs Spark.  ``planner.plan`` turns a qualified defining query into an
operator tree (one operator per module, each headed by its delta rule), ``delta_plan`` turns a
tree and two frontiers into the one immutable plan a refresh executes (``refresh/differential.py``
runs it), and the appliers (``bag.py``, ``algebraic.py``, ``recompute.py``) build the statement
that applies a delta.
"""
from __future__ import annotations


def differential_blockers(defining_query: str, sources) -> list[str]:
    """Constructs in ``defining_query`` that DIFFERENTIAL refresh cannot maintain (empty: none)."""
    from airflow_trickle.dvm.planner import unsupported_constructs

    columns = {s.name: [c for c, _ in s.columns] for s in sources.values()} if sources else None
    return unsupported_constructs(defining_query, columns)

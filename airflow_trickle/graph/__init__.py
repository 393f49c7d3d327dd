"""The stream-table dependency graph: pure functions over a networkx DiGraph.

Nodes are qualified table names; an edge ``a -> b`` means ``b`` reads ``a``.  Nothing here
imports Airflow or Spark.
"""
from airflow_trickle.graph.dependencies import (
    build_graph,
    cycle_members,
    downstream_of,
    find_cycle,
    topological_order,
    upstream_of,
)
from airflow_trickle.graph.diamonds import ConsistencyGroup, Diamond, consistency_groups, find_diamonds
from airflow_trickle.graph.schedules import CommitWatches, commit_watches, effective_periods, group_period

__all__ = [
    "CommitWatches", "ConsistencyGroup", "Diamond", "build_graph", "commit_watches", "consistency_groups", "cycle_members", "downstream_of",
    "effective_periods",
    "find_cycle", "find_diamonds", "group_period", "topological_order", "upstream_of",
]

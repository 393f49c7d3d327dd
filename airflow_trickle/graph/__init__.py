"""The stream-table dependency graph: pure functions over a networkx DiGraph.

Nodes are qualified table names; an edge ``a -> b`` means ``b`` reads ``a``.  Nothing here
imports Airflow or Spark.
"""
from airflow_trickle.graph.dependencies import build_graph, find_cycle, topological_order, upstream_of, downstream_of

__all__ = ["build_graph", "downstream_of", "find_cycle", "topological_order", "upstream_of"]

"""Diamonds and consistency groups (seed 002 §13), as pure functions over the dependency graph.

A *diamond* is a fan-in stream table D with two or more upstream branches that share an
ancestor::

        A (source)
       / \\
      B   C          B and C are stream tables
       \\ /
        D            D reads B and C: the convergence point

If B refreshes and C fails, D would read new B with old C.  With ``diamond_consistency =
'atomic'`` the members (B, C, D) refresh together: all commit or none stay committed.
Overlapping diamonds are merged into one group.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import networkx as nx

from airflow_trickle.graph.dependencies import build_graph, topological_order  # noqa: F401 (doctest)


@dataclass(frozen=True)
class Diamond:
    convergence: str
    members: frozenset[str]  # the stream tables between the shared ancestors and the convergence point
    shared_ancestors: frozenset[str]


@dataclass
class ConsistencyGroup:
    """Stream tables refreshed as one unit, in ``members`` order (upstream first)."""

    members: list[str]
    convergence_points: list[str] = field(default_factory=list)

    @property
    def name(self) -> str:
        return self.members[-1] if len(self.members) == 1 else "group:" + "+".join(self.members)

    @property
    def is_singleton(self) -> bool:
        return len(self.members) == 1


def _is_stream_table(graph: nx.DiGraph, node: str) -> bool:
    return graph.nodes[node].get("kind") == "stream_table"


def find_diamonds(graph: nx.DiGraph) -> list[Diamond]:
    """Every fan-in stream table whose upstream branches share an ancestor, with its members.

    >>> g = build_graph([("a", "b"), ("a", "c"), ("b", "d"), ("c", "d")], stream_tables=["b", "c", "d"])
    >>> [sorted(d.members) for d in find_diamonds(g)]
    [['b', 'c', 'd']]
    """
    diamonds = []
    for node in topological_order(graph):
        if not _is_stream_table(graph, node):
            continue
        # a fan-in of stream tables (seed 002 §13); a base table read at its own version adds no split
        parents = sorted(p for p in graph.predecessors(node) if _is_stream_table(graph, p))
        if len(parents) < 2:
            continue
        branches = {p: nx.ancestors(graph, p) | {p} for p in parents}
        shared: set[str] = set()
        for i, first in enumerate(parents):
            for second in parents[i + 1:]:
                shared |= branches[first] & branches[second]
        if not shared:
            continue
        # members: stream tables on a path from a shared ancestor to the convergence point
        downstream_of_shared = set().union(*(nx.descendants(graph, a) for a in shared))
        upstream_of_node = nx.ancestors(graph, node)
        members = {n for n in (downstream_of_shared & upstream_of_node) if _is_stream_table(graph, n)}
        members.add(node)
        diamonds.append(Diamond(node, frozenset(members), frozenset(shared)))
    return diamonds


def consistency_groups(graph: nx.DiGraph, atomic: set[str] | None = None) -> list[ConsistencyGroup]:
    """Partition the stream tables into refresh units, in topological order.

    Diamonds whose convergence point is in ``atomic`` (default: all) become one group each,
    overlapping ones merged; every other stream table is a singleton group.
    """
    order = [n for n in topological_order(graph) if _is_stream_table(graph, n)]
    parent = {n: n for n in order}

    def root(n: str) -> str:
        while parent[n] != n:
            parent[n] = parent[parent[n]]
            n = parent[n]
        return n

    convergence: dict[str, set[str]] = {}
    for diamond in find_diamonds(graph):
        if atomic is not None and diamond.convergence not in atomic:
            continue
        members = sorted(diamond.members)
        for other in members[1:]:
            parent[root(other)] = root(members[0])
        convergence.setdefault(diamond.convergence, set())
    # Collapsing a group into one unit must keep the units acyclic: a stream table outside the
    # group that lies on a path between two members (possible once overlapping diamonds merged)
    # would depend on the group and the group on it.  Merge every strongly connected set of the
    # unit graph into one unit; the units' graph is then the condensation, which is acyclic.
    units = nx.DiGraph()
    units.add_nodes_from(root(n) for n in order)
    units.add_edges_from((root(a), root(b)) for a, b in graph.edges if a in parent and b in parent
                         and root(a) != root(b))
    for component in nx.strongly_connected_components(units):
        first, *rest = sorted(component)
        for other in rest:
            parent[root(other)] = root(first)
    groups: dict[str, list[str]] = {}
    for node in order:
        groups.setdefault(root(node), []).append(node)
    result = []
    for members in groups.values():
        points = [m for m in members if m in convergence]
        result.append(ConsistencyGroup(members=members, convergence_points=points))
    position = {n: i for i, n in enumerate(order)}
    return sorted(result, key=lambda g: position[g.members[0]])

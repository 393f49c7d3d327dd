"""Build the dependency graph, find cycles, order refreshes."""
from __future__ import annotations

from typing import Iterable

import networkx as nx


def build_graph(edges: Iterable[tuple[str, str]], stream_tables: Iterable[str] = ()) -> nx.DiGraph:
    """A DiGraph with an edge ``source -> stream table`` per dependency.

    Nodes carry ``kind``: ``"stream_table"`` for names in ``stream_tables``, ``"table"`` otherwise.
    """
    graph = nx.DiGraph()
    stream_tables = set(stream_tables)
    for name in stream_tables:
        graph.add_node(name, kind="stream_table")
    for source, target in edges:
        for node in (source, target):
            if node not in graph:
                graph.add_node(node, kind="stream_table" if node in stream_tables else "table")
        graph.add_edge(source, target)
    return graph


def find_cycle(graph: nx.DiGraph) -> list[str] | None:
    """One cycle as a closed path ``[a, b, ..., a]``, or ``None`` when the graph is acyclic.

    >>> find_cycle(build_graph([("a", "b"), ("b", "a")]))
    ['a', 'b', 'a']
    """
    try:
        edges = nx.find_cycle(graph)
    except nx.NetworkXNoCycle:
        return None
    path = [edges[0][0]] + [target for _, target in edges]
    return path


def topological_order(graph: nx.DiGraph, nodes: Iterable[str] | None = None) -> list[str]:
    """Nodes in refresh order (upstream first), ties broken by name for stable output.

    In a graph with (allowed, monotone) cycles, the members of each cycle come together, in
    name order, where the cycle as a whole belongs.

    >>> topological_order(build_graph([("s", "a"), ("a", "b"), ("b", "a"), ("b", "c")]))
    ['s', 'a', 'b', 'c']
    """
    if nx.is_directed_acyclic_graph(graph):
        order = list(nx.lexicographical_topological_sort(graph))
    else:
        condensed = nx.condensation(graph)
        members = condensed.graph["mapping"]
        label = {c: min(n for n, m in members.items() if m == c) for c in condensed}
        order = [n for c in nx.lexicographical_topological_sort(condensed, key=lambda c: label[c])
                 for n in sorted(n for n, m in members.items() if m == c)]
    if nodes is None:
        return order
    wanted = set(nodes)
    return [n for n in order if n in wanted]


def upstream_of(graph: nx.DiGraph, name: str) -> set[str]:
    return nx.ancestors(graph, name) if name in graph else set()


def downstream_of(graph: nx.DiGraph, name: str) -> set[str]:
    return nx.descendants(graph, name) if name in graph else set()


def cycle_members(graph: nx.DiGraph, name: str) -> list[str]:
    """The stream tables on a cycle with ``name`` (its strongly connected set), or ``[]``.

    >>> cycle_members(build_graph([("s", "a"), ("a", "b"), ("b", "a")]), "b")
    ['a', 'b']
    """
    for component in nx.strongly_connected_components(graph):
        if name in component and len(component) > 1:
            return topological_order(graph.subgraph(component).copy())
    return []

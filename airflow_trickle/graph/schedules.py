"""Effective schedules: CALCULATED stream tables inherit the tightest downstream cadence.

A stream table without a schedule (seed: CALCULATED) refreshes when a downstream stream table
needs it; its effective period is the shortest period among the stream tables that read it,
directly or through other CALCULATED ones.  A consistency group fires on the ``fastest``
member's period (any member due) or the ``slowest`` (all members due).
"""
from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

import networkx as nx

from airflow_trickle.graph.dependencies import build_graph, topological_order  # noqa: F401 (doctest)
from airflow_trickle.schedule import parse_schedule


def effective_periods(graph: nx.DiGraph, schedules: dict[str, str | None]) -> dict[str, timedelta | None]:
    """Period of every stream table in ``schedules``; ``None`` where nothing downstream has one.

    >>> g = build_graph([("src", "a"), ("a", "b"), ("a", "c")], stream_tables=["a", "b", "c"])
    >>> effective_periods(g, {"a": None, "b": "5m", "c": "1m"})["a"]
    datetime.timedelta(seconds=60)
    """
    periods: dict[str, timedelta | None] = {
        name: parse_schedule(text, stream_table=name).nominal_period() for name, text in schedules.items()
    }
    for node in reversed(topological_order(graph, schedules)):
        if periods[node] is not None:
            continue
        downstream = [periods[c] for c in graph.successors(node) if c in periods and periods[c] is not None]
        periods[node] = min(downstream) if downstream else None
    return periods


def group_period(periods: list[timedelta | None], policy: str = "fastest") -> timedelta | None:
    """When a consistency group fires: its fastest member's period, or its slowest."""
    known = [p for p in periods if p is not None]
    if not known:
        return None
    if policy not in ("fastest", "slowest"):
        raise ValueError(f"diamond_schedule_policy must be 'fastest' or 'slowest', not {policy!r}")
    return min(known) if policy == "fastest" else max(known)


@dataclass(frozen=True)
class CommitWatches:
    """What refresh on commit watches and refreshes in a project.

    ``sources``: each base source to watch, with the stream tables reading it directly whose
    frontiers say what of it was consumed; ``refreshed``: each source's stream tables to refresh
    when it commits (its readers, every stream table downstream of them, in no order).
    """

    sources: dict[str, tuple[str, ...]]
    refreshed: dict[str, tuple[str, ...]]

    @property
    def members(self) -> set[str]:
        return {name for names in self.refreshed.values() for name in names}


def commit_watches(graph: nx.DiGraph, schedules: dict[str, str | None]) -> CommitWatches:
    """The base sources whose commits refresh ``on_commit`` stream tables (of ``schedules``).

    Up from each ``on_commit`` table, through the stream tables that have no clock of their own
    (CALCULATED ones, or other ``on_commit`` ones), to the base sources reached: those are
    watched. A stream table with its own clock upstream is not looked through: it refreshes on
    its clock, and the on_commit table follows it through the refresh DAG's cascade. The
    project's own stream tables are never watched, so its refreshes cannot trigger a loop.

    >>> g = build_graph([("src", "a"), ("a", "b"), ("b", "c"), ("other", "d"), ("d", "b")],
    ...                 stream_tables=["a", "b", "c", "d"])
    >>> w = commit_watches(g, {"a": None, "b": "on_commit", "c": "5m", "d": "1m"})
    >>> w.sources, sorted(w.refreshed["src"])
    ({'src': ('a',)}, ['a', 'b', 'c'])
    """
    parsed = {name: parse_schedule(text, stream_table=name) for name, text in schedules.items()}
    readers: dict[str, set[str]] = {}
    refreshed: dict[str, set[str]] = {}
    for name in (n for n, s in parsed.items() if s.on_commit):
        climbed, stack = {name}, [name]
        while stack:
            node = stack.pop()
            for parent in graph.predecessors(node):
                if parent not in parsed:
                    readers.setdefault(parent, set()).add(node)
                    refreshed.setdefault(parent, set()).update(_downstream(graph, node, parsed))
                elif parent not in climbed and (parsed[parent].is_calculated or parsed[parent].on_commit):
                    climbed.add(parent)
                    stack.append(parent)
    return CommitWatches(sources={s: tuple(sorted(r)) for s, r in sorted(readers.items())},
                         refreshed={s: tuple(sorted(r)) for s, r in sorted(refreshed.items())})


def _downstream(graph: nx.DiGraph, name: str, stream_tables) -> set[str]:
    return {name} | {n for n in nx.descendants(graph, name) if n in stream_tables}

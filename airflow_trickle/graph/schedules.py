"""Effective schedules: CALCULATED stream tables inherit the tightest downstream cadence.

A stream table without a schedule (seed: CALCULATED) refreshes when a downstream stream table
needs it; its effective period is the shortest period among the stream tables that read it,
directly or through other CALCULATED ones.  A consistency group fires on the ``fastest``
member's period (any member due) or the ``slowest`` (all members due).
"""
from __future__ import annotations

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

from airflow_trickle.graph import build_graph, downstream_of, find_cycle, topological_order, upstream_of


def test_acyclic_order_and_reachability():
    graph = build_graph([("src", "a"), ("a", "b"), ("a", "c"), ("b", "d"), ("c", "d")], stream_tables=["a", "b", "c", "d"])
    assert find_cycle(graph) is None
    assert topological_order(graph) == ["src", "a", "b", "c", "d"]
    assert topological_order(graph, ["d", "b"]) == ["b", "d"]
    assert upstream_of(graph, "d") == {"src", "a", "b", "c"}
    assert downstream_of(graph, "a") == {"b", "c", "d"}
    assert graph.nodes["src"]["kind"] == "table" and graph.nodes["a"]["kind"] == "stream_table"


def test_cycle_is_reported_as_a_closed_path():
    cycle = find_cycle(build_graph([("a", "b"), ("b", "c"), ("c", "a"), ("x", "a")]))
    assert cycle[0] == cycle[-1] and set(cycle) == {"a", "b", "c"} and len(cycle) == 4


from datetime import timedelta  # noqa: E402

import pytest  # noqa: E402

from airflow_trickle.graph import consistency_groups, effective_periods, find_diamonds, group_period  # noqa: E402

STS = ["b", "c", "d", "e", "f", "g", "x"]


def test_diamond_over_a_base_table():
    graph = build_graph([("a", "b"), ("a", "c"), ("b", "d"), ("c", "d")], stream_tables=["b", "c", "d"])
    (diamond,) = find_diamonds(graph)
    assert diamond.convergence == "d" and diamond.members == {"b", "c", "d"} and diamond.shared_ancestors == {"a"}


def test_fan_in_without_shared_ancestor_is_no_diamond():
    graph = build_graph([("a", "b"), ("z", "c"), ("b", "d"), ("c", "d")], stream_tables=["b", "c", "d"])
    assert find_diamonds(graph) == []
    assert [g.members for g in consistency_groups(graph)] == [["b"], ["c"], ["d"]]


def test_overlapping_diamonds_merge_and_others_stay_singletons():
    edges = [("a", "b"), ("a", "c"), ("b", "d"), ("c", "d"),  # diamond 1: b c d
             ("c", "e"), ("d", "f"), ("e", "f"),               # diamond 2: shares c with diamond 1
             ("a", "x"), ("f", "g")]
    graph = build_graph(edges, stream_tables=STS)
    groups = consistency_groups(graph)
    merged = [g for g in groups if not g.is_singleton]
    assert len(merged) == 1 and merged[0].members == ["b", "c", "d", "e", "f"]
    assert merged[0].convergence_points == ["d", "f"]
    assert sorted(g.members[0] for g in groups if g.is_singleton) == ["g", "x"]
    # only atomic convergence points form groups
    assert all(g.is_singleton for g in consistency_groups(graph, atomic=set()))


def test_calculated_schedules_take_the_tightest_downstream_period():
    graph = build_graph([("src", "a"), ("a", "b"), ("b", "c"), ("a", "d")], stream_tables=["a", "b", "c", "d"])
    periods = effective_periods(graph, {"a": None, "b": None, "c": "10m", "d": "*/2 * * * *"})
    assert periods == {"a": timedelta(minutes=2), "b": timedelta(minutes=10), "c": timedelta(minutes=10),
                       "d": timedelta(minutes=2)}
    assert effective_periods(graph, {"a": None, "b": None, "c": None, "d": None})["a"] is None


def test_group_schedule_policy():
    periods = [timedelta(minutes=1), None, timedelta(minutes=5)]
    assert group_period(periods, "fastest") == timedelta(minutes=1)
    assert group_period(periods, "slowest") == timedelta(minutes=5)
    with pytest.raises(ValueError):
        group_period(periods, "sometimes")


def test_refresh_units_stay_acyclic_when_diamonds_merge():
    """Collapsing each group into one task must never create a cycle between tasks (seeded random DAGs)."""
    import random

    import networkx as nx

    rng = random.Random(1)
    for _ in range(1000):
        n = rng.randint(4, 9)
        edges = []
        for i in range(n):
            parents = rng.sample(["s0", "s1"] + [f"t{j}" for j in range(i)], k=min(rng.randint(1, 2), i + 2))
            edges += [(p, f"t{i}") for p in parents]
        graph = build_graph(edges, stream_tables=[f"t{i}" for i in range(n)])
        atomic = {f"t{i}" for i in range(n) if rng.random() < 0.5}
        groups = consistency_groups(graph, atomic=atomic)
        unit_of = {m: i for i, g in enumerate(groups) for m in g.members}
        assert sorted(unit_of) == sorted(f"t{i}" for i in range(n))
        units = nx.DiGraph()
        units.add_nodes_from(range(len(groups)))
        units.add_edges_from((unit_of[a], unit_of[b]) for a, b in graph.edges if a in unit_of and unit_of[a] != unit_of[b])
        assert nx.is_directed_acyclic_graph(units), groups
        for group in groups:  # members stay in refresh order
            assert group.members == [m for m in topological_order(graph) if m in group.members]


def test_two_atomic_groups_that_feed_each_other_become_one_unit():
    # {t0, t2, t6} converges at t6 and {t1, t3, t4} at t4, but t1 -> t2 and t0 -> t3 cross between
    # them: as two tasks each would wait for the other.
    edges = [("s1", "t0"), ("s0", "t1"), ("t1", "t2"), ("s1", "t2"), ("s0", "t3"), ("t0", "t3"), ("t3", "t4"),
             ("t1", "t4"), ("t0", "t5"), ("t0", "t6"), ("t2", "t6")]
    graph = build_graph(edges, stream_tables=[f"t{i}" for i in range(7)])
    groups = consistency_groups(graph, atomic={"t4", "t6"})
    assert [g.members for g in groups] == [["t0", "t1", "t2", "t3", "t4", "t6"], ["t5"]]
    assert groups[0].convergence_points == ["t4", "t6"]

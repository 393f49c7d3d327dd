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

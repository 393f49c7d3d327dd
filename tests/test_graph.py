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

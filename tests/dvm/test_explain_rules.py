"""``explain`` names, per operator, the delta rule it uses (no JVM: the planner alone)."""
from __future__ import annotations

import pytest

from airflow_trickle.dvm.planner import plan

COLUMNS = {"s.o": ["id", "cid", "amount"], "s.c": ["id", "region"]}


@pytest.mark.parametrize("query, rules", [
    ("SELECT o.id, c.region FROM s.o o LEFT JOIN s.c c ON o.cid = c.id WHERE o.amount > 1",
     ["Project id, region  [linear: π(Δ)]", "Filter o.amount > 1  [linear: σ(Δ)]",
      "Join [2-way LEFT, on o.cid = c.id]  [padding transitions]", "[delta of c: rows of the changed join keys",
      "Scan s.o  [delta: net change feed]"]),
    ("SELECT c.region, SUM(o.amount) AS t FROM s.o o JOIN s.c c ON o.cid = c.id GROUP BY c.region",
     ["Aggregate group by c.region: SUM(o.amount)  [groups touched by the input's delta, before and after]",
      "Join [2-way, on o.cid = c.id]  [each input's delta joined with the others' states]"]),
    ("SELECT id FROM s.o UNION ALL SELECT id FROM s.c", ["UnionAll  [linear: the inputs' deltas, concatenated]"]),
    ("SELECT id, ROW_NUMBER() OVER (PARTITION BY cid ORDER BY amount) AS r FROM s.o ORDER BY r, id LIMIT 3",
     ["LIMIT 3  [scoped recompute:", "Window [partitions of changed rows recomputed, by cid]"]),
    ("SELECT id, SUM(amount) OVER () AS total FROM s.o",
     ["Window [no PARTITION BY common to every window: recomputed whole]"]),
])
def test_explain_names_the_rule_of_every_operator(query, rules):
    text = "\n".join(plan(query, COLUMNS).explain())
    for rule in rules:
        assert rule in text, text


def test_the_pending_scopes_are_the_windows_and_aggregates_a_change_reaches():
    """``dvm.pending.scopes``: per window and aggregate the change reaches, outermost first, the
    query listing its partitions or groups (read from the change feed); unchanged inputs none."""
    from airflow_trickle.dvm.base import Versions
    from airflow_trickle.dvm.pending import scopes

    query = ("SELECT region, n, RANK() OVER (PARTITION BY region ORDER BY n) AS r FROM ("
             "SELECT c.region, COUNT(*) AS n FROM s.o o JOIN s.c c ON o.cid = c.id GROUP BY c.region) t "
             "UNION ALL SELECT CAST(id AS STRING), amount, ROW_NUMBER() OVER (ORDER BY id) FROM s.o")
    tree = plan(query, COLUMNS)
    only_c = Versions(old={"s.o": 1, "s.c": 1}, new={"s.o": 1, "s.c": 4}, columns=COLUMNS)
    found = scopes(tree, only_c)
    assert [(s.operator, s.unit) for s in found] == [("Window by region", "partitions"),
                                                     ("Aggregate group by c.region", "groups")]
    for scope in found:
        assert "table_changes" in scope.count_sql().lower() and scope.count_sql().startswith("SELECT COUNT(*)")
    both = Versions(old={"s.o": 1, "s.c": 1}, new={"s.o": 2, "s.c": 4}, columns=COLUMNS)
    assert [s.operator for s in scopes(tree, both)][-1] == "Window without a common PARTITION BY"
    assert scopes(tree, both)[-1].count_sql() is None
    assert scopes(tree, Versions(old={"s.o": 2, "s.c": 4}, new={"s.o": 2, "s.c": 4}, columns=COLUMNS)) == []

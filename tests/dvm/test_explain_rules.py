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


def test_the_reads_of_a_delta_say_which_states_the_change_s_keys_reduce():
    """``dvm.reads``: an aggregate recomputed by touched groups reads each state restricted to
    the groups' keys, and scans ``s.c`` whole where it computes those keys from the change."""
    from airflow_trickle.dvm.base import Versions
    from airflow_trickle.dvm.reads import describe, statement_reads

    query = ("SELECT g.region, g.n FROM (SELECT c.region, COUNT(*) AS n FROM s.o o JOIN s.c c ON o.cid = c.id "
             "GROUP BY c.region) g")
    v = Versions(old={"s.o": 3, "s.c": 3}, new={"s.o": 5, "s.c": 3}, columns=COLUMNS,
                 use_cdf={"s.o": True, "s.c": True}, consolidate=False)
    assert describe(statement_reads(plan(query, COLUMNS).delta_sql(v))) == [
        "s.c version 3: 4 reads (2 reduced by the change's keys, 2 scanned whole)",
        "s.o change feed 4..5: 2 reads",
        "s.o version 3: 1 read (reduced by the change's keys)",
        "s.o version 5: 1 read (reduced by the change's keys)",
    ]


@pytest.mark.parametrize("name, expected", [
    # orders ⋈ lineitem, both changed: each state is read once, scanned whole by the other's change
    ("q12", ["s.st stored: 1 read (scanned whole)", "tpch.lineitem change feed 4..5: 1 read",
             "tpch.lineitem version 3: 1 read (scanned whole)", "tpch.orders change feed 4..5: 1 read",
             "tpch.orders version 5: 1 read (scanned whole)"]),
    # the six-way join: the four unchanged inputs are read once per changed input's term
    ("q5", ["s.st stored: 1 read (scanned whole)", "tpch.customer version 3: 2 reads (2 scanned whole)",
            "tpch.lineitem change feed 4..5: 1 read", "tpch.lineitem version 3: 1 read (scanned whole)",
            "tpch.nation version 3: 2 reads (2 scanned whole)", "tpch.orders change feed 4..5: 1 read",
            "tpch.orders version 5: 1 read (scanned whole)", "tpch.region version 3: 2 reads (2 scanned whole)",
            "tpch.supplier version 3: 2 reads (2 scanned whole)"]),
])
def test_the_reads_of_tpch_merges_count_each_input_read(name, expected):
    """What a refresh of a TPC-H stream table reads when ``orders`` and ``lineitem`` changed (RF1 +
    RF2), read off the MERGE it runs: the figures ``explain`` prints under "reads"."""
    from sqlglot.optimizer.qualify import qualify

    from airflow_trickle.dvm.reads import describe, statement_reads
    from airflow_trickle.sql.parse import DIALECT, parse_query
    from tests.dvm.golden import Case, compile_case
    from tests.dvm.test_tpch_coverage import COLUMNS as TPCH_COLUMNS, SCHEMA, tpch_queries

    query = qualify(parse_query(tpch_queries()[name]), schema=SCHEMA, dialect=DIALECT).sql(DIALECT)
    case = Case(name=name, sources=TPCH_COLUMNS, changed=["tpch.orders", "tpch.lineitem"], output="merge",
                query=query, expected="")
    assert describe(statement_reads(compile_case(case))) == expected

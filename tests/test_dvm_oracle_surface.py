"""Ways of writing SQL that were once refused, each maintained DIFFERENTIALLY against the oracle
(tests/oracle.py) through random inserts, updates and deletes with NULLs and duplicates: output
names with capitals (TPC-DS q28, q61, q91, q92), parentheses around an ON condition (q40, q72, q75,
q78, q97) and around a set operation's operand (q2, q8, q66, q87), ``t.*`` beside ``JOIN ... USING``
and ``SELECT DISTINCT`` over window functions (a TPC-DI medallion pipeline)."""
from __future__ import annotations

from tests.oracle import drive, workload


def test_capitals_parentheses_using_stars_and_distinct_windows_stay_differential(tr, db):
    tables = ["o", "c", "x"]
    load = workload(tr, db, tables, {
        "named": "SELECT cid AS CustomerId, SUM(amount) AS `Total Amount`, COUNT(*) AS Orders, "
                 "CAST(SUM(price) AS DECIMAL(12,2)) FROM {db}.o GROUP BY cid",
        "paren_on": "SELECT o.id, o.amount, c.region FROM {db}.o o LEFT JOIN {db}.c c ON (o.cid = c.id)",
        "paren_full": "SELECT o.id, c.region FROM {db}.o o FULL OUTER JOIN {db}.c c "
                      "ON ((o.cid = c.id) AND (c.region IS NOT NULL))",
        "paren_union": "SELECT id, amount FROM {db}.o UNION ALL (SELECT k, v FROM {db}.x WHERE v > 2)",
        "paren_intersect": "(SELECT amount FROM {db}.o) INTERSECT (SELECT v FROM {db}.x)",
        "using_star": "WITH s1 AS (SELECT amount, cid AS id FROM {db}.o) "
                      "SELECT s1.*, c.region FROM s1 JOIN {db}.c c USING (id)",
        "distinct_window": "SELECT DISTINCT cid, MIN(amount) OVER (PARTITION BY cid) AS low FROM {db}.o",
    })
    # the names as written, capitals and Spark's own name of an unaliased expression included
    assert [f.name for f in tr.read(f"{db}.named").schema.fields] == [
        "CustomerId", "Total Amount", "Orders", "CAST(sum(price) AS DECIMAL(12,2))"]
    assert [f.name for f in tr.read(f"{db}.using_star").schema.fields] == ["id", "amount", "region"]
    for name in load.queries:
        assert tr.get(name).effective_mode == "DIFFERENTIAL", (name, tr.get(name).mode_reason)
    drive(load, tables)

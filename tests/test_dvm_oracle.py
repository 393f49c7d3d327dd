"""Scans, filters, projections, unions, stream tables over stream tables, subqueries and a window
against the full-recompute oracle (tests/oracle.py); and, at the level of the delta alone
(``DeltaOracle``), every outer-join, subquery, set-operation, window and generator shape.

Each test builds sources and stream tables once, then hypothesis drives random batches of
inserts, deletes, group-changing updates and occasional emptying of a table, with NULLs and
duplicate rows; after each batch every stream table is refreshed DIFFERENTIALLY and compared.
(The workloads are split over two files so that two test processes can run them side by side.)
"""
from __future__ import annotations

import logging

from tests.oracle import drive, drive_deltas, multiset, workload


def test_stream_tables_over_stream_tables(tr, db):
    """Chains, diamonds and mixed sources, refreshed upstream first in each batch (seed 000)."""
    tables = ["o", "c"]
    load = workload(tr, db, tables, {
        # a chain of depth 3; s2 reads a stream table and a base table that change together (ΔL⋈ΔR)
        "s1": "SELECT id, cid, amount FROM {db}.o WHERE amount IS NULL OR amount > 2",
        "s2": "SELECT s1.id, s1.amount, c.region FROM {db}.s1 s1 JOIN {db}.c c ON s1.cid = c.id",
        "s3": "SELECT region, COUNT(*) AS n, SUM(amount) AS total FROM {db}.s2 GROUP BY region",
        # a diamond whose two branches both join the same changed base table
        "lhs": "SELECT o.id, o.amount, c.region FROM {db}.o o JOIN {db}.c c ON o.cid = c.id",
        "rhs": "SELECT c.region, COUNT(*) AS n FROM {db}.o o JOIN {db}.c c ON o.cid = c.id GROUP BY c.region",
        "meet": "SELECT l.id, l.amount, r.region, r.n FROM {db}.lhs l JOIN {db}.rhs r ON l.region = r.region",
        # a FULL upstream (applied as a diff) under a DIFFERENTIAL downstream
        "full_up": "SELECT cid, MAX(amount) AS top FROM {db}.o GROUP BY cid",
        "full_down": "SELECT f.cid, f.top, s.id FROM {db}.full_up f JOIN {db}.s1 s ON f.cid = s.cid",
        # a FULL bag (duplicates, NULLs) under a DIFFERENTIAL downstream: applied as its
        # difference, consolidated per content (refresh/local_difference.py)
        "full_bag": "SELECT cid, amount FROM {db}.o WHERE amount IS NULL OR amount > 1",
        "full_bag_down": "SELECT cid, COUNT(*) AS n, SUM(amount) AS total FROM {db}.full_bag GROUP BY cid",
    }, modes={"full_up": "FULL", "full_bag": "FULL"})
    drive(load, tables)


def test_scan_filter_project_union_all_and_top_k(tr, db, caplog):
    tables = ["o", "x"]
    load = workload(tr, db, tables, {
        "projected": "SELECT id, cid, amount * 2 AS doubled, CAST(price AS STRING) AS p, "
                     "CASE WHEN amount > 5 THEN 'big' WHEN amount IS NULL THEN 'none' ELSE 'small' END AS size "
                     "FROM {db}.o WHERE amount IS NULL OR amount <> 3",
        "keyless": "SELECT cid, amount FROM {db}.o",
        "unioned": "SELECT id, amount FROM {db}.o WHERE amount > 4 UNION ALL SELECT k, v FROM {db}.x",
        # top-K: ordered totally (ties only between equal rows), so the query's rows are determined
        "top_rows": "SELECT id, cid, amount FROM {db}.o ORDER BY amount DESC, id, cid LIMIT 3",
        "top_groups": "SELECT cid, SUM(amount) AS total, COUNT(*) AS n FROM {db}.o GROUP BY cid "
                      "ORDER BY total DESC, cid LIMIT 2",
        "top_offset": "SELECT k, v FROM {db}.x ORDER BY 2, 1 LIMIT 2 OFFSET 1",
        # dual counts: min(l, r) and max(l - r, 0) copies of each row, NULLs equal
        "intersect_all": "SELECT cid, amount FROM {db}.o INTERSECT ALL SELECT k, v FROM {db}.x",
        "except_all": "SELECT amount FROM {db}.o EXCEPT ALL SELECT v FROM {db}.x",
    })
    drive(load, tables)
    # Scripted: a row entering the top 3 is applied from the stored rows plus the delta; deleting
    # the first row makes the query read beyond the stored boundary.
    caplog.set_level(logging.INFO, logger="airflow_trickle.refresh")
    caplog.clear()  # what the random batches logged (they may delete a top row) is not this step's
    top = f"{db}.top_rows"
    tr.sql(f"INSERT INTO {db}.o VALUES (900, 1, 1000000, 1.00)")
    load.refresh_all()
    assert (900, 1, 1000000) in multiset(tr.read(top)) and f"{top}: a row left the top-K" not in caplog.text
    caplog.clear()
    tr.sql(f"DELETE FROM {db}.o WHERE id = 900")
    load.refresh_all()
    assert f"{top}: a row left the top-K" in caplog.text


def test_groups_vanish_and_reappear_and_null_keys_stay_apart(tr, db):
    load = workload(tr, db, ["o"], {
        "pairs": "SELECT cid, amount, COUNT(*) AS n, SUM(price) AS s FROM {db}.o GROUP BY cid, amount",
        "total": "SELECT COUNT(*) AS n, SUM(amount) AS s, AVG(price) AS a FROM {db}.o",
    })
    steps = [
        "INSERT INTO {db}.o VALUES (10, 1, NULL, 1.00), (11, NULL, 1, 2.00), (12, 1, NULL, 3.00)",
        "DELETE FROM {db}.o",  # every group vanishes; the scalar aggregate keeps its one row
        "INSERT INTO {db}.o VALUES (13, 1, NULL, 4.00), (14, NULL, 1, NULL)",  # groups reappear
        "UPDATE {db}.o SET cid = NULL, amount = 1 WHERE id = 13",  # (1,NULL) becomes (NULL,1)
    ]
    for step in steps:
        tr.sql(step.format(db=db))
        load.refresh_all()
    assert sorted(tuple(r) for r in tr.read(f"{db}.pairs").select("cid", "amount", "n").collect()) == [(None, 1, 2)]


def test_explain_shows_tree_strategy_and_delta_sql(tr, db):
    load = workload(tr, db, ["o", "c"], {
        "explained": "SELECT c.region, SUM(o.amount) AS s FROM {db}.o o JOIN {db}.c c ON o.cid = c.id GROUP BY c.region",
        "ranked": "SELECT id, cid, RANK() OVER (PARTITION BY cid ORDER BY amount) AS r FROM {db}.o",
    })
    explanation = tr.explain(f"{db}.explained")
    assert explanation["mode"] == "DIFFERENTIAL" and explanation["strategy"] == "algebraic"
    text = explanation["text"]
    for word in ("Aggregate group by", "Join [2-way", f"Scan {db}.o", f"Scan {db}.c", "MERGE INTO"):
        assert word in text, text
    assert "table_changes" in explanation["delta_sql"].lower()
    read = {(r["table"], r["kind"]) for r in explanation["reads"]}
    assert {(f"{db}.o", "change feed"), (f"{db}.c", "change feed"), (f"{db}.explained", "stored")} <= read, read
    assert "reads of the delta SQL" in text and f"{db}.o change feed" in text, text
    assert explanation["pending"] == [] and "pending change: none" in text
    # two new orders: customer 3 (region NULL) and customer 0 (no customer: the join drops it)
    tr.sql(f"INSERT INTO {db}.o VALUES (6, 3, 7, 1.00), (7, 0, 1, 2.00)")
    counted = {name: tr.explain(f"{db}.{name}") for name in ("explained", "ranked")}
    assert counted["explained"]["pending"] == [{"operator": "Aggregate group by `c`.`region`", "unit": "groups",
                                                "count": 1}]
    assert counted["ranked"]["pending"] == [{"operator": "Window by `o`.`cid`", "unit": "partitions", "count": 2}]
    assert "Window by `o`.`cid`: 2 partitions" in counted["ranked"]["text"], counted["ranked"]["text"]
    load.refresh_all()
    assert tr.explain(f"{db}.ranked")["pending"] == []


def test_subqueries_exists_not_exists_scalar_and_a_window(tr, db):
    """Subqueries (rewritten into outer joins and aggregates) and a window function, end to end."""
    tables = ["o", "c"]
    load = workload(tr, db, tables, {
        "exists": "SELECT o.id FROM {db}.o o WHERE EXISTS (SELECT 1 FROM {db}.c c WHERE c.id = o.cid "
                  "AND c.region IS NOT NULL) OR o.amount > 8",
        "not_exists": "SELECT c.id, c.region FROM {db}.c c WHERE NOT EXISTS (SELECT 1 FROM {db}.o o WHERE o.cid = c.id)",
        "scalar_count": "SELECT c.id, (SELECT COUNT(*) FROM {db}.o o WHERE o.cid = c.id) AS n FROM {db}.c c",
        "ranked": "SELECT id, cid, RANK() OVER (PARTITION BY cid ORDER BY amount) AS r FROM {db}.o",
    })
    drive(load, tables)


def test_outer_join_subquery_set_operation_window_and_generator_deltas(tr, db):
    """The delta rules of the outer-join shapes, subqueries, set operations, windows and generators that the end-to-end
    workloads here and in test_dvm_oracle_joins.py do not store (``DeltaOracle``)."""
    drive_deltas(tr, db, ["o", "c", "x"], {
        "right": "SELECT o.id, c.id AS cid, c.region FROM {db}.o o RIGHT OUTER JOIN {db}.c c ON o.cid = c.id",
        "left_using": "SELECT * FROM {db}.o LEFT JOIN {db}.c USING (id)",
        "full_then_inner": "SELECT o.id, c.region, x.v FROM {db}.o o FULL JOIN {db}.c c ON o.cid = c.id "
                           "JOIN {db}.x x ON x.k = coalesce(o.cid, c.id)",
        "chain": "SELECT o.id, c.region, x.v FROM {db}.o o JOIN {db}.c c ON o.cid = c.id "
                 "LEFT JOIN {db}.x x ON x.k = c.id AND x.v > 2",
        "two_left": "SELECT o.id, c.region, x.v FROM {db}.o o LEFT JOIN {db}.c c ON o.cid = c.id "
                    "LEFT JOIN {db}.x x ON x.k = c.id",
        "anti": "SELECT o.id, o.cid FROM {db}.o o LEFT ANTI JOIN {db}.c c ON o.cid = c.id",
        "semi": "SELECT o.id FROM {db}.o o LEFT SEMI JOIN {db}.x x ON x.k = o.cid AND x.v > 1",
        "not_in": "SELECT o.id, o.amount FROM {db}.o o WHERE o.amount NOT IN (SELECT i.cid FROM {db}.o i WHERE i.id > 4) "
                  "OR o.id = 0",
        "in_sub": "SELECT o.id, o.amount FROM {db}.o o WHERE o.cid IN (SELECT x.k FROM {db}.x x WHERE x.v > 3)",
        "scalar": "SELECT o.id FROM {db}.o o WHERE o.amount > (SELECT AVG(i.amount) FROM {db}.o i WHERE i.cid = o.cid)",
        "scalar_in_select": "SELECT o.id, o.amount - (SELECT AVG(x.v) FROM {db}.x x) AS dev, "
                            "(SELECT MAX(c.id) FROM {db}.c c WHERE c.region IS NOT NULL) AS m FROM {db}.o o",
        "above_average": "SELECT o.id, o.amount FROM {db}.o o WHERE o.amount > (SELECT AVG(amount) FROM {db}.o)",
        "intersect": "SELECT cid, amount FROM {db}.o INTERSECT SELECT k, v FROM {db}.x",
        "except": "SELECT cid FROM {db}.o EXCEPT SELECT id FROM {db}.c EXCEPT SELECT k FROM {db}.x",
        "except_all_counted": "SELECT e.cid, COUNT(*) AS n FROM (SELECT cid FROM {db}.o EXCEPT ALL SELECT id FROM {db}.c "
                              "EXCEPT ALL SELECT k FROM {db}.x) AS e GROUP BY e.cid",
        "intersect_all_joined": "SELECT i.k, c.region FROM (SELECT cid AS k FROM {db}.o INTERSECT ALL SELECT k FROM {db}.x) AS i "
                                "JOIN {db}.c c ON c.id = i.k",
        "union_of_three": "SELECT cid FROM {db}.o UNION SELECT id FROM {db}.c UNION SELECT k FROM {db}.x",
        "ranked": "SELECT id, cid, amount, RANK() OVER (PARTITION BY cid ORDER BY amount) AS r, "
                  "DENSE_RANK() OVER (PARTITION BY cid ORDER BY amount DESC) AS dr FROM {db}.o",
        "offsets": "SELECT id, cid, LAG(amount) OVER (PARTITION BY cid ORDER BY id, amount, price) AS prev, "
                   "SUM(amount) OVER (PARTITION BY cid ORDER BY id, amount, price "
                   "ROWS BETWEEN 1 PRECEDING AND CURRENT ROW) AS running, "
                   "1 + NTILE(2) OVER (PARTITION BY cid, amount ORDER BY id, price) AS tile FROM {db}.o",
        "unpartitioned": "SELECT id, amount, ROW_NUMBER() OVER (ORDER BY id, cid, amount, price) AS rn FROM {db}.o",
        "exploded": "SELECT o.id, t.n FROM {db}.o o LATERAL VIEW OUTER explode(sequence(1, o.amount % 3)) t AS n",
        "generated": "SELECT id, explode(array(cid, amount)) AS v FROM {db}.o",
        "exploded_counts": "SELECT t.n, COUNT(*) AS c FROM {db}.o o LATERAL VIEW explode(sequence(1, o.cid)) t AS n "
                           "GROUP BY t.n",
        "window_over_join": "SELECT o.id, c.region, COUNT(*) OVER (PARTITION BY c.region) AS n FROM {db}.o o "
                            "JOIN {db}.c c ON o.cid = c.id",
    })

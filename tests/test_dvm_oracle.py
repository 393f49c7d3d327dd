"""Scans, filters, projections, unions and stream tables over stream tables against the full-recompute
oracle (tests/oracle.py).

Each test builds sources and stream tables once, then hypothesis drives random batches of
inserts, deletes, group-changing updates and occasional emptying of a table, with NULLs and
duplicate rows; after each batch every stream table is refreshed DIFFERENTIALLY and compared.
(The workloads are split over two files so that two test processes can run them side by side.)
"""
from __future__ import annotations

from tests.oracle import drive, workload


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
    }, modes={"full_up": "FULL"})
    drive(load, tables)


def test_scan_filter_project_and_union_all(tr, db):
    tables = ["o", "x"]
    load = workload(tr, db, tables, {
        "projected": "SELECT id, cid, amount * 2 AS doubled, CAST(price AS STRING) AS p, "
                     "CASE WHEN amount > 5 THEN 'big' WHEN amount IS NULL THEN 'none' ELSE 'small' END AS size "
                     "FROM {db}.o WHERE amount IS NULL OR amount <> 3",
        "keyless": "SELECT cid, amount FROM {db}.o",
        "unioned": "SELECT id, amount FROM {db}.o WHERE amount > 4 UNION ALL SELECT k, v FROM {db}.x",
    })
    drive(load, tables)


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
    })
    explanation = tr.explain(f"{db}.explained")
    assert explanation["mode"] == "DIFFERENTIAL" and explanation["strategy"] == "algebraic"
    text = explanation["text"]
    for word in ("Aggregate group by", "Join [2-way", f"Scan {db}.o", f"Scan {db}.c", "MERGE INTO"):
        assert word in text, text
    assert "table_changes" in explanation["delta_sql"].lower()
    assert load.queries



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

"""Inner and outer joins, aggregates and their combinations against the full-recompute oracle (tests/oracle.py).

Each test builds sources and stream tables once, then hypothesis drives random batches of
inserts, deletes, group-changing updates and occasional emptying of a table, with NULLs and
duplicate rows; after each batch every stream table is refreshed DIFFERENTIALLY and compared.
(The workloads are split over two files so that two test processes can run them side by side.)
"""
from __future__ import annotations

from tests.oracle import drive, workload


def test_inner_joins_equi_theta_self_and_three_way(tr, db):
    tables = ["o", "c", "x"]
    load = workload(tr, db, tables, {
        "equi": "SELECT o.id, c.region, o.amount FROM {db}.o o JOIN {db}.c c ON o.cid = c.id",
        "theta": "SELECT o.id, x.k FROM {db}.o o JOIN {db}.x x ON o.amount > x.v",
        "self": "SELECT a.id, b.id AS other FROM {db}.o a JOIN {db}.o b ON a.cid = b.cid AND a.id < b.id",
        "three": "SELECT o.id, c.region, x.v FROM {db}.o o, {db}.c c, {db}.x x WHERE o.cid = c.id AND x.k = c.id",
    })
    drive(load, tables)


def test_aggregates_algebraic_recomputed_scalar_and_distinct(tr, db):
    tables = ["o", "x"]
    load = workload(tr, db, tables, {
        "algebraic": "SELECT cid, COUNT(*) AS n, SUM(amount) AS s, AVG(amount) AS av, COUNT(amount) AS na, "
                     "SUM(price) AS sp, AVG(price) AS ap, SUM(amount) * 2 + COUNT(*) AS expr, MIN(amount) AS mn, "
                     "MAX(price) AS mx, MIN(amount) + MAX(amount) AS spread FROM {db}.o GROUP BY cid",
        "two_keys": "SELECT cid, amount, COUNT(*) AS n FROM {db}.o GROUP BY cid, amount",
        "recomputed": "SELECT cid, MIN(amount) AS mn, MAX(amount) AS mx, COUNT(DISTINCT amount) AS nd, "
                      "stddev_samp(amount) AS sd, collect_set(amount) IS NOT NULL AS has FROM {db}.o GROUP BY cid "
                      "HAVING COUNT(*) > 1",
        "scalar": "SELECT COUNT(*) AS n, SUM(amount) AS s, MAX(amount) AS m FROM {db}.o WHERE amount > 2",
        "distinct": "SELECT DISTINCT cid, amount FROM {db}.o",
        "unioned": "SELECT cid AS k FROM {db}.o UNION SELECT k FROM {db}.x",
    })
    strategies = {name.split(".")[1]: tr.get(name).storage.strategy for name in load.queries}
    assert strategies == {"algebraic": "algebraic", "two_keys": "algebraic", "recomputed": "recompute",
                          "scalar": "algebraic", "distinct": "algebraic", "unioned": "algebraic"}
    drive(load, tables)


def test_combinations_aggregate_over_joins_and_subqueries(tr, db):
    tables = ["o", "c", "x"]
    load = workload(tr, db, tables, {
        "agg_join": "SELECT c.region, SUM(o.amount) AS s, COUNT(*) AS n FROM {db}.o o JOIN {db}.c c "
                    "ON o.cid = c.id WHERE o.amount IS NOT NULL GROUP BY c.region",
        "agg_three": "SELECT x.v, COUNT(*) AS n, MAX(o.amount) AS m FROM {db}.o o JOIN {db}.c c ON o.cid = c.id "
                     "JOIN {db}.x x ON x.k = c.id GROUP BY x.v",
        "cte_nested": "WITH big AS (SELECT cid, amount FROM {db}.o WHERE amount > 1) "
                      "SELECT b.cid, b.amount, t.total FROM big b JOIN "
                      "(SELECT cid, SUM(amount) AS total FROM {db}.o GROUP BY cid) t ON b.cid = t.cid",
        "agg_of_agg": "SELECT n, COUNT(*) AS groups FROM (SELECT cid, COUNT(*) AS n FROM {db}.o GROUP BY cid) g GROUP BY n",
    })
    drive(load, tables)



def test_outer_joins_left_full_and_aggregated(tr, db):
    """Outer joins end to end: stored, refreshed and compared with their query."""
    tables = ["o", "c", "x"]
    load = workload(tr, db, tables, {
        "left": "SELECT o.id, o.amount, c.region FROM {db}.o o LEFT JOIN {db}.c c ON o.cid = c.id",
        "full": "SELECT o.id, c.id AS cid, c.region FROM {db}.o o FULL JOIN {db}.c c "
                "ON o.cid = c.id AND c.region IS NOT NULL",
        "agg_left": "SELECT c.region, COUNT(o.id) AS n, SUM(o.amount) AS s FROM {db}.c c "
                    "LEFT JOIN {db}.o o ON o.cid = c.id GROUP BY c.region",
    })
    drive(load, tables)


"""Which recursive CTEs DIFFERENTIAL maintains, what it says about the others, and the CTE
hoisting their statements need on Spark (no JVM)."""
from __future__ import annotations

from dataclasses import replace

import pytest
import sqlglot

from airflow_trickle.dvm.base import Versions
from airflow_trickle.dvm.planner import plan, unsupported_constructs
from airflow_trickle.dvm.recursive import Recursive
from airflow_trickle.sql.parse import DIALECT
from airflow_trickle.sql.rewrite import hoist_nested_ctes

COLUMNS = {"g.e": ["src", "dst"], "g.f": ["a", "b"]}
PATHS = ("WITH RECURSIVE r(src, dst) AS (SELECT e.src, e.dst FROM g.e AS e UNION ALL "
         "SELECT r.src, e.dst FROM r AS r JOIN g.e AS e ON r.dst = e.src) SELECT r.src AS src, r.dst AS dst FROM r AS r")


def test_a_linear_recursive_cte_plans_as_a_recursive_node_under_the_outer_query():
    tree = plan(PATHS, COLUMNS)
    recursive = tree.items[0][1]
    assert isinstance(recursive, Recursive)
    assert (recursive.name, recursive.columns, recursive.other.name) == ("r", ["src", "dst"], "g.e")
    assert recursive.sources() == {"g.e"}
    assert "Recursive r through g.e  [derivations counted: insert-only changes evaluated semi-naively" in \
        "\n".join(tree.explain())


@pytest.mark.parametrize("query, why", [
    ("WITH RECURSIVE r(a) AS (SELECT src FROM g.e UNION ALL SELECT r.a FROM r JOIN r AS r2 ON r.a = r2.a) "
     "SELECT a FROM r", "a recursive term that reads r 2 times (only linear recursion is maintained)"),
    ("WITH RECURSIVE r(a) AS (SELECT src FROM g.e UNION ALL SELECT r.a FROM r LEFT JOIN g.e ON r.a = e.src) "
     "SELECT a FROM r", "a recursive term with LEFT JOIN (not monotone: recomputed instead)"),
    ("WITH RECURSIVE r(a, n) AS (SELECT src, 1 FROM g.e UNION ALL SELECT r.a, COUNT(*) FROM r GROUP BY r.a) "
     "SELECT a, n FROM r", "a recursive term with aggregate COUNT (not monotone: recomputed instead)"),
    ("WITH RECURSIVE r(a) AS (SELECT src FROM g.e UNION ALL SELECT r.a FROM r JOIN g.e ON r.a = e.src "
     "JOIN g.f ON f.a = r.a) SELECT a FROM r", "a recursive term that joins more than one other table"),
    ("WITH RECURSIVE r(a) AS (SELECT src FROM g.e UNION ALL SELECT r.a FROM r WHERE r.a IN (SELECT a FROM g.f)) "
     "SELECT a FROM r", "a subquery in the recursive term"),
    ("WITH RECURSIVE r(a) AS (SELECT src FROM g.e UNION ALL SELECT a + 1 FROM r WHERE a < 3), s AS "
     "(SELECT a FROM r) SELECT a FROM s", "WITH RECURSIVE with more than one CTE"),
    ("WITH RECURSIVE r(a) AS (SELECT src FROM g.e) SELECT a FROM r",
     "WITH RECURSIVE whose CTE does not read itself"),
])
def test_recursive_ctes_that_are_not_maintained_are_refused_by_name(query, why):
    assert why in unsupported_constructs(query, COLUMNS)[0]


def test_nested_ctes_are_hoisted_before_their_user_and_equal_ones_kept_once():
    inner = "WITH RECURSIVE x(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM x WHERE n < 3) SELECT n FROM x"
    statement = (f"MERGE INTO s.t AS t USING (WITH h AS (SELECT * FROM ({inner}) AS a UNION ALL "
                 f"SELECT * FROM ({inner}) AS b) SELECT * FROM h) AS s ON t.n = s.n WHEN NOT MATCHED THEN INSERT *")
    assert hoist_nested_ctes(statement) == (
        "MERGE INTO s.t AS t USING (WITH RECURSIVE x(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM x WHERE n < 3), "
        "h AS (SELECT * FROM (SELECT n FROM x) AS a UNION ALL SELECT * FROM (SELECT n FROM x) AS b) "
        "SELECT * FROM h) AS s ON t.n = s.n WHEN NOT MATCHED THEN INSERT *")
    plain = "MERGE INTO s.t AS t USING (WITH h AS (SELECT 1 AS n) SELECT * FROM h) AS s ON t.n = s.n"
    assert hoist_nested_ctes(plain) is plain  # no recursion: untouched, not even parsed


def test_two_different_ctes_of_one_name_are_not_merged_silently():
    statement = ("SELECT * FROM (WITH RECURSIVE x(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM x WHERE n < 2) "
                 "SELECT n FROM x) AS a JOIN (WITH RECURSIVE x(n) AS (SELECT 5 UNION ALL SELECT n + 1 FROM x "
                 "WHERE n < 7) SELECT n FROM x) AS b ON a.n = b.n")
    with pytest.raises(ValueError, match="two different CTEs named x"):
        hoist_nested_ctes(statement)


def test_the_sql_dialect_keeps_ctes_where_they_are():
    text = "SELECT * FROM (WITH t(c) AS (SELECT 1) SELECT * FROM t) AS subq"
    assert sqlglot.parse_one(text, read=DIALECT).sql(DIALECT) == text


def test_e_at_both_versions_and_r_old_are_computed_once_when_r_old_is_recursed():
    recursive = plan(PATHS, COLUMNS).items[0][1]
    # E's table is read at every iteration of both recursions, r_old by both of them
    assert recursive.materialized_parts() == ["__trickle_e_delta", "__trickle_e_old", "__trickle_e_new",
                                              "__trickle_old", "__trickle_base_delta", "__trickle_removed",
                                              "__trickle_added"]
    recursive = replace(recursive, stored_old="(SELECT `src` AS `src`, `dst` AS `dst` FROM `s`.`t`) AS __stored")
    # r_old read from the stream table: E is read by one recursion each, at its versions
    assert recursive.materialized_parts() == ["__trickle_e_delta", "__trickle_base_delta", "__trickle_removed",
                                              "__trickle_added"]
    alone = plan("WITH RECURSIVE c(a, k) AS (SELECT e.src, 0 FROM g.e AS e UNION ALL SELECT c.a, c.k + 1 "
                 "FROM c AS c WHERE c.k < 2) SELECT c.a AS a, c.k AS k FROM c AS c", COLUMNS).items[0][1]
    # no step through a table: nothing is stepped from r_old, so it is neither computed nor named
    assert alone.materialized_parts() == ["__trickle_base_delta", "__trickle_removed", "__trickle_added"]
    at = Versions(old={"g.e": 1}, new={"g.e": 2}, columns={"g.e": ["src", "dst"]}, use_cdf={"g.e": True})
    assert "__trickle_rec_old" not in alone.delta(at).sql(DIALECT)

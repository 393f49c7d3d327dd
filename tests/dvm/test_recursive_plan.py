"""Which recursive CTEs DIFFERENTIAL maintains, what it says about the others, and the CTE
hoisting their statements need on Spark (no JVM)."""
from __future__ import annotations

from dataclasses import replace

import pytest
import sqlglot

from airflow_trickle.dvm.base import Versions
from airflow_trickle.dvm.bindings import Reach
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
    assert ("Recursive r through g.e; E's rows looked up by src from the changes' keys  [derivations counted: "
            "insert-only changes evaluated semi-naively") in "\n".join(tree.explain())


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


def test_a_recursion_through_the_rows_the_changes_keys_reach_is_unrolled_when_their_levels_are_few():
    """With the rows of E the removed derivations reach bound (a view, and two levels), that
    recursion joins them twice in one statement, E's kept rows being those rows less E's removed
    ones; with the levels unknown it is Spark's recursion over them; unbound, over E."""
    recursive = plan(PATHS, COLUMNS).items[0][1]
    at = Versions(old={"g.e": 1}, new={"g.e": 2}, columns={"g.e": ["src", "dst"]}, use_cdf={"g.e": True})

    for part in recursive.materialized_parts()[:5]:  # computed by then, as a refresh does
        at = at.bound(at.bindings.with_part(recursive, part, f"{part}_view"))

    def removed(v: Versions) -> str:
        return " ".join(recursive.part_sql(v, "__trickle_removed").split())

    unrolled = removed(at.bound(at.bindings.with_reach(recursive, "removed", Reach("reached_view", 2))))
    assert "RECURSIVE" not in unrolled
    assert ("__trickle_removed_e AS (SELECT `src`, `dst`, CAST(1 AS BIGINT) AS __trickle_m FROM reached_view "
            "UNION ALL SELECT `src`, `dst`, -__trickle_m FROM __trickle_e_removed)") in unrolled
    assert "__trickle_removed_0 AS (SELECT * FROM (SELECT `src`, `dst`, CAST(-__trickle_w AS BIGINT)" in unrolled
    assert ("__trickle_removed_1(`src`, `dst`, __trickle_n) AS (SELECT r.src, e.dst, `r`.__trickle_n * "
            "`e`.__trickle_m AS __trickle_n FROM __trickle_removed_0 AS `r` JOIN __trickle_removed_e AS `e` "
            "ON r.dst = e.src)") in unrolled
    assert "__trickle_removed_2(`src`, `dst`, __trickle_n) AS (SELECT r.src, e.dst" in unrolled
    assert "FROM __trickle_removed_1 AS `r` JOIN __trickle_removed_e AS `e`" in unrolled
    assert ("__trickle_removed(`src`, `dst`, __trickle_n) AS (SELECT * FROM __trickle_removed_0 UNION ALL "
            "SELECT * FROM __trickle_removed_1 UNION ALL SELECT * FROM __trickle_removed_2)") in unrolled
    assert "__trickle_removed_3" not in unrolled and "g.e" not in unrolled
    looped = removed(at.bound(at.bindings.with_reach(recursive, "removed", Reach("reached_view", None))))
    assert looped.startswith("WITH RECURSIVE") and "JOIN __trickle_removed_e AS `e`" in looped
    assert "__trickle_removed_1" not in looped
    scanned = removed(at)
    assert "reached_view" not in scanned and "JOIN __trickle_e_kept AS `e`" in scanned
    # the added derivations go through E's new rows alone
    added = " ".join(recursive.part_sql(at.bound(at.bindings.with_reach(recursive, "added", Reach("new_view", 1))),
                                        "__trickle_added").split())
    assert "__trickle_added_e AS (SELECT `src`, `dst`, CAST(1 AS BIGINT) AS __trickle_m FROM new_view)" in added


@pytest.mark.parametrize("step, key", [
    # the key is passed on: the rows of the seed's keys are all a recursion reaches
    ("SELECT r.src, e.dst FROM r JOIN g.e AS e ON r.src = e.src", ("src", "src", None)),
    # unqualified columns of one side only, and the equality in WHERE
    ("SELECT r.src, b FROM r, g.f AS f WHERE a = r.dst AND b > 1", ("a", "dst", "b")),
    # the next key is an expression, another column of r, or under an OR: not followed
    ("SELECT r.src, e.dst + 1 FROM r JOIN g.e AS e ON r.dst = e.src", None),
    ("SELECT r.src, r.src FROM r JOIN g.e AS e ON r.dst = e.src", None),
    ("SELECT r.src, e.dst FROM r JOIN g.e AS e ON r.dst = e.src OR r.src = e.src", None),
])
def test_the_key_a_recursion_follows_through_its_table(step, key):
    query = f"WITH RECURSIVE r(src, dst) AS (SELECT e.src, e.dst FROM g.e AS e UNION ALL {step}) SELECT src, dst FROM r"
    found = plan(query, COLUMNS).items[0][1].reach_key
    assert (found and (found.other_key, found.self_key, found.next_key)) == (key or None)

"""Rewrite passes, SQL in and SQL out (no JVM)."""
from __future__ import annotations

import pytest
import sqlglot

from airflow_trickle.dvm.rewrites import null_rejecting_outer_joins_to_inner
from airflow_trickle.sql.parse import DIALECT

INNER = [
    # EXISTS / IN as subqueries_to_joins writes them
    ("SELECT o.a FROM o LEFT JOIN u ON u.k = o.k WHERE NOT u.k IS NULL",
     "SELECT o.a FROM o JOIN u ON u.k = o.k WHERE NOT u.k IS NULL"),
    # a compared scalar subquery's value, among other conditions, in parentheses
    ("SELECT o.a FROM o LEFT OUTER JOIN u ON u.k = o.k WHERE (o.a > 1 AND o.y < u.x)",
     "SELECT o.a FROM o JOIN u ON u.k = o.k WHERE (o.a > 1 AND o.y < u.x)"),
    ("SELECT o.a FROM o LEFT JOIN u ON u.k = o.k WHERE u.name LIKE 'a%'",
     "SELECT o.a FROM o JOIN u ON u.k = o.k WHERE u.name LIKE 'a%'"),
    ("SELECT o.a FROM o LEFT JOIN u ON u.k = o.k WHERE u.c IN (1, 2)",
     "SELECT o.a FROM o JOIN u ON u.k = o.k WHERE u.c IN (1, 2)"),
    # only the join whose item is rejected
    ("SELECT o.a FROM o LEFT JOIN u ON u.k = o.k LEFT JOIN v ON v.k = o.k WHERE v.k <> 0",
     "SELECT o.a FROM o LEFT JOIN u ON u.k = o.k JOIN v ON v.k = o.k WHERE v.k <> 0"),
]

KEPT = [
    "SELECT o.a FROM o LEFT JOIN u ON u.k = o.k WHERE u.k IS NULL",  # NOT EXISTS: the padded rows are the result
    "SELECT o.a FROM o LEFT JOIN u ON u.k = o.k WHERE NOT NOT u.k IS NULL",
    "SELECT o.a FROM o LEFT JOIN u ON u.k = o.k WHERE u.k IS NULL OR u.x > 1",  # under OR
    "SELECT o.a FROM o LEFT JOIN u ON u.k = o.k WHERE u.k <=> 1",  # NULL-safe: true for NULL <=> NULL
    "SELECT o.a FROM o LEFT JOIN u ON u.k = o.k WHERE COALESCE(u.k, 0) = 0",  # not the column itself
    "SELECT o.a FROM o LEFT JOIN u ON u.k = o.k WHERE o.a > 1",  # the preserved side
    "SELECT o.a FROM o LEFT SEMI JOIN u ON u.k = o.k WHERE o.k > 1",
    "SELECT o.a FROM o FULL JOIN u ON u.k = o.k WHERE u.k = 0",
    "SELECT o.a FROM o LEFT JOIN u ON u.k = o.k",
]


def rewritten(sql: str) -> str:
    return null_rejecting_outer_joins_to_inner(sqlglot.parse_one(sql, read=DIALECT)).sql(DIALECT)


@pytest.mark.parametrize("before,after", INNER)
def test_a_left_join_whose_right_side_where_rejects_when_null_is_inner(before, after):
    assert rewritten(before) == sqlglot.parse_one(after, read=DIALECT).sql(DIALECT)


@pytest.mark.parametrize("sql", KEPT)
def test_other_outer_joins_are_kept(sql):
    assert rewritten(sql) == sqlglot.parse_one(sql, read=DIALECT).sql(DIALECT)


def test_a_subquery_in_from_is_rewritten_too_and_the_input_is_left_alone():
    tree = sqlglot.parse_one("SELECT s.a FROM (SELECT o.a FROM o LEFT JOIN u ON u.k = o.k WHERE u.k > 0) AS s",
                             read=DIALECT)
    before = tree.sql(DIALECT)
    assert "LEFT JOIN" not in null_rejecting_outer_joins_to_inner(tree).sql(DIALECT)
    assert tree.sql(DIALECT) == before

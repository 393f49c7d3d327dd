"""Ways of writing a query that the compiler once took for other constructs (TPC-DS q40, q72, q75,
q78, q97: ``ON (a.k = b.k)``; q2, q8, q66, q87: ``... UNION ALL (SELECT ...)``): each compiles,
to the same delta SQL as the query written without the parentheses (no JVM)."""
from __future__ import annotations

import pytest
import sqlglot
from sqlglot import exp

from airflow_trickle.dvm.base import Unsupported
from airflow_trickle.dvm.planner import plan
from airflow_trickle.sql.parse import DIALECT
from tests.dvm.golden import Case, compile_case, pretty

SOURCES = {"s.o": ["id", "cid", "amount"], "s.c": ["id", "region"], "s.r": ["id", "cid", "amount"]}

#: (written with parentheses, written without): each pair must compile to the same SQL.
PAIRS = [
    ("SELECT o.id, c.region FROM s.o AS o LEFT JOIN s.c AS c ON (o.cid = c.id)",
     "SELECT o.id, c.region FROM s.o AS o LEFT JOIN s.c AS c ON o.cid = c.id"),
    ("SELECT o.id, c.region FROM s.o AS o FULL JOIN s.c AS c ON ((o.cid = c.id) AND (c.region IS NOT NULL))",
     "SELECT o.id, c.region FROM s.o AS o FULL JOIN s.c AS c ON o.cid = c.id AND c.region IS NOT NULL"),
    ("SELECT c.region, COUNT(*) AS n FROM s.c AS c LEFT JOIN s.o AS o ON (c.id = o.cid) GROUP BY c.region",
     "SELECT c.region, COUNT(*) AS n FROM s.c AS c LEFT JOIN s.o AS o ON c.id = o.cid GROUP BY c.region"),
    ("SELECT o.id, o.amount FROM s.o AS o UNION ALL (SELECT r.id, r.amount FROM s.r AS r)",
     "SELECT o.id, o.amount FROM s.o AS o UNION ALL SELECT r.id, r.amount FROM s.r AS r"),
    ("SELECT o.cid FROM s.o AS o EXCEPT ALL (SELECT r.cid FROM s.r AS r)",
     "SELECT o.cid FROM s.o AS o EXCEPT ALL SELECT r.cid FROM s.r AS r"),
    ("SELECT o.cid FROM s.o AS o INTERSECT ALL (SELECT r.cid FROM s.r AS r)",
     "SELECT o.cid FROM s.o AS o INTERSECT ALL SELECT r.cid FROM s.r AS r"),
    ("(SELECT o.cid FROM s.o AS o) INTERSECT (SELECT r.cid FROM s.r AS r)",
     "SELECT o.cid FROM s.o AS o INTERSECT SELECT r.cid FROM s.r AS r"),
    ("SELECT o.cid FROM s.o AS o UNION (SELECT r.cid FROM s.r AS r)",
     "SELECT o.cid FROM s.o AS o UNION SELECT r.cid FROM s.r AS r"),
    ("(SELECT o.cid FROM s.o AS o) EXCEPT (SELECT r.cid FROM s.r AS r)",
     "SELECT o.cid FROM s.o AS o EXCEPT SELECT r.cid FROM s.r AS r"),
]


def compiled(query: str, changed: list[str]) -> str:
    """The delta SQL of ``query``, with every parenthesis node dropped: the pairs differ in
    parentheses the user wrote, which the SQL keeps where it quotes the query's conditions."""
    sql = compile_case(Case(name="surface", sources=SOURCES, changed=changed, output="delta", query=query,
                            expected=""))
    tree = sqlglot.parse_one(sql, read=DIALECT)
    for paren in list(tree.find_all(exp.Paren)):
        paren.replace(paren.this)
    return pretty(tree.sql(DIALECT))


@pytest.mark.parametrize("written, plain", PAIRS, ids=[f"pair{i}" for i in range(len(PAIRS))])
def test_parentheses_change_nothing_in_the_delta(written, plain):
    for changed in (["s.o"], ["s.c", "s.r"]):
        assert compiled(written, changed) == compiled(plain, changed)


def test_distinct_over_window_functions_compiles_and_a_refusal_names_its_construct():
    """TPC-DI's silver models: ``SELECT DISTINCT`` over ``MIN(...) OVER (...)``, no GROUP BY."""
    assert compiled("SELECT DISTINCT o.cid, MIN(o.amount) OVER (PARTITION BY o.cid) AS low FROM s.o AS o", ["s.o"])
    with pytest.raises(Unsupported, match="SELECT DISTINCT over window functions and aggregates together"):
        plan("SELECT DISTINCT o.cid, COUNT(*) OVER () AS n, MAX(o.id) AS top FROM s.o AS o", SOURCES)


def test_a_scalar_subquery_is_still_refused_where_it_may_return_several_rows():
    with pytest.raises(Unsupported, match="scalar subquery"):
        plan("SELECT o.id FROM s.o AS o WHERE o.amount > (SELECT r.amount FROM s.r AS r)", SOURCES)

"""Top-K planning (no JVM): which ORDER BY ... LIMIT queries become a TopK, ordered how, and
which are refused with what message.  The oracle tests prove the maintenance exact."""
from __future__ import annotations

import pytest

from airflow_trickle.dvm.base import Unsupported
from airflow_trickle.dvm.planner import plan
from airflow_trickle.dvm.topk import SortKey, TopK

COLUMNS = {"s.o": ["id", "cid", "amount"]}


@pytest.mark.parametrize("query,order,limit,offset", [
    ("SELECT id, amount FROM s.o ORDER BY amount DESC, id LIMIT 3",
     [SortKey("amount", True, False), SortKey("id", False, True)], 3, 0),
    ("SELECT id, amount AS a FROM s.o ORDER BY 2 NULLS LAST, a DESC NULLS FIRST LIMIT 1 OFFSET 4",
     [SortKey("a", False, False), SortKey("a", True, True)], 1, 4),
    ("SELECT cid, SUM(amount) AS total FROM s.o GROUP BY cid ORDER BY SUM(amount) LIMIT 2",
     [SortKey("total", False, True)], 2, 0),
    ("SELECT id FROM s.o UNION ALL SELECT cid FROM s.o ORDER BY id LIMIT 5", [SortKey("id", False, True)], 5, 0),
])
def test_order_by_limit_at_the_top_becomes_a_top_k_on_output_columns(query, order, limit, offset):
    node = plan(query, COLUMNS)
    assert isinstance(node, TopK)
    assert (node.order, node.limit, node.offset) == (order, limit, offset)
    assert node.scoped == (offset == 0)
    assert node.explain()[0].startswith("TopK ORDER BY")


def test_order_by_without_limit_is_ignored():
    assert not isinstance(plan("SELECT id FROM s.o ORDER BY id", COLUMNS), TopK)


@pytest.mark.parametrize("query,message", [
    ("SELECT id FROM s.o LIMIT 3", "LIMIT without ORDER BY"),
    ("SELECT id FROM s.o ORDER BY amount LIMIT 3", "ORDER BY amount with LIMIT: a top-K may only be ordered by"),
    ("SELECT x.id FROM (SELECT id FROM s.o ORDER BY id LIMIT 2) x", "LIMIT inside a subquery"),
    ("SELECT id FROM s.o ORDER BY id LIMIT 2 + 1", "LIMIT 2 + 1 that is not a constant whole number"),
])
def test_what_a_top_k_refuses_is_named(query, message):
    with pytest.raises(Unsupported, match="^" + message.replace("+", r"\+")):
        plan(query, COLUMNS)

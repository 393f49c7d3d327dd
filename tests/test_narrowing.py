"""Rows a block's filter surely rejects, left out in Arrow before a lookup (no JVM).

``refresh/narrowing.py`` may keep more rows than the filter (Spark applies all of it after),
never fewer: each case lists the rows a filter keeps, and the rows Arrow keeps must hold them
-- exactly them where Arrow tests the whole filter.  The conditions are what
``dvm/conjuncts.item_conditions`` gives a block's FROM items (pinned by its doctest and below).
"""
from __future__ import annotations

import datetime
from decimal import Decimal

import pyarrow as pa
import pytest
from sqlglot import parse_one

from airflow_trickle.dvm.planner import plan
from airflow_trickle.dvm.conjuncts import item_conditions
from airflow_trickle.refresh.narrowing import arrow_condition, narrowed
from airflow_trickle.sql.parse import DIALECT

D = datetime.date
ROWS = pa.table({
    "id": pa.array([1, 2, 3, 4, 5, 6], pa.int32()),
    "d": pa.array([D(1995, 9, 1), D(1995, 9, 30), D(1995, 10, 1), None, D(1994, 1, 1), D(1995, 9, 15)]),
    "q": pa.array([Decimal("1.00"), Decimal("11.50"), None, Decimal("20.00"), Decimal("0.05"), Decimal("11.49")],
                  pa.decimal128(12, 2)),
    "m": pa.array(["AIR", "AIR REG", None, "MAIL", "air", "special big requests"]).cast(pa.string_view()),
    "f": pa.array([0.5, None, 2.0, 1.5, -1.0, 3.0]),
    "e": pa.array([D(1995, 9, 2), D(1995, 9, 1), D(1995, 10, 1), D(1995, 1, 1), None, D(1995, 9, 20)]),
})

# (condition, ids the filter keeps, whether Arrow tests all of it)
CASES = [
    ("t.d >= CAST('1995-09-01' AS DATE) AND t.d < CAST('1995-10-01' AS DATE)", {1, 2, 6}, True),
    ("t.d BETWEEN CAST('1995-09-01' AS DATE) AND CAST('1995-09-30' AS DATE)", {1, 2, 6}, True),
    ("CAST('1995-09-15' AS DATE) <= t.d", {2, 3, 6}, True),
    ("t.q <= 11.5", {1, 2, 5, 6}, True),
    ("t.q > -1 AND t.q <> 20", {1, 2, 5, 6}, True),
    ("t.m IN ('AIR', 'AIR REG')", {1, 2}, True),
    ("t.m = 'AIR' OR t.id > 5", {1, 6}, True),
    ("t.m IS NULL", {3}, True),
    ("t.m IS NOT NULL AND t.f > 1", {4, 6}, False),  # floats are left to Spark (NaN sorts last there)
    ("t.m LIKE 'AIR%'", {1, 2}, True),
    ("t.m LIKE '%REG'", {2}, True),
    ("t.m LIKE 'AIR'", {1}, True),
    ("t.d < t.e", {1, 6}, True),
    ("t.id IN (1, 4, 5)", {1, 4, 5}, True),
    # only partly testable: the rest is left to Spark, so Arrow keeps a superset
    ("t.m LIKE '%special%requests%'", {6}, False),  # both words, in either order
    ("t.m LIKE 'A_R%'", {1, 2}, False),
    ("t.q > 1 AND UPPER(t.m) = 'MAIL'", {4}, False),
    ("t.m = 'AIR' OR UPPER(t.m) = 'MAIL'", {1, 4}, False),
    ("NOT t.m = 'AIR'", {2, 4, 5, 6}, False),
    ("t.m NOT LIKE 'AIR%'", {4, 5, 6}, False),  # sqlglot: a LIKE with ``negate`` (TPC-H q13)
    ("t.m NOT LIKE '%special%requests%'", {1, 2, 4, 5}, False),
    ("t.d > '1995-09-01'", {2, 3, 6}, False),  # a string compared with a date: Spark casts, Arrow does not try
    ("t.q > 1e1", {2, 4, 6}, False),  # a double literal: compared as doubles by Spark
]


@pytest.mark.parametrize("condition,kept,whole", CASES, ids=[c for c, _, _ in CASES])
def test_arrow_keeps_every_row_the_filter_keeps(condition, kept, whole):
    tree = parse_one(condition, dialect=DIALECT)
    found = set(narrowed(ROWS, tree)["id"].to_pylist())
    assert kept <= found, f"{condition}: Arrow dropped {sorted(kept - found)}"
    if whole:
        assert found == kept, condition
    assert (arrow_condition(tree, ROWS.schema) is not None) == (found != set(ROWS["id"].to_pylist()) or whole)


def test_untestable_conditions_keep_the_rows_whole():
    for condition in ("UPPER(t.m) = 'AIR'", "t.m = 'AIR' OR UPPER(t.m) = 'X'", "t.missing = 1", "t.id = 1.5",
                      "t.f > 1", "t.d = CAST('19950901' AS DATE)"):
        assert narrowed(ROWS, parse_one(condition, dialect=DIALECT)) is ROWS, condition


def test_each_from_item_gets_the_filter_its_rows_must_pass():
    columns = {"s.o": ["k", "c", "d"], "s.c": ["k", "r"], "s.x": ["k", "v"]}

    def conditions(sql):
        node = plan(sql, columns)
        return {node.items[i][0]: c.sql(DIALECT) for i, c in item_conditions(node).items()}

    # WHERE conjuncts of one item; an equality repeated in every disjunct is a join equality
    assert conditions("SELECT o.d FROM s.o AS o, s.c AS c WHERE o.c = c.k AND o.d > 1 AND c.r = 'n'") == {
        "o": "o.d > 1", "c": "c.r = 'n'"}
    # the null-supplying side of a LEFT join: its own ON only; the preserved side: the WHERE
    assert conditions("SELECT o.d, c.r FROM s.o AS o LEFT JOIN s.c AS c ON o.c = c.k AND c.r = 'n' "
                      "AND o.d > 5 WHERE o.d < 9 AND c.r IS NULL") == {"o": "o.d < 9", "c": "c.r = 'n'"}
    # a FULL join: nothing
    assert conditions("SELECT o.d FROM s.o AS o FULL JOIN s.c AS c ON o.c = c.k WHERE o.d > 1") == {}


def test_strings_are_tested_as_a_char_column_would_be_too():
    # Spark pads a CHAR(6) column's values when it reads them (``'AIR' = 'AIR   '`` holds there);
    # delta-rs hands over what is stored, padded or not: trailing spaces are ignored both ways
    rows = pa.table({"id": [1, 2, 3], "m": ["AIR   ", "AIR", "MAIL  "]})
    for condition, kept in (("t.m = 'AIR'", {1, 2}), ("t.m IN ('AIR  ', 'SHIP')", {1, 2}),
                            ("t.m LIKE '%IR'", {1, 2}), ("t.m LIKE 'MA%L '", {3}), ("t.m LIKE 'AIR'", {1, 2})):
        assert set(narrowed(rows, parse_one(condition, dialect=DIALECT))["id"].to_pylist()) == kept, condition
    for condition in ("t.m > 'A'", "t.m <> 'AIR'", "t.m BETWEEN 'A' AND 'B'"):  # by order: padding matters
        assert narrowed(rows, parse_one(condition, dialect=DIALECT)) is rows, condition

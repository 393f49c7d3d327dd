"""Groups an aggregate recomputes, written as literals when a refresh counted them (no JVM)."""
from __future__ import annotations

import datetime
import decimal

from airflow_trickle.dvm.base import Versions
from airflow_trickle.dvm.aggregate import literal as _literal
from airflow_trickle.dvm.planner import plan
from airflow_trickle.sql.parse import DIALECT

COLUMNS = {"s.o": ["id", "cid", "amount"], "s.c": ["id", "region"]}
VERSIONS = Versions(old={"s.o": 3, "s.c": 3}, new={"s.o": 5, "s.c": 3}, columns=COLUMNS,
                    use_cdf={"s.o": True, "s.c": True}, consolidate=False)
QUERY = ("SELECT c.region, o.cid, COUNT(*) AS n FROM s.o AS o JOIN s.c AS c ON o.cid = c.id "
         "GROUP BY c.region, o.cid HAVING COUNT(*) > 1")


def test_known_groups_become_filters_on_the_group_columns_and_literal_keys():
    block = plan(QUERY, COLUMNS)
    unknown = block.delta(VERSIONS).sql(DIALECT)
    assert "TABLE_CHANGES('s.o', 4, 5)" in unknown.split("__old")[0]  # K computed from the delta
    known = block.delta(VERSIONS.bound(VERSIONS.bindings.with_touched_groups(block, [(11, "EU", 7), (12, None, 8)])))
    known = known.sql(DIALECT)
    assert "VALUES (11), (12)" in known
    assert "c.region IN ('EU') OR c.region IS NULL" in known
    assert "o.cid IN (7, 8)" in known  # in the order the groups came
    # the hash filter stays: the column filters only narrow what is read
    assert known.count("XXHASH64(") >= 2
    # the delta's change feed is not read to name the groups any more: only by the sides themselves
    assert known.count("TABLE_CHANGES") < unknown.count("TABLE_CHANGES")


def test_no_known_group_reads_nothing():
    block = plan(QUERY, COLUMNS)
    sql = block.delta(VERSIONS.bound(VERSIONS.bindings.with_touched_groups(block, []))).sql(DIALECT)
    assert "WHERE FALSE" in sql.upper() and "IN (" not in sql.replace("IN (SELECT", "")


def test_a_value_without_an_exact_literal_leaves_its_column_unfiltered():
    block = plan(QUERY, COLUMNS)
    sql = block.delta(VERSIONS.bound(VERSIONS.bindings.with_touched_groups(block, [(11, "EU", 1.5)]))).sql(DIALECT)
    assert "c.region IN ('EU')" in sql and "o.cid IN" not in sql


def test_literals():
    assert _literal(True).sql(DIALECT) == "TRUE"
    assert _literal(12).sql(DIALECT) == "12"
    assert _literal(decimal.Decimal("1E+3")).sql(DIALECT) == "1000"
    assert _literal(decimal.Decimal("12.50")).sql(DIALECT) == "12.50"
    assert _literal("it's").sql(DIALECT) == "'it\\'s'"
    assert _literal(datetime.date(2026, 11, 27)).sql(DIALECT) == "CAST('2026-11-27' AS DATE)"
    for inexact in (1.5, datetime.datetime(2026, 11, 27, 1, 2), decimal.Decimal("NaN"), b"x"):
        assert _literal(inexact) is None

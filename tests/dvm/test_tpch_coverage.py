"""Which of the 22 TPC-H queries DIFFERENTIAL maintains, and why the others are refused (no JVM).

The queries (``tpch/queries.sql``, Spark SQL) are qualified against the TPC-H schema the way
``create_stream_table`` qualifies a definition, then planned.  ``EXPECTED`` records the state of
the compiler: a query that starts being maintained, or is refused for another reason, changes
this table on purpose.  Whether the maintained ones are *exact* is the oracle tests' business;
this pins down how far the SQL surface reaches.
"""
from __future__ import annotations

from pathlib import Path

import pytest
from sqlglot.optimizer.qualify import qualify

from airflow_trickle.dvm.base import Unsupported
from airflow_trickle.dvm.planner import plan
from airflow_trickle.sql.parse import DIALECT, parse_query

SCHEMA = {"tpch": {
    "nation": {"n_nationkey": "bigint", "n_name": "string", "n_regionkey": "bigint", "n_comment": "string"},
    "region": {"r_regionkey": "bigint", "r_name": "string", "r_comment": "string"},
    "part": {"p_partkey": "bigint", "p_name": "string", "p_mfgr": "string", "p_brand": "string", "p_type": "string",
             "p_size": "int", "p_container": "string", "p_retailprice": "decimal(12,2)", "p_comment": "string"},
    "supplier": {"s_suppkey": "bigint", "s_name": "string", "s_address": "string", "s_nationkey": "bigint",
                 "s_phone": "string", "s_acctbal": "decimal(12,2)", "s_comment": "string"},
    "partsupp": {"ps_partkey": "bigint", "ps_suppkey": "bigint", "ps_availqty": "int",
                 "ps_supplycost": "decimal(12,2)", "ps_comment": "string"},
    "customer": {"c_custkey": "bigint", "c_name": "string", "c_address": "string", "c_nationkey": "bigint",
                 "c_phone": "string", "c_acctbal": "decimal(12,2)", "c_mktsegment": "string", "c_comment": "string"},
    "orders": {"o_orderkey": "bigint", "o_custkey": "bigint", "o_orderstatus": "string",
               "o_totalprice": "decimal(12,2)", "o_orderdate": "date", "o_orderpriority": "string",
               "o_clerk": "string", "o_shippriority": "int", "o_comment": "string"},
    "lineitem": {"l_orderkey": "bigint", "l_partkey": "bigint", "l_suppkey": "bigint", "l_linenumber": "int",
                 "l_quantity": "decimal(12,2)", "l_extendedprice": "decimal(12,2)", "l_discount": "decimal(12,2)",
                 "l_tax": "decimal(12,2)", "l_returnflag": "string", "l_linestatus": "string",
                 "l_shipdate": "date", "l_commitdate": "date", "l_receiptdate": "date",
                 "l_shipinstruct": "string", "l_shipmode": "string", "l_comment": "string"},
}}
COLUMNS = {f"tpch.{table}": list(columns) for table, columns in SCHEMA["tpch"].items()}

#: "incremental", or the start of the refusal.
EXPECTED = {
    "q1": "incremental", "q2": "incremental", "q3": "incremental", "q4": "incremental", "q5": "incremental",
    "q6": "incremental", "q7": "incremental", "q8": "incremental", "q9": "incremental", "q10": "incremental",
    "q11": "incremental", "q12": "incremental", "q13": "incremental", "q14": "incremental",
    "q15": "incremental", "q16": "incremental", "q17": "incremental", "q18": "incremental",
    "q19": "incremental", "q20": "incremental", "q21": "incremental", "q22": "incremental",
}


def tpch_queries() -> dict[str, str]:
    text = (Path(__file__).parent / "tpch" / "queries.sql").read_text()
    queries = {}
    for chunk in text.split("-- q")[1:]:
        number, body = chunk.split("\n", 1)
        queries[f"q{number.strip()}"] = body.strip().rstrip(";")
    return queries


def coverage(query: str) -> str:
    qualified = qualify(parse_query(query), schema=SCHEMA, dialect=DIALECT, validate_qualify_columns=True,
                        quote_identifiers=True)
    try:
        plan(qualified.sql(DIALECT), COLUMNS)
    except Unsupported as err:
        return str(err)
    return "incremental"


@pytest.mark.parametrize("name", sorted(EXPECTED, key=lambda n: int(n[1:])))
def test_tpch_query_is_maintained_or_refused_as_recorded(name):
    assert coverage(tpch_queries()[name]).startswith(EXPECTED[name])


def test_all_22_queries_are_here():
    assert sorted(tpch_queries()) == sorted(EXPECTED)

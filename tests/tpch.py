"""TPC-H as a correctness workload: the 22 queries as DIFFERENTIAL stream tables, kept exact
through refresh functions RF1 (new orders with their line items), RF2 (orders deleted with
their line items) and an update batch (quantities, prices, and segments, flags and priorities
that move rows between groups).

Used by ``tests/test_tpch.py`` (scale factor 0.01, one cycle), ``benchmarks/tpch.py`` and
``benchmarks/suite_settings.py``.  Data
comes from ``tpchgen-cli`` (installed with the test extras) as Parquet, loaded into Delta tables
with their change feeds on.  The queries are ``tests/dvm/tpch/queries.sql`` as written (q18's
unaliased ``SUM(l_quantity)`` is stored as Spark names it, ``sum(l_quantity)``), except that
``ORDER BY … LIMIT`` is completed with the remaining output columns: a top-K whose order has
ties at the boundary keeps *some* of the tied rows, and SQL does not say which, so only a total
order makes "equals its query" a test.
"""
from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

from tests.oracle import both_multisets

QUERIES = Path(__file__).resolve().parent / "dvm" / "tpch" / "queries.sql"
TABLES = ("region", "nation", "part", "supplier", "partsupp", "customer", "orders", "lineitem")


def queries() -> dict[str, str]:
    """``{"q1": sql, ...}``: the 22 queries, each ORDER BY … LIMIT made total."""
    found = {}
    for block in QUERIES.read_text().split("-- q")[1:]:
        number, sql = block.split("\n", 1)
        found[f"q{int(number.strip())}"] = _total_order(sql.strip().rstrip(";").strip())
    return found


def _total_order(sql: str) -> str:
    """Append the output columns not already ordered by to a top-level ``ORDER BY … LIMIT``."""
    import sqlglot

    from airflow_trickle.sql.parse import DIALECT

    tree = sqlglot.parse_one(sql, read=DIALECT)
    if not tree.args.get("limit") or not tree.args.get("order"):
        return sql
    ordered = {o.this.sql(DIALECT) for o in tree.args["order"].expressions}
    # an output column by its name, or an unnamed one (q18's SUM(l_quantity)) by its expression
    outputs = [e.alias_or_name or e.sql(DIALECT) for e in tree.selects]
    extra = [o for o in outputs if o not in ordered]
    return tree.order_by(*extra, append=True).sql(DIALECT) if extra else sql


def generator() -> str:
    """The ``tpchgen-cli`` command (beside this Python, else on PATH)."""
    beside = Path(sys.executable).with_name("tpchgen-cli")
    found = str(beside) if beside.exists() else shutil.which("tpchgen-cli")
    if not found:
        raise RuntimeError("tpchgen-cli is not installed: pip install tpchgen-cli (it is in the test extras)")
    return found


def load(tr, scale: float, folder: Path, database: str = "tpch") -> None:
    """Generate TPC-H at ``scale`` into ``folder`` and load it into Delta tables ``database.*``."""
    folder.mkdir(parents=True, exist_ok=True)
    subprocess.run([generator(), "parquet", "-s", str(scale), f"--output-dir={folder}"], check=True,
                   capture_output=True)
    tr.sql(f"CREATE DATABASE IF NOT EXISTS {database}")
    for table in TABLES:
        tr.sql(f"CREATE TABLE {database}.{table} USING delta TBLPROPERTIES (delta.enableChangeDataFeed = true) "
               f"AS SELECT * FROM parquet.`{folder / (table + '.parquet')}`")


def for_database(sql: str, database: str) -> str:
    return re.sub(r"\btpch\.", f"{database}.", sql)


def refresh_functions(tr, cycle: int, database: str = "tpch", *, updates: bool = True) -> list[str]:
    """RF1, RF2 and (with ``updates``) an update batch: new orders (copies of existing ones
    under new keys, with their line items), some orders deleted with their line items, and
    updates that move rows between groups.  ``cycle`` keeps the new keys of successive cycles
    apart."""
    db = database
    offset = 10_000_000 * (cycle + 1)
    statements = [
        # RF1: ~0.1% new orders with their line items
        f"INSERT INTO {db}.orders SELECT o_orderkey + {offset}, o_custkey, o_orderstatus, o_totalprice, "
        f"o_orderdate, o_orderpriority, o_clerk, o_shippriority, o_comment FROM {db}.orders "
        f"WHERE o_orderkey < 10000000 AND pmod(o_orderkey, 997) = {cycle}",
        f"INSERT INTO {db}.lineitem SELECT l_orderkey + {offset}, l_partkey, l_suppkey, l_linenumber, l_quantity, "
        f"l_extendedprice, l_discount, l_tax, l_returnflag, l_linestatus, l_shipdate, l_commitdate, l_receiptdate, "
        f"l_shipinstruct, l_shipmode, l_comment FROM {db}.lineitem "
        f"WHERE l_orderkey < 10000000 AND pmod(l_orderkey, 997) = {cycle}",
        # RF2: ~0.1% of the orders deleted with their line items
        f"DELETE FROM {db}.lineitem WHERE pmod(l_orderkey, 991) = {cycle + 1}",
        f"DELETE FROM {db}.orders WHERE pmod(o_orderkey, 991) = {cycle + 1}",
    ]
    statements += [
        # updates: quantities and prices; flags, priorities and segments that move rows between groups
        f"UPDATE {db}.lineitem SET l_quantity = l_quantity + 1, l_extendedprice = l_extendedprice * 1.01, "
        f"l_returnflag = CASE l_returnflag WHEN 'N' THEN 'R' ELSE 'N' END WHERE pmod(l_orderkey, 983) = {cycle + 2}",
        f"UPDATE {db}.orders SET o_orderpriority = '1-URGENT', o_orderdate = date_add(o_orderdate, 30) "
        f"WHERE pmod(o_orderkey, 977) = {cycle + 3}",
        f"UPDATE {db}.customer SET c_mktsegment = 'BUILDING', c_acctbal = c_acctbal + 100 "
        f"WHERE pmod(c_custkey, 97) = {cycle + 4}",
        f"UPDATE {db}.partsupp SET ps_supplycost = ps_supplycost * 0.9, ps_availqty = ps_availqty + 7 "
        f"WHERE pmod(ps_partkey, 89) = {cycle + 5}",
        f"UPDATE {db}.part SET p_size = 15, p_type = 'LARGE POLISHED BRASS' WHERE pmod(p_partkey, 83) = {cycle + 6}",
        f"UPDATE {db}.supplier SET s_acctbal = s_acctbal - 50, s_comment = 'Customer Complaints noted' "
        f"WHERE pmod(s_suppkey, 31) = {cycle + 7}",
    ] if updates else []
    for statement in statements:
        tr.sql(statement)
    return statements


def create_differential(tr, database: str) -> dict[str, str]:
    """The 22 queries over ``database`` as DIFFERENTIAL stream tables ``database.q1`` … ``q22``;
    their names and queries."""
    made = {f"{database}.{name}": for_database(sql, database) for name, sql in queries().items()}
    for name, sql in made.items():
        tr.create_stream_table(name, sql, refresh_mode="DIFFERENTIAL", schedule=None)
        assert tr.get(name).effective_mode == "DIFFERENTIAL", name
    return made


def refresh_and_check(tr, made: dict[str, str], cycle: int) -> None:
    """Refresh each stream table of ``made`` once: every refresh must be DIFFERENTIAL and leave
    the table equal to its query."""
    for name, sql in made.items():
        result = tr.refresh_stream_table(name)
        assert (result.status, result.action) == ("COMPLETED", "DIFFERENTIAL"), (cycle, name, result)
        stored, wanted = both_multisets(tr.read(name), tr.sql(sql))
        assert stored == wanted, (f"cycle {cycle}: {name} differs from its query: "
                                  f"missing {[r for r in wanted if r not in stored][:3]}, "
                                  f"extra {[r for r in stored if r not in wanted][:3]}")

"""The example, end to end on the embedded default: sources, stream tables, changes, refreshes.

    python dags_example/shop.py [WAREHOUSE_DIR]

Creates two source tables, a chain and an aggregate of stream tables over them, changes the
sources, refreshes, and prints what each refresh did and what the tables hold.
"""
from __future__ import annotations

import sys
import tempfile

from airflow_trickle import Trickle


def main(warehouse: str) -> None:
    # The example's tables hold a handful of rows, so each change is a large share of them and the
    # default differential_max_change_ratio (0.15) would recompute instead; raise it to show deltas.
    tr = Trickle(warehouse=warehouse, spark_master="local[2]", shuffle_partitions=2,
                 differential_max_change_ratio=1.0)
    tr.sql("CREATE DATABASE IF NOT EXISTS shop")
    for name in ("shop.region_revenue", "shop.big_orders", "shop.order_lines"):
        tr.drop_stream_table(name, if_exists=True, cascade=True)
    tr.sql("DROP TABLE IF EXISTS shop.orders")
    tr.sql("DROP TABLE IF EXISTS shop.customers")
    tr.sql("CREATE TABLE shop.customers (id INT, name STRING, region STRING) USING delta")
    tr.sql("CREATE TABLE shop.orders (id INT, customer_id INT, amount DECIMAL(10,2)) USING delta")
    tr.sql("INSERT INTO shop.customers VALUES (1, 'Ada', 'north'), (2, 'Brian', 'south'), (3, 'Chen', 'north')")
    tr.sql("INSERT INTO shop.orders VALUES (1, 1, 120.00), (2, 1, 35.50), (3, 2, 999.99), (4, 3, 10.00)")

    tr.create_stream_table(
        "shop.order_lines",
        "SELECT o.id, c.name, c.region, o.amount FROM shop.orders o JOIN shop.customers c ON o.customer_id = c.id",
        schedule="1m",
    )
    tr.create_stream_table("shop.big_orders", "SELECT id, name, amount FROM shop.order_lines WHERE amount >= 100",
                           schedule="5m")
    tr.create_stream_table(
        "shop.region_revenue",
        "SELECT region, COUNT(*) AS orders, SUM(amount) AS revenue, AVG(amount) AS average "
        "FROM shop.order_lines GROUP BY region",
        schedule="5m",
    )
    show(tr, "after create")

    tr.sql("INSERT INTO shop.orders VALUES (5, 2, 250.00), (6, 3, 40.00)")
    tr.sql("UPDATE shop.orders SET amount = 20.00 WHERE id = 1")
    tr.sql("DELETE FROM shop.orders WHERE id = 4")
    tr.sql("UPDATE shop.customers SET region = 'west' WHERE id = 3")
    for name in ("shop.order_lines", "shop.big_orders", "shop.region_revenue"):
        result = tr.refresh_stream_table(name)
        print(f"refresh {name}: {result.action} +{result.rows_inserted} -{result.rows_deleted} "
              f"in {result.duration_ms} ms{f' ({result.reason})' if result.reason else ''}")
    print("refresh again:", tr.refresh_stream_table("shop.region_revenue").action)
    show(tr, "after changes")
    print(tr.explain("shop.region_revenue")["text"].split("  delta SQL")[0])


def show(tr, title: str) -> None:
    print(f"\n== {title} ==")
    for name in ("shop.big_orders", "shop.region_revenue"):
        print(name)
        tr.read(name).orderBy(tr.read(name).columns[0]).show(truncate=False)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else tempfile.mkdtemp(prefix="trickle-example-"))

"""Differential vs FULL refresh, measured side by side in one run.

    python benchmarks/differential_vs_full.py [--rows 1000000] [--change 0.001] [--repeat 2]

A fact table of N rows joined to a dimension table, aggregated per customer (N/100 groups).
The same query is kept by two stream tables, one FULL and one DIFFERENTIAL.  A change of
``--change`` of the fact rows (updates, inserts and deletes) is applied, then both refresh;
the script prints both times and their ratio.  The same number of changed rows is then applied
at N/10 rows, to show that DIFFERENTIAL follows the change size, not the table size.
"""
from __future__ import annotations

import argparse
import statistics
import tempfile
import time

from airflow_trickle import Trickle

QUERY = ("SELECT c.segment, f.customer_id, COUNT(*) AS orders, SUM(f.amount) AS revenue, AVG(f.amount) AS avg_amount "
         "FROM {db}.facts f JOIN {db}.customers c ON f.customer_id = c.id GROUP BY c.segment, f.customer_id")


def build(tr: Trickle, db: str, rows: int) -> None:
    customers = max(rows // 100, 1)
    tr.sql(f"CREATE DATABASE IF NOT EXISTS {db}")
    tr.sql(f"CREATE TABLE {db}.customers (id BIGINT, segment STRING) USING delta")
    tr.sql(f"INSERT INTO {db}.customers SELECT id, concat('seg', id % 7) FROM range({customers})")
    tr.sql(f"CREATE TABLE {db}.facts (id BIGINT, customer_id BIGINT, amount DECIMAL(12,2)) USING delta "
           f"TBLPROPERTIES (delta.enableChangeDataFeed = true)")
    tr.sql(f"INSERT INTO {db}.facts SELECT id, id % {customers}, CAST(id % 1000 AS DECIMAL(12,2)) / 10 "
           f"FROM range({rows})")
    for mode in ("FULL", "DIFFERENTIAL"):
        tr.create_stream_table(f"{db}.agg_{mode.lower()}", QUERY.format(db=db), refresh_mode=mode, schedule=None)


def change(tr: Trickle, db: str, rows: int, changed: int, round_no: int) -> None:
    third = max(changed // 3, 1)
    base = rows * (round_no + 2)
    tr.sql(f"UPDATE {db}.facts SET amount = amount + 1 WHERE id % {max(rows // third, 1)} = {round_no}")
    tr.sql(f"INSERT INTO {db}.facts SELECT id, id % {max(rows // 100, 1)}, 5.00 FROM range({base}, {base + third})")
    tr.sql(f"DELETE FROM {db}.facts WHERE id % {max(rows // third, 1)} = {round_no + 1} AND id < {rows}")


def timed_refresh(tr: Trickle, name: str, expect: str) -> float:
    started = time.perf_counter()
    result = tr.refresh_stream_table(name)
    elapsed = time.perf_counter() - started
    assert result.action == expect, (name, result.action, result.reason)
    return elapsed


def check(tr: Trickle, db: str) -> None:
    full = tr.read(f"{db}.agg_full")
    diff = tr.read(f"{db}.agg_differential")
    assert full.exceptAll(diff).count() == 0 and diff.exceptAll(full).count() == 0, "results differ"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--change", type=float, default=0.001)
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--warehouse", default=None)
    args = parser.parse_args()
    warehouse = args.warehouse or tempfile.mkdtemp(prefix="trickle-bench-")
    tr = Trickle(warehouse=warehouse, spark_master="local[2]", shuffle_partitions=4)
    changed = max(int(args.rows * args.change), 3)
    results = {}
    for label, rows in (("N/10", args.rows // 10), ("N", args.rows)):
        db = f"bench_{rows}"
        started = time.perf_counter()
        build(tr, db, rows)
        print(f"built {label} = {rows:,} rows and both stream tables in {time.perf_counter() - started:.1f} s", flush=True)
        full_times, diff_times = [], []
        for round_no in range(args.repeat):
            change(tr, db, rows, changed, round_no)
            diff_times.append(timed_refresh(tr, f"{db}.agg_differential", "DIFFERENTIAL"))
            full_times.append(timed_refresh(tr, f"{db}.agg_full", "FULL"))
            check(tr, db)
        results[label] = (rows, statistics.median(full_times), statistics.median(diff_times))
    print(f"\nchanged rows per refresh: ~{changed:,} (updates, inserts, deletes); median of {args.repeat} refreshes")
    print(f"{'size':>6} {'rows':>12} {'FULL s':>8} {'DIFF s':>8} {'FULL/DIFF':>10}")
    for label, (rows, full, diff) in results.items():
        print(f"{label:>6} {rows:>12,} {full:8.2f} {diff:8.2f} {full / diff:10.1f}x")
    small, large = results["N/10"][2], results["N"][2]
    print(f"DIFFERENTIAL at N vs N/10 (same change size): {large / small:.2f}x the time for 10x the rows")


if __name__ == "__main__":
    main()

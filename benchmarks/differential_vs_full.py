"""DIFFERENTIAL vs our FULL vs the plain recompute a user would write, side by side in one run.

    python benchmarks/differential_vs_full.py [--rows 1000000,10000000] [--change 0.001 | --changed 1000]
                                              [--repeat 3] [--bag-rows 100000] [--warehouse DIR]

For each size N: a fact table of N rows joined to a dimension of N/100 customers, aggregated
per (segment, customer).  The same query is kept three ways: a DIFFERENTIAL stream table, a
FULL stream table, and a plain Delta table rewritten with ``INSERT OVERWRITE <table> <query>``
(what a user without stream tables runs, and what open-source Spark Declarative Pipelines does
for a materialized view).  Each round changes ``--change`` of the fact rows (or ``--changed``
rows at every size: a third updated, a third inserted, a third deleted), then times all three.
The DIFFERENTIAL refresh's phases (``refresh/phases.py``) are printed as medians.

``--bag-rows`` adds the bag scenario: a filter over a fact table of that many rows, refreshed
after a one-row insert (an append: no MERGE; appended by delta-rs, and by Spark's INSERT in a
``placement: spark`` twin) and after a one-row update (a MERGE).
"""
from __future__ import annotations

import argparse
import statistics
import tempfile
import time

from airflow_trickle import Trickle

QUERY = ("SELECT c.segment, f.customer_id, COUNT(*) AS orders, SUM(f.amount) AS revenue, AVG(f.amount) AS avg_amount "
         "FROM {db}.facts f JOIN {db}.customers c ON f.customer_id = c.id GROUP BY c.segment, f.customer_id")
BAG_QUERY = "SELECT id, customer_id, amount FROM {db}.facts WHERE amount >= 50"


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
    tr.sql(f"CREATE TABLE {db}.agg_plain USING delta AS {QUERY.format(db=db)}")


def change(tr: Trickle, db: str, rows: int, changed: int, round_no: int) -> None:
    third = max(changed // 3, 1)
    base = rows * (round_no + 2)
    tr.sql(f"UPDATE {db}.facts SET amount = amount + 1 WHERE id % {max(rows // third, 1)} = {round_no}")
    tr.sql(f"INSERT INTO {db}.facts SELECT id, id % {max(rows // 100, 1)}, 5.00 FROM range({base}, {base + third})")
    tr.sql(f"DELETE FROM {db}.facts WHERE id % {max(rows // third, 1)} = {round_no + 1} AND id < {rows}")


def timed_refresh(tr: Trickle, name: str, expect: str):
    started = time.perf_counter()
    result = tr.refresh_stream_table(name)
    elapsed = time.perf_counter() - started
    assert result.action == expect, (name, result.action, result.reason)
    return elapsed, result


def timed_plain(tr: Trickle, db: str) -> float:
    started = time.perf_counter()
    tr.sql(f"INSERT OVERWRITE {db}.agg_plain {QUERY.format(db=db)}")
    return time.perf_counter() - started


def check(tr: Trickle, db: str) -> None:
    full = tr.read(f"{db}.agg_full")
    diff = tr.read(f"{db}.agg_differential")
    plain = tr.spark.table(f"{db}.agg_plain")
    for other in (full, plain):
        assert other.exceptAll(diff).count() == 0 and diff.exceptAll(other).count() == 0, "results differ"


def median_phases(results) -> dict[str, float]:
    names = dict.fromkeys(k for r in results for k in r.phases)
    return {k: statistics.median(r.phases.get(k, 0) for r in results) for k in names}


def bag_scenario(tr: Trickle, rows: int, repeat: int) -> dict[str, float]:
    """One-row insert (append path) and one-row update (MERGE path) into a bag stream table, and
    the same insert into its twin kept with ``placement: spark`` (Spark's INSERT, not delta-rs's
    append); the time rule off (``differential_max_time_ratio``), so each times the delta path even
    where it would recompute (a 100,000-row filter's FULL costs about what its MERGE does)."""
    db = f"bag_{rows}"
    tr.config.differential_max_time_ratio = 1e9
    tr.sql(f"CREATE DATABASE IF NOT EXISTS {db}")
    tr.sql(f"CREATE TABLE {db}.facts (id BIGINT, customer_id BIGINT, amount DECIMAL(12,2)) USING delta "
           f"TBLPROPERTIES (delta.enableChangeDataFeed = true)")
    tr.sql(f"INSERT INTO {db}.facts SELECT id, id % 1000, CAST(id % 1000 AS DECIMAL(12,2)) / 10 FROM range({rows})")
    tr.create_stream_table(f"{db}.big", BAG_QUERY.format(db=db), schedule=None)
    tr.create_stream_table(f"{db}.big_spark", BAG_QUERY.format(db=db), schedule=None,
                           options={"placement": "spark"})
    tr.sql(f"CREATE TABLE {db}.plain USING delta AS {BAG_QUERY.format(db=db)}")
    times: dict[str, list[float]] = {"insert 1 row (delta-rs append)": [], "insert 1 row (Spark INSERT)": [],
                                     "update 1 row": [], "plain recompute": []}
    for round_no in range(repeat + 1):  # the first round warms the code paths up
        tr.sql(f"INSERT INTO {db}.facts VALUES ({rows * 2 + round_no}, 1, 99.00)")
        insert_s, _ = timed_refresh(tr, f"{db}.big", "DIFFERENTIAL")
        spark_insert_s, _ = timed_refresh(tr, f"{db}.big_spark", "DIFFERENTIAL")
        tr.sql(f"UPDATE {db}.facts SET amount = amount + 1 WHERE id = {round_no * 1000 + 600}")
        update_s, _ = timed_refresh(tr, f"{db}.big", "DIFFERENTIAL")
        started = time.perf_counter()
        tr.sql(f"INSERT OVERWRITE {db}.plain {BAG_QUERY.format(db=db)}")
        plain_s = time.perf_counter() - started
        timed_refresh(tr, f"{db}.big_spark", "DIFFERENTIAL")  # the update, untimed: the twins stay alike
        if round_no:
            for label, elapsed in zip(times, (insert_s, spark_insert_s, update_s, plain_s)):
                times[label].append(elapsed)
    expected = tr.sql(BAG_QUERY.format(db=db))
    for name in ("big", "big_spark"):
        stored = tr.read(f"{db}.{name}")
        assert stored.exceptAll(expected).count() == 0 and expected.exceptAll(stored).count() == 0, name
    return {k: statistics.median(v) for k, v in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", default="100000,1000000", help="comma-separated fact table sizes")
    parser.add_argument("--change", type=float, default=0.001, help="share of the fact rows changed per round")
    parser.add_argument("--changed", type=int, default=None, help="rows changed per round at every size")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--bag-rows", type=int, default=100_000, help="0 skips the bag scenario")
    parser.add_argument("--warehouse", default=None)
    parser.add_argument("--driver-memory", default="4g", help="the sources' own DML at 10M+ rows needs more than 1g")
    args = parser.parse_args()
    warehouse = args.warehouse or tempfile.mkdtemp(prefix="trickle-bench-")
    tr = Trickle(warehouse=warehouse, spark_master="local[2]", shuffle_partitions=4,
                 spark_conf={"spark.driver.memory": args.driver_memory})
    sizes = [int(s) for s in args.rows.split(",")]
    table = []
    for rows in sizes:
        db = f"bench_{rows}"
        changed = args.changed or max(int(rows * args.change), 3)
        started = time.perf_counter()
        build(tr, db, rows)
        print(f"built {rows:,} rows, both stream tables and the plain table in {time.perf_counter() - started:.1f} s",
              flush=True)
        change(tr, db, rows, changed, 0)  # a warm-up round, not timed
        timed_refresh(tr, f"{db}.agg_differential", "DIFFERENTIAL")
        timed_refresh(tr, f"{db}.agg_full", "FULL")
        timed_plain(tr, db)
        full_times, diff_times, plain_times, diff_results = [], [], [], []
        for round_no in range(1, args.repeat + 1):
            change(tr, db, rows, changed, round_no)
            elapsed, result = timed_refresh(tr, f"{db}.agg_differential", "DIFFERENTIAL")
            diff_times.append(elapsed)
            diff_results.append(result)
            full_times.append(timed_refresh(tr, f"{db}.agg_full", "FULL")[0])
            plain_times.append(timed_plain(tr, db))
            check(tr, db)
        table.append((rows, changed, statistics.median(diff_times), statistics.median(full_times),
                      statistics.median(plain_times), median_phases(diff_results)))
    print(f"\nmedian of {args.repeat} rounds; changes: a third updated, a third inserted, a third deleted")
    print(f"{'rows':>12} {'changed':>8} {'DIFF s':>7} {'FULL s':>7} {'plain s':>8} {'FULL/DIFF':>10} {'plain/DIFF':>11}")
    for rows, changed, diff, full, plain, _ in table:
        print(f"{rows:>12,} {changed:>8,} {diff:7.2f} {full:7.2f} {plain:8.2f} {full / diff:9.1f}x {plain / diff:10.1f}x")
    print("\nDIFFERENTIAL phases (median ms):")
    for rows, _, _, _, _, phases in table:
        print(f"{rows:>12,}  " + "  ".join(f"{k} {v:.0f}" for k, v in phases.items()))
    for (small, c1, d1, *_), (large, c2, d2, *_) in zip(table, table[1:]):
        same = " (same change size)" if c1 == c2 else f" (changes {c1:,} vs {c2:,})"
        print(f"DIFFERENTIAL at {large:,} vs {small:,} rows: {d2 / d1:.2f}x the time{same}")
    if args.bag_rows:
        bag = bag_scenario(tr, args.bag_rows, args.repeat)
        print(f"\nbag stream table over {args.bag_rows:,} rows (median of {args.repeat}): "
              + ", ".join(f"{k} {v:.2f} s" for k, v in bag.items()))


if __name__ == "__main__":
    main()

"""TPC-H, per query: DIFFERENTIAL vs our FULL vs the plain recompute a user would write.

    python benchmarks/tpch.py [--scale 0.1] [--queries q1,q3,...] [--warehouse DIR]

Generates TPC-H at ``--scale`` (``tpchgen-cli``), loads it into Delta tables with change
feeds on, and keeps each query three ways: a DIFFERENTIAL stream table, a FULL stream table,
and a plain Delta table rewritten with ``INSERT OVERWRITE <table> <query>``.  Then, after one
untimed cycle (the cost model learns each table's fan-out from a refresh it has seen), one cycle of
refresh functions (``tests/tpch.py``: ~0.1% new orders with their line items, ~0.1% deleted,
and updates that move rows between groups) and, per query, the three timed side by side --
each DIFFERENTIAL result checked against its query.  The DIFFERENTIAL table runs with the
default cost model, so where recomputing is cheaper (a change touching most groups) it runs
FULL and the row says why.  Prints one row per query and the median ratios.  Run it on an otherwise idle machine.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from airflow_trickle import Trickle  # noqa: E402
from tests import tpch  # noqa: E402
from tests.oracle import both_multisets  # noqa: E402


def timed(action) -> tuple[float, object]:
    started = time.perf_counter()
    result = action()
    return time.perf_counter() - started, result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--scale", type=float, default=0.1)
    parser.add_argument("--queries", default=None, help="comma-separated, e.g. q1,q3 (default: all 22)")
    parser.add_argument("--warehouse", default=None)
    args = parser.parse_args()
    warehouse = args.warehouse or tempfile.mkdtemp(prefix="trickle-tpch-")
    tr = Trickle(warehouse=warehouse)
    queries = tpch.queries()
    chosen = args.queries.split(",") if args.queries else list(queries)
    started = time.perf_counter()
    tpch.load(tr, args.scale, Path(warehouse) / "tpch-data")
    print(f"TPC-H SF {args.scale:g} loaded in {time.perf_counter() - started:.0f} s "
          f"({tr.sql('SELECT COUNT(*) FROM tpch.lineitem').first()[0]:,} line items)", flush=True)
    for name in chosen:
        for mode in ("DIFFERENTIAL", "FULL"):
            tr.create_stream_table(f"tpch.{name}_{mode.lower()}", queries[name], refresh_mode=mode, schedule=None)
        tr.sql(f"CREATE TABLE tpch.{name}_plain USING delta AS {queries[name]}")
    # A first cycle, untimed: the cost model learns each table's fan-out from a refresh it has
    # seen (until then it assumes every changed row touches a stored row), as in production.
    tpch.refresh_functions(tr, 0)
    for name in chosen:
        for mode in ("differential", "full"):
            tr.refresh_stream_table(f"tpch.{name}_{mode}")
    statements = tpch.refresh_functions(tr, 1)
    print(f"refresh functions applied ({len(statements)} statements), after one untimed cycle\n", flush=True)
    print(f"{'query':6} {'DIFF s':>8} {'FULL s':>8} {'plain s':>8} {'FULL/DIFF':>10} {'plain/DIFF':>11}  rows",
          flush=True)
    ratios_full, ratios_plain = [], []
    for name in chosen:
        diff_s, diff = timed(lambda: tr.refresh_stream_table(f"tpch.{name}_differential"))
        full_s, full = timed(lambda: tr.refresh_stream_table(f"tpch.{name}_full"))
        plain_s, _ = timed(lambda: tr.sql(f"INSERT OVERWRITE tpch.{name}_plain {queries[name]}"))
        stored, wanted = both_multisets(tr.read(f"tpch.{name}_differential"), tr.sql(queries[name]))
        if stored != wanted or full.action != "FULL":
            print(f"{name}: NOT EXACT ({diff.action}: {diff.reason})", flush=True)
            return 1
        ratios_full.append(full_s / diff_s)
        ratios_plain.append(plain_s / diff_s)
        # the DIFFERENTIAL table runs FULL where the cost model finds recomputing cheaper: say so
        chose = "" if diff.action == "DIFFERENTIAL" else f"  (ran {diff.action}: {diff.reason})"
        print(f"{name:6} {diff_s:8.2f} {full_s:8.2f} {plain_s:8.2f} {full_s / diff_s:9.2f}x {plain_s / diff_s:10.2f}x"
              f"  {len(stored)}{chose}", flush=True)
    print(f"\nmedian: FULL/DIFF {statistics.median(ratios_full):.2f}x, plain/DIFF {statistics.median(ratios_plain):.2f}x;"
          f" queries where DIFFERENTIAL is slower than the plain recompute: "
          f"{sum(r < 1 for r in ratios_plain)} of {len(ratios_plain)}")
    tr.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""A recursive CTE kept fresh: DIFFERENTIAL vs our FULL vs a plain recompute, side by side.

    python benchmarks/recursive.py [--people 100000] [--change 0.001] [--repeat 3] [--warehouse DIR]

An org chart of ``--people`` rows (``people(id, boss)``, ten reports per manager, so about
five levels) and one recursive query over it: every person with the root of their tree and
their depth, ``WITH RECURSIVE tree AS (roots UNION ALL tree ⋈ people)``.  Three copies: a
DIFFERENTIAL stream table (``dvm/recursive.py``: derivations counted, old rows read from the
stream table), a FULL stream table, and a plain Delta table a user would rebuild with
``INSERT OVERWRITE <table> <query>``.  Each round changes ``--change`` of the people (new
hires under random managers, leavers without reports, and people moved to another manager
with their whole team), then refreshes the three and times each; the DIFFERENTIAL table is
checked against its query.  Prints the medians and the ratios.
"""
from __future__ import annotations

import argparse
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # tests.oracle

QUERY = ("WITH RECURSIVE tree(id, root, depth) AS ("
         "SELECT id, id, 0 FROM org.people WHERE boss IS NULL "
         "UNION ALL SELECT p.id, t.root, t.depth + 1 FROM tree t JOIN org.people p ON p.boss = t.id) "
         "SELECT id, root, depth FROM tree")


def change(tr, people: int, fraction: float, rng: random.Random, next_id: int) -> int:
    """New hires, leavers (people with no reports: ids past every manager) and moves."""
    count = max(3, int(people * fraction))
    hires = ", ".join(f"({next_id + i}, {rng.randint(0, people // 10)})" for i in range(count // 3))
    tr.sql(f"INSERT INTO org.people VALUES {hires}")
    leavers = ", ".join(str(rng.randint(people // 10 + 1, people - 1)) for _ in range(count // 3))
    tr.sql(f"DELETE FROM org.people WHERE id IN ({leavers})")
    movers = ", ".join(str(rng.randint(people // 100 + 1, people // 10)) for _ in range(count // 3))
    # a manager moves under another manager of a higher level, with the whole team: no cycle
    tr.sql(f"UPDATE org.people SET boss = {rng.randint(1, people // 100)} WHERE id IN ({movers})")
    return next_id + count // 3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--people", type=int, default=100_000)
    parser.add_argument("--change", type=float, default=0.001)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--warehouse", default=None)
    args = parser.parse_args()

    from airflow_trickle import Trickle
    from tests.oracle import both_multisets

    warehouse = args.warehouse or tempfile.mkdtemp(prefix="bench-recursive-")
    tr = Trickle(warehouse, shuffle_partitions=2, spark_conf={"spark.ui.enabled": "false"})
    tr.sql("CREATE DATABASE IF NOT EXISTS org")
    tr.sql("CREATE TABLE org.people (id BIGINT, boss BIGINT) USING delta")
    # ten reports per manager: person i reports to i // 10 (0 is the root)
    tr.sql(f"INSERT INTO org.people SELECT id, CASE WHEN id = 0 THEN NULL ELSE id DIV 10 END "
           f"FROM range({args.people})")
    started = time.perf_counter()
    tr.create_stream_table("org.tree_diff", QUERY, schedule=None, refresh_mode="DIFFERENTIAL")
    print(f"create + populate (DIFFERENTIAL): {time.perf_counter() - started:.1f}s", flush=True)
    tr.create_stream_table("org.tree_full", QUERY, schedule=None, refresh_mode="FULL")
    tr.sql(f"CREATE TABLE org.tree_plain USING delta AS {QUERY}")
    rows = tr.sql("SELECT COUNT(*) FROM org.tree_diff").first()[0]
    print(f"{args.people:,} people, {rows:,} rows in the stream table; change {args.change:.2%} per round",
          flush=True)
    rng = random.Random(1)
    next_id = args.people
    times: dict[str, list[float]] = {"DIFFERENTIAL": [], "FULL": [], "plain": []}
    for round_no in range(args.repeat + 1):  # round 0 warms up
        next_id = change(tr, args.people, args.change, rng, next_id)
        started = time.perf_counter()
        result = tr.refresh_stream_table("org.tree_diff")
        diff = time.perf_counter() - started
        started = time.perf_counter()
        tr.refresh_stream_table("org.tree_full")
        full = time.perf_counter() - started
        started = time.perf_counter()
        tr.sql(f"INSERT OVERWRITE org.tree_plain {QUERY}")
        plain = time.perf_counter() - started
        stored, wanted = both_multisets(tr.read("org.tree_diff"), tr.sql(QUERY))
        exact = stored == wanted
        print(f"round {round_no}: DIFFERENTIAL {diff:.2f}s ({result.action}, +{result.rows_inserted} "
              f"-{result.rows_deleted}, {'exact' if exact else 'NOT EXACT'}), FULL {full:.2f}s, plain {plain:.2f}s",
              flush=True)
        if not exact:
            raise SystemExit("the DIFFERENTIAL table differs from its query")
        if round_no:
            times["DIFFERENTIAL"].append(diff)
            times["FULL"].append(full)
            times["plain"].append(plain)
    median = {k: statistics.median(v) for k, v in times.items()}
    print(f"medians: DIFFERENTIAL {median['DIFFERENTIAL']:.2f}s, our FULL {median['FULL']:.2f}s, "
          f"plain INSERT OVERWRITE {median['plain']:.2f}s; FULL/DIFF {median['FULL'] / median['DIFFERENTIAL']:.1f}x, "
          f"plain/DIFF {median['plain'] / median['DIFFERENTIAL']:.1f}x", flush=True)
    tr.close()


if __name__ == "__main__":
    main()

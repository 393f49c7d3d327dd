"""What a FULL refresh costs when a DIFFERENTIAL stream table reads the table it recomputes.

    python benchmarks/full_difference.py [--rows 10000000] [--change 0.001] [--repeat 2] [--warehouse DIR]

Over one source of ``--rows`` rows (``cascade.py``'s), a bag stream table (a filter of the
source) read by a DIFFERENTIAL aggregate, in two copies: one refreshed FULL -- applied as its
difference, so the aggregate reading it stays differential (``refresh/local_difference.py``) --
and one DIFFERENTIAL; beside them the plain Delta tables a user would rebuild with ``INSERT
OVERWRITE``.  Each round changes ``--change`` of the source rows and refreshes all three,
side by side; it prints each refresh's time, how its commit landed, and whether the FULL copy
equals its query.
"""
from __future__ import annotations

import argparse
import statistics
import time

from cascade import change, with_source

FILTER = "SELECT id, g, amount FROM bench.src WHERE amount >= 10"
AGGREGATE = "SELECT g, COUNT(*) AS n, SUM(amount) AS total FROM bench.{p}up GROUP BY g"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=10_000_000)
    parser.add_argument("--change", type=float, default=0.001)
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--warehouse", default=None)
    parser.add_argument("--driver-memory", default="8g")
    args = parser.parse_args()

    tr = with_source(args.warehouse, args.rows, args.driver_memory, prefix="trickle-full-difference-")
    for prefix, mode in (("f_", "FULL"), ("d_", "DIFFERENTIAL")):
        tr.create_stream_table(f"bench.{prefix}up", FILTER, schedule=None, refresh_mode=mode)
        tr.create_stream_table(f"bench.{prefix}down", AGGREGATE.format(p=prefix), schedule=None,
                               refresh_mode="DIFFERENTIAL")
    tr.sql(f"CREATE TABLE bench.p_up USING delta AS {FILTER}")
    tr.sql(f"CREATE TABLE bench.p_down USING delta AS {AGGREGATE.format(p='p_')}")
    print(f"{args.rows:,} source rows; the filter keeps {tr.spark.table('bench.p_up').count():,}")

    timings: dict[str, list[float]] = {"FULL up": [], "DIFF up": [], "plain up": [], "FULL down": [], "DIFF down": [],
                                       "plain down": []}
    for round_no in range(args.repeat + 1):  # round 0 warms the code paths up and is not counted
        change(tr, args.rows, args.change, round_no)
        seen = {}
        for prefix, label in (("f_", "FULL"), ("d_", "DIFF")):
            for hop in ("up", "down"):
                started = time.perf_counter()
                result = tr.refresh_stream_table(f"bench.{prefix}{hop}")
                seen[f"{label} {hop}"] = (time.perf_counter() - started, result.action)
        for hop, query in (("up", FILTER), ("down", AGGREGATE.format(p="p_"))):
            started = time.perf_counter()
            tr.sql(f"INSERT OVERWRITE bench.p_{hop} {query}")
            seen[f"plain {hop}"] = (time.perf_counter() - started, "INSERT OVERWRITE")
        engine = tr.spark.sql("DESCRIBE HISTORY bench.f_up LIMIT 1").first().engineInfo
        exact = tr.spark.sql(f"SELECT COUNT(*) FROM ((SELECT id, g, amount FROM bench.f_up EXCEPT ALL {FILTER}) "
                             f"UNION ALL ({FILTER} EXCEPT ALL SELECT id, g, amount FROM bench.f_up))").first()[0] == 0
        if round_no:
            for key, (seconds, _) in seen.items():
                timings[key].append(seconds)
        print(f"round {round_no}: " + ", ".join(f"{key} {action} {seconds:.1f}s" for key, (seconds, action) in seen.items())
              + f"; the FULL's commit by {engine.split('/')[0].split(':')[0]}; FULL copy equals its query: {exact}",
              flush=True)
    print(f"\nmedian of {args.repeat} rounds: the FULL copy (up applied as its difference, down DIFFERENTIAL), "
          "the DIFFERENTIAL copy, the plain tables")
    for hop, what in (("up", "the filter (read by the aggregate)"), ("down", "the aggregate")):
        full, diff, plain = (statistics.median(timings[f"{kind} {hop}"]) for kind in ("FULL", "DIFF", "plain"))
        print(f"{what:<36} FULL copy {full:6.2f} s, DIFFERENTIAL copy {diff:6.2f} s, plain {plain:6.2f} s")


if __name__ == "__main__":
    main()

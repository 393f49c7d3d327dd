"""How long a small source change takes to reach the end of a chain and of a diamond.

    python benchmarks/cascade.py [--rows 1000000] [--change 0.001] [--repeat 2] [--warehouse DIR]

Builds, over one source table of ``--rows`` rows (and a 1,000-row dimension), two copies of:

* a chain of five stream tables: filter -> join with the dimension -> projection -> aggregate
  -> filter;
* a diamond: a filter and an aggregate of the source, joined again at the convergence point
  (an atomic group, refreshed all-or-nothing);

one copy DIFFERENTIAL (each hop reads its upstream's change feed), one FULL (each hop
recomputes; still applied as a diff), and a third copy as plain Delta tables that a user would
rebuild with ``INSERT OVERWRITE <table> <query>`` hop by hop.  Each round changes ``--change``
of the source rows (updates, inserts, deletes) and times the refreshes, in order, until the
last table is fresh; all copies see the same change, side by side, in one run.  The
DIFFERENTIAL copy's time per hop and the action each hop took are printed too.
"""
from __future__ import annotations

import argparse
import statistics
import tempfile
import time

CHAIN = [
    ("c1", "SELECT id, g, amount FROM bench.src WHERE amount >= 10"),
    ("c2", "SELECT c.id, c.g, c.amount, d.label FROM bench.{p}c1 c JOIN bench.dim d ON c.g = d.g"),
    ("c3", "SELECT id, label, amount * 2 AS doubled FROM bench.{p}c2"),
    ("c4", "SELECT label, COUNT(*) AS n, SUM(doubled) AS total FROM bench.{p}c3 GROUP BY label"),
    ("c5", "SELECT label, total FROM bench.{p}c4 WHERE n > 1"),
]
DIAMOND = [
    ("b", "SELECT id, g, amount FROM bench.src WHERE amount >= 50"),
    ("c", "SELECT g, COUNT(*) AS n, SUM(amount) AS total FROM bench.src GROUP BY g"),
    ("d", "SELECT b.id, b.amount, c.n, c.total FROM bench.{p}b b JOIN bench.{p}c c ON b.g = c.g"),
]


def with_source(warehouse: str | None, rows: int, driver_memory: str, *, prefix: str):
    """A Trickle on ``warehouse`` (a new temporary one when None) holding ``bench.src`` of
    ``rows`` rows: ``id``, ``g`` (1,000 groups) and ``amount``."""
    from airflow_trickle import Trickle

    tr = Trickle(warehouse or tempfile.mkdtemp(prefix=prefix), spark_master="local[2]",
                 shuffle_partitions=4, differential_max_change_ratio=0.5,
                 spark_conf={"spark.driver.memory": driver_memory})
    tr.sql("CREATE DATABASE IF NOT EXISTS bench")
    tr.sql("CREATE TABLE bench.src USING delta AS SELECT id, CAST(id % 1000 AS INT) AS g, "
           f"CAST(id % 97 AS INT) AS amount FROM range(0, {rows}) AS t(id)")
    return tr


def build(tr, prefix: str, mode: str) -> None:
    for name, query in CHAIN:
        tr.create_stream_table(f"bench.{prefix}{name}", query.format(p=prefix), schedule=None, refresh_mode=mode)
    for name, query in DIAMOND:
        options = {"diamond_consistency": "atomic"} if name == "d" else None
        tr.create_stream_table(f"bench.{prefix}{name}", query.format(p=prefix), schedule=None, refresh_mode=mode,
                               options=options)


def build_plain(tr) -> None:
    for name, query in CHAIN + DIAMOND:
        tr.sql(f"CREATE TABLE bench.p_{name} USING delta AS {query.format(p='p_')}")


def recompute_plain(tr) -> tuple[float, float, list[float]]:
    """INSERT OVERWRITE every plain table in order: (chain seconds, diamond seconds, per hop)."""
    hops = []
    for name, query in CHAIN + DIAMOND:
        started = time.perf_counter()
        tr.sql(f"INSERT OVERWRITE bench.p_{name} {query.format(p='p_')}")
        hops.append(time.perf_counter() - started)
    return sum(hops[:len(CHAIN)]), sum(hops[len(CHAIN):]), hops


def change(tr, rows: int, fraction: float, round_no: int) -> None:
    """About ``fraction`` of the rows: a third updated, a third deleted, a third inserted."""
    step = max(3, int(1 / fraction) * 3)
    offset = round_no * 7
    tr.sql(f"UPDATE bench.src SET amount = amount + 1 WHERE id % {step} = {offset % step}")
    tr.sql(f"DELETE FROM bench.src WHERE id % {step} = {(offset + 1) % step}")
    count = max(1, int(rows * fraction / 3))
    start = rows * (round_no + 2)
    tr.sql(f"INSERT INTO bench.src SELECT id, CAST(id % 1000 AS INT) AS g, CAST(id % 97 AS INT) AS amount "
           f"FROM range({start}, {start + count}) AS t(id)")


def propagate(tr, prefix: str) -> tuple[float, float, list[str]]:
    """Refresh the chain, then the diamond group; returns (chain s, diamond s, actions, per-hop s)."""
    actions, hops = [], []
    started = time.perf_counter()
    for name, _ in CHAIN:
        hop = time.perf_counter()
        actions.append(tr.refresh_stream_table(f"bench.{prefix}{name}").action)
        hops.append(time.perf_counter() - hop)
    chain = time.perf_counter() - started
    started = time.perf_counter()
    result = tr.refresh_group([f"bench.{prefix}{n}" for n, _ in DIAMOND])
    actions += [r.action for r in result.results]
    hops += [r.duration_ms / 1000 for r in result.results]
    return chain, time.perf_counter() - started, actions, hops


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--change", type=float, default=0.001)
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--warehouse", default=None)
    parser.add_argument("--driver-memory", default="4g")
    args = parser.parse_args()

    tr = with_source(args.warehouse, args.rows, args.driver_memory, prefix="trickle-cascade-")
    tr.sql("CREATE TABLE bench.dim USING delta AS SELECT CAST(id AS INT) AS g, CONCAT('label', id % 50) AS label "
           "FROM range(0, 1000) AS t(id)")
    started = time.perf_counter()
    build(tr, "d_", "DIFFERENTIAL")
    build(tr, "f_", "FULL")
    build_plain(tr)
    print(f"{args.rows:,} source rows; 16 stream tables and 8 plain tables created in "
          f"{time.perf_counter() - started:.1f} s")

    timings = {"d_": [], "f_": [], "p_": []}
    names = [n for n, _ in CHAIN + DIAMOND]
    for round_no in range(args.repeat + 1):  # round 0 warms the code paths up and is not counted
        change(tr, args.rows, args.change, round_no)
        for prefix in ("d_", "f_"):
            chain, diamond, actions, hops = propagate(tr, prefix)
            if round_no:
                timings[prefix].append((chain, diamond))
            label = "DIFFERENTIAL" if prefix == "d_" else "FULL"
            print(f"round {round_no} {label:>12}: chain of 5 {chain:6.2f} s, diamond {diamond:6.2f} s  "
                  + ", ".join(f"{n} {a} {h:.1f}s" for n, a, h in zip(names, actions, hops)), flush=True)
        chain, diamond, hops = recompute_plain(tr)
        if round_no:
            timings["p_"].append((chain, diamond))
        print(f"round {round_no} {'plain':>12}: chain of 5 {chain:6.2f} s, diamond {diamond:6.2f} s  "
              + ", ".join(f"{n} {h:.1f}s" for n, h in zip(names, hops)), flush=True)
    print(f"\nmedian of {args.repeat} rounds, time until the last table is fresh")
    print(f"{'scenario':<24} {'DIFF s':>7} {'FULL s':>7} {'plain s':>8} {'FULL/DIFF':>10} {'plain/DIFF':>11}")
    for index, label in ((0, "chain of 5"), (1, "diamond (atomic group)")):
        diff, full, plain = (statistics.median(t[index] for t in timings[p]) for p in ("d_", "f_", "p_"))
        print(f"{label:<24} {diff:7.2f} {full:7.2f} {plain:8.2f} {full / diff:9.1f}x {plain / diff:10.1f}x")


if __name__ == "__main__":
    main()

"""Spike: what a probe of a join input by a change's keys costs, by the ways Spark can do it.

A delta term such as ``Δorders ⋈ lineitem`` needs the line items of a few thousand order keys;
today it scans ``lineitem``. This script loads TPC-H at ``--scale`` (``lineitem``, ``orders``),
takes ``--keys`` random order keys (the size of one RF1 + RF2) and times, in one warm session,
side by side and taking turns:

* ``delta scan + semi-join``   -- the Delta table read whole, the keys broadcast (today's plan);
* ``cached + semi-join``       -- a cached projection in Spark memory, the keys broadcast;
* ``cached sorted``            -- the same sorted by the key (``--batch-rows`` per batch); with
                                   ``--in-list`` also probed with the keys as literals, so the
                                   in-memory scan skips batches whose [min, max] holds none;
* ``sorted Delta copy``        -- lineitem sorted by the key in small files, probed with the
                                   keys' widest-gap ranges as literals (Delta's file skipping),
                                   by the random keys and by the newest keys (as appends bring);
* ``plain``                    -- the whole join + aggregate (q12's shape: its filters on
                                   lineitem, its priority count), the recompute a user would run.

    .venv/bin/python benchmarks/probe_spike.py --scale 1 --keys 3000
"""
from __future__ import annotations

import argparse
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from airflow_trickle import Trickle  # noqa: E402
from tests import tpch  # noqa: E402

#: q12's columns of lineitem (the join key first).
LINEITEM = "l_orderkey, l_shipmode, l_commitdate, l_receiptdate, l_shipdate"


def timed(run) -> float:
    started = time.perf_counter()
    run()
    return time.perf_counter() - started


def key_ranges(keys: list[int], most: int) -> list[tuple[int, int]]:
    """At most ``most`` [low, high] ranges covering ``keys``, cut at the widest gaps."""
    ordered = sorted(set(keys))
    gaps = sorted(range(1, len(ordered)), key=lambda i: ordered[i] - ordered[i - 1], reverse=True)[:most - 1]
    cuts = [0, *sorted(gaps), len(ordered)]
    return [(ordered[a], ordered[b - 1]) for a, b in zip(cuts, cuts[1:])]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--scale", type=float, default=1)
    parser.add_argument("--keys", type=int, default=3000)
    parser.add_argument("--batch-rows", default="10000")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=2, help="untimed passes over every variant first")
    parser.add_argument("--in-list", action="store_true",
                        help="also probe the sorted cache with the keys as literals (slow: see the README)")
    parser.add_argument("--sorted-file-rows", type=int, default=100_000,
                        help="a copy of lineitem sorted by the key in files of this many rows, probed with the keys' "
                             "ranges as literals (Delta's file skipping), by random keys and by the newest keys")
    parser.add_argument("--ranges", type=int, default=16, help="at most this many key ranges in a probe")
    parser.add_argument("--warehouse", default=None)
    args = parser.parse_args()
    warehouse = args.warehouse or tempfile.mkdtemp(prefix="trickle-probe-")
    conf = {"spark.driver.memory": "8g", "spark.ui.enabled": "false"}
    if args.in_list:  # the cache's batch filter tests IN, not the InSet a long IN becomes
        conf["spark.sql.optimizer.inSetConversionThreshold"] = "100000000"
    tr = Trickle(warehouse=warehouse, spark_master="local[2]", spark_conf=conf)
    spark = tr.spark
    if not (Path(warehouse) / "loaded").exists():
        started = time.perf_counter()
        tpch.load(tr, args.scale, Path(warehouse) / "tpch-data")
        (Path(warehouse) / "loaded").write_text("1")
        print(f"SF {args.scale:g} loaded in {time.perf_counter() - started:.0f} s", flush=True)
    rows = spark.sql("SELECT COUNT(*) FROM tpch.lineitem").first()[0]
    keys = [r[0] for r in spark.sql(f"SELECT o_orderkey FROM tpch.orders ORDER BY rand(7) LIMIT {args.keys}").collect()]

    def keys_view(view: str, values: list[int]) -> None:
        spark.createDataFrame([(k,) for k in values], "k BIGINT").createOrReplaceTempView(view)

    keys_view("probe_keys", keys)
    ordered = sorted(keys)  # chunks of neighbouring keys: Spark builds a batch filter one level deep per literal
    literals = " OR ".join(f"l_orderkey IN ({', '.join(str(k) for k in ordered[i:i + 64])})"
                           for i in range(0, len(ordered), 64))
    consume = "SELECT l_shipmode, COUNT(*) AS n, MAX(l_receiptdate) AS r FROM ({}) AS s GROUP BY l_shipmode"
    semi = (f"SELECT /*+ BROADCAST(k) */ {LINEITEM} FROM {{table}} l LEFT SEMI JOIN {{keys}} k "
            "ON l.l_orderkey = k.k")
    inlist = f"SELECT {LINEITEM} FROM {{table}} WHERE {literals}"
    plain = ("SELECT l_shipmode, SUM(CASE WHEN o_orderpriority IN ('1-URGENT', '2-HIGH') THEN 1 ELSE 0 END) h, "
             "COUNT(*) n FROM tpch.orders JOIN tpch.lineitem ON o_orderkey = l_orderkey "
             "WHERE l_shipmode IN ('MAIL', 'SHIP') AND l_commitdate < l_receiptdate AND l_shipdate < l_commitdate "
             "GROUP BY l_shipmode")
    runs = {"delta scan + semi-join": lambda: spark.sql(consume.format(semi.format(table="tpch.lineitem", keys="probe_keys"))).collect(),
            "plain q12-shaped recompute": lambda: spark.sql(plain).collect()}
    built = {}
    for batch in [int(b) for b in args.batch_rows.split(",")]:
        spark.conf.set("spark.sql.inMemoryColumnarStorage.batchSize", str(batch))
        name = f"arr_{batch}"
        started = time.perf_counter()
        spark.sql(f"CACHE TABLE {name} AS SELECT {LINEITEM} FROM tpch.lineitem "
                  "DISTRIBUTE BY l_orderkey DIV 100000 SORT BY l_orderkey")
        built[name] = time.perf_counter() - started
        runs[f"cached ({batch:,}-row batches) + semi-join"] = (
            lambda name=name: spark.sql(consume.format(semi.format(table=name, keys="probe_keys"))).collect())
        if args.in_list:
            runs[f"cached sorted ({batch:,}-row batches) + IN"] = (
                lambda name=name: spark.sql(consume.format(inlist.format(table=name))).collect())
    started = time.perf_counter()
    spark.sql(f"CACHE TABLE arr_plain AS SELECT {LINEITEM} FROM tpch.lineitem")
    built["arr_plain"] = time.perf_counter() - started
    runs["cached, as read (no sort) + semi-join"] = lambda: spark.sql(
        consume.format(semi.format(table="arr_plain", keys="probe_keys"))).collect()
    if not spark.catalog.tableExists("tpch.lineitem_sorted"):
        spark.conf.set("spark.sql.files.maxRecordsPerFile", str(args.sorted_file_rows))
        spark.sql("CREATE TABLE tpch.lineitem_sorted USING delta AS SELECT * FROM tpch.lineitem ORDER BY l_orderkey")
        spark.conf.unset("spark.sql.files.maxRecordsPerFile")
    files = spark.sql("DESCRIBE DETAIL tpch.lineitem_sorted").first()["numFiles"]
    newest = [r[0] for r in spark.sql(f"SELECT o_orderkey FROM tpch.orders ORDER BY o_orderkey DESC LIMIT {args.keys}")
              .collect()]
    keys_view("newest_keys", newest)

    def ranged(keys, view):
        within = " OR ".join(f"l_orderkey BETWEEN {a} AND {b}" for a, b in key_ranges(keys, args.ranges))
        return consume.format(semi.format(table="tpch.lineitem_sorted", keys=view) + f" WHERE {within}")

    runs[f"sorted Delta copy ({files} files) + semi-join"] = (
        lambda: spark.sql(consume.format(semi.format(table="tpch.lineitem_sorted", keys="probe_keys"))).collect())
    runs[f"sorted Delta copy + semi-join + {args.ranges} key ranges"] = lambda: spark.sql(ranged(keys, "probe_keys")).collect()
    newest_runs = {
        "newest keys: Delta scan + semi-join": lambda: spark.sql(
            consume.format(semi.format(table="tpch.lineitem", keys="newest_keys"))).collect(),
        f"newest keys: sorted copy + semi-join + {args.ranges} key ranges": lambda: spark.sql(
            ranged(newest, "newest_keys")).collect()}
    want_newest = newest_runs["newest keys: Delta scan + semi-join"]()
    for name, run in newest_runs.items():
        assert sorted(run()) == sorted(want_newest), name
    runs.update(newest_runs)
    expected = runs["delta scan + semi-join"]()
    for name, run in runs.items():
        if name.startswith(("plain", "newest")):
            continue
        assert sorted(run()) == sorted(expected), name
    for _ in range(args.warmup):  # the JIT: the first passes run up to 3x slower
        for run in runs.values():
            run()
    results = {name: [] for name in runs}
    for turn in range(args.repeat):
        order = list(runs)[turn % len(runs):] + list(runs)[:turn % len(runs)]
        for name in order:
            results[name].append(timed(runs[name]))
    print(f"\nSF {args.scale:g}: lineitem {rows:,} rows; {args.keys:,} random order keys "
          f"({sum(r[1] for r in expected):,} line items); median of {args.repeat} after {args.warmup} untimed passes, "
          "turns taken")
    for name, times in results.items():
        print(f"  {name:45} median {statistics.median(times):6.3f} s, min {min(times):6.3f} s   "
              f"{['%.3f' % t for t in times]}")
    for name, seconds in built.items():
        # a materialized cache's size in memory, from the plan's statistics
        plan = spark.sql(f"EXPLAIN COST SELECT * FROM {name}").first()[0]
        size = re.search(r"sizeInBytes=([0-9.]+ ?[A-Za-z]*)", plan)
        print(f"  built {name} in {seconds:.1f} s; in memory {size.group(1) if size else '?'} "
              f"for {rows:,} rows")
    return 0


if __name__ == "__main__":
    sys.exit(main())

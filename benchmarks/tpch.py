"""TPC-H, per query: DIFFERENTIAL vs our FULL vs the plain recompute a user would write.

    python benchmarks/tpch.py [--scale 0.1] [--queries q1,q3,...] [--changes rf|mixed] [--warehouse DIR]

(``--warehouse`` of an earlier run: its tables are reused for its next two cycles of changes,
the first untimed; first the sources' files no stream table reads any more are vacuumed.)

Generates TPC-H at ``--scale`` (``tpchgen-cli``), loads it into Delta tables with change
feeds on, and keeps each query three ways: a DIFFERENTIAL stream table, a FULL stream table,
and a plain Delta table rewritten with ``INSERT OVERWRITE <table> <query>``.  Then, after one
untimed cycle (the cost model learns each table's fan-out from a refresh it has seen), one cycle of
refresh functions (``tests/tpch.py``: RF1, ~0.1% new orders with their line items, and RF2,
~0.1% deleted; with ``--changes mixed`` also updates that move rows between groups) and, per
query, the three timed side by side -- each DIFFERENTIAL result checked against its query,
with the DIFFERENTIAL refresh split into our bookkeeping (catalog, Delta logs, no Spark job),
planning (the SQL; a top-K's candidates are computed here) and the commit (Spark's MERGE or
INSERT).  At the end, the cheapest commit (one row into a one-row table, by Spark's MERGE and
the way small changes are committed): with our bookkeeping, the floor under any DIFFERENTIAL
refresh at this scale.  The
DIFFERENTIAL table runs with the default cost model, so where recomputing is cheaper (a change
touching most groups, or a delta its recent refreshes measured slower than its FULL ones) it
runs FULL and the row says why; ``--max-time-ratio 1e9`` times the delta itself every time.
Our FULL against the plain recompute is a ratio of two statements of the same size, where one
sample's noise (±15% on a statement of 1-3 s) decides the verdict: ``--full-samples`` pairs
more of them (our FULL asked for, ``mode="FULL"``, and the plain ``INSERT OVERWRITE``, taking
turns at going first) and the row shows the medians.
Prints one row per query and the median ratios.  Run it on an otherwise idle machine.
"""
from __future__ import annotations

import argparse
import itertools
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


#: Phases of a refresh that run no Spark job (catalog, Delta logs, schemas, the history row);
#: ``plan`` writes the SQL and, for a top-K or a recursive CTE, computes parts of it in Spark.
BOOKKEEPING = ("catalog", "versions", "schema", "record")


def merge_floor(tr: Trickle, database: str, repeat: int = 5) -> tuple[float, float]:
    """The median times of the cheapest commits of a DIFFERENTIAL refresh: a Delta MERGE of one
    row into a one-row table run by Spark, and the same change the way small changes are
    committed (a Spark query that reads the table, collected, then a delta-rs MERGE)."""
    from deltalake import DeltaTable

    tr.sql(f"CREATE OR REPLACE TABLE {database}.merge_floor (k BIGINT, v BIGINT) USING delta")
    tr.sql(f"INSERT INTO {database}.merge_floor VALUES (1, 0)")
    location = DeltaTable(tr.sql(f"DESCRIBE DETAIL {database}.merge_floor").first().location).table_uri

    def spark_merge(n):
        tr.sql(f"MERGE INTO {database}.merge_floor t USING (SELECT 1 AS k, {n} AS v) s ON t.k = s.k "
               "WHEN MATCHED THEN UPDATE SET v = s.v WHEN NOT MATCHED THEN INSERT *").collect()

    def local_merge(n):
        table = DeltaTable(location)
        rows = tr.sql(f"SELECT s.k, s.v FROM (SELECT 1 AS k, {n} AS v) s LEFT JOIN "
                      f"{database}.merge_floor VERSION AS OF {table.version()} t ON t.k = s.k").toArrow()
        table.merge(rows, "t.k = s.k", source_alias="s", target_alias="t").when_matched_update(
            {"v": "s.v"}).when_not_matched_insert({"k": "s.k", "v": "s.v"}).execute()

    floors = []
    for merge in (spark_merge, local_merge):
        times = [timed(lambda: merge(n))[0] for n in range(repeat + 1)]
        floors.append(statistics.median(times[1:]))  # the first warms the code path up
    return floors[0], floors[1]


def vacuum_sources(tr: Trickle) -> None:
    """Delete the source files no stream table reads any more (a reused warehouse): every RF2
    rewrites files of ``lineitem`` and ``orders``, and the SF 3 warehouse had grown to 57 GB
    after 74 cycles (2 GB once vacuumed).  Each source keeps the history its slowest
    DIFFERENTIAL reader still needs (``ops/maintain.readers_retention``, as ``trickle maintain`` does
    for stream tables), so no change feed a refresh will read is deleted."""
    from airflow_trickle.catalog.model import utcnow
    from airflow_trickle.ops.maintain import readers_retention, vacuum
    from airflow_trickle.storage.deltalog import active_file_count

    tables = {st.name: st for st in tr.catalog.list()}
    dependencies = tr.catalog.dependencies()
    started = time.perf_counter()
    kept = []
    for table in tpch.TABLES:
        name = f"tpch.{table}"
        readers = [d for d in dependencies if d.source_name == name]
        if not readers:
            continue
        location = tr.catalog.at(readers[0].source_location)
        retained, _, slowest = readers_retention(location, readers, tables, utcnow())
        if slowest:
            kept.append(f"{table} {retained:g} h ({slowest})")
        # below Delta's default of 7 days: the sources keep only what their readers need
        vacuum(tr.spark, name, retained, active_files=active_file_count(location), below_table_retention=True)
    print(f"sources vacuumed in {time.perf_counter() - started:.0f} s"
          + (f"; history kept for readers behind: {', '.join(kept)}" if kept else ""), flush=True)


def more_full_samples(tr: Trickle, name: str, query: str, full_s: float, plain_s: float, samples: int,
                      number: int) -> tuple[float, float]:
    """The medians of ``samples`` times each of our FULL and of the plain recompute of one query:
    the side-by-side round's, then pairs taking turns at going first (our FULL asked for, since
    the sources have not changed since)."""
    fulls, plains = [full_s], [plain_s]
    for sample in range(1, samples):
        pair = [("full", lambda: tr.refresh_stream_table(f"tpch.{name}_full", mode="FULL")),
                ("plain", lambda: tr.sql(f"INSERT OVERWRITE tpch.{name}_plain {query}"))]
        for key, run in pair if (number + sample) % 2 else pair[::-1]:
            seconds, result = timed(run)
            if key == "full" and result.action != "FULL":
                raise SystemExit(f"{name}: our FULL asked for ran {result.action} ({result.reason})")
            (fulls if key == "full" else plains).append(seconds)
    return statistics.median(fulls), statistics.median(plains)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--scale", type=float, default=0.1)
    parser.add_argument("--queries", default=None, help="comma-separated, e.g. q1,q3 (default: all 22)")
    parser.add_argument("--changes", choices=("rf", "mixed"), default="rf",
                        help="rf: RF1 + RF2 (~0.1%% new and ~0.1%% deleted orders with their line items); "
                             "mixed: also the update batch that moves rows between groups")
    parser.add_argument("--warehouse", default=None)
    parser.add_argument("--driver-memory", default="6g")
    parser.add_argument("--max-time-ratio", type=float, default=None,
                        help="the cost model's differential_max_time_ratio (default 1: a DIFFERENTIAL table "
                             "whose deltas took longer than its FULL refreshes recomputes; 1e9 measures the "
                             "delta every time)")
    parser.add_argument("--full-samples", type=int, default=3,
                        help="samples of our FULL and of the plain recompute per query, their medians compared "
                             "(the first from the side-by-side round; default 3)")
    args = parser.parse_args()
    warehouse = args.warehouse or tempfile.mkdtemp(prefix="trickle-tpch-")
    settings = {} if args.max_time_ratio is None else {"differential_max_time_ratio": args.max_time_ratio}
    tr = Trickle(warehouse=warehouse, spark_master="local[2]", **settings,
                 spark_conf={"spark.driver.memory": args.driver_memory, "spark.ui.enabled": "false"})
    queries = tpch.queries()
    chosen = args.queries.split(",") if args.queries else list(queries)
    updates = args.changes == "mixed"
    cycles = Path(warehouse) / "tpch-cycles"  # a warehouse an earlier run left: its next cycles
    if cycles.exists():
        cycle = int(cycles.read_text()) + 2
        print(f"reusing the TPC-H warehouse in {warehouse} (cycles {cycle - 1} and {cycle})", flush=True)
        vacuum_sources(tr)
    else:
        cycle = 1
        started = time.perf_counter()
        tpch.load(tr, args.scale, Path(warehouse) / "tpch-data")
        print(f"TPC-H SF {args.scale:g} loaded in {time.perf_counter() - started:.0f} s "
              f"({tr.sql('SELECT COUNT(*) FROM tpch.lineitem').first()[0]:,} line items)", flush=True)
    started = time.perf_counter()
    missing = [name for name in chosen if tr.catalog.get(f"tpch.{name}_differential") is None]
    for name in missing:  # a reused warehouse keeps the queries an earlier run chose
        for mode in ("DIFFERENTIAL", "FULL"):
            tr.create_stream_table(f"tpch.{name}_{mode.lower()}", queries[name], refresh_mode=mode, schedule=None)
        # column mapping: q18's unaliased sum(l_quantity) is not a name Delta accepts otherwise
        tr.sql(f"CREATE TABLE tpch.{name}_plain USING delta "
               f"TBLPROPERTIES ('delta.columnMapping.mode' = 'name') AS {queries[name]}")
    if missing:
        print(f"{len(missing)} queries kept three ways in {time.perf_counter() - started:.0f} s", flush=True)
    # A first cycle, untimed: the cost model learns each table's fan-out from a refresh it has
    # seen (until then it assumes every changed row touches a stored row), as in production,
    # and the JVM warms up.
    tpch.refresh_functions(tr, cycle - 1, updates=updates)
    for name in chosen:
        for mode in ("differential", "full"):
            tr.refresh_stream_table(f"tpch.{name}_{mode}")
    statements = tpch.refresh_functions(tr, cycle, updates=updates)
    cycles.write_text(str(cycle))
    # The first read of a table after its change rebuilds Delta's snapshot state of the new
    # version (cached from then on): read every source once here, so that none of the three
    # timed refreshes of the first query to read it pays for that alone.  A scan does it; a
    # COUNT(*) does not (Delta answers it from the log's statistics): with COUNT(*) here, the
    # first of the three to scan paid 0.3-2 s (4 more Spark jobs for q4 at SF 3) -- our FULL
    # in two of three queries, since a DIFFERENTIAL going first reads only the change.
    for table in tpch.TABLES:
        tr.sql(f"SELECT * FROM tpch.{table} LIMIT 1").collect()
    print(f"changes ({args.changes}) applied: {len(statements)} statements, after one untimed cycle\n", flush=True)
    print(f"{'query':6} {'DIFF s':>7} {'ours s':>7} {'plan s':>7} {'probe s':>8} {'commit s':>9} {'jobs':>5} {'FULL s':>7} {'plain s':>8} "
          f"{'FULL/DIFF':>10} {'plain/DIFF':>11} {'FULL/plain':>11}  rows", flush=True)
    ratios_full, ratios_plain, diffs, plains, ours, full_over_plain = [], [], [], [], [], []
    for number, name in enumerate(chosen):
        runs = {"diff": lambda: tr.refresh_stream_table(f"tpch.{name}_differential"),
                "full": lambda: tr.refresh_stream_table(f"tpch.{name}_full"),
                "plain": lambda: tr.sql(f"INSERT OVERWRITE tpch.{name}_plain {queries[name]}")}
        # The first statement to scan a changed source costs more than the next ones over it
        # (0.5-0.7 s for q19 at SF 3, even after the scans above): the three take turns through
        # all six orders, so that each of them precedes each other one in half the queries (a
        # rotation of three put our FULL before the plain recompute in two queries of three,
        # since a DIFFERENTIAL going first reads little more than the change).
        order = list(itertools.permutations(runs))[number % 6]
        measured = {key: timed(runs[key]) for key in order}
        (diff_s, diff), (full_s, full), (plain_s, _) = measured["diff"], measured["full"], measured["plain"]
        stored, wanted = both_multisets(tr.read(f"tpch.{name}_differential"), tr.sql(queries[name]))
        if stored != wanted or full.action not in ("FULL", "NO_DATA"):
            print(f"{name}: NOT EXACT ({diff.action}: {diff.reason})", flush=True)
            return 1
        if diff.action == "NO_DATA":  # the query reads no table the changes touched
            print(f"{name:6} {diff_s:7.2f}  (NO_DATA: none of its sources changed; plain recompute {plain_s:.2f} s; "
                  f"not counted in the medians)", flush=True)
            continue
        phases = tr.history(f"tpch.{name}_differential", limit=1)[0].phases or {}
        full_median, plain_median = more_full_samples(tr, name, queries[name], full_s, plain_s, args.full_samples, number)
        bookkeeping = sum(phases.get(k, 0) for k in BOOKKEEPING) / 1000
        ratios_full.append(full_s / diff_s)
        ratios_plain.append(plain_s / diff_s)
        diffs.append(diff_s)
        plains.append(plain_s)
        ours.append(bookkeeping)
        full_over_plain.append(full_median / plain_median)
        # the DIFFERENTIAL table runs FULL where the cost model finds recomputing cheaper: say so
        chose = "" if diff.action == "DIFFERENTIAL" else f"  (ran {diff.action}: {diff.reason})"
        print(f"{name:6} {diff_s:7.2f} {bookkeeping:7.2f} {phases.get('plan', 0) / 1000:7.2f} "
              f"{phases.get('probe', 0) / 1000:8.2f} "
              f"{phases.get('commit', 0) / 1000:9.2f} "
              f"{phases.get('spark_jobs', 0):5} {full_s:7.2f} {plain_s:8.2f} {full_s / diff_s:9.2f}x "
              f"{plain_s / diff_s:10.2f}x {full_median / plain_median:10.2f}x  {len(stored)}{chose}", flush=True)
    spark_floor, floor = merge_floor(tr, "tpch")
    print(f"\nmedian: FULL/DIFF {statistics.median(ratios_full):.2f}x, plain/DIFF {statistics.median(ratios_plain):.2f}x;"
          f" queries where DIFFERENTIAL is slower than the plain recompute: "
          f"{sum(r < 1 for r in ratios_plain)} of {len(ratios_plain)}; the slowest plain/DIFF "
          f"{min(ratios_plain):.2f}x; our FULL / plain (each the median of {args.full_samples} samples) median "
          f"{statistics.median(full_over_plain):.2f}x, highest {max(full_over_plain):.2f}x")
    print(f"medians: DIFFERENTIAL {statistics.median(diffs):.2f} s, plain recompute {statistics.median(plains):.2f} s, "
          f"our bookkeeping per refresh {statistics.median(ours):.2f} s; the cheapest commit (one row into a "
          f"one-row table): Spark's MERGE {spark_floor:.2f} s, resolved by Spark and committed by delta-rs "
          f"{floor:.2f} s")
    print(f"a refresh whose delta cost nothing would still take ~{statistics.median(ours) + floor:.2f} s: "
          f"plain/DIFF could reach at most ~{statistics.median(plains) / (statistics.median(ours) + floor):.1f}x "
          f"at this scale")
    kept = tr.arrangements()
    if kept:
        print(f"\njoin arrangements kept: {len(kept)}, {sum(k['bytes'] for k in kept) / 2**20:,.0f} MiB")
        for k in kept:
            rows = "" if k.get("held_rows") is None else f", {k['held_rows']:,} rows, {k['bytes_per_row']:g} bytes per row"
            print(f"  {k['table'].rsplit('/', 1)[-1]} by {k['key']} ({k['columns']}): {k['bytes'] / 2**20:,.0f} MiB{rows}")
    tr.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Spike: a join input kept as a key-sorted arrangement outside Spark, probed in O(k log n).

Design (c) of issue 38, beside today's plan. A delta term such as ``Δorders ⋈ lineitem_old``
needs the line items of a few thousand order keys; today Spark scans ``lineitem`` for them.
Here every input a delta probes is kept as an **arrangement** (``storage/arrangement.py``): the
columns the query needs, sorted by the join key, in an Arrow IPC file that the refresh's process
memory-maps (the page cache keeps it warm across processes), current at a known Delta version,
plus small **runs** of later changes (the change rows each refresh reads anyway, with their
weights); a term's partners are probed along its join (the changed orders' line items, then
their parts, suppliers, ...).  A probe for k keys is a binary search per key over the mapped key column, the
matching rows taken, the runs' rows of those keys added and consolidated (bag semantics, NULL
keys never match an equality); the result goes to Spark as a local relation, and Spark
computes the delta over local relations only.

Per cycle of RF1 + RF2 (~0.1 % of ``orders`` and ``lineitem``), taking turns at going first:

* ``DIFF``     -- the product's DIFFERENTIAL refresh of the query (what a user gets today);
* ``Δ, Delta`` -- the delta's SQL as the product writes it for a join of two changed inputs
                  (each change joined with the other input's state ``VERSION AS OF``), collected:
                  the delta's cost without the commit;
* ``Δ, arranged`` -- the same delta from the arrangements, by phase: the change feeds read and
                  collected (Spark), the probes (here), the delta over local relations (Spark);
* ``Δ, arranged, feeds by delta-rs`` -- the same with the change feeds read by delta-rs;
* ``plain``    -- ``INSERT OVERWRITE`` of the query into a Delta table.

Every arranged delta is checked against the query at the old and new versions (per group,
exactly).  The commit a delta would need is the product's floor for a small change, measured
in the same run (``tpch.merge_floor``).

    .venv/bin/python benchmarks/arrangement_spike.py --scale 1 --cycles 3 --queries q12,q5,q9

The plan and the commit of a refresh through arrangements are not built yet: the last figure it
prints is the arranged delta plus the cheapest commit, a floor (``benchmarks/README.md``).
"""
from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from airflow_trickle import Trickle  # noqa: E402
from airflow_trickle.storage.arrangement import WEIGHT, Arrangement, change_rows  # noqa: E402
from tests import tpch  # noqa: E402

W = "__w"


@dataclass
class Query:
    """A join query's delta written both ways: its change feeds, its arranged inputs, its terms."""

    name: str
    #: changed table -> the columns its delta terms read of its change
    changes: dict[str, list[str]]
    #: (arranged table, key, columns) -- the large inputs the terms probe
    arranged: list[tuple[str, str, list[str]]]
    #: the delta's SQL over relations named ``d_<table>`` (a change, with ``__w``), ``old_<table>``,
    #: ``new_<table>`` (a changed input's state) and ``cur<n>_<table>`` (an unchanged one's); the
    #: arranged path fills each with a local relation
    delta_sql: str
    #: each state relation a term probes, in order: (relation, arranged table, the relation whose
    #: column ``key`` gives the keys -- a change ``d_<table>`` or a relation probed before)
    probes: list[tuple[str, str, str, str]]
    #: how many leading output columns are the GROUP BY's
    groups: int = 1


Q12_FILTER = ("l_shipmode IN ('MAIL', 'SHIP') AND l_commitdate < l_receiptdate AND l_shipdate < l_commitdate "
              "AND l_receiptdate >= DATE '1994-01-01' AND l_receiptdate < DATE '1995-01-01'")
Q12_HIGH = "CASE WHEN o_orderpriority = '1-URGENT' OR o_orderpriority = '2-HIGH' THEN 1 ELSE 0 END"
Q12_LOW = "CASE WHEN o_orderpriority <> '1-URGENT' AND o_orderpriority <> '2-HIGH' THEN 1 ELSE 0 END"
Q12_L = ["l_orderkey", "l_shipmode", "l_commitdate", "l_receiptdate", "l_shipdate"]
Q12_O = ["o_orderkey", "o_orderpriority"]
Q12_TERM = "l.l_shipmode, l.l_commitdate, l.l_receiptdate, l.l_shipdate"
Q5_L = ["l_orderkey", "l_suppkey", "l_extendedprice", "l_discount"]
Q5_O = ["o_orderkey", "o_custkey", "o_orderdate"]
Q5_TERM = ("SELECT n.n_name, l.l_extendedprice, l.l_discount, {w} AS __w FROM {o} o "
           "JOIN {l} l ON l.l_orderkey = o.o_orderkey JOIN cur{n}_customer c ON c.c_custkey = o.o_custkey "
           "JOIN cur{n}_supplier s ON l.l_suppkey = s.s_suppkey AND c.c_nationkey = s.s_nationkey "
           "JOIN cur{n}_nation n ON s.s_nationkey = n.n_nationkey JOIN cur{n}_region r ON n.n_regionkey = r.r_regionkey "
           "WHERE r.r_name = 'ASIA' AND o.o_orderdate >= DATE '1994-01-01' AND o.o_orderdate < DATE '1995-01-01'")
Q9_L = ["l_orderkey", "l_partkey", "l_suppkey", "l_quantity", "l_extendedprice", "l_discount"]
Q9_O = ["o_orderkey", "o_orderdate"]
Q9_TERM = ("SELECT n.n_name AS nation, YEAR(o.o_orderdate) AS o_year, "
           "l.l_extendedprice * (1 - l.l_discount) - ps.ps_supplycost * l.l_quantity AS amount, {w} AS __w "
           "FROM {o} o JOIN {l} l ON o.o_orderkey = l.l_orderkey JOIN cur{n}_part p ON p.p_partkey = l.l_partkey "
           "JOIN cur{n}_partsupp ps ON ps.ps_partkey = l.l_partkey AND ps.ps_suppkey = l.l_suppkey "
           "JOIN cur{n}_supplier s ON s.s_suppkey = l.l_suppkey JOIN cur{n}_nation n ON s.s_nationkey = n.n_nationkey "
           "WHERE p.p_name LIKE '%green%'")
QUERIES = {
    "q12": Query(
        name="q12",
        changes={"orders": Q12_O, "lineitem": Q12_L},
        arranged=[("lineitem", "l_orderkey", Q12_L), ("orders", "o_orderkey", Q12_O)],
        delta_sql=(
            f"SELECT l_shipmode, SUM(__w * {Q12_HIGH}) AS high_line_count, SUM(__w * {Q12_LOW}) AS low_line_count "
            f"FROM (SELECT o.o_orderpriority, {Q12_TERM}, o.__w FROM d_orders o JOIN old_lineitem l "
            "ON o.o_orderkey = l.l_orderkey "
            f"UNION ALL SELECT o.o_orderpriority, {Q12_TERM}, l.__w FROM new_orders o JOIN d_lineitem l "
            "ON o.o_orderkey = l.l_orderkey) "
            f"WHERE {Q12_FILTER} GROUP BY l_shipmode"),
        probes=[("old_lineitem", "lineitem", "d_orders", "o_orderkey"), ("new_orders", "orders", "d_lineitem", "l_orderkey")]),
    # the six-way join: every input arranged, each term's partners probed along the join
    "q5": Query(
        name="q5",
        changes={"orders": Q5_O, "lineitem": Q5_L},
        arranged=[("lineitem", "l_orderkey", Q5_L), ("orders", "o_orderkey", Q5_O),
                  ("customer", "c_custkey", ["c_custkey", "c_nationkey"]),
                  ("supplier", "s_suppkey", ["s_suppkey", "s_nationkey"]),
                  ("nation", "n_nationkey", ["n_nationkey", "n_name", "n_regionkey"]),
                  ("region", "r_regionkey", ["r_regionkey", "r_name"])],
        delta_sql=(
            "SELECT n_name, SUM(__w * l_extendedprice * (1 - l_discount)) AS revenue FROM ("
            + Q5_TERM.format(w="o.__w", o="d_orders", l="old_lineitem", n=1) + " UNION ALL "
            + Q5_TERM.format(w="l.__w", o="new_orders", l="d_lineitem", n=2) + ") x GROUP BY n_name"),
        probes=[("old_lineitem", "lineitem", "d_orders", "o_orderkey"),
                ("cur1_customer", "customer", "d_orders", "o_custkey"),
                ("cur1_supplier", "supplier", "old_lineitem", "l_suppkey"),
                ("cur1_nation", "nation", "cur1_supplier", "s_nationkey"),
                ("cur1_region", "region", "cur1_nation", "n_regionkey"),
                ("new_orders", "orders", "d_lineitem", "l_orderkey"),
                ("cur2_customer", "customer", "new_orders", "o_custkey"),
                ("cur2_supplier", "supplier", "d_lineitem", "l_suppkey"),
                ("cur2_nation", "nation", "cur2_supplier", "s_nationkey"),
                ("cur2_region", "region", "cur2_nation", "n_regionkey")]),
    # six inputs: the change's partners in lineitem or orders, and theirs in part and partsupp, probed
    # in turn (supplier and nation, small, read by Spark)
    "q9": Query(
        name="q9",
        changes={"orders": Q9_O, "lineitem": Q9_L},
        arranged=[("lineitem", "l_orderkey", Q9_L), ("orders", "o_orderkey", Q9_O),
                  ("part", "p_partkey", ["p_partkey", "p_name"]),
                  ("partsupp", "ps_partkey", ["ps_partkey", "ps_suppkey", "ps_supplycost"]),
                  ("supplier", "s_suppkey", ["s_suppkey", "s_nationkey"]),
                  ("nation", "n_nationkey", ["n_nationkey", "n_name"])],
        delta_sql=(
            "SELECT nation, o_year, SUM(__w * amount) AS sum_profit FROM ("
            + Q9_TERM.format(w="o.__w", o="d_orders", l="old_lineitem", n=1) + " UNION ALL "
            + Q9_TERM.format(w="l.__w", o="new_orders", l="d_lineitem", n=2) + ") x GROUP BY nation, o_year"),
        probes=[("old_lineitem", "lineitem", "d_orders", "o_orderkey"), ("cur1_part", "part", "old_lineitem", "l_partkey"),
                ("cur1_partsupp", "partsupp", "old_lineitem", "l_partkey"),
                ("cur1_supplier", "supplier", "old_lineitem", "l_suppkey"),
                ("cur1_nation", "nation", "cur1_supplier", "s_nationkey"),
                ("new_orders", "orders", "d_lineitem", "l_orderkey"), ("cur2_part", "part", "d_lineitem", "l_partkey"),
                ("cur2_partsupp", "partsupp", "d_lineitem", "l_partkey"),
                ("cur2_supplier", "supplier", "d_lineitem", "l_suppkey"),
                ("cur2_nation", "nation", "cur2_supplier", "s_nationkey")],
        groups=2),
}


def weighted(changes: pa.Table) -> pa.Table:
    """A change read here (weight ``__w``) as an arrangement's run takes it."""
    return changes.rename_columns([WEIGHT if c == W else c for c in changes.column_names])


def timed(run):
    started = time.perf_counter()
    result = run()
    return time.perf_counter() - started, result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--scale", type=float, default=1)
    parser.add_argument("--cycles", type=int, default=3, help="timed cycles of RF1 + RF2 (after one untimed)")
    parser.add_argument("--queries", default="q12")
    parser.add_argument("--warehouse", default=None)
    parser.add_argument("--driver-memory", default="8g")
    args = parser.parse_args()
    from tpch import merge_floor  # benchmarks/tpch.py

    warehouse = args.warehouse or tempfile.mkdtemp(prefix="trickle-arranged-")
    tr = Trickle(warehouse=warehouse, spark_master="local[2]", differential_max_time_ratio=1e9,
                 spark_conf={"spark.driver.memory": args.driver_memory, "spark.ui.enabled": "false"})
    spark = tr.spark
    chosen = [QUERIES[q] for q in args.queries.split(",")]
    text = tpch.queries()
    marker = Path(warehouse) / "arranged-cycle"
    if marker.exists() or spark.catalog.tableExists("tpch.lineitem"):
        cycle = int(marker.read_text()) + 1 if marker.exists() else 1
    else:
        started = time.perf_counter()
        tpch.load(tr, args.scale, Path(warehouse) / "tpch-data")
        print(f"SF {args.scale:g} loaded in {time.perf_counter() - started:.0f} s", flush=True)
        cycle = 1
    for q in chosen:
        for suffix, create in (("differential", lambda: tr.create_stream_table(
                f"tpch.{q.name}_differential", text[q.name], refresh_mode="DIFFERENTIAL", schedule=None)),
                               ("plain", lambda: tr.sql(f"CREATE TABLE tpch.{q.name}_plain USING delta AS {text[q.name]}"))):
            if not spark.catalog.tableExists(f"tpch.{q.name}_{suffix}"):
                create()
    location = {t: spark.sql(f"DESCRIBE DETAIL tpch.{t}").first().location for t in tpch.TABLES}
    folder = Path(warehouse) / "arrangements"
    folder.mkdir(exist_ok=True)
    arrangements: dict[tuple[str, str], Arrangement] = {}  # by query and table
    print("arrangements (delta-rs read, sort, IPC file, mapped):", flush=True)
    for q in chosen:
        for table, key, columns in q.arranged:
            seconds, arranged = timed(lambda: Arrangement.build(folder / f"{q.name}.{table}", location[table], key,
                                                                columns))
            arrangements[q.name, table] = arranged
            print(f"  {table} by {key}: {arranged.base.num_rows:,} rows, {len(columns)} columns, built in "
                  f"{seconds:.1f} s, {arranged.nbytes / 2 ** 20:.0f} MiB ({arranged.nbytes / max(arranged.base.num_rows, 1):.1f} "
                  "bytes a row)", flush=True)
    for q in chosen:  # catch the stream tables up to where the arrangements are
        tr.refresh_stream_table(f"tpch.{q.name}_differential")
    floor_spark, floor_local = merge_floor(tr, "tpch")
    print(f"commit floor: Spark MERGE {floor_spark:.2f} s, delta-rs {floor_local:.2f} s", flush=True)

    def version(table: str) -> int:
        from deltalake import DeltaTable
        return DeltaTable(location[table]).version()

    results: dict[str, dict[str, list[float]]] = {q.name: {} for q in chosen}
    for turn in range(args.cycles + 1):
        old = {t: version(t) for t in ("orders", "lineitem")}
        tpch.refresh_functions(tr, cycle, updates=False)
        marker.write_text(str(cycle))
        cycle += 1
        new = {t: version(t) for t in ("orders", "lineitem")}
        for table in tpch.TABLES:  # Delta's snapshot of each new version, built once (as tpch.py does)
            spark.sql(f"SELECT * FROM tpch.{table} LIMIT 1").collect()
        changes: dict[str, pa.Table] = {}
        for qn, q in enumerate(chosen):
            def change_sql(table, columns):
                weight = "CASE WHEN _change_type IN ('insert', 'update_postimage') THEN 1 ELSE -1 END"
                return (f"SELECT {', '.join(columns)}, {weight} AS {W} FROM "
                        f"table_changes('tpch.{table}', {old[table] + 1}, {new[table]})")

            def version_of(relation: str, table: str) -> int:
                which = relation.split("_")[0]
                if which == "old":
                    return old[table]
                if which == "new":
                    return new[table]
                return arrangements[q.name, table].version  # an unchanged input

            def by_delta():
                for table, columns in q.changes.items():
                    spark.sql(change_sql(table, columns)).createOrReplaceTempView(f"d_{table}")
                for relation, table, _, _ in q.probes:
                    at = version_of(relation, table)
                    spark.sql(f"SELECT * FROM tpch.{table} VERSION AS OF {at}").createOrReplaceTempView(relation)
                return spark.sql(q.delta_sql).collect()

            def feed_by_delta_rs(table, columns) -> pa.Table:
                rows = change_rows(location[table], old[table], new[table], columns)
                plain = pa.schema([f.with_type(pa.string()) if pa.types.is_string_view(f.type) else f
                                   for f in rows.schema])  # Spark's Arrow reader takes no string views
                return rows.cast(plain).rename_columns([W if c == WEIGHT else c for c in rows.column_names])

            def arranged(feeds: str):
                phases = {}
                started = time.perf_counter()
                for table, columns in q.changes.items():
                    changes[table] = (spark.sql(change_sql(table, columns)).toArrow() if feeds == "spark"
                                      else feed_by_delta_rs(table, columns))
                phases["change feeds"] = time.perf_counter() - started
                started = time.perf_counter()
                probed = {}
                relations = {f"d_{t}": rows for t, rows in changes.items()}
                for relation, table, source, key in q.probes:
                    at = version_of(relation, table)
                    arrangement = arrangements[q.name, table]
                    if table in new and at == new[table]:  # caught up from the change just read
                        arrangement.add_run(old[table], new[table], weighted(changes[table]))
                    wanted = pc.drop_null(relations[source][key]).to_numpy()
                    probed[relation] = relations[relation] = arrangement.probe(wanted, at)
                phases["probes"] = time.perf_counter() - started
                started = time.perf_counter()
                for table in q.changes:
                    spark.createDataFrame(changes[table]).createOrReplaceTempView(f"d_{table}")
                for relation, rows in probed.items():
                    spark.createDataFrame(rows).createOrReplaceTempView(relation)
                rows = spark.sql(q.delta_sql).collect()
                phases["delta over local relations"] = time.perf_counter() - started
                phases["probed rows"] = sum(r.num_rows for r in probed.values())
                return rows, phases

            runs = {"DIFF": lambda: tr.refresh_stream_table(f"tpch.{q.name}_differential"),
                    "plain": lambda: tr.sql(f"INSERT OVERWRITE tpch.{q.name}_plain {text[q.name]}"),
                    "Δ, Delta": by_delta, "Δ, arranged": lambda: arranged("spark"),
                    "Δ, arranged, feeds by delta-rs": lambda: arranged("delta-rs")}
            first = (turn + qn) % len(runs)
            measured = {k: timed(runs[k]) for k in list(runs)[first:] + list(runs)[:first]}
            for table in q.changes:  # the runs the probes at new did not add
                if (q.name, table) in arrangements:
                    arrangements[q.name, table].add_run(old[table], new[table], weighted(changes[table]))
            # exact: the arranged delta is the query at new minus the query at old, per group
            want = {}
            for which, sign in ((old, -1), (new, 1)):
                sql = text[q.name].split(" ORDER BY")[0]
                for t, v in which.items():
                    sql = sql.replace(f"tpch.{t}", f"tpch.{t} VERSION AS OF {v}", 1)
                for row in spark.sql(sql).collect():
                    values = want.setdefault(tuple(row[:q.groups]), [0] * (len(row) - q.groups))
                    for i, x in enumerate(row[q.groups:]):
                        values[i] += sign * x
            rows, phases = measured["Δ, arranged"][1]
            rows_rs, phases_rs = measured["Δ, arranged, feeds by delta-rs"][1]
            phases["change feeds by delta-rs"] = phases_rs["change feeds"]
            got = {tuple(r[:q.groups]): list(r[q.groups:]) for r in rows}
            got_rs = {tuple(r[:q.groups]): list(r[q.groups:]) for r in rows_rs}
            delta = {tuple(r[:q.groups]): list(r[q.groups:]) for r in measured["Δ, Delta"][1]}
            want = {g: v for g, v in want.items() if any(v) or g in got}
            got = {g: v for g, v in got.items() if any(v) or g in want}
            delta = {g: v for g, v in delta.items() if any(v) or g in want}
            got_rs = {g: v for g, v in got_rs.items() if any(v) or g in want}
            if got != want or delta != want or got_rs != want:
                print(f"{q.name}: NOT EXACT arranged={got} delta={delta} want={want}", flush=True)
                return 1
            result = measured["DIFF"][1]
            if turn == 0:
                print(f"{q.name}: cycle untimed (warm-up), {result.action}", flush=True)
                continue
            times = results[q.name]
            for name, (seconds, _) in measured.items():
                times.setdefault(name, []).append(seconds)
            for phase, seconds in phases.items():
                times.setdefault(phase, []).append(seconds)
            print(f"{q.name} cycle {turn}: " + ", ".join(f"{k} {v[0]:.2f} s" for k, v in measured.items())
                  + "; arranged phases " + ", ".join(f"{k} {v:.3f}" if isinstance(v, float) else f"{k} {v}"
                                                     for k, v in phases.items()), flush=True)
    print(f"\nSF {args.scale:g}, medians of {args.cycles} cycles (RF1 + RF2), turns taken:")
    for qname, times in results.items():
        med = {k: statistics.median(v) for k, v in times.items()}
        estimate = med["Δ, arranged, feeds by delta-rs"] + floor_local
        print(f"  {qname}: DIFF {med['DIFF']:.2f} s, plain {med['plain']:.2f} s (plain/DIFF {med['plain'] / med['DIFF']:.2f}x); "
              f"delta by Delta scans {med['Δ, Delta']:.2f} s; arranged {med['Δ, arranged']:.2f} s = change feeds "
              f"{med['change feeds']:.2f} + probes {med['probes']:.3f} + delta over local relations "
              f"{med['delta over local relations']:.2f} ({med['probed rows']:,.0f} rows probed); with the feeds "
              f"read by delta-rs {med['Δ, arranged, feeds by delta-rs']:.2f} s (feeds {med['change feeds by delta-rs']:.2f}); "
              f"arranged + delta-rs commit floor {estimate:.2f} s (plain/that {med['plain'] / estimate:.2f}x)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Soak: hundreds of refresh cycles on one stream table, exact after each, files kept bounded.

    .venv/bin/python scripts/soak.py --cycles 300 [--maintain-every 50] [--seed 1] [--keep]

A fresh warehouse (an embedded classic Spark) with two sources and one DIFFERENTIAL stream
table over them, a join and an aggregate.  Each cycle changes the sources at random (inserts
with NULLs and duplicate rows, deletes, updates that move rows between groups, now and then a
change of the joined dimension), refreshes, and compares the stream table with its query on
the sources (multiset equality).  Every ``--maintain-every`` cycles ``maintain`` compacts and
vacuums the storage and the catalog (retention 0: no other reader).  Every 25 cycles it prints
the file counts of the storage table and of the catalog tables: active files (what a reader
opens), data files on disk, and commit files in the Delta log.  Exits 1 if a cycle is not
exact, or if the active files after the last maintenance exceed those after the first.
"""
from __future__ import annotations

import argparse
import os
import random
import shutil
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

QUERY = ("SELECT s.grp, d.label, COUNT(*) AS n, SUM(s.v) AS total, COUNT(s.v) AS counted "
         "FROM soak.src s JOIN soak.dim d ON s.grp = d.grp GROUP BY s.grp, d.label")
NAME = "soak.totals"
#: Groups of the aggregate; the sources start with ``INITIAL_ROWS`` rows spread over them.
GROUPS, INITIAL_ROWS = 100, 3000


def change(tr, rng: random.Random, next_id: int) -> int:
    """One random batch on the sources; returns the next unused id."""
    def value(low, high):
        return "NULL" if rng.random() < 0.1 else str(rng.randint(low, high))

    rows = [f"({next_id + i}, {value(0, GROUPS - 1)}, {value(-5, 50)})" for i in range(rng.randint(1, 12))]
    rows.append(rows[0])  # a duplicate row
    tr.sql(f"INSERT INTO soak.src VALUES {', '.join(rows)}")
    next_id += len(rows)
    if rng.random() < 0.6:
        low = rng.randint(0, next_id)
        tr.sql(f"DELETE FROM soak.src WHERE id BETWEEN {low} AND {low + rng.randint(0, 6)}")
    if rng.random() < 0.6:
        low = rng.randint(0, next_id)
        tr.sql(f"UPDATE soak.src SET grp = {value(0, GROUPS - 1)}, v = v + 1 WHERE id BETWEEN {low} AND {low + 4}")
    if rng.random() < 0.1:
        tr.sql(f"UPDATE soak.dim SET label = '{rng.choice('abc')}' WHERE grp = {rng.randint(0, GROUPS - 1)}")
    return next_id


def file_counts(location: str) -> tuple[int, int, int]:
    """(active files, data files on disk, commit files in the log) of a local Delta table."""
    from airflow_trickle.location import Location
    from airflow_trickle.storage.deltalog import active_file_count, normalize_location

    root = normalize_location(location)
    on_disk = sum(1 for folder, _, files in os.walk(root) if "_delta_log" not in folder
                  for f in files if f.endswith(".parquet"))
    log = sum(1 for f in os.listdir(os.path.join(root, "_delta_log")) if f.endswith(".json"))
    return active_file_count(Location(root)), on_disk, log


def report(tr, cycle: int) -> dict[str, tuple[int, int, int]]:
    from airflow_trickle.catalog.tables import TABLES

    counts = {"storage": file_counts(tr.get(NAME).location)}
    for table in TABLES:
        counts[f"catalog.{table}"] = file_counts(tr.catalog.path(table))
    print(f"  after cycle {cycle:3d}: " + "; ".join(f"{k} {a}/{d}/{j}" for k, (a, d, j) in counts.items()),
          flush=True)
    return counts


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cycles", type=int, default=300)
    parser.add_argument("--maintain-every", type=int, default=50)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--keep", action="store_true", help="keep the warehouse (its path is printed)")
    args = parser.parse_args()

    from airflow_trickle import Trickle
    from tests.oracle import both_multisets

    warehouse = tempfile.mkdtemp(prefix="soak-")
    rng = random.Random(args.seed)
    tr = Trickle(warehouse, shuffle_partitions=2, spark_conf={"spark.ui.enabled": "false"})
    failures, actions, maintained = 0, {}, []
    started = time.monotonic()
    try:
        tr.sql("CREATE DATABASE soak")
        tr.sql("CREATE TABLE soak.src (id INT, grp INT, v INT) USING delta")
        tr.sql("CREATE TABLE soak.dim (grp INT, label STRING) USING delta")
        tr.sql(f"INSERT INTO soak.dim SELECT id, substr('abc', id % 3 + 1, 1) FROM range({GROUPS})")
        tr.sql("INSERT INTO soak.dim VALUES (3, 'c'), (NULL, 'a')")  # a duplicate join partner, a NULL key
        tr.sql(f"INSERT INTO soak.src SELECT id, id % {GROUPS}, id % 50 FROM range({INITIAL_ROWS})")
        next_id = change(tr, rng, INITIAL_ROWS)
        tr.create_stream_table(NAME, QUERY, schedule=None, refresh_mode="DIFFERENTIAL")
        print("active/on disk/log files of the storage and each catalog table:", flush=True)
        report(tr, 0)
        for cycle in range(1, args.cycles + 1):
            next_id = change(tr, rng, next_id)
            result = tr.refresh_stream_table(NAME)
            actions[str(result.action)] = actions.get(str(result.action), 0) + 1
            if result.action != "DIFFERENTIAL" and actions[str(result.action)] <= 3:
                print(f"cycle {cycle}: {result.action}: {result.reason}", flush=True)
            stored, wanted = both_multisets(tr.read(NAME), tr.sql(QUERY))
            if stored != wanted:
                failures += 1
                print(f"cycle {cycle}: NOT EXACT ({result.action})\n stored: {stored}\n wanted: {wanted}", flush=True)
            if cycle % args.maintain_every == 0:
                done = tr.maintain(retention_hours=0)
                maintained.append(report(tr, cycle))
                print(f"  maintained: " + "; ".join(f"{m.table} {m.active_files_before}->{m.active_files_after}"
                                                     for m in done), flush=True)
            elif cycle % 25 == 0:
                report(tr, cycle)
        findings = tr.check()
        took = time.monotonic() - started
        print(f"{args.cycles - failures}/{args.cycles} cycles exact; actions {actions}; "
              f"check: {len(findings)} finding(s); {took:.0f}s", flush=True)
        for finding in findings:
            print("  ", finding, flush=True)
        grew = [k for k in (maintained[-1] if maintained else {})
                if maintained[-1][k][0] > max(maintained[0][k][0], 1)]
        if grew:
            print("active files grew between the first and the last maintenance:", ", ".join(grew), flush=True)
        return 1 if failures or findings or grew else 0
    finally:
        tr.close()
        if args.keep:
            print("warehouse:", warehouse)
        else:
            shutil.rmtree(warehouse, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())

"""A small keyed refresh with the stored rows it matches read three ways, beside a plain recompute.

    python benchmarks/stored_rows.py [--groups 10,100000] [--repeat 5] [--connect]

A stream table ``SELECT k, SUM(v), COUNT(*) FROM events GROUP BY k`` over ``--groups`` groups
(ten rows each); every round inserts one row into one group and refreshes three copies of the
table, taking turns, each resolving its small change (``refresh/stored_reads.py``) against the
stored rows the change matches read

* **whole**: by delta-rs, the whole table shipped to Spark with the query computing the change,
  whatever its size (the refresh does it for tables of at most ``STORED_SHIPPED_WHOLE_ROWS`` rows);
* **by keys**: by delta-rs, only the rows the change's keys name, once Spark has computed them;
* **spark**: by Spark, ``VERSION AS OF`` the version delta-rs commits on (what every small
  refresh did before: Spark first rebuilds the table's snapshot, the commit delta-rs made
  having no checksum file);

then the plain recompute a user would run instead (``INSERT OVERWRITE`` of the query).  Prints
the medians of the refresh and of its commit phase (where the resolution runs), per way and
size.  ``--connect`` runs over a Spark service started for the run (as Airflow tasks do).
"""
from __future__ import annotations

import argparse
import statistics
import tempfile
import time

from airflow_trickle import Trickle
from airflow_trickle.refresh import plan

QUERY = "SELECT k, SUM(v) AS total, COUNT(*) AS n FROM {db}.events GROUP BY k"
WAYS = {"whole": {"STORED_SHIPPED_WHOLE_ROWS": 10**9}, "by keys": {"STORED_SHIPPED_WHOLE_ROWS": 0},
        "spark": {"STORED_SHIPPED_WHOLE_ROWS": 0, "STORED_READ_MAX_ROWS": 0}}
DEFAULTS = {"STORED_SHIPPED_WHOLE_ROWS": plan.STORED_SHIPPED_WHOLE_ROWS,
            "STORED_READ_MAX_ROWS": plan.STORED_READ_MAX_ROWS}


def run(tr: Trickle, groups: int, repeat: int) -> dict[str, dict[str, list[float]]]:
    db = f"rows_{groups}"
    tr.sql(f"CREATE DATABASE {db}")
    tr.sql(f"CREATE TABLE {db}.events (k BIGINT, v BIGINT) USING delta "
           "TBLPROPERTIES (delta.enableChangeDataFeed = true)")
    tr.sql(f"INSERT INTO {db}.events SELECT id % {groups}, id FROM range({groups * 10})")
    query = QUERY.format(db=db)
    names = {way: f"{db}.agg_{way.replace(' ', '_')}" for way in WAYS}
    for name in names.values():
        tr.create_stream_table(name, query, schedule=None, refresh_mode="DIFFERENTIAL")
    tr.sql(f"CREATE TABLE {db}.plain USING delta AS {query}")
    times: dict[str, dict[str, list[float]]] = {way: {"refresh": [], "commit": []} for way in (*WAYS, "plain")}
    for round_no in range(repeat + 1):  # the first round warms up, untimed
        tr.sql(f"INSERT INTO {db}.events VALUES ({round_no % groups}, {round_no})")
        for way, limits in WAYS.items():
            for key, value in {**DEFAULTS, **limits}.items():
                setattr(plan, key, value)
            started = time.monotonic()
            result = tr.refresh_stream_table(names[way])
            seconds = time.monotonic() - started
            assert result.action.value == "DIFFERENTIAL", result
            engine = tr.sql(f"DESCRIBE HISTORY {names[way]} LIMIT 1").first().engineInfo
            assert engine.startswith("delta-rs"), (way, engine)
            if round_no:
                times[way]["refresh"].append(seconds)
                times[way]["commit"].append(result.phases["commit"] / 1000)
        started = time.monotonic()
        tr.sql(f"INSERT OVERWRITE {db}.plain {query}")
        if round_no:
            times["plain"]["refresh"].append(time.monotonic() - started)
    for key, value in DEFAULTS.items():
        setattr(plan, key, value)
    expected = sorted(tr.sql(query).collect())
    for name in names.values():
        assert sorted(tr.read(name).collect()) == expected, name
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--groups", default="10,100000")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--connect", action="store_true", help="over a Spark service (Spark Connect)")
    args = parser.parse_args()
    settings = {"shuffle_partitions": 2, "differential_max_change_ratio": 1e9,
                "differential_max_touched_ratio": 1e9, "differential_max_time_ratio": 1e9}
    with tempfile.TemporaryDirectory(prefix="trickle-stored-rows-") as warehouse:
        service = None
        if args.connect:
            from airflow_trickle.spark.service import start_detached, stop_service

            service = start_detached(warehouse, port=0, master="local[2]", settings={"shuffle_partitions": 2})
            tr = Trickle(warehouse=warehouse, remote=service.address, **settings)
        else:
            tr = Trickle(warehouse=warehouse, spark_master="local[2]", **settings)
        try:
            print(f"{'groups':>8} | {'way':<8} | {'refresh':>8} | {'commit':>8} | plain / refresh")
            for groups in (int(g) for g in args.groups.split(",")):
                times = run(tr, groups, args.repeat)
                plain = statistics.median(times["plain"]["refresh"])
                for way in WAYS:
                    refresh = statistics.median(times[way]["refresh"])
                    print(f"{groups:>8} | {way:<8} | {refresh:7.2f}s | {statistics.median(times[way]['commit']):7.2f}s"
                          f" | {plain / refresh:.2f}x", flush=True)
                print(f"{groups:>8} | {'plain':<8} | {plain:7.2f}s |          |", flush=True)
        finally:
            tr.close()
            if service is not None:
                stop_service(warehouse)


if __name__ == "__main__":
    main()

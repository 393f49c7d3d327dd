"""A stream table with ``cluster_by`` beside the same table unclustered: what a reader's key lookup
gains, and what a small refresh pays for it.

    python benchmarks/cluster_by.py [--rows 4000000] [--repeat 5] [--file-mb 4]

``events (k BIGINT, v BIGINT)`` holds ``--rows`` rows whose keys arrive in random order; two
stream tables ``SELECT k, v, v % 7 AS bucket FROM events`` hold them, one with
``options={"cluster_by": ["k"]}``, both maintained (``maintain()``: OPTIMIZE) after the load.
Delta writes files of up to 1 GB; ``--file-mb`` caps OPTIMIZE's files so that a table of a few
million rows spans as many files as one of a few billion would at the default (say so when you
quote the figures).  Each round, the three take turns:

* **refresh**: one row of ``events`` updated, both stream tables refreshed DIFFERENTIALLY (the
  unclustered one commits through delta-rs, the clustered one through Spark's MERGE);
* **lookup**: ``SELECT COUNT(*), SUM(v) FROM <table> WHERE k = <key>``, a BI reader's point query;
* the **plain** recompute a user would run instead (``INSERT OVERWRITE`` of the query).

Prints the medians, and the files each table has and each lookup reads (Delta's file skipping,
from ``DESCRIBE DETAIL`` and the scan's ``numFiles`` metric where the session exposes it).
"""
from __future__ import annotations

import argparse
import statistics
import tempfile
import time

from airflow_trickle import Trickle

QUERY = "SELECT k, v, v % 7 AS bucket FROM {db}.events"


def timed(fn) -> float:
    started = time.monotonic()
    fn()
    return time.monotonic() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=4_000_000)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--file-mb", type=int, default=4)
    args = parser.parse_args()
    settings = {"shuffle_partitions": 2, "differential_max_change_ratio": 1e9,
                "differential_max_touched_ratio": 1e9, "differential_max_time_ratio": 1e9,
                "spark_conf": {"spark.databricks.delta.optimize.maxFileSize": str(args.file_mb << 20)}}
    with tempfile.TemporaryDirectory(prefix="trickle-cluster-by-") as warehouse:
        tr = Trickle(warehouse=warehouse, spark_master="local[2]", **settings)
        try:
            db, keys = "bench", args.rows // 10
            tr.sql(f"CREATE DATABASE {db}")
            tr.sql(f"CREATE TABLE {db}.events (k BIGINT, v BIGINT) USING delta "
                   "TBLPROPERTIES (delta.enableChangeDataFeed = true)")
            tr.sql(f"INSERT INTO {db}.events SELECT pmod(id * 2654435761, {keys}), id FROM range({args.rows})")
            query = QUERY.format(db=db)
            names = {"unclustered": f"{db}.plain_layout", "cluster_by k": f"{db}.clustered"}
            tr.create_stream_table(names["unclustered"], query, schedule=None)
            tr.create_stream_table(names["cluster_by k"], query, schedule=None, options={"cluster_by": ["k"]})
            tr.sql(f"CREATE TABLE {db}.plain USING delta AS {query}")
            made = {way: timed(lambda name=name: tr.maintain([name])) for way, name in names.items()}
            files = {way: tr.sql(f"DESCRIBE DETAIL {name}").first()["numFiles"] for way, name in names.items()}
            times = {f"{kind} {way}": [] for kind in ("refresh", "lookup") for way in names}
            times["plain recompute"] = []
            for round_no in range(args.repeat + 1):  # the first round warms up, untimed
                tr.sql(f"UPDATE {db}.events SET v = -v - 1 WHERE v = {round_no * 1009}")  # a MERGE, not an append
                key = (round_no * 7919) % keys
                ways = list(names.items())
                ways = ways if round_no % 2 else ways[::-1]  # taking turns at going first
                for way, name in ways:
                    seconds = timed(lambda name=name: _refresh(tr, name))
                    lookup = timed(lambda name=name: tr.sql(
                        f"SELECT COUNT(*), SUM(v) FROM {name} WHERE k = {key}").collect())
                    if round_no:
                        times[f"refresh {way}"].append(seconds)
                        times[f"lookup {way}"].append(lookup)
                plain = timed(lambda: tr.sql(f"INSERT OVERWRITE {db}.plain {query}"))
                if round_no:
                    times["plain recompute"].append(plain)
            expected = sorted(tr.sql(query).collect())
            for name in names.values():
                assert sorted(tr.read(name).collect()) == expected, name
            print(f"{args.rows:,} rows; OPTIMIZE files of at most {args.file_mb} MB")
            for way in names:
                print(f"  {way}: {files[way]} files after maintain() ({made[way]:.1f} s)")
            for label, values in times.items():
                print(f"  {label:<24} median {statistics.median(values):6.2f} s  min {min(values):6.2f} s")
            plain = statistics.median(times["plain recompute"])
            for way in names:
                print(f"  plain / refresh, {way}: {plain / statistics.median(times[f'refresh {way}']):.2f}x")
        finally:
            tr.close()


def _refresh(tr, name: str) -> None:
    result = tr.refresh_stream_table(name)
    assert result.action.value == "DIFFERENTIAL", result


if __name__ == "__main__":
    main()

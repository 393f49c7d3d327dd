"""Wall times of the basic operations, for the record (not a test).

    python benchmarks/foundation_timings.py [--rows 100000]

Prints: Spark session start (JVM + Delta), create + initialize of a stream table over
``--rows`` rows, a FULL refresh with no change, a NO_DATA refresh, and a DIFFERENTIAL refresh
of one changed row.
"""
from __future__ import annotations

import argparse
import tempfile
import time

from airflow_trickle import Trickle


def timed(label: str, action):
    started = time.perf_counter()
    result = action()
    print(f"{label:<48} {time.perf_counter() - started:7.2f} s", flush=True)
    return result


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=100_000)
    args = parser.parse_args()
    tr = Trickle(warehouse=tempfile.mkdtemp(prefix="trickle-timings-"), spark_master="local[2]", shuffle_partitions=4)
    timed("Spark session start (JVM, Delta)", lambda: tr.spark)
    tr.sql("CREATE DATABASE t")
    tr.sql("CREATE TABLE t.events (id BIGINT, kind STRING, value INT) USING delta")
    tr.sql(f"INSERT INTO t.events SELECT id, CAST(id % 13 AS STRING), CAST(id % 1000 AS INT) FROM range({args.rows})")
    query = "SELECT id, kind, value * 2 AS doubled FROM t.events WHERE value >= 0"
    timed(f"create + initialize, {args.rows:,} rows (FULL mode)",
          lambda: tr.create_stream_table("t.copy_full", query, refresh_mode="FULL"))
    timed(f"create + initialize, {args.rows:,} rows (DIFFERENTIAL)",
          lambda: tr.create_stream_table("t.copy_diff", query))
    result = timed("FULL refresh, no change", lambda: tr.refresh_stream_table("t.copy_full", mode="FULL"))
    assert result.rows_inserted == result.rows_deleted == 0
    timed("refresh with no new source version (NO_DATA)", lambda: tr.refresh_stream_table("t.copy_diff"))
    tr.sql("UPDATE t.events SET value = 5 WHERE id = 42")
    result = timed("DIFFERENTIAL refresh, one row changed", lambda: tr.refresh_stream_table("t.copy_diff"))
    assert result.action == "DIFFERENTIAL"


if __name__ == "__main__":
    main()

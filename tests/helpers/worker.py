"""A separate Spark application for concurrency tests: change a source, refresh, repeat.

    python -m tests.helpers.worker WAREHOUSE SOURCE STREAM_TABLE ROUNDS

With ``$TRICKLE_REMOTE`` set it works through that Spark service instead of a JVM of its own.
"""
import os
import sys

from airflow_trickle import Trickle


def main(warehouse: str, source: str, stream_table: str, rounds: int) -> None:
    tr = Trickle(warehouse=warehouse, remote=os.environ.get("TRICKLE_REMOTE"), spark_master="local[1]",
                 shuffle_partitions=1)
    for round_no in range(rounds):
        tr.sql(f"INSERT INTO {source} VALUES ({1000 + round_no}, {round_no}, {round_no * 10})")
        result = tr.refresh_stream_table(stream_table)
        print(f"{stream_table} {result.action} {result.status}", flush=True)
    tr.close()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]))

"""A refreshing process with a Spark of its own, driven line by line (the race tests' writers).

    python -m tests.helpers.race_worker WAREHOUSE [LOCAL_COMMIT_MAX_ROWS]

Reads ``SECONDS refresh NAME,NAME,...`` lines from stdin: refreshes the tables one after the
other, again and again, for that many seconds; then answers with one JSON line, the errors met
(none: ``{}``).  ``SECONDS churn NAME,...`` first ALTERs each table's schedule (a metadata
commit to its storage, as a user's ALTER is) and then refreshes it.  Storage options and the lease's length come from the
environment (``TRICKLE_STORAGE_OPTIONS``, ``TRICKLE_LEASE_SECONDS``), as a deployment's would.
Prints ``READY`` once its Spark is up.
"""
import json
import sys
import time

from airflow_trickle import Trickle


def main(warehouse: str, local_commit_max_rows: int) -> None:
    tr = Trickle(warehouse=warehouse, spark_master="local[1]", shuffle_partitions=1,
                 local_commit_max_rows=local_commit_max_rows, differential_max_change_ratio=1e9,
                 differential_max_touched_ratio=1e9, differential_max_time_ratio=1e9,
                 spark_conf={"spark.ui.enabled": "false", "spark.sql.adaptive.enabled": "false"})
    tr.sync()
    print("READY", flush=True)
    for line in sys.stdin:
        if line.strip() == "quit":
            break
        seconds, verb, names = line.split()
        errors: dict[str, str] = {}
        deadline = time.monotonic() + float(seconds)
        while time.monotonic() < deadline:
            tr.sync()
            for name in names.split(","):
                try:
                    if verb == "churn":
                        current = tr.get(name).schedule
                        tr.alter_stream_table(name, schedule="7m" if current == "5m" else "5m")
                    tr.refresh_stream_table(name)
                except Exception as err:  # noqa: BLE001 - reported to the test
                    errors[name] = f"{type(err).__name__}: {str(err)[:300]}"
        print(json.dumps(errors), flush=True)
    tr.close()


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 100_000)

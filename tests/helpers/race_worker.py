"""A writing process with a Spark of its own, driven line by line (the race tests' writers).

    python -m tests.helpers.race_worker WAREHOUSE [LOCAL_COMMIT_MAX_ROWS]

Reads commands from stdin, one a line, and answers each with one JSON line, the errors met
(none: ``{}``):

* ``refresh SECONDS NAME,NAME,...``: refreshes the tables one after the other, again and
  again, until SECONDS have passed;
* ``churn SECONDS NAME,...``: the same, but ALTERs each table's schedule (a metadata commit to
  its storage, as a user's ALTER is) before refreshing it;
* ``sync NAME,...``: registers the warehouse's tables in its Spark (the race's tables, once they
  exist) and refreshes each of them once (a JVM's first refresh compiles and loads what later
  ones reuse);
* ``append PATH TAG COUNT``: appends COUNT rows ``(TAG, i)`` to the Delta table at PATH, one
  ``INSERT`` (one Delta commit) each, each under the table's writer lease
  (``storage/lease.py``) -- the lease's plain case, outside the refresh engine;
* ``quit``.

Storage options and the lease's length come from the environment (``TRICKLE_STORAGE_OPTIONS``,
``TRICKLE_LEASE_SECONDS``; 0: no lease), as a deployment's would.  Prints ``READY`` once its
Spark is up.
"""
import json
import sys
import time

from airflow_trickle import Trickle
from airflow_trickle.storage.lease import fence, writer_lease
from tests.conftest import CHILD_SPARK


def main(warehouse: str, local_commit_max_rows: int) -> None:
    tr = Trickle(warehouse=warehouse, spark_master="local[1]", shuffle_partitions=1,
                 local_commit_max_rows=local_commit_max_rows, differential_max_change_ratio=1e9,
                 differential_max_touched_ratio=1e9, differential_max_time_ratio=1e9,
                 spark_conf=CHILD_SPARK)
    tr.sync()
    print("READY", flush=True)
    for line in sys.stdin:
        verb, *args = line.split()
        if verb == "quit":
            break
        errors: dict[str, str] = {}
        if verb == "sync":
            tr.sync()
            for name in args[0].split(","):
                write(tr, "refresh", name, errors)
        elif verb == "append":
            append(tr, *args, errors=errors)
        else:
            seconds, names = float(args[0]), args[1].split(",")
            deadline = time.monotonic() + seconds
            while time.monotonic() < deadline:
                tr.sync()
                for name in names:
                    write(tr, verb, name, errors)
                    if time.monotonic() >= deadline:
                        break
        print(json.dumps(errors), flush=True)
    tr.close()


def write(tr: Trickle, verb: str, name: str, errors: dict[str, str]) -> None:
    """Refresh ``name`` (``churn``: ALTER it first); an error goes into ``errors``, and each
    outcome into standard error, which the test shows when it fails."""
    started = time.monotonic()
    try:
        if verb == "churn":
            current = tr.get(name).schedule
            tr.alter_stream_table(name, schedule="7m" if current == "5m" else "5m")
        done = tr.refresh_stream_table(name)
        outcome = f"{done.action} in {time.monotonic() - started:.1f} s {done.phases}"
    except Exception as err:  # noqa: BLE001 - reported to the test
        outcome = errors[name] = f"{type(err).__name__}: {str(err)[:300]}"
    print(f"{time.strftime('%H:%M:%S')} {verb} {name}: {outcome}", file=sys.stderr, flush=True)


def append(tr: Trickle, path: str, tag: str, count: str, *, errors: dict[str, str]) -> None:
    catalog, seconds = tr.config.location.child("_trickle"), tr.config.lease_seconds
    try:
        for i in range(int(count)):
            with writer_lease(catalog, ["appended"], seconds=seconds):
                fence(catalog, "appended", seconds)
                tr.spark.sql(f"INSERT INTO delta.`{path}` VALUES ({int(tag)}, {i})")
    except Exception as err:  # noqa: BLE001 - reported to the test
        errors["append"] = f"{type(err).__name__}: {str(err)[:300]}"


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 100_000)

"""A writer that appends to one Delta table on S3, in a Spark of its own (the lease's plain case).

    python -m tests.helpers.appender WAREHOUSE TAG COUNT LEASE_SECONDS

Prints ``READY``, waits for a line on stdin, then appends ``COUNT`` rows ``(TAG, i)`` to
``<WAREHOUSE>/appended``, one ``INSERT`` (one Delta commit) each -- each under the table's
writer lease (``storage/lease.py``) unless ``LEASE_SECONDS`` is 0.  Storage options come from
``TRICKLE_STORAGE_OPTIONS``.
"""
import sys

from airflow_trickle.config import TrickleConfig
from airflow_trickle.spark.session import build_session
from airflow_trickle.storage.lease import fence, writer_lease


def main(warehouse: str, tag: int, count: int, lease_seconds: float) -> None:
    config = TrickleConfig.from_env(warehouse=warehouse, spark_master="local[1]", shuffle_partitions=1,
                                    spark_conf={"spark.ui.enabled": "false"})
    spark = build_session(config, warehouse)
    catalog = config.location.child("_trickle")
    path = f"{warehouse}/appended"
    print("READY", flush=True)
    sys.stdin.readline()
    for i in range(count):
        with writer_lease(catalog, ["appended"], seconds=lease_seconds):
            fence(catalog, "appended", lease_seconds)
            spark.sql(f"INSERT INTO delta.`{path}` VALUES ({tag}, {i})")
    print("DONE", flush=True)
    spark.stop()


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4]))

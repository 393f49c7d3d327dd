"""Resolve the Delta jars once: ``python -m airflow_trickle.spark.jars``.

Starts and stops a tiny local session, which resolves ``io.delta:delta-spark`` from Maven
Central (the only network use) and remembers the jar paths for every later session.
"""
from __future__ import annotations

import sys
import tempfile


def main() -> int:
    from airflow_trickle.spark.session import delta_jars_conf

    if "spark.jars" in delta_jars_conf():
        return 0
    from airflow_trickle.config import TrickleConfig
    from airflow_trickle.spark.session import build_session

    with tempfile.TemporaryDirectory() as warehouse:
        spark = build_session(TrickleConfig(spark_master="local[1]"), warehouse)
        spark.sql("SELECT 1").collect()
        spark.stop()
    ok = "spark.jars" in delta_jars_conf()
    print("Delta jars resolved" if ok else "Delta jars could not be resolved", file=sys.stderr)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

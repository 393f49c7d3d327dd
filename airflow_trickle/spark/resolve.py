"""``python -m airflow_trickle.spark.resolve [--s3]``: resolve the Java artifacts once, ahead of time.

Delta's jars are resolved by starting one local Spark session (Spark's Ivy does it, and
:mod:`airflow_trickle.spark.jars` remembers the paths); ``--s3`` (or an ``s3://`` warehouse in
``$TRICKLE_WAREHOUSE``) fetches the S3A jars too.  Its own module: it starts a session
(:mod:`~airflow_trickle.spark.session`), which itself reads the resolved jars.
"""
from __future__ import annotations

import os
import sys
import tempfile

from airflow_trickle.config import TrickleConfig
from airflow_trickle.spark.jars import delta_jars_conf, s3a_jars
from airflow_trickle.spark.session import build_session


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if "--s3" in args or (os.environ.get("TRICKLE_WAREHOUSE") or "").startswith(("s3://", "s3a://")):
        s3a_jars()
    if "spark.jars" in delta_jars_conf():
        return 0
    with tempfile.TemporaryDirectory() as warehouse:
        spark = build_session(TrickleConfig(spark_master="local[1]"), warehouse)
        spark.sql("SELECT 1").collect()
        spark.stop()
    ok = "spark.jars" in delta_jars_conf()
    print("Delta jars resolved" if ok else "Delta jars could not be resolved", file=sys.stderr)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

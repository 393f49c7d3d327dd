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
from airflow_trickle.output import output_to
from airflow_trickle.spark.jars import cache_root, delta_jars_conf, delta_package, s3a_jars
from airflow_trickle.spark.session import build_session


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if "--s3" in args or (os.environ.get("TRICKLE_WAREHOUSE") or "").startswith(("s3://", "s3a://")):
        s3a_jars()
    if "spark.jars" in delta_jars_conf():
        return 0
    log = cache_root() / "resolve.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    print(f"resolving the Delta jars ({delta_package()}) from Maven once; its log: {log}", file=sys.stderr)
    with output_to(log), tempfile.TemporaryDirectory() as warehouse:
        spark = build_session(TrickleConfig(spark_master="local[1]"), warehouse)  # Spark's Ivy prints here
        spark.sql("SELECT 1").collect()
        spark.stop()
    ok = "spark.jars" in delta_jars_conf()
    if not ok:
        tail = log.read_text(errors="replace").splitlines()[-20:]
        print(f"The Delta jars ({delta_package()}) could not be resolved from Maven Central: either it is not "
              "reachable from here, or the installed delta-spark has no jars published there (install the "
              "version before it).  The end of its log:\n" + "\n".join(tail), file=sys.stderr)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

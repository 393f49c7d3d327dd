#!/usr/bin/env bash
# Runs the test suite (real Spark + Delta on local[2], Airflow dag.test()) in two processes, one
# per core.  Tests go out by xdist group (--dist loadgroup): tests/conftest.py groups the tests on
# a classic Spark session, those over the Spark service, and each module that starts its own
# Spark, so a process starts one Spark JVM, not both; groups go out in collection order
# (--no-loadscope-reorder): JVM-free tests first, then the groups, longest first.
source "$(dirname "$0")/scripts/env.sh"
# The S3A jars and the test servers' artifacts (s3proxy, a Hive metastore), fetched once; the
# class-data archive of Spark's classes the suite's Spark JVMs start from, made once.
python -m tests.helpers.artifacts
exec python -m pytest -q -n 2 --dist loadgroup --no-loadscope-reorder "$@"

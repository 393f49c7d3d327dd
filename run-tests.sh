#!/usr/bin/env bash
# Runs the test suite (real Spark + Delta on local[2], Airflow dag.test()), two test files at a
# time: much of a Spark test's time is JVM and I/O latency, so two workers fill the two cores.
# Files go out in collection order (--no-loadscope-reorder): tests/conftest.py puts the JVM-free
# ones first and the long Spark modules next, longest first, so no worker idles at the end.
source "$(dirname "$0")/scripts/env.sh"
exec python -m pytest -q -n 2 --dist loadfile --no-loadscope-reorder "$@"

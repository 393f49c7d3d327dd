#!/usr/bin/env bash
# Runs the test suite (real Spark + Delta on local[2], Airflow dag.test()) in two test processes:
# much of a Spark test's time is JVM and I/O latency, so two fill the two cores.  Work goes out
# in collection order (--no-loadscope-reorder): tests/conftest.py puts the JVM-free tests first,
# then the tests on the shared classic and Connect Sparks, each mode as one group (one JVM per
# process), then the modules that start Spark themselves, longest first.
source "$(dirname "$0")/scripts/env.sh"
exec python -m pytest -q -n 2 --dist loadgroup --no-loadscope-reorder "$@"

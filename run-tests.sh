#!/usr/bin/env bash
# Runs the test suite (real Spark + Delta on local[2], Airflow dag.test()), two test files at a
# time: much of a Spark test's time is JVM and I/O latency, so two workers fill the two cores.
source "$(dirname "$0")/scripts/env.sh"
exec python -m pytest -q -n 2 --dist loadfile "$@"

#!/usr/bin/env bash
# Runs the example end to end: Airflow (SQLite) runs the generated DAG, each refresh a spark-submit job.
source "$(dirname "$0")/scripts/env.sh"
exec python dags_example/run_example.py "$@"

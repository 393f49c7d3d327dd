#!/usr/bin/env bash
# Runs the example end to end: Airflow (SQLite) runs the generated DAG, its refresh tasks over the Spark service.
source "$(dirname "$0")/scripts/env.sh"
exec python dags_example/run_example.py "$@"

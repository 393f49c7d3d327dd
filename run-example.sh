#!/usr/bin/env bash
# Runs the example end to end on the embedded default (local Spark, local Delta warehouse).
source "$(dirname "$0")/scripts/env.sh"
exec python dags_example/shop.py "$@"

#!/usr/bin/env bash
# Runs the test suite (real Spark + Delta on local[2]).
source "$(dirname "$0")/scripts/env.sh"
exec python -m pytest -q "$@"

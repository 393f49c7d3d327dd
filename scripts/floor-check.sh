#!/usr/bin/env bash
# The lower end of the supported ranges: a second virtualenv with the floors
# (scripts/floor-constraints.txt: the oldest Airflow, pyspark and delta-spark), then the JVM-free
# tests and a DIFFERENTIAL refresh on the floor's Spark and Delta jars (scripts/floor_smoke.py).
# Not part of run-tests.sh: it installs a second environment (about 2 minutes from PyPI).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${TRICKLE_FLOOR_VENV:-$ROOT/.venv-floor}"
PYTHON_BIN="${PYTHON:-python3.11}"
command -v "$PYTHON_BIN" >/dev/null 2>&1 || PYTHON_BIN=python3
if [ ! -x "$VENV/bin/python" ]; then
  "$PYTHON_BIN" -m venv "$VENV"
fi
echo "installing the floors into $VENV (its log: $VENV/install.log)" >&2
{ "$VENV/bin/pip" install --quiet --upgrade pip \
  && "$VENV/bin/pip" install --quiet -e "$ROOT[spark,test]" -c "$ROOT/scripts/floor-constraints.txt"; } \
  >"$VENV/install.log" 2>&1 || { tail -n 30 "$VENV/install.log" >&2; exit 1; }
cd "$ROOT"
"$VENV/bin/pip" list 2>/dev/null | grep -E "^(apache-airflow|pyspark|delta-spark) " >&2
# The Stream tables page starts Airflow's API server, which Airflow 3.2 cannot start with
# today's newest pydantic (Airflow's own constraints file pins what it was released with).
"$VENV/bin/python" -m pytest -q -p no:cacheprovider -m "not jvm" -n 2 \
  --deselect tests/test_stream_tables_page.py::test_the_page_needs_airflow_login_and_shows_every_stream_table
"$VENV/bin/python" scripts/floor_smoke.py

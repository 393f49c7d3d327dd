# Sourced by run-example.sh and run-tests.sh: a virtualenv with the project and its test tools.
# Python 3.11 and a JDK 17 must be on the machine; everything else is installed here.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${TRICKLE_VENV:-$ROOT/.venv}"
PYTHON_BIN="${PYTHON:-python3.11}"
command -v "$PYTHON_BIN" >/dev/null 2>&1 || PYTHON_BIN=python3
command -v java >/dev/null 2>&1 || { echo "a JDK 17 is needed (java not found)" >&2; exit 1; }
stamp="$VENV/.installed-$(sha1sum "$ROOT/pyproject.toml" | cut -c1-12)"
if [ ! -f "$stamp" ]; then
  echo "installing the project into $VENV (its log: $VENV/install.log)" >&2
  "$PYTHON_BIN" -m venv "$VENV"
  { "$VENV/bin/pip" install --quiet --upgrade pip && "$VENV/bin/pip" install --quiet -e "$ROOT[spark,test]"; } \
    >"$VENV/install.log" 2>&1 || { tail -n 30 "$VENV/install.log" >&2; exit 1; }
  touch "$stamp"
fi
# Resolve the Delta jars from Maven Central once (later Spark sessions start offline).
"$VENV/bin/python" -m airflow_trickle.spark.resolve
export PATH="$VENV/bin:$PATH"
cd "$ROOT"

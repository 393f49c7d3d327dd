"""A manual run during a scheduled one, in a live Airflow: API server, scheduler (LocalExecutor)
and DAG processor, the refresh tasks over the test process's Spark service.

The scheduled run's refresh of ``a`` is held (the test helper keeps ``a``'s refresh lock, as a
long refresh by another run would); meanwhile a manual FULL run of ``b`` is triggered through
the REST API. It must start at once and finish while the scheduled run is still in flight --
with the DAG-wide single run slot of old (``max_active_runs: 1``) it would queue behind it
(checked by hand: it waited until the helper gave up). Then ``a`` refreshes, and both stream
tables equal their queries.
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import rows

ROOT = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.spark_service


@pytest.fixture
def live(tr, db, warehouse, service, tmp_path) -> dict:
    tr.sql(f"CREATE TABLE {db}.src (k INT, v INT) USING delta TBLPROPERTIES (delta.enableChangeDataFeed = true)")
    tr.sql(f"INSERT INTO {db}.src VALUES (1, 1), (1, 2), (1, 2), (2, NULL), (3, -1), (NULL, 5)")
    done = subprocess.run([sys.executable, "-m", "tests.helpers.live_airflow", str(tmp_path), warehouse,
                           service.address, db], cwd=ROOT, capture_output=True, text=True, timeout=1200)
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    assert lines, done.stdout[-3000:] + done.stderr[-3000:]
    result = json.loads(lines[-1][len("RESULT "):])
    assert "error" not in result, failure_report(result)
    return result


def failure_report(result: dict) -> str:
    """What went wrong, the most telling last (a CI log may keep only a report's tail): the
    processes' log tails, the tasks' warnings and errors, the events, every run's task states,
    the error."""
    order = ("logs", "task_log_problems", "events", "states", "error")
    return "\n".join(f"{key}: {json.dumps(result[key], indent=1)}" for key in (
        *(k for k in result if k not in order), *order) if key in result)


def test_a_manual_run_does_not_wait_for_a_scheduled_run_in_flight(live, tr, db):
    scheduled, manual = live["scheduled"], live["manual"]
    assert (scheduled["run_type"], manual["run_type"]) == ("scheduled", "manual")
    # the manual run started within seconds and ended while the scheduled one was still refreshing a
    assert live["manual_started_after_s"] < 60, live["events"]
    assert manual["state"] == "success"
    assert live["scheduled_while_manual_ended"] == {"run": "running", "a": "running"}
    assert {t: v["state"] for t, v in manual["tasks"].items()} == {
        "plan": "success", f"{db}.a": "skipped", f"{db}.b": "success"}
    # what each task did, on the task itself (notes through the REST API)
    assert manual["note"] == f"manual run: {db}.b (mode FULL)"
    assert manual["tasks"][f"{db}.a"]["note"] == "skipped: not selected in this manual run", live["manual_a_log_note"]
    assert manual["tasks"][f"{db}.b"]["note"].startswith("FULL +"), manual["tasks"]
    # the held refresh of a waited for its lock, then went on once it was free
    assert scheduled["state"] == "success"
    assert {t: v["state"] for t, v in scheduled["tasks"].items()} == {
        "plan": "success", f"{db}.a": "success", f"{db}.b": "success"}
    note = scheduled["tasks"][f"{db}.a"]["note"]
    assert note.startswith("CREATED +4 -0 rows in ") and note.endswith("s of it waiting for another run's refresh)"), note
    assert any(f"{db}.a is being refreshed by another run; waiting" in line for line in live["a_log_wait"])
    for name, query in ((f"{db}.a", f"SELECT k, SUM(v) AS total FROM {db}.src GROUP BY k"),
                        (f"{db}.b", f"SELECT k, v FROM {db}.src WHERE v > 0")):
        assert rows(tr.read(name)) == rows(tr.sql(query)), name

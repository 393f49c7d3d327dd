"""A live Airflow: API server, scheduler (LocalExecutor), DAG processor and triggerer, the refresh
tasks over the test process's Spark service. Two scenarios in one Airflow (``tests/helpers/live_airflow.py``).

A manual run during a scheduled one:

The scheduled run's refresh of ``a`` is held (the test helper keeps ``a``'s refresh lock, as a
long refresh by another run would); meanwhile a manual FULL run of ``b`` is triggered through
the REST API. It must start at once and finish while the scheduled run is still in flight --
with the DAG-wide single run slot of old (``max_active_runs: 1``) it would queue behind it
(checked by hand: it waited until the helper gave up). Then ``a`` refreshes, and both stream
tables equal their queries.

Refresh on commit: a source's commits, made through Spark Connect, are seen by the asset watcher
on the triggerer and refreshed by the on-commit DAG -- each within seconds (target: a median of
10 s or less from the source's commit to the stream table's), a burst of 20 commits in 5 s in at
most two refreshes, and the stream tables equal to their queries after all of it. Where it may
(as root), the helper runs Airflow and the Spark service at a raised CPU priority, so the other
test process of the suite, sharing the two cores, does not decide the latency measured.
"""
from __future__ import annotations

import json
import subprocess
import statistics
import sys
import uuid
from pathlib import Path

import pytest

from tests.conftest import rows

ROOT = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.spark_service


#: The one live Airflow's result, shared by this module's tests (starting Airflow is most of the cost).
_RESULT: dict = {}


@pytest.fixture
def live(tr, warehouse, service, tmp_path_factory) -> dict:
    if not _RESULT:
        db = f"live_{uuid.uuid4().hex[:8]}"
        tr.sql(f"CREATE DATABASE {db}")
        tr.sql(f"CREATE TABLE {db}.src (k INT, v INT) USING delta TBLPROPERTIES (delta.enableChangeDataFeed = true)")
        tr.sql(f"INSERT INTO {db}.src VALUES (1, 1), (1, 2), (1, 2), (2, NULL), (3, -1), (NULL, 5)")
        tr.sql(f"CREATE TABLE {db}.events (k INT, v INT) USING delta "
               "TBLPROPERTIES (delta.enableChangeDataFeed = true)")
        tr.sql(f"INSERT INTO {db}.events VALUES (1, 5), (2, 7), (NULL, 1)")
        done = subprocess.run([sys.executable, "-m", "tests.helpers.live_airflow", str(tmp_path_factory.mktemp("live")),
                               warehouse, service.address, db], cwd=ROOT, capture_output=True, text=True, timeout=1500)
        lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
        assert lines, done.stdout[-3000:] + done.stderr[-3000:]
        _RESULT.update(json.loads(lines[-1][len("RESULT "):]), db=db)
    assert "error" not in _RESULT, failure_report(_RESULT)
    return _RESULT


def failure_report(result: dict) -> str:
    """What went wrong, the most telling last (a CI log may keep only a report's tail): the
    processes' log tails, the tasks' warnings and errors, the events, every run's task states,
    the error."""
    order = ("logs", "task_log_problems", "events", "states", "error")
    return "\n".join(f"{key}: {json.dumps(result[key], indent=1)}" for key in (
        *(k for k in result if k not in order), *order) if key in result)


def test_a_manual_run_does_not_wait_for_a_scheduled_run_in_flight(live, tr):
    db = live["db"]
    scheduled, manual = live["scheduled"], live["manual"]
    assert (scheduled["run_type"], manual["run_type"]) == ("scheduled", "manual")
    # the manual run started within seconds and ended while the scheduled one was still refreshing a
    assert live["manual_started_after_s"] < 60, live["events"]
    assert manual["state"] == "success"
    assert live["scheduled_while_manual_ended"] == {"run": "running", "a": "running"}
    assert {t: v["state"] for t, v in manual["tasks"].items()} == {
        "plan": "success", f"{db}.a": "skipped", f"{db}.b": "success"}
    # what each task did, on the task itself (notes through the REST API)
    # the run's selection, then the project's plan against the catalog: a, whose first refresh
    # the scheduled run is still making, is yet to be created
    assert manual["note"].splitlines() == [f"manual run: {db}.b (mode FULL)",
                                           "project live: 2 stream tables, 1 unchanged", f"create    {db}.a"]
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


def test_commits_refresh_their_stream_tables_within_seconds_and_a_burst_coalesces(live, tr):
    db, found = live["db"], live["on_commit"]
    latencies = found["latencies_s"]
    print(f"refresh on commit (Airflow and the Spark service at a raised CPU priority: {live.get('favoured')}): "
          f"latency median {statistics.median(latencies):.1f} s, max {max(latencies):.1f} s "
          f"({latencies}); a burst of 20 commits in {found['burst_seconds']} s: "
          f"{len(found['burst_refreshes'])} refreshes ({found['burst_refreshes']}), {len(found['burst_runs'])} runs; "
          "phases after the commit, median / max: " + ", ".join(
              f"{key} {statistics.median(p[key] for p in found['phases_s']):.1f} / "
              f"{max(p[key] for p in found['phases_s']):.1f} s" for key in found["phases_s"][0])
          + "; the refresh's phases, median ms: " + ", ".join(
              f"{key} {statistics.median(p.get(key, 0) for p in found['refresh_phases']):.0f}"
              for key in found["refresh_phases"][0]))
    assert len(latencies) == 10 and statistics.median(latencies) <= 10.0, found
    # 20 commits in about 5 s (delta-rs appends): at most two refreshes, and two runs
    assert found["burst_seconds"] <= 8, f"the writers could not keep the burst's pace: {found}"
    assert 1 <= len(found["burst_refreshes"]) <= 2, found
    assert 1 <= len(found["burst_runs"]) <= 2, found
    # every run was started by the watchers' asset events, and none failed
    assert {r["type"] for r in found["runs"].values()} == {"asset_triggered"}, found["runs"]
    assert {r["state"] for r in found["runs"].values()} == {"success"}, found["runs"]
    # the downstream stream table followed through the cascade of the same run
    assert found["tasks_of_last_run"][f"{db}.big_keys"]["state"] == "success", found["tasks_of_last_run"]
    assert found["watchers"][f"{db}.per_key"]["state"] == "watching", found["watchers"]
    for name, query in ((f"{db}.per_key", f"SELECT k, SUM(v) AS total, COUNT(*) AS n FROM {db}.events GROUP BY k"),
                        (f"{db}.big_keys", f"SELECT k, SUM(v) AS total FROM {db}.events GROUP BY k "
                                           "HAVING SUM(v) > 10")):
        assert rows(tr.read(name)) == rows(tr.sql(query)), name

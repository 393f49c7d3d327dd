"""The Airflow pieces in-process, against the test warehouse: refresh task decisions made
without Spark, freshness misses, the source-data sensor, its deferrable trigger, the deadline
callback."""
from __future__ import annotations

import asyncio
from datetime import timedelta
from types import SimpleNamespace

import pytest
from airflow.sdk.exceptions import AirflowException, AirflowSkipException, TaskDeferred

from airflow_trickle.catalog.model import utcnow
from airflow_trickle.project import define_project


def context(run_type="scheduled", **params):
    return {"params": params, "dag_run": SimpleNamespace(run_type=run_type, run_id="run_1"),
            "ti": SimpleNamespace(dag_id="trickle_p", task_id="db.st", try_number=1)}


@pytest.fixture
def stream_table(tr, db, monkeypatch):
    monkeypatch.delenv("AIRFLOW_CONN_SPARK_LOCAL", raising=False)
    tr.sql(f"CREATE TABLE {db}.src (k INT, v STRING) USING delta")
    tr.sql(f"INSERT INTO {db}.src VALUES (1, 'a'), (2, NULL)")
    name = f"{db}.st"
    tr.create_stream_table(name, f"SELECT k, v FROM {db}.src", schedule="1m")
    project = define_project("p", warehouse=tr.warehouse, sources=[f"{db}.src"], stream_tables=[
        {"name": name, "query": f"SELECT k, v FROM {db}.src", "schedule": "1m"}])
    return name, project


def test_refresh_task_ends_without_spark_records_the_miss_and_notifies(tr, stream_table, monkeypatch):
    from airflow_trickle.operators import notes
    from airflow_trickle.operators.refresh import StreamTableRefreshOperator

    noted = []  # (connection, note) of every task note the task writes
    monkeypatch.setattr(notes, "write_task_note", lambda conn_id, context, text: noted.append((conn_id, text)))
    name, project = stream_table
    hour_ago = utcnow() - timedelta(hours=1)
    tr.catalog.update(name, lambda row: (setattr(row, "data_timestamp", hour_ago),
                                         setattr(row, "last_refresh_at", hour_ago)))
    notified = []
    task = StreamTableRefreshOperator(task_id="st", project=project, stream_tables=[name],
                                      freshness_notifier=notified.append)
    # due, stale, nothing new: NO_DATA recorded, no Spark job (no Spark connection exists here)
    with pytest.raises(AirflowSkipException, match=r"nothing to refresh \(NO_DATA\)"):
        task.execute(context())
    (miss,) = [n["freshness_miss"] for n in notified]
    assert miss["stream_table"] == name and miss["target_seconds"] == 120 and miss["staleness_seconds"] >= 3600
    history = tr.history(name, limit=3)
    assert [h.action for h in history[:2]] == ["NO_DATA", "FRESHNESS_MISS"]
    assert history[1].status == "ALERT" and "missed its freshness target" in history[1].reason
    assert history[0].initiated_by == "AIRFLOW trickle_p/run_1/db.st#1"
    # the skip's reason is the task instance's note (the project names no notes connection: None)
    assert len(noted) == 1 and noted[0][0] is None and noted[0][1].startswith("skipped: nothing to refresh (NO_DATA)")
    assert tr.get(name).data_timestamp > hour_ago  # NO_DATA marks the table fresh
    # just refreshed: the next scheduled run finds it not due, and records nothing
    recorded = len(tr.history(name, limit=50))
    with pytest.raises(AirflowSkipException, match="not due"):
        task.execute(context())
    assert noted[-1][1].startswith("skipped: not due")
    assert len(tr.history(name, limit=50)) == recorded
    assert len(notified) == 1


def test_refresh_task_refuses_bad_parameters_and_a_missing_spark_connection(tr, stream_table):
    from airflow_trickle.operators.refresh import StreamTableRefreshOperator
    from airflow_trickle.operators.selection import StreamTableSelectionOperator

    name, project = stream_table
    task = StreamTableRefreshOperator(task_id="st", project=project, stream_tables=[name])
    with pytest.raises(AirflowException, match=r"refused: 'tables' names 'db.nope'"):
        task.execute(context("manual", tables=["db.nope"]))
    with pytest.raises(AirflowException, match="refused: 'mode' must be one of"):
        StreamTableSelectionOperator(task_id="plan", project=project).execute(context("manual", mode="SOMETIMES"))
    selected = StreamTableSelectionOperator(task_id="plan", project=project).execute(context("manual"))
    assert {k: selected[k] for k in ("tables", "mode", "forced")} == {"tables": [name], "mode": "AUTO", "forced": True}
    # the table was made through the API: the project's plan claims it (its refresh task will)
    assert [(t["name"], t["change"], t["claims"]) for t in selected["plan"]["tables"]] == [(name, "UNCHANGED", True)]
    # a typo in the REST API's conf is not a declared param, and must not mean "everything"
    typo = context("manual")
    typo["dag_run"].conf = {"table": [name], "mode": "FULL"}
    with pytest.raises(AirflowException, match="refused: unknown run parameter 'table'.*the parameters are tables"):
        StreamTableSelectionOperator(task_id="plan", project=project).execute(typo)
    # FULL needs Spark: without a Spark connection the provider would fall back to YARN; we refuse
    with pytest.raises(AirflowException, match="Spark connection 'spark_local' is not defined.*AIRFLOW_CONN_SPARK_LOCAL"):
        task.execute(context("manual", tables=[name], mode="FULL"))


def test_the_plan_task_notes_the_plan_stops_when_told_and_refuses_another_projects_table(tr, stream_table, db,
                                                                                         monkeypatch):
    from airflow_trickle.operators import notes
    from airflow_trickle.operators.selection import StreamTableSelectionOperator

    noted, task_notes = [], []
    monkeypatch.setattr(notes, "write_run_note", lambda conn_id, context, text: noted.append(text))
    monkeypatch.setattr(notes, "write_task_note", lambda conn_id, context, text: task_notes.append(text))
    name, project = stream_table
    tr.alter_stream_table(name, owner=("p", "/projects/p.yaml"))
    edited = [{"name": name, "query": f"SELECT k, v FROM {db}.src WHERE k > 1", "schedule": "1m"}]
    applying = define_project("p", warehouse=tr.warehouse, stream_tables=edited)
    result = StreamTableSelectionOperator(task_id="plan", project=applying).execute(context())
    assert noted[-1] == f"scheduled run: {name} (mode AUTO)\nproject p: 1 stream table, 0 unchanged\nalter     {name}: query"
    assert result["plan"]["has_changes"] and result["plan"]["tables"][0]["changes"] == ["query"]
    stopping = define_project("p", warehouse=tr.warehouse, stream_tables=edited, deploy={"on_change": "stop"})
    with pytest.raises(AirflowException, match=r"(?s)deploy.on_change is 'stop'.*trickle apply`\n.*\nalter .*: query"):
        StreamTableSelectionOperator(task_id="plan", project=stopping).execute(context())
    assert task_notes[-1].endswith(f"\nalter     {name}: query")  # the plan, on the plan task itself
    # unchanged, the same project goes on with on_change: stop
    unchanged = define_project("p", warehouse=tr.warehouse, deploy={"on_change": "stop"},
                               stream_tables=[{"name": name, "query": f"SELECT k, v FROM {db}.src", "schedule": "1m"}])
    assert not StreamTableSelectionOperator(task_id="plan", project=unchanged).execute(context())["plan"]["has_changes"]
    rival = define_project("rival", warehouse=tr.warehouse, stream_tables=edited)
    with pytest.raises(AirflowException, match=rf"refused: {name}: owned by project 'p' \(/projects/p.yaml\)"):
        StreamTableSelectionOperator(task_id="plan", project=rival).execute(context())
    assert tr.get(name).original_query == f"SELECT k, v FROM {db}.src"  # nothing was changed


def test_sensor_and_deferrable_trigger_wait_for_data_beyond_the_frontier(tr, stream_table):
    from airflow_trickle.sensors.source_data import StreamTableSourceSensor
    from airflow_trickle.triggers.source_data import StreamTableSourceTrigger

    name, _ = stream_table
    source = name.replace(".st", ".src")
    sensor = StreamTableSourceSensor(task_id="wait", stream_table=name, warehouse=tr.warehouse, poke_interval=1)
    assert not sensor.poke({}).is_done
    trigger = StreamTableSourceTrigger(stream_table=name, warehouse=tr.warehouse, poll_interval=0.05)

    async def first_event(timeout):
        return await asyncio.wait_for(anext(trigger.run()), timeout)

    with pytest.raises(asyncio.TimeoutError):
        asyncio.run(first_event(0.5))  # nothing new: the trigger keeps waiting
    with pytest.raises(TaskDeferred) as deferred:
        StreamTableSourceSensor(task_id="w", stream_table=name, warehouse=tr.warehouse, deferrable=True).execute({})
    classpath, kwargs = deferred.value.trigger.serialize()
    assert classpath == "airflow_trickle.triggers.source_data.StreamTableSourceTrigger"
    assert kwargs["stream_table"] == name

    frontier = tr.get(name).frontier[source]
    tr.sql(f"INSERT INTO {source} VALUES (3, 'c')")
    result = sensor.poke({})
    assert result.is_done and result.xcom_value == {source: [frontier, frontier + 1]}
    event = asyncio.run(first_event(10))
    assert event.payload == {"status": "success", "pending": {source: [frontier, frontier + 1]}}
    assert sensor.execute_complete({}, event.payload) == {source: [frontier, frontier + 1]}
    only_other = StreamTableSourceSensor(task_id="o", stream_table=name, warehouse=tr.warehouse, source="db.other")
    with pytest.raises(Exception, match="not a source"):
        only_other.poke({})


def test_deadline_callback_records_only_stale_tables_once_per_run(tr, stream_table):
    from airflow_trickle.notifiers.freshness import record_deadline_miss

    name, _ = stream_table
    before = len(tr.history(name, limit=50))
    # Airflow 3.3 passes the run as DAGRunResponse fields: dag_run_id, dag_id, state
    run = {"dag_run": {"dag_run_id": "scheduled_9", "dag_id": "trickle_p", "state": "running"}}
    # the run is late, but the table was refreshed just now: within its target, nothing recorded
    assert asyncio.run(record_deadline_miss(context=run, warehouse=tr.warehouse, project="p",
                                            targets={name: 60}, interval_seconds=60)) == []
    assert len(tr.history(name, limit=50)) == before
    hour_ago = utcnow() - timedelta(hours=1)
    tr.catalog.update(name, lambda row: setattr(row, "data_timestamp", hour_ago))
    for _ in range(2):  # a second alert for the same run records nothing more
        asyncio.run(record_deadline_miss(context=run, warehouse=tr.warehouse, project="p",
                                         targets={name: 60}, interval_seconds=60))
    misses = [h for h in tr.history(name, limit=50) if h.action == "FRESHNESS_MISS"]
    assert len(misses) == 1 and misses[0].initiated_by == "DEADLINE trickle_p/scheduled_9"
    # a run whose id is a prefix of the first's is another run: its miss is recorded
    other = {"dag_run": {"dag_run_id": "scheduled", "dag_id": "trickle_p", "state": "running"}}
    assert asyncio.run(record_deadline_miss(context=other, warehouse=tr.warehouse, project="p",
                                            targets={name: 60}, interval_seconds=60)) == [name]
    assert "its data is 1h" in misses[0].reason and "(target 1m," in misses[0].reason


def test_a_manual_run_does_not_wait_for_other_tables_and_waits_out_its_own(tr, stream_table, tmp_path):
    """A scheduled run in flight holds the refresh lock of the table it is refreshing: a manual run
    of another table goes ahead at once; a manual run of that table waits, then finds nothing to do."""
    import threading
    import time

    from airflow_trickle.operators.refresh import StreamTableRefreshOperator
    from airflow_trickle.refresh.lock import refresh_lock

    name, project = stream_table
    task = StreamTableRefreshOperator(task_id="st", project=project, stream_tables=[name])
    taken, release = threading.Event(), threading.Event()

    def scheduled_refresh():  # stands for the scheduled run's refresh task, mid-refresh
        with refresh_lock(tr.warehouse, [name]):
            taken.set()
            release.wait(30)

    holder = threading.Thread(target=scheduled_refresh)
    holder.start()
    assert taken.wait(10)
    started = time.monotonic()
    with refresh_lock(tr.warehouse, [name + "_other"]):  # another table: not blocked
        assert time.monotonic() - started < 1
    threading.Timer(1.5, release.set).start()
    started = time.monotonic()
    with pytest.raises(AirflowSkipException, match=r"skipped: nothing to refresh \(NO_DATA\)"):
        task.execute(context("manual", tables=[name]))
    assert time.monotonic() - started >= 1.0  # it waited for the other run's refresh to end
    holder.join()

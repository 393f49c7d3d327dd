"""Refresh on commit without a JVM: the schedule's spelling, what a project watches, the
on-commit DAG Airflow's own parser finds, the watcher trigger run against Delta tables written
with delta-rs (bursts coalesce, a long burst is capped, readers not created yet fire at once),
its heartbeats and what ``trickle status`` makes of them. The live Airflow test
(``test_airflow_live.py``) runs it end to end with a triggerer."""
from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import write_deltalake

from airflow_trickle.catalog.model import Dependency, StreamTable, utcnow
from airflow_trickle.catalog.store import CatalogStore
from airflow_trickle.errors import InvalidScheduleError, ProjectError
from airflow_trickle.project import load_project
from airflow_trickle.schedule import parse_schedule

ROOT = Path(__file__).resolve().parent.parent

PROJECT = """\
project: oc
warehouse: {warehouse}
sources: [s.src, s.dim, s.clocked_src]
airflow:
  dag_id: trickle_oc
  on_commit: {{poll_interval: 1s, debounce: 0.5, max_wait: 10s}}
stream_tables:
  - name: s.base
    query: SELECT k, v FROM s.src WHERE v IS NOT NULL
    schedule: null
  - name: s.totals
    query: SELECT b.k, SUM(b.v) AS total, MAX(d.x) AS x FROM s.base b JOIN s.dim d ON b.k = d.k GROUP BY b.k
    schedule: on_commit
  - name: s.report
    query: SELECT k, total FROM s.totals WHERE total > 0
    schedule: 5m
  - name: s.clocked
    query: SELECT k FROM s.clocked_src
    schedule: 1m
  - name: s.follows_clock
    query: SELECT k FROM s.clocked
    schedule: on_commit
"""


def write_project(tmp_path: Path, text: str = PROJECT, **fields) -> Path:
    path = tmp_path / "trickle.yaml"
    path.write_text(text.format(warehouse=tmp_path / "wh", **fields))
    return path


def test_on_commit_is_a_schedule_without_a_clock():
    parsed = parse_schedule(" On_Commit ", stream_table="s.t")
    assert parsed.on_commit and parsed.text == "on_commit" and not parsed.is_calculated
    assert parsed.nominal_period() is None and parsed.next_due(utcnow()) is None
    with pytest.raises(InvalidScheduleError, match="on_commit"):  # the hint names the spelling
        parse_schedule("on commit", stream_table="s.t")


def test_a_project_watches_base_sources_up_through_tables_without_a_clock(tmp_path):
    project = load_project(write_project(tmp_path))
    watches = project.commit_watches
    # s.totals reads s.dim directly and s.src through the CALCULATED s.base; s.follows_clock reads
    # only s.clocked, which has its own clock: it follows its refreshes, nothing is watched for it
    assert watches.sources == {"s.dim": ("s.totals",), "s.src": ("s.base",)}
    assert watches.refreshed == {"s.dim": ("s.report", "s.totals"), "s.src": ("s.base", "s.report", "s.totals")}
    assert project.airflow.on_commit_debounce == timedelta(milliseconds=500)
    # the refresh DAG's tick ignores on_commit; there it is due in every run (its cheap check skips)
    assert project.tick() == "1m"
    from airflow_trickle.project.planning import is_due

    due, why = is_due(project, project.unit_of("s.follows_clock"), {"s.follows_clock": utcnow()}, utcnow())
    assert due and "on_commit" in why


@pytest.mark.parametrize("setting, message", [
    ("{poll_interval: 0s}", "poll_interval must be longer than zero"),
    ("{debounce: '*/5 * * * *'}", "debounce must be a duration"),
    ("{every: 1s}", r"unknown key 'airflow.on_commit.every'"),
    ("5s", r"airflow.on_commit must be a mapping of keys to values, not '5s'"),
])
def test_bad_on_commit_settings_are_refused_at_load(tmp_path, setting, message):
    text = PROJECT.replace("{{poll_interval: 1s, debounce: 0.5, max_wait: 10s}}", setting.replace("{", "{{")
                           .replace("}", "}}"))
    with pytest.raises((ProjectError, InvalidScheduleError), match=message):
        load_project(write_project(tmp_path, text))


def test_the_dags_folder_file_yields_an_on_commit_dag_on_watched_source_assets(tmp_path, monkeypatch):
    from airflow.dag_processing.dagbag import DagBag
    from airflow.sdk.definitions.asset import AssetAny

    monkeypatch.delenv("TRICKLE_DAG_DEADLINES", raising=False)
    project = write_project(tmp_path)
    (tmp_path / "dags").mkdir()
    (tmp_path / "dags" / "oc_dag.py").write_text(
        f"from airflow_trickle.dag_factory import stream_table_dag\ndag = stream_table_dag({str(project)!r})\n")
    bag = DagBag(dag_folder=str(tmp_path / "dags"))
    assert not bag.import_errors, bag.import_errors
    assert set(bag.dag_ids) == {"trickle_oc", "trickle_oc__on_commit"}
    dag = bag.dags["trickle_oc__on_commit"]
    assert dag.max_active_runs == 1 and "on_commit" in dag.tags
    # a run refreshes what a commit reaches, wired as in the refresh DAG, and has no plan task
    assert sorted(dag.task_ids) == ["s.base", "s.report", "s.totals"]
    assert dag.get_task("s.totals").upstream_task_ids == {"s.base"}
    assert dag.get_task("s.report").upstream_task_ids == {"s.totals"}
    assert {(t.on_commit, t.check_schedule) for t in dag.tasks} == {(True, False)}
    condition = dag.timetable.asset_condition
    assert isinstance(condition, AssetAny)
    watched = {a.name: a for a in condition.objects}
    assert set(watched) == {"trickle/oc/s.dim", "trickle/oc/s.src"}
    (watcher,) = watched["trickle/oc/s.src"].watchers
    classpath, kwargs = watcher.trigger.serialize()
    assert classpath == "airflow_trickle.triggers.source_commit.SourceCommitTrigger"
    assert (kwargs["source"], kwargs["readers"], kwargs["serves"]) == ("s.src", ["s.base"],
                                                                       ["s.base", "s.report", "s.totals"])
    assert (kwargs["poll_interval"], kwargs["debounce"], kwargs["max_wait"]) == (1.0, 0.5, 10.0)
    # the refresh DAG declares the same asset with the same watcher (one definition: no DAG drops it)
    main = bag.dags["trickle_oc"]
    inlet = next(a for a in main.get_task("s.base").inlets if a.name == "trickle/oc/s.src")
    assert inlet.watchers[0].trigger.serialize() == watcher.trigger.serialize()
    assert "s.follows_clock" in main.task_ids


def test_a_watcher_carries_no_credentials(tmp_path):
    text = PROJECT.replace("airflow:", "settings:\n  storage_options: {{aws_endpoint: 'http://127.0.0.1:9',"
                                       " aws_secret_access_key: hidden-secret, aws_access_key_id: some-key}}\nairflow:")
    from airflow_trickle.dag_factory import watched_source_asset

    asset = watched_source_asset(load_project(write_project(tmp_path, text)), "s.src")
    kwargs = json.dumps(asset.watchers[0].trigger.serialize())
    assert "hidden-secret" not in kwargs and "some-key" not in kwargs and "127.0.0.1:9" in kwargs


def test_an_on_commit_task_skips_unless_its_sources_committed(tmp_path):
    from airflow.sdk import Asset
    from airflow.sdk.exceptions import AirflowSkipException

    from airflow_trickle.operators.refresh import StreamTableRefreshOperator, committed_sources

    project = load_project(write_project(tmp_path))
    events = {Asset(name="trickle/oc/s.dim", uri="trickle://oc/s.dim"): []}
    context = {"triggering_asset_events": events, "dag_run": type("Run", (), {"run_type": "asset_triggered"})()}
    assert committed_sources(context, "oc") == {"s.dim"}
    task = StreamTableRefreshOperator(task_id="s.base", project=project, stream_tables=["s.base"], on_commit=True,
                                      check_schedule=False)
    with pytest.raises(AirflowSkipException, match=r"none of its sources committed \(committed: s.dim\)"):
        task._execute(context)
    assert committed_sources({"triggering_asset_events": {}}, "oc") is None  # by hand: every task runs


# -- the watcher trigger, on Delta tables written with delta-rs -----------------------------------

def _source(path: Path, rows: int = 1) -> None:
    write_deltalake(str(path), pa.table({"k": list(range(rows))}), mode="append")


def _catalog_with_reader(warehouse: Path, source_path: Path, frontier: int | None) -> CatalogStore:
    catalog = CatalogStore(str(warehouse / "_trickle"))
    row = StreamTable(name="s.base", st_id="id-base", defining_query="SELECT k FROM s.src",
                      original_query="SELECT k FROM s.src", schedule=None, refresh_mode="DIFFERENTIAL",
                      effective_mode="DIFFERENTIAL", output_columns=["k"],
                      frontier={} if frontier is None else {"s.src": frontier})
    catalog.insert(row, [Dependency(st_name="s.base", source_name="s.src", source_type="TABLE",
                                    source_location=str(source_path))])
    return catalog


def _trigger(warehouse: Path, **kwargs):
    from airflow_trickle.triggers.source_commit import SourceCommitTrigger

    return SourceCommitTrigger(project="oc", warehouse=str(warehouse), source="s.src", readers=["s.base"],
                               serves=["s.base", "s.totals"], dag_id="trickle_oc__on_commit",
                               **{"poll_interval": 0.05, "debounce": 0.3, "max_wait": 5.0, **kwargs})


def _events(trigger, commits, until: int) -> list[tuple[float, dict]]:
    """Run ``trigger`` while ``commits`` (an async function) commits; the first ``until`` events."""
    async def main():
        found, started = [], time.monotonic()

        async def collect():
            async for event in trigger.run():
                found.append((round(time.monotonic() - started, 2), event.payload))
                if len(found) >= until:
                    return

        collector = asyncio.create_task(collect())
        await commits()
        await asyncio.wait_for(collector, 30)
        return found

    return asyncio.run(main())


def test_a_burst_of_commits_is_one_event_and_a_long_burst_is_capped(tmp_path):
    source = tmp_path / "wh" / "s" / "src"
    _source(source)  # version 0, consumed by the reader
    _catalog_with_reader(tmp_path / "wh", source, frontier=0)

    async def commits():
        await asyncio.sleep(0.4)  # nothing new yet: no event
        for _ in range(5):  # a burst: 5 commits 50 ms apart
            await asyncio.to_thread(_source, source)
            await asyncio.sleep(0.05)
        await asyncio.sleep(1.0)  # the burst is reported once the debounce has passed
        deadline = time.monotonic() + 2.0  # a commit every 100 ms for 2 s: no quiet moment at all
        while time.monotonic() < deadline:
            await asyncio.to_thread(_source, source)
            await asyncio.sleep(0.1)

    events = _events(_trigger(tmp_path / "wh", max_wait=1.0), commits, until=2)
    (first_at, first), (second_at, second) = events
    assert (first["source"], first["reason"], first["after_version"], first["version"]) == ("s.src", "commit", 0, 5)
    assert first_at >= 0.4 + 0.3, events  # not before the debounce after the burst
    # the second burst never paused for 300 ms: reported when it had been held for max_wait (1 s)
    assert second["after_version"] == 5 and second["version"] > 6 and second_at < first_at + 1.0 + 2.0, events

    from airflow_trickle.ops.watchers import read_beats, watcher_state

    beats = read_beats(CatalogStore(str(tmp_path / "wh" / "_trickle")).location)
    assert [(b["source"], b["serves"], b["version"]) for b in beats] == [("s.src", ["s.base", "s.totals"],
                                                                          second["version"])]
    assert watcher_state("s.totals", beats, utcnow())["state"] == "watching"
    assert watcher_state("s.totals", beats, utcnow() + timedelta(minutes=5))["state"] == "stale"


def test_unconsumed_commits_and_uncreated_readers_fire_at_once(tmp_path):
    source = tmp_path / "wh" / "s" / "src"
    for _ in range(3):
        _source(source)  # versions 0..2; the reader consumed 0: a watcher (re)started fires for 1..2
    _catalog_with_reader(tmp_path / "wh", source, frontier=0)

    async def nothing():
        return

    ((_, event),) = _events(_trigger(tmp_path / "wh"), nothing, until=1)
    assert (event["after_version"], event["version"]) == (0, 2)

    empty = tmp_path / "empty"
    CatalogStore(str(empty / "_trickle")).ensure()
    ((_, event),) = _events(_trigger(empty), nothing, until=1)
    assert event["reason"] == "its stream tables are not created yet"


def test_status_says_when_no_watcher_polls_an_on_commit_table(tmp_path):
    """``trickle status`` of an on_commit stream table that no Airflow watches (a CLI process,
    no JVM: the catalog row is written by delta-rs, as a create would)."""
    source = tmp_path / "wh" / "s" / "src"
    _source(source)
    catalog = CatalogStore(str(tmp_path / "wh" / "_trickle"))
    row = StreamTable(name="s.t", st_id="id-t", defining_query="SELECT k FROM s.src", original_query="SELECT k FROM s.src",
                      schedule="on_commit", refresh_mode="DIFFERENTIAL", effective_mode="DIFFERENTIAL",
                      output_columns=["k"])
    catalog.insert(row, [Dependency(st_name="s.t", source_name="s.src", source_type="TABLE",
                                    source_location=str(source))])
    from airflow_trickle.ops.overview import commit_watchers

    (state,) = commit_watchers(catalog, catalog.list(), utcnow()).values()
    assert state["state"] == "none" and "triggerer" in state["message"]
    done = subprocess.run([sys.executable, "-m", "airflow_trickle.cli", "--warehouse", str(tmp_path / "wh"), "--embedded",
                           "status"], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    header, _, line = done.stdout.splitlines()
    assert header.split()[-1] == "watcher" and "on_commit" in line and "no watcher has polled its sources" in line


def test_a_source_the_watcher_cannot_read_shows_in_status_and_does_not_stop_it(tmp_path):
    missing = tmp_path / "wh" / "s" / "gone"  # the catalog says the source lives here; it does not
    _catalog_with_reader(tmp_path / "wh", missing, frontier=0)
    trigger = _trigger(tmp_path / "wh")

    async def watch_a_while():
        running = asyncio.create_task(anext(trigger.run()))
        await asyncio.sleep(1.0)  # a score of failed polls: no event, and the trigger still runs
        assert not running.done()
        running.cancel()

    asyncio.run(watch_a_while())
    from airflow_trickle.ops.watchers import read_beats, watcher_state

    (beat,) = read_beats(CatalogStore(str(tmp_path / "wh" / "_trickle")).location)
    assert beat["error"]
    state = watcher_state("s.totals", [beat], utcnow())
    assert state["state"] == "stale" and state["message"].startswith("the watcher cannot read s.src: "), state

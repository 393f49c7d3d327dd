"""The example DAG end to end in Airflow: dag.test() on SQLite, refresh tasks over the Spark
service, the warehouse in an S3 bucket (``run_example.py --s3``: a local s3proxy, started and
stopped by the runner, holds the sources and the stream tables).

The example runner (``dags_example/run_example.py``) runs in its own process, because Airflow
reads its home and database settings once per process; it writes a JSON report that this test
checks: run and task states, the manual selection, the refusal of an unknown table, every
stream table against its defining query at its frontier versions, and the refresh tasks'
OpenLineage events, datasets named by the bucket.

One run on S3 covers both the example and the example where lakehouses live: the runner's code
is the same on a local directory (the README's ``./run-example.sh``, every other Spark test) but
for the storage, and one example run in the suite instead of two pays for a Spark service, an
Airflow database and an API server once (the two took 272 s of a test process in CI).
"""
from __future__ import annotations

import json
import subprocess
import sys
from decimal import Decimal
from pathlib import Path

import pytest

from airflow_trickle.operators.lineage import dataset_id
from tests.conftest import TINY_TABLES_SPARK

ROOT = Path(__file__).resolve().parent.parent
#: The example's Spark with the suite's settings for tables of a few rows (they change how Spark
#: plans and runs, not what the example does or finds).
TINY_SPARK = ("--spark-conf", json.dumps(TINY_TABLES_SPARK))


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    warehouse = tmp_path_factory.mktemp("example")
    out = warehouse / "report.json"
    done = subprocess.run([sys.executable, str(ROOT / "dags_example" / "run_example.py"), "--s3", "--warehouse",
                           str(warehouse / "wh"), "--report", str(out), *TINY_SPARK],
                          capture_output=True, text=True, timeout=1200)
    assert out.exists(), done.stdout[-4000:] + done.stderr[-4000:]
    data = json.loads(out.read_text())
    data["returncode"] = done.returncode
    data["printed"] = (done.stdout + done.stderr).splitlines()
    return data


def test_every_run_succeeds(report):
    assert [r["state"] for r in report["runs"]] == ["success"] * 4
    assert report["returncode"] == 0


def test_the_example_prints_a_short_summary_and_keeps_airflows_logs_in_a_file(report):
    printed = report["printed"]
    assert len(printed) < 100, "\n".join(printed)
    assert not any("Traceback" in line for line in printed), "\n".join(printed)
    assert any(line.startswith("== a run for an unknown table: plan failed the run: refused:") for line in printed)
    assert sum("equals its query at its frontier" in line for line in printed) == 6
    logs = next(line for line in printed if "Airflow's own logs: " in line).split("Airflow's own logs: ")[1]
    assert "not a stream table of project 'shop'" in Path(logs).read_text()  # the refusal's traceback, there


def test_scheduled_shape_runs_every_refresh_task(report):
    for run in report["runs"][:2]:
        assert set(run["tasks"].values()) == {"success"}, run["tasks"]
        assert set(run["tasks"]) == {"plan", "shop.atomic__region_report", "shop.order_lines",
                                     "shop.customer_totals", "shop.top_customers"}


def test_manual_run_refreshes_only_the_selection_in_the_chosen_mode(report):
    manual = report["runs"][2]["tasks"]
    assert manual == {"plan": "success", "shop.order_lines": "success", "shop.top_customers": "success",
                      "shop.customer_totals": "skipped", "shop.atomic__region_report": "skipped"}
    tables = report["before_edit"]  # the tables as the manual run left them
    # FULL as asked; order_lines saw the new order 9; customer_totals, not selected, did not refresh
    assert tables["shop.order_lines"]["last_actions"][:3] == ["FULL", "DIFFERENTIAL", "FULL"]
    assert tables["shop.top_customers"]["last_actions"][:3] == ["FULL", "DIFFERENTIAL", "FULL"]
    assert tables["shop.customer_totals"]["last_actions"][:2] == ["DIFFERENTIAL", "FULL"]
    assert 9 in {r["id"] for r in tables["shop.order_lines"]["rows"]}


def test_unknown_table_is_refused(report):
    assert report["refused"] and "shop.no_such_table" in report["refused"]


def test_every_stream_table_equals_its_query_at_its_frontier(report):
    for tables in (report["before_edit"], report["tables"]):  # before and after the project file's edit
        assert {name: t["matches_query"] for name, t in tables.items()} == dict.fromkeys(
            ["shop.big_orders", "shop.customer_totals", "shop.order_lines", "shop.region_report",
             "shop.region_revenue", "shop.top_customers"], True)


def test_contents_after_the_differential_run(report):
    tables = report["before_edit"]
    revenue = {r["region"]: (r["orders"], Decimal(r["revenue"])) for r in tables["shop.region_revenue"]["rows"]}
    # order 8 has no customer (NULL) and joins nothing; Chen moved to 'west'; order 4 deleted
    assert revenue == {"north": (2, Decimal("55.50")), "south": (3, Decimal("1070.99")),
                       "west": (1, Decimal("400.00")), None: (1, Decimal("150.00"))}
    report_rows = {(r["region"], r["big_order"]) for r in tables["shop.region_report"]["rows"]}
    assert report_rows == {("south", 3), ("west", 7)}
    top = {r["customer"] for r in tables["shop.top_customers"]["rows"]}
    assert top == {"Brian", "Chen"}


def test_refreshed_stream_tables_emit_asset_events_with_what_they_did(report):
    first_three = {run["run_id"] for run in report["runs"][:3]}
    events = [e for e in report["asset_events"] if e["run"] in first_three]
    # one per stream table of each successful refresh task: 6 + 6 in the full runs, 2 in the manual one
    assert len(events) == 14
    assert sorted(e["asset"] for e in events if e["run"] == events[0]["run"]) == [
        "trickle://shop/shop.order_lines", "trickle://shop/shop.top_customers"]
    by_asset = {}
    for event in events:  # newest first
        by_asset.setdefault(event["asset"], event)
    newest = by_asset["trickle://shop/shop.order_lines"]
    assert newest["task"] == "shop.order_lines"
    assert newest["extra"]["action"] == "FULL" and newest["extra"]["status"] == "COMPLETED"
    assert newest["extra"]["table_version"] > 0 and newest["extra"]["rows_inserted"] >= 1
    group = [e for e in events if e["task"] == "shop.atomic__region_report"]
    assert {e["asset"] for e in group} == {"trickle://shop/shop.big_orders", "trickle://shop/shop.region_revenue",
                                           "trickle://shop/shop.region_report"}
    assert {e["extra"].get("action") for e in group} <= {"FULL", "DIFFERENTIAL", "CREATED", "NO_DATA"}


def test_each_task_notes_what_it_did_and_plan_notes_the_selection(report):
    """The example serves Airflow's API server beside its runs; the tasks write their notes
    through it (``notes_connection: trickle_notes``)."""
    first, second, manual = report["runs"][:3]
    assert first["notes"]["shop.order_lines"].startswith("CREATED +7 -0 rows in ")
    # the atomic group's members were created by its task: no NO_DATA for a table just made
    assert first["notes"]["shop.atomic__region_report"].startswith(
        "shop.big_orders: CREATED +3 -0 rows; shop.region_revenue: CREATED +3 -0 rows; "
        "shop.region_report: CREATED +2 -0 rows in "), first["notes"]
    assert second["notes"]["shop.order_lines"].startswith("DIFFERENTIAL +2 -2 rows in ")
    assert manual["run_note"] == "manual run: shop.order_lines, shop.top_customers (mode FULL)"
    assert manual["notes"]["shop.customer_totals"] == "skipped: not selected in this manual run"
    assert manual["notes"]["shop.order_lines"].startswith("FULL +1 -0 rows in ")


def test_a_query_edited_in_the_project_file_is_altered_in_place_by_the_next_run(report):
    """The fourth run follows an edit of top_customers' query in the project file: the plan task
    notes the plan, the table's task ALTERs it in place (no drop: its history goes on) and says so."""
    edited = report["runs"][3]
    assert edited["state"] == "success"
    assert "alter     shop.top_customers: query" in edited["run_note"], edited["run_note"]
    assert edited["notes"]["shop.top_customers"].startswith("ALTERED in place (query), then "), edited["notes"]
    history = report["tables"]["shop.top_customers"]["refreshes"]
    assert [h["initiated_by"] for h in history[:2]] == [history[0]["initiated_by"], "ALTER"], history
    assert history[0]["initiated_by"].startswith("AIRFLOW trickle_shop/")  # the task's refresh, after the ALTER
    assert history[-1]["initiated_by"] == "INITIAL", history  # the same table since it was created: no drop
    assert report["tables"]["shop.top_customers"]["matches_query"]
    # total >= 200 became >= 100: Dara's 150 counts now
    top = {r["customer"] for r in report["tables"]["shop.top_customers"]["rows"]}
    totals = {r["customer"]: Decimal(r["total"]) for r in report["tables"]["shop.customer_totals"]["rows"]}
    assert top >= {"Brian", "Chen", "Dara"} and top == {c for c, total in totals.items() if total >= 100}


def test_refresh_tasks_emit_openlineage_with_versions_and_column_lineage(report):
    """The OpenLineage provider's file transport wrote each refresh task's COMPLETE event; read
    back: inputs at the frontier versions, outputs at their new versions, schema and column lineage."""
    tables = report["tables"]
    where = {name: dataset_id(info["location"])[1] for name, info in tables.items()}  # the dataset's name
    events = report["lineage"]
    assert {e["job"] for e in events} >= {"trickle_shop.shop.order_lines", "trickle_shop.shop.customer_totals",
                                          "trickle_shop.shop.atomic__region_report"}

    def newest(table):
        """The newest event whose outputs hold ``table``, and that output."""
        found = [(e, o) for e in events for o in e["outputs"] if o["name"] == where[table]]
        return found[-1]

    # a join + aggregate, refreshed in the atomic group's task: sources at its frontier
    event, output = newest("shop.region_revenue")
    assert event["job"] == "trickle_shop.shop.atomic__region_report"
    assert sorted(o["name"] for o in event["outputs"]) == sorted(
        where[m] for m in ("shop.big_orders", "shop.region_revenue", "shop.region_report"))
    versions = {i["name"].rsplit("/", 1)[-1]: i["version"] for i in event["inputs"]}  # by table directory
    frontier = tables["shop.region_revenue"]["frontier"]
    assert set(frontier) == {"shop.orders", "shop.customers"}
    assert {source: versions[source.split(".")[1]] for source in frontier} == {
        source: str(version) for source, version in frontier.items()}
    assert output["fields"] == ["region", "orders", "revenue"]
    assert [column for _, column in output["columns"]["revenue"]] == ["amount"]
    assert output["columns"]["orders"] == []  # COUNT(*): no source column
    assert event["refreshes"]["shop.region_revenue"]["action"] in ("DIFFERENTIAL", "FULL", "CREATED", "NO_DATA")
    # a stream table over a stream table: its input is the upstream's storage, at the version read
    event, output = newest("shop.customer_totals")
    assert [i["name"] for i in event["inputs"]] == [where["shop.order_lines"]]
    assert event["inputs"][0]["version"] == str(tables["shop.customer_totals"]["frontier"]["shop.order_lines"])
    assert all(source == where["shop.order_lines"] for cols in output["columns"].values() for source, _ in cols)
    assert event["sql"] and "shop.order_lines" in event["sql"]


def test_the_warehouse_is_the_bucket_and_lineage_names_datasets_by_it(report):
    """Every stream table lives in the bucket, and the refresh tasks' OpenLineage datasets are
    named by it (namespace ``s3://trickle``, name the key), each with its version and fields."""
    tables = report["tables"]
    assert all(t["location"].startswith("s3://trickle/warehouse/") for t in tables.values()), tables
    outputs = {o["name"]: o for e in report["lineage"] for o in e["outputs"]}
    assert set(outputs) == {t["location"].rstrip("/").removeprefix("s3://trickle/") for t in tables.values()}, outputs
    assert {o["namespace"] for o in outputs.values()} == {"s3://trickle"}
    assert all(o["version"] is not None and o["fields"] for o in outputs.values())

"""The generated DAG: shape, task ids, parameters, assets, deadline -- built without Spark."""
from __future__ import annotations

import copy
import json
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import pytest

EXAMPLE = Path(__file__).resolve().parent.parent / "dags_example" / "shop" / "trickle.yaml"


@pytest.fixture(scope="module")
def dag(monkeypatch_module):
    from airflow_trickle.dag_factory import stream_table_dag

    return stream_table_dag(EXAMPLE)


@pytest.fixture(scope="module")
def monkeypatch_module():
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TRICKLE_WAREHOUSE", "/data/wh")
        mp.delenv("TRICKLE_DAG_DEADLINES", raising=False)
        yield mp


def test_task_groups_per_database_and_one_task_per_unit(dag):
    assert dag.dag_id == "trickle_shop"
    assert sorted(dag.task_ids) == ["plan", "shop.atomic__region_report", "shop.customer_totals",
                                    "shop.order_lines", "shop.top_customers"]
    assert set(dag.task_group.children) == {"plan", "shop"}
    group = dag.get_task("shop.atomic__region_report")
    assert group.stream_tables == ["shop.big_orders", "shop.region_revenue", "shop.region_report"]
    assert dag.get_task("shop.customer_totals").upstream_task_ids == {"shop.order_lines"}
    assert dag.get_task("shop.top_customers").upstream_task_ids == {"shop.customer_totals"}
    assert dag.get_task("shop.order_lines").upstream_task_ids == {"plan"}
    assert {t.trigger_rule for t in dag.tasks if t.task_id != "plan"} == {"none_failed"}
    assert dag.schedule == timedelta(seconds=60)
    assert dag.max_active_runs == 3 and not dag.catchup  # a manual run never queues behind a tick
    assert group.task_display_name == "region_report (atomic: big_orders, region_revenue, region_report)"
    assert dag.get_task("shop.order_lines").task_display_name == "order_lines"


def test_task_docs_say_what_each_task_refreshes(dag):
    doc = dag.get_task("shop.order_lines").doc_md
    for text in ("Orders with their customer's name and region.", "Mode **DIFFERENTIAL**", "schedule **1m**",
                 "freshness target **2m**", "trickle://shop/shop.order_lines", "SELECT\n  o.id,"):
        assert text in doc, doc
    group_doc = dag.get_task("shop.atomic__region_report").doc_md
    assert group_doc.startswith("**Atomic diamond group**") and group_doc.count("```sql") == 3
    assert "| `shop.order_lines` | 1m | 1m | 2m | `shop.order_lines` |" in dag.doc_md


def test_each_refresh_task_updates_one_asset_per_stream_table(dag):
    group = dag.get_task("shop.atomic__region_report")
    assert [a.uri for a in group.outlets] == ["trickle://shop/shop.big_orders", "trickle://shop/shop.region_revenue",
                                             "trickle://shop/shop.region_report"]
    assert [a.extra["stream_table"] for a in dag.get_task("shop.order_lines").outlets] == ["shop.order_lines"]
    # inlets: what each task reads, so the asset graph shows source -> stream table -> stream table
    assert [a.uri for a in dag.get_task("shop.order_lines").inlets] == ["trickle://shop/shop.customers",
                                                                        "trickle://shop/shop.orders"]
    assert [a.extra for a in dag.get_task("shop.order_lines").inlets] == [{"source_table": "shop.customers"},
                                                                          {"source_table": "shop.orders"}]
    assert [a.uri for a in dag.get_task("shop.top_customers").inlets] == ["trickle://shop/shop.customer_totals"]
    assert {a.uri for a in group.inlets} == {"trickle://shop/shop.customers", "trickle://shop/shop.orders"}


def test_trigger_form_is_a_pick_list_with_nothing_required(dag):
    """Airflow's form draws a multi-select for an array with top-level ``examples``, and marks a
    field required unless its type admits null (airflow/ui FlexibleForm, 3.3)."""
    from airflow.sdk.exceptions import ParamValidationError

    from airflow_trickle.project import load_project

    params = dag.params
    tables = params.get_param("tables").schema
    names = list(load_project(EXAMPLE).stream_tables)
    assert tables["examples"] == [*names, "shop.*"] and "enum" not in tables["items"]
    assert tables["values_display"]["shop.*"] == "all of shop (6 stream tables)"
    assert params.get_param("mode").schema["enum"] == ["AUTO", "FULL", "DIFFERENTIAL", "REINITIALIZE", None]
    for key in ("tables", "mode", "include_upstream", "include_downstream"):
        assert "null" in params.get_param(key).schema["type"], key
    chosen = copy.deepcopy(params)
    chosen.update({"tables": ["shop.big_orders"], "mode": "FULL", "include_downstream": True})
    assert chosen.validate() == {"tables": ["shop.big_orders"], "mode": "FULL", "include_upstream": False,
                                 "include_downstream": True}
    emptied = copy.deepcopy(params)
    emptied.update({"tables": None, "mode": None, "include_upstream": None, "include_downstream": None})
    assert emptied.validate() == dict.fromkeys(("tables", "mode", "include_upstream", "include_downstream"))
    for key, value in (("mode", "FASTER"), ("include_upstream", "yes"), ("tables", "shop.orders")):
        with pytest.raises(ParamValidationError, match=key):
            copy.deepcopy(params)[key] = value


def test_every_choice_of_the_form_is_accepted_by_plan(dag):
    from airflow_trickle.project.planning import select
    from airflow_trickle.project import load_project

    project = load_project(EXAMPLE)
    for choice in dag.params.get_param("tables").schema["examples"]:
        assert select(project, {"tables": [choice]}, manual=True).tables
    assert select(project, {"tables": ["shop.*"]}, manual=True).tables == set(project.stream_tables)
    empty = {"tables": None, "mode": None, "include_upstream": None, "include_downstream": None}
    assert select(project, empty, manual=True).tables == set(project.stream_tables)


def test_deadline_alert_is_the_tightest_freshness_target(dag):
    (alert,) = dag.deadline
    assert alert.interval == timedelta(minutes=2)  # order_lines: 2 x 1m
    assert alert.callback.path == "airflow_trickle.notifiers.freshness.record_deadline_miss"
    targets = alert.callback.kwargs["targets"]  # every table's own target: the callback checks each
    assert targets["shop.order_lines"] == 120 and targets["shop.top_customers"] == 600 and len(targets) == 6
    assert alert.callback.kwargs["warehouse"] == "/data/wh"


def test_deadline_can_be_turned_off(monkeypatch_module):
    from airflow_trickle.dag_factory import stream_table_dag

    assert not stream_table_dag(EXAMPLE, deadline=False, dag_id="no_deadline").deadline


def test_building_the_dag_imports_no_spark_and_parses_fast(tmp_path):
    code = ("import os, sys, time, json\n"
            "os.environ['TRICKLE_WAREHOUSE'] = '/wh'\n"
            "import airflow.sdk\n"
            "from airflow_trickle.dag_factory import stream_table_dag\n"
            f"stream_table_dag({str(EXAMPLE)!r})\n"
            "print(json.dumps(sorted(m for m in ('pyspark', 'py4j', 'deltalake', 'pyarrow') if m in sys.modules)))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={**__import__("os").environ}).stdout
    assert json.loads(out.strip().splitlines()[-1]) == []


def test_a_maintenance_schedule_adds_a_maintenance_dag_beside_the_refresh_dag(tmp_path, monkeypatch_module):
    """Off by default; with ``airflow.maintenance`` the dags-folder file yields a second DAG whose
    one task maintains every stream table (found by Airflow's own DAG-folder parser)."""
    import yaml
    from airflow.dag_processing.dagbag import DagBag

    from airflow_trickle.operators.maintenance import StreamTableMaintenanceOperator

    data = yaml.safe_load(EXAMPLE.read_text())
    for entry in data["stream_tables"]:
        if "query_file" in entry:
            entry["query"] = (EXAMPLE.parent / entry.pop("query_file")).read_text()
    project = tmp_path / "trickle.yaml"
    project.write_text(yaml.safe_dump(data))
    (tmp_path / "dags").mkdir()
    (tmp_path / "dags" / "shop_dag.py").write_text(
        "from airflow_trickle.dag_factory import stream_table_dag\n"
        f"dag = stream_table_dag({str(project)!r})\n")

    assert set(DagBag(dag_folder=str(tmp_path / "dags")).dag_ids) == {"trickle_shop"}

    data.setdefault("airflow", {}).update({"maintenance": "@daily", "maintenance_retention_hours": 48})
    project.write_text(yaml.safe_dump(data))
    bag = DagBag(dag_folder=str(tmp_path / "dags"))
    assert not bag.import_errors, bag.import_errors
    assert set(bag.dag_ids) == {"trickle_shop", "trickle_shop__maintenance"}
    maintenance = bag.dags["trickle_shop__maintenance"]
    task = maintenance.get_task("maintain")
    assert isinstance(task, StreamTableMaintenanceOperator) and maintenance.task_ids == ["maintain"]
    assert task.stream_tables == list(bag.dags["trickle_shop"].get_task("plan").project.stream_tables)
    assert task.retention_hours == 48 and "maintenance" in maintenance.tags and maintenance.max_active_runs == 1

    data["airflow"]["maintenance_retention_hours"] = "a week"
    project.write_text(yaml.safe_dump(data))
    from airflow_trickle.errors import ProjectError
    from airflow_trickle.project import load_project

    with pytest.raises(ProjectError, match="maintenance_retention_hours must be a number of hours"):
        load_project(project)

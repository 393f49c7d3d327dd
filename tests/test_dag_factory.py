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
    assert dag.max_active_runs == 1 and not dag.catchup


def test_each_refresh_task_updates_one_asset_per_stream_table(dag):
    group = dag.get_task("shop.atomic__region_report")
    assert [a.uri for a in group.outlets] == ["trickle://shop/shop.big_orders", "trickle://shop/shop.region_revenue",
                                             "trickle://shop/shop.region_report"]
    assert [a.extra["stream_table"] for a in dag.get_task("shop.order_lines").outlets] == ["shop.order_lines"]


def test_trigger_form_offers_only_the_projects_tables_and_modes(dag):
    from airflow.sdk.exceptions import ParamValidationError

    from airflow_trickle.project import load_project

    params = dag.params
    assert params.get_param("tables").schema["items"]["enum"] == list(load_project(EXAMPLE).stream_tables)
    assert params.get_param("mode").schema["enum"] == ["AUTO", "FULL", "DIFFERENTIAL", "REINITIALIZE"]
    chosen = copy.deepcopy(params)
    chosen.update({"tables": ["shop.big_orders"], "mode": "FULL", "include_downstream": True})
    assert chosen.validate() == {"tables": ["shop.big_orders"], "mode": "FULL", "include_upstream": False,
                                 "include_downstream": True}
    for key, value in (("tables", ["shop.nope"]), ("mode", "FASTER"), ("include_upstream", "yes")):
        with pytest.raises(ParamValidationError, match=key):
            copy.deepcopy(params)[key] = value


def test_deadline_alert_is_the_tightest_freshness_target(dag):
    (alert,) = dag.deadline
    assert alert.interval == timedelta(minutes=2)  # order_lines: 2 x 1m
    assert alert.callback.path == "airflow_trickle.notifiers.freshness.record_deadline_miss"
    assert alert.callback.kwargs["tables"] == ["shop.order_lines"]
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

"""Project files: loading and validation without Spark (milliseconds each)."""
from __future__ import annotations

import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import pytest
import yaml

from airflow_trickle.errors import (
    CycleError,
    DefinitionError,
    InvalidQueryError,
    InvalidScheduleError,
    ProjectError,
    UnknownSourceError,
    UnsupportedConstructError,
)
from airflow_trickle.project import define_project, load_project

EXAMPLE = Path(__file__).resolve().parent.parent / "dags_example" / "shop" / "trickle.yaml"


def project(*tables, **keys):
    keys.setdefault("warehouse", "/wh")
    return define_project("p", stream_tables=list(tables), **keys)


def test_example_project_loads_with_its_graph_units_and_schedules(monkeypatch):
    monkeypatch.setenv("TRICKLE_WAREHOUSE", "/data/wh")
    p = load_project(EXAMPLE)
    assert p.warehouse == "/data/wh"
    assert list(p.stream_tables)[0] in ("shop.big_orders", "shop.order_lines")
    order = list(p.stream_tables)
    assert order.index("shop.order_lines") < order.index("shop.customer_totals") < order.index("shop.top_customers")
    assert [u.task_id for u in p.units] == ["shop.atomic__region_report", "shop.order_lines",
                                            "shop.customer_totals", "shop.top_customers"]
    group = p.units[0]
    assert group.members == ("shop.big_orders", "shop.region_revenue", "shop.region_report")
    assert group.convergence_points == ("shop.region_report",)
    # CALCULATED customer_totals inherits top_customers' 2m; freshness defaults to twice the period
    assert p.stream_tables["shop.customer_totals"].schedule is None
    assert p.periods["shop.customer_totals"] == timedelta(minutes=2)
    assert p.freshness_target("shop.customer_totals") == timedelta(minutes=4)
    assert p.freshness_target("shop.top_customers") == timedelta(minutes=10)  # explicit
    assert p.tick() == "1m"
    assert "GROUP BY customer" in p.stream_tables["shop.customer_totals"].query  # from query_file
    assert p.config().differential_max_change_ratio == 1.0


def test_loading_a_project_starts_no_jvm_and_imports_no_spark():
    code = ("import sys, os; os.environ['TRICKLE_WAREHOUSE'] = '/wh'\n"
            "from airflow_trickle.project import load_project\n"
            f"load_project({str(EXAMPLE)!r})\n"
            "print(sorted(m for m in ('pyspark', 'py4j', 'deltalake') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_unparsable_query_names_the_table():
    with pytest.raises(InvalidQueryError, match="stream table 's.a'"):
        project({"name": "s.a", "query": "SELECT FROM WHERE"})


def test_unknown_source_is_refused_when_sources_are_declared():
    with pytest.raises(UnknownSourceError, match="stream table 's.b'.*'s.missing'.*sources"):
        project({"name": "s.a", "query": "SELECT * FROM s.src"}, {"name": "s.b", "query": "SELECT * FROM s.missing"},
                sources=["s.src"])


def test_cycle_is_refused_with_the_cycle_printed():
    with pytest.raises(CycleError) as err:
        project({"name": "s.a", "query": "SELECT * FROM s.c"}, {"name": "s.b", "query": "SELECT * FROM s.a"},
                {"name": "s.c", "query": "SELECT * FROM s.b"})
    assert " -> ".join(err.value.cycle) in str(err.value)
    assert set(err.value.cycle) == {"s.a", "s.b", "s.c"}


@pytest.mark.parametrize("entry, error, text", [
    ({"name": "s.a", "query": "SELECT 1", "schedule": "every tuesday"}, InvalidScheduleError, "every tuesday"),
    ({"name": "s.a", "query": "SELECT 1", "shedule": "5m"}, ProjectError, "shedule"),
    ({"name": "s.a"}, ProjectError, "query"),
    ({"name": "s.a", "query_file": "missing.sql"}, ProjectError, "missing.sql"),
    ({"name": "s.a", "query": "SELECT 1", "diamond_consistency": "sometimes"}, ProjectError, "sometimes"),
    ({"name": "s.a", "query": "SELECT 1", "freshness": "*/5 * * * *"}, ProjectError, "duration"),
    ({"name": "s.a", "query": "SELECT rand() AS r FROM s.src"}, UnsupportedConstructError, "rand"),
    ({"name": "s.a", "query": "SELECT 1 AS x", "cluster_by": {"x": 1}}, DefinitionError, "cluster_by"),
    ({"name": "s.a", "query": "SELECT 1 AS x", "cluster_by": "x, X"}, DefinitionError, "distinct"),
])
def test_bad_stream_table_entries_are_refused_naming_the_table(entry, error, text):
    with pytest.raises(error, match=text) as caught:
        project(entry)
    assert "s.a" in str(caught.value)


def test_cluster_by_reaches_the_table_s_options_and_the_refresh_job():
    from airflow_trickle.project.model import StreamTableSpec

    p = project({"name": "s.a", "query": "SELECT 1 AS x, 2 AS y", "cluster_by": "y, x"},
                {"name": "s.b", "query": "SELECT x FROM s.a"})
    spec = p.stream_tables["s.a"]
    assert spec.cluster_by == ("y", "x") and spec.options()["cluster_by"] == ["y", "x"]
    assert StreamTableSpec.from_json(spec.to_json()) == spec
    assert "cluster_by" not in p.stream_tables["s.b"].options()


def test_nondeterministic_query_is_accepted_in_full_mode():
    p = project({"name": "s.a", "query": "SELECT rand() AS r FROM s.src", "refresh_mode": "FULL"})
    assert p.stream_tables["s.a"].refresh_mode == "FULL"


def test_project_level_errors(tmp_path, monkeypatch):
    monkeypatch.delenv("TRICKLE_WAREHOUSE", raising=False)
    with pytest.raises(ProjectError, match="no warehouse"):
        define_project("p", stream_tables=[{"name": "s.a", "query": "SELECT 1"}])
    with pytest.raises(ProjectError, match="declared twice"):
        project({"name": "s.a", "query": "SELECT 1"}, {"name": "S.A", "query": "SELECT 2"})
    with pytest.raises(ProjectError, match="unknown key"):
        project({"name": "s.a", "query": "SELECT 1"}, airflow={"dagid": "x"})
    file = tmp_path / "p.yaml"
    file.write_text("project: [unclosed")
    with pytest.raises(ProjectError, match="not valid YAML"):
        load_project(file)
    with pytest.raises(ProjectError, match="does not exist"):
        load_project(tmp_path / "nope.yaml")


def test_yaml_and_python_forms_are_equivalent(tmp_path):
    data = {"project": "p", "warehouse": "wh", "sources": ["s.src"],
            "stream_tables": [{"name": "s.a", "query": "SELECT x FROM s.src", "schedule": "30s"},
                              {"name": "s.b", "query": "SELECT x FROM s.a", "schedule": None}]}
    file = tmp_path / "p.yaml"
    file.write_text(yaml.safe_dump(data))
    from_yaml = load_project(file)
    from_python = define_project(**{k: v for k, v in data.items() if k != "project"}, project="p", base_dir=tmp_path)
    assert from_yaml.stream_tables == from_python.stream_tables
    assert from_yaml.warehouse == from_python.warehouse == str(tmp_path / "wh")  # relative to the file
    assert from_yaml.periods["s.b"] is None and from_yaml.freshness_target("s.b") is None


def test_diamond_is_one_unit_only_when_atomic():
    tables = [{"name": "s.b", "query": "SELECT * FROM s.a"}, {"name": "s.c", "query": "SELECT * FROM s.a"},
              {"name": "s.d", "query": "SELECT * FROM s.b JOIN s.c USING (k)"}]
    assert not [u for u in project(*tables).units if u.is_group]  # default: none
    tables[2]["diamond_consistency"] = "atomic"
    assert [u.members for u in project(*tables).units if u.is_group] == [("s.b", "s.c", "s.d")]

"""The project file's shape: each hole a user hit has a clear error, and the published JSON Schema
says the same as the loader (no JVM)."""
from __future__ import annotations

import json
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import jsonschema
import pytest
import yaml

from airflow_trickle.errors import DefinitionError, InvalidScheduleError, ProjectError
from airflow_trickle.project import define_project, load_project
from airflow_trickle.project.file_model import json_schema

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "dags_example" / "shop" / "trickle.yaml"
SCHEMA_FILE = ROOT / "docs" / "project-file.schema.json"
TABLE = {"name": "s.t", "query": "SELECT k FROM s.src"}


def project(**keys):
    keys.setdefault("warehouse", "/wh")
    keys.setdefault("stream_tables", [dict(TABLE)])
    return define_project("p", **keys)


def example_data() -> dict:
    return yaml.safe_load(EXAMPLE.read_text())


#: Each hole of the loader before the file had a model: the key, the bad value, what the error says.
HOLES = [
    ({"airflow": {"tags": "airflow_trickle"}}, r"airflow\.tags must be a list of tags.*not 'airflow_trickle'"),
    ({"airflow": {"deadline": "no"}}, r"airflow\.deadline must be true or false, not 'no'"),
    ({"airflow": {"retries": "three"}}, r"airflow\.retries must be a whole number.*not 'three'"),
    ({"airflow": {"schedule": "0 9 * * * *"}}, r"airflow\.schedule must be .*five-field cron.*'0 9 \* \* \* \*'"),
    ({"stream_tables": [{**TABLE, "schedule": "0 9 * * * *"}]},
     r"stream table 's\.t': schedule must be .*five-field cron"),
    ({"defaults": {"schedule": "*/5 * * * * *"}}, r"defaults\.schedule must be .*five-field cron"),
    ({"settings": {"cdc_mode": "snapshto"}}, r"settings\.cdc_mode must be 'auto', 'cdf' or 'snapshot', not 'snapshto'"),
    ({"settings": {"default_refresh_mode": "BOGUS"}},
     r"settings\.default_refresh_mode must be 'DIFFERENTIAL', 'FULL' or 'AUTO', not 'BOGUS'"),
    ({"settings": {"shuffle_partitions": "4"}}, r"settings\.shuffle_partitions must be a valid integer"),
    ({"deploy": {"on_change": "yolo"}}, r"deploy\.on_change must be 'apply' or 'stop'"),
    ({"stream_tables": [{**TABLE, "refresh_mode": "sometimes"}]}, r"stream table 's\.t': refresh_mode must be"),
]


@pytest.mark.parametrize("keys, message", HOLES)
def test_each_hole_in_the_project_file_is_a_clear_error_naming_the_key(keys, message):
    with pytest.raises(ProjectError, match=message):
        project(**keys)


@pytest.mark.parametrize("keys, message", HOLES)
def test_the_json_schema_refuses_each_hole_too(keys, message):
    data = {**example_data(), **keys}
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(data, json_schema())


def test_a_six_field_cron_is_refused_wherever_a_schedule_is_parsed():
    from airflow_trickle.schedule import parse_schedule

    with pytest.raises(InvalidScheduleError, match="six fields.*five fields"):
        parse_schedule("0 9 * * * *", stream_table="s.t")
    assert parse_schedule("0 9 * * *").cron == "0 9 * * *"


def test_settings_default_schedule_and_refresh_mode_are_honoured_and_defaults_beat_them():
    p = project(settings={"default_schedule": "7m", "default_refresh_mode": "full"},
                stream_tables=[dict(TABLE), {"name": "s.u", "query": "SELECT k FROM s.src", "refresh_mode": "AUTO"}])
    assert p.stream_tables["s.t"].schedule == "7m" and str(p.stream_tables["s.t"].refresh_mode) == "FULL"
    assert str(p.stream_tables["s.u"].refresh_mode) == "AUTO"
    assert p.config().default_schedule == "7m"
    p = project(settings={"default_schedule": "7m"}, defaults={"schedule": "3m"})
    assert p.stream_tables["s.t"].schedule == "3m"
    with pytest.raises(InvalidScheduleError, match="never"):
        project(settings={"default_schedule": "never"})


def test_per_table_options_are_accepted_with_the_apis_validation():
    p = project(stream_tables=[{**TABLE, "options": {"strict": True, "cluster_by": ["k"],
                                                     "differential_max_change_ratio": 0.5}}])
    spec = p.stream_tables["s.t"]
    assert spec.table_options.is_strict and spec.cluster_by == ("k",)
    assert spec.options()["differential_max_change_ratio"] == 0.5
    # the job spec carries them to the refresh job unchanged
    from airflow_trickle.project import StreamTableSpec

    assert StreamTableSpec.from_json(spec.to_json()) == spec
    with pytest.raises(DefinitionError, match="stream table 's.t': unknown option 'stirct'"):
        project(stream_tables=[{**TABLE, "options": {"stirct": True}}])
    with pytest.raises(DefinitionError, match="option 'strict' must be true or false"):
        project(stream_tables=[{**TABLE, "options": {"strict": "sometimes"}}])
    with pytest.raises(ProjectError, match="'cluster_by' or 'options.cluster_by', not both"):
        project(stream_tables=[{**TABLE, "cluster_by": ["k"], "options": {"cluster_by": ["k"]}}])


def test_the_deploy_section_is_read():
    assert project().deploy.on_change == "apply" and not project().deploy.prune
    p = project(deploy={"on_change": "stop", "prune": True})
    assert p.deploy.on_change == "stop" and p.deploy.prune


def test_mistakes_in_several_tables_and_sections_are_reported_together():
    from airflow_trickle.errors import ProjectErrors

    with pytest.raises(ProjectErrors) as refused:
        project(stream_tables=[{**TABLE, "schedul": "5m"}, {"name": "s.u", "query": "SELEC k FROM s.src"},
                               {"name": "s.v", "query": "SELECT 1 FROM s.src", "freshness": 10}])
    messages = [str(e) for e in refused.value.errors]
    assert any("s.t" in m and "unknown key 'schedul'" in m for m in messages)
    assert any("s.u" in m for m in messages) and any("s.v" in m and "freshness" in m for m in messages)


def test_the_published_schema_is_the_loaders_and_validates_the_example():
    assert json.loads(SCHEMA_FILE.read_text()) == json_schema(), \
        "docs/project-file.schema.json is stale: run `trickle schema > docs/project-file.schema.json`"
    jsonschema.validate(example_data(), json_schema())
    printed = subprocess.run([sys.executable, "-m", "airflow_trickle.cli", "schema"], capture_output=True, text=True,
                             check=True).stdout
    assert json.loads(printed) == json_schema()


def test_the_example_still_loads_with_its_tags_and_start_date(monkeypatch):
    monkeypatch.setenv("TRICKLE_WAREHOUSE", "/wh")
    p = load_project(EXAMPLE)
    assert p.airflow.tags == ("airflow_trickle", "example") and p.file == str(EXAMPLE.resolve())
    # YAML reads an unquoted date as a date: the loader takes it as the text Airflow wants
    p = project(airflow={"start_date": __import__("datetime").date(2024, 1, 1), "retry_delay": "1m"})
    assert p.airflow.start_date == "2024-01-01" and p.airflow.retry_delay == timedelta(minutes=1)


def test_trickle_plan_offline_reads_the_file_and_the_catalog_without_a_jvm_or_a_new_catalog(tmp_path):
    warehouse = tmp_path / "wh"
    warehouse.mkdir()
    file = tmp_path / "trickle.yaml"
    file.write_text(yaml.safe_dump({"project": "p", "warehouse": str(warehouse), "stream_tables": [
        TABLE, {"name": "s.u", "query": "SELECT k, COUNT(*) AS n FROM s.t GROUP BY k", "schedule": "5m"}]}))
    code = ("import json, sys\n"
            "from airflow_trickle.cli import main\n"
            f"main(['plan', {str(file)!r}, '--offline', '--json'])\n"
            "print(json.dumps(sorted(m for m in ('pyspark', 'py4j') if m in sys.modules)))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    plan, imported = done.stdout.rsplit("\n", 2)[0], done.stdout.rsplit("\n", 2)[1]
    assert [(t["name"], t["change"]) for t in json.loads(plan)["tables"]] == [("s.t", "CREATE"), ("s.u", "CREATE")]
    assert json.loads(imported) == [] and not (warehouse / "_trickle").exists()
    text = subprocess.run([sys.executable, "-m", "airflow_trickle.cli", "plan", str(file), "--offline"],
                          capture_output=True, text=True, check=True).stdout
    assert text.splitlines() == ["project p: 2 stream tables, none registered yet", "create    s.t", "create    s.u"]

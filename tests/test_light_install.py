"""Airflow's own components without the engine: a scheduler, DAG processor, API server or
triggerer installs ``airflow-trickle`` without its ``spark`` extra (no pyspark, delta-spark,
pandas or numpy).  In a process where those cannot be imported, the example's DAG parses and
builds its tasks, the commit watcher reads a Delta log and fires, and a refresh says which
extra it needs -- and none of the engine's modules was loaded on the way."""
from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

#: The engine's packages, made unimportable in the child (as if the extra were not installed).
SCRIPT = textwrap.dedent("""
    import importlib.abc, json, sys

    ENGINE = ("pyspark", "delta", "pandas", "numpy")

    class NotInstalled(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path, target=None):
            if name.split(".")[0] in ENGINE:
                raise ModuleNotFoundError(f"No module named {name!r}", name=name)

    sys.meta_path.insert(0, NotInstalled())
    import asyncio, os
    from pathlib import Path

    from airflow.dag_processing.dagbag import DagBag

    from airflow_trickle.errors import TrickleError
    from tests.test_on_commit import _catalog_with_reader, _events, _source, _trigger

    tmp = Path(sys.argv[1])
    found = {}
    bag = DagBag(dag_folder=str(Path(sys.argv[2]) / "dags_example"))
    found["import_errors"] = {k: str(v) for k, v in bag.import_errors.items()}
    dag = bag.dags["trickle_shop"]
    found["tasks"] = sorted(t.task_id for t in dag.tasks)
    source = tmp / "wh" / "s" / "src"
    for _ in range(2):
        _source(source)
    _catalog_with_reader(tmp / "wh", source, frontier=0)

    async def nothing():
        return

    ((_, event),) = _events(_trigger(tmp / "wh"), nothing, until=1)
    found["event"] = [event["after_version"], event["version"]]
    try:
        from airflow_trickle import Trickle
    except TrickleError as err:
        found["api"] = str(err)
    found["loaded"] = sorted({m.split(".")[0] for m in sys.modules} & set(ENGINE))
    from airflow_trickle.operators.refresh import StreamTableRefreshOperator

    try:
        StreamTableRefreshOperator._execute(dag.get_task("shop.order_lines"), {})
    except TrickleError as err:
        found["refresh"] = str(err)
    print("RESULT " + json.dumps(found))
""")


def test_airflow_s_components_work_without_the_engine(tmp_path):
    env = {"PATH": "/usr/bin:/bin", "AIRFLOW_HOME": str(tmp_path / "airflow"), "PYTHONPATH": str(ROOT),
           "TRICKLE_WAREHOUSE": str(tmp_path / "example-wh"), "TRICKLE_DAG_DEADLINES": "off"}
    done = subprocess.run([sys.executable, "-c", SCRIPT, str(tmp_path), str(ROOT)], capture_output=True, text=True,
                          timeout=300, env=env, cwd=tmp_path)
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    assert done.returncode == 0 and lines, done.stdout[-3000:] + done.stderr[-3000:]
    found = json.loads(lines[0].removeprefix("RESULT "))
    assert found["import_errors"] == {}
    assert found["tasks"] == ["plan", "shop.atomic__region_report", "shop.customer_totals", "shop.order_lines",
                              "shop.top_customers"]
    assert found["event"] == [0, 1]  # the watcher saw the commit the reader has not consumed
    for what in ("api", "refresh"):
        assert "needs Spark, and this environment lacks pyspark, delta, pandas, numpy" in found[what], found
        assert "pip install 'airflow-trickle[spark]'" in found[what], found
    assert found["loaded"] == []

"""The example, end to end: Airflow (SQLite) runs the generated DAG; each refresh is a spark-submit job.

    python dags_example/run_example.py [--warehouse DIR] [--report FILE]

1. migrates a throw-away Airflow metadata DB and creates the sources ``shop.orders`` and
   ``shop.customers`` in the warehouse;
2. runs the DAG of ``shop/trickle.yaml`` (``trickle_shop.py`` in this folder) with
   ``dag.test()``: the first run creates and populates the six stream tables;
3. changes the sources and runs it again: every stream table refreshes DIFFERENTIALLY;
4. changes the sources again and triggers a manual run whose form asks for a FULL refresh of
   ``shop.order_lines`` and ``shop.top_customers``: those two refresh (top_customers although
   its upstream, not selected, is skipped), the others are skipped;
5. tries a run for an unknown table (refused), then checks every stream table against its
   defining query at its frontier versions and prints what it holds.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
DAG_ID = "trickle_shop"


def prepare_airflow(warehouse: str, home: str) -> None:
    """Environment for an embedded Airflow: SQLite metadata DB, this folder as the dags folder."""
    os.environ.update({
        "AIRFLOW_HOME": home,
        "AIRFLOW__CORE__DAGS_FOLDER": str(HERE),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{home}/airflow.db",
        "TRICKLE_WAREHOUSE": warehouse,
        # dag.test() of Airflow 3.3.2 fails after a run whose DAG carries deadline=; see docs/airflow.md
        "TRICKLE_DAG_DEADLINES": "off",
    })
    os.environ.setdefault("AIRFLOW_CONN_SPARK_LOCAL", json.dumps({"conn_type": "spark", "host": "local[2]"}))
    Path(home).mkdir(parents=True, exist_ok=True)
    subprocess.run([sys.executable, "-m", "airflow", "db", "migrate"], check=True, stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL)


def create_sources(tr) -> None:
    tr.sql("CREATE DATABASE IF NOT EXISTS shop")
    tr.sql("CREATE TABLE shop.customers (id INT, name STRING, region STRING) USING delta")
    tr.sql("CREATE TABLE shop.orders (id INT, customer_id INT, amount DECIMAL(10,2)) USING delta")
    tr.sql("INSERT INTO shop.customers VALUES (1, 'Ada', 'north'), (2, 'Brian', 'south'), (3, 'Chen', 'north'), "
           "(4, 'Dara', NULL)")
    tr.sql("INSERT INTO shop.orders VALUES (1, 1, 120.00), (2, 1, 35.50), (3, 2, 999.99), (4, 3, 10.00), "
           "(5, 4, 150.00), (6, 2, 35.50), (6, 2, 35.50)")


def run_dag(dag, title: str, conf: dict | None = None) -> dict:
    """One ``dag.test()`` run; returns its state and every task's state."""
    run = dag.test(run_conf=conf)
    from airflow.models import DagRun
    from airflow.utils.session import create_session

    with create_session() as session:
        run = session.query(DagRun).filter_by(dag_id=dag.dag_id, run_id=run.run_id).one()
        tasks = {ti.task_id: str(ti.state) for ti in run.get_task_instances(session=session)}
        state = str(run.state)
    print(f"\n== {title}: run {state} ==")
    for task_id, task_state in sorted(tasks.items()):
        print(f"  {task_id:<34} {task_state}")
    return {"title": title, "state": state, "tasks": tasks}


def asset_events() -> list[dict]:
    """The Asset events the refresh tasks emitted (newest first), from the metadata DB."""
    from airflow.models.asset import AssetEvent, AssetModel
    from airflow.utils.session import create_session

    with create_session() as session:
        rows = (session.query(AssetEvent, AssetModel).join(AssetModel, AssetEvent.asset_id == AssetModel.id)
                .order_by(AssetEvent.id.desc()).all())
        return [{"asset": model.uri, "task": event.source_task_id, "run": event.source_run_id,
                 "extra": dict(event.extra or {})} for event, model in rows]


def check_tables(tr) -> dict:
    """Every stream table against its defining query at its frontier versions (multiset equality)."""
    from airflow_trickle.refresh.engine import pinned_query_sql

    report = {}
    for st in tr.catalog.list():
        stored = tr.read(st.name)
        expected = tr.spark.sql(pinned_query_sql(tr, st, st.frontier))
        matches = stored.exceptAll(expected).count() == 0 and expected.exceptAll(stored).count() == 0
        rows = sorted((json.dumps(r.asDict(), default=str, sort_keys=True) for r in stored.collect()))
        history = tr.history(st.name, limit=12)
        report[st.name] = {"matches_query": matches, "rows": [json.loads(r) for r in rows],
                           "last_actions": [h.action for h in history if h.status != "ALERT"][:4],
                           "alerts": [h.reason for h in history if h.status == "ALERT"]}
    return report


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--warehouse", default=None, help="warehouse directory (default: a new temporary one)")
    parser.add_argument("--report", default=None, help="write a JSON report of the runs and tables here")
    args = parser.parse_args()
    warehouse = os.path.abspath(args.warehouse or tempfile.mkdtemp(prefix="trickle-example-"))
    prepare_airflow(warehouse, os.path.join(warehouse, "_airflow"))
    print(f"warehouse: {warehouse}")

    from airflow.dag_processing.dagbag import DagBag

    from airflow_trickle import Trickle

    tr = Trickle(warehouse, spark_master="local[2]", shuffle_partitions=2)
    create_sources(tr)
    dagbag = DagBag(dag_folder=str(HERE))
    if dagbag.import_errors:
        print(dagbag.import_errors, file=sys.stderr)
        return 1
    dag = dagbag.get_dag(DAG_ID)
    runs = [run_dag(dag, "first run: create and populate")]

    tr.sql("INSERT INTO shop.orders VALUES (7, 3, 400.00), (8, NULL, 75.00)")
    tr.sql("UPDATE shop.orders SET amount = 20.00 WHERE id = 1")
    tr.sql("DELETE FROM shop.orders WHERE id = 4")
    tr.sql("UPDATE shop.customers SET region = 'west' WHERE id = 3")
    runs.append(run_dag(dag, "second run: differential refreshes"))

    tr.sql("INSERT INTO shop.orders VALUES (9, 1, 500.00)")
    runs.append(run_dag(dag, "manual run: tables = [shop.order_lines, shop.top_customers], mode = FULL",
                        {"tables": ["shop.order_lines", "shop.top_customers"], "mode": "FULL"}))

    refused = None
    try:
        dag.test(run_conf={"tables": ["shop.no_such_table"]})
    except Exception as err:  # noqa: BLE001 - the refusal is what we show
        refused = f"{type(err).__name__}: {str(err).splitlines()[0]}"
    print(f"\n== a run for an unknown table: {refused or 'NOT refused'} ==")

    events = asset_events()
    print(f"\n== {len(events)} asset events; the newest ==")
    for event in events[:4]:
        print(f"  {event['asset']:<34} from {event['task']:<30} {event['extra']}")
    tables = check_tables(tr)
    for name, info in tables.items():
        print(f"\n{name}: {'equals' if info['matches_query'] else 'DIFFERS FROM'} its query at its frontier; "
              f"last actions {info['last_actions']}")
        for row in info["rows"]:
            print("  ", row)
        for alert in info["alerts"]:
            print("   ALERT:", alert)
    if args.report:
        Path(args.report).write_text(json.dumps({"runs": runs, "refused": refused, "tables": tables,
                                                 "asset_events": events}, indent=1, default=str))
    ok = all(r["state"].endswith("success") for r in runs) and refused and all(
        t["matches_query"] for t in tables.values())
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

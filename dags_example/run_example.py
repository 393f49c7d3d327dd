"""The example, end to end: Airflow (SQLite) runs the generated DAG against the Spark service.

    python dags_example/run_example.py [--warehouse DIR] [--report FILE] [--spark connect|submit] [--serve] [--s3]
                                     [--spark-conf JSON]

With ``--s3`` (or ``TRICKLE_EXAMPLE_S3=1``) the warehouse is ``s3://trickle/warehouse`` on an
s3proxy server the example starts on 127.0.0.1 and stops at the end
(``docs/object-storage.md``); Airflow's own files then stay in a local folder.

1. starts the Spark service for the warehouse (``trickle serve``; with ``--spark submit``,
   every refresh is a spark-submit job instead), migrates a throw-away Airflow metadata DB,
   starts Airflow's API server on it (the UI, and the REST API through which each refresh task
   notes its outcome on its task instance) and creates the sources ``shop.orders`` and
   ``shop.customers`` in the warehouse;
2. runs the DAG of ``shop/trickle.yaml`` (``trickle_shop.py`` in this folder) with
   ``dag.test()``: the first run creates and populates the six stream tables;
3. changes the sources and runs it again: every stream table refreshes DIFFERENTIALLY;
4. changes the sources again and triggers a manual run whose form asks for a FULL refresh of
   ``shop.order_lines`` and ``shop.top_customers``: those two refresh (top_customers although
   its upstream, not selected, is skipped), the others are skipped;
5. tries a run for an unknown table (refused), edits top_customers' query in (its copy of) the
   project file and runs again: the plan task notes the change, the table's task ALTERs it in
   place (no drop, no gap) before refreshing; then checks every stream table against its
   defining query at its frontier versions, prints what it holds, and stops the service and
   the API server -- with ``--serve``, only at Ctrl-C: the UI stays up to look at the runs.

The project names the Airflow connection ``trickle_spark``; its type decides how refresh tasks
run (``spark_connect``: in the task process, against the service; ``spark``: spark-submit).
Its ``notes_connection``, ``trickle_notes``, is the API server's address and a user allowed to
write notes.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from airflow_trickle.output import output_to

HERE = Path(__file__).resolve().parent
DAG_ID = "trickle_shop"
STARTED = time.monotonic()
#: Users of the example's Airflow (the simple auth manager): you, in the UI, and the note writer.
UI_USER, NOTES_USER = ("admin", "admin"), ("trickle_notes", "trickle-notes-password")


def step(text: str) -> None:
    print(f"[{time.monotonic() - STARTED:5.0f} s] {text}", flush=True)


def runs_log(home: str) -> str:
    return str(Path(home) / "runs.log")


def start_spark(warehouse: str, how: str, spark_conf: dict[str, str] | None = None):
    """The Spark the example uses, and the Airflow connection its refresh tasks use.

    ``connect``: the Spark service (one JVM for the whole example; this process and every task
    are Spark Connect clients).  ``submit``: an embedded session here, spark-submit per task.
    ``spark_conf``: extra Spark settings of the service or the embedded session.
    Returns ``(Trickle, service or None)``.
    """
    from airflow_trickle import Trickle

    if how == "submit":
        # the provider runs `spark-submit` from PATH: the one pyspark installs beside this Python
        os.environ["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"
        os.environ["AIRFLOW_CONN_TRICKLE_SPARK"] = json.dumps({"conn_type": "spark", "host": "local[2]"})
        return Trickle(warehouse, spark_master="local[2]", shuffle_partitions=2, spark_conf=spark_conf or {}), None
    from airflow_trickle.spark.service import start_detached

    started = time.monotonic()
    service = start_detached(warehouse, port=0, master="local[2]",
                             settings={"shuffle_partitions": 2, "spark_conf": spark_conf or {}}, timeout=300)
    step(f"Spark service at {service.address} (ready in {time.monotonic() - started:.0f} s)")
    host, port = service.host_port
    os.environ["AIRFLOW_CONN_TRICKLE_SPARK"] = json.dumps({"conn_type": "spark_connect", "host": host, "port": port})
    return Trickle(warehouse, remote=service.address, shuffle_partitions=2), service


def prepare_airflow(warehouse: str, home: str) -> None:
    """Environment for an embedded Airflow: SQLite metadata DB, a copy of this folder's DAG file
    and project as the dags folder (the example edits its copy of the project)."""
    dags = Path(home) / "dags"
    shutil.copytree(HERE / "shop", dags / "shop", dirs_exist_ok=True)
    shutil.copy(HERE / "trickle_shop.py", dags / "trickle_shop.py")
    os.environ.update({
        "AIRFLOW_HOME": home,
        "AIRFLOW__CORE__DAGS_FOLDER": str(dags),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{home}/airflow.db",
        "TRICKLE_WAREHOUSE": warehouse,
        # dag.test() of Airflow 3.3.2 fails after a run whose DAG carries deadline=; see docs/airflow.md
        "TRICKLE_DAG_DEADLINES": "off",
        # OpenLineage (with airflow-trickle[openlineage]): every task's events as JSON lines, a
        # file the report reads back; point a Marquez at it instead with type "http" (README)
        "AIRFLOW__OPENLINEAGE__TRANSPORT": json.dumps({"type": "file", "log_file_path": lineage_file(home),
                                                       "append": True}),
        "AIRFLOW__OPENLINEAGE__NAMESPACE": "trickle_example",
    })
    Path(home).mkdir(parents=True, exist_ok=True)
    subprocess.run([sys.executable, "-m", "airflow", "db", "migrate"], check=True, stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL)


def lineage_file(home: str) -> str:
    return str(Path(home) / "openlineage.jsonl")


def lineage_events(home: str) -> list[dict]:
    """The OpenLineage events the refresh tasks emitted (COMPLETE ones), as the report keeps them:
    the job, its inputs and outputs with their versions, schema and column lineage."""
    path = Path(lineage_file(home))
    if not path.exists():
        return []
    events = []
    for line in path.read_text().splitlines():
        event = json.loads(line)
        if event.get("eventType") != "COMPLETE" or not event.get("outputs"):
            continue

        def dataset(d: dict) -> dict:
            facets = d.get("facets") or {}
            return {"namespace": d["namespace"], "name": d["name"],
                    "version": (facets.get("version") or {}).get("datasetVersion"),
                    "fields": [f["name"] for f in (facets.get("schema") or {}).get("fields", [])],
                    "columns": {c: [(i["name"], i["field"]) for i in spec.get("inputFields", [])]
                                for c, spec in ((facets.get("columnLineage") or {}).get("fields") or {}).items()}}

        events.append({"job": event["job"]["name"], "sql": ((event["job"].get("facets") or {}).get("sql") or {}).get("query"),
                       "inputs": [dataset(d) for d in event.get("inputs") or []],
                       "outputs": [dataset(d) for d in event["outputs"]],
                       "refreshes": ((event["run"].get("facets") or {}).get("airflow_trickle") or {}).get("refreshes")})
    return events


def start_api_server(home: str, warehouse: str) -> tuple[subprocess.Popen | None, str]:
    """Airflow's API server on the example's metadata DB: the UI, the Stream tables page, and
    the REST API the refresh tasks write their notes through (connection ``trickle_notes``).

    Returns the server (None if it did not start: the example then runs without notes) and its URL.
    """
    from airflow_trickle.spark.service import free_port

    port = free_port()
    url = f"http://127.0.0.1:{port}"
    passwords = Path(home) / "passwords.json"
    passwords.write_text(json.dumps(dict([UI_USER, NOTES_USER])))
    os.environ.update({
        "AIRFLOW__API_AUTH__JWT_SECRET": "the-example-s-own-secret-long-enough-for-hs512-" * 2,
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": f"{UI_USER[0]}:admin,{NOTES_USER[0]}:op",
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE": str(passwords),
        "AIRFLOW__AIRFLOW_TRICKLE__WAREHOUSES": warehouse,
        "AIRFLOW_CONN_TRICKLE_NOTES": json.dumps({"conn_type": "http", "host": "127.0.0.1", "port": port,
                                                  "login": NOTES_USER[0], "password": NOTES_USER[1]}),
    })
    with open(Path(home) / "api-server.log", "wb") as log:
        server = subprocess.Popen([sys.executable, "-m", "airflow", "api-server", "--port", str(port)],
                                  stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                  start_new_session=True)
    import urllib.request

    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and server.poll() is None:
        try:
            urllib.request.urlopen(f"{url}/api/v2/monitor/health", timeout=2)
            return server, url
        except OSError:
            time.sleep(0.5)
    stop_api_server(server)
    print(f"Airflow's API server did not start (see {home}/api-server.log): no task notes", file=sys.stderr)
    return None, url


def stop_api_server(server: subprocess.Popen | None) -> None:
    if server is None or server.poll() is not None:
        return
    os.killpg(server.pid, signal.SIGTERM)
    try:
        server.wait(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(server.pid, signal.SIGKILL)


def create_sources(tr) -> None:
    tr.sql("CREATE DATABASE IF NOT EXISTS shop")
    tr.sql("CREATE TABLE shop.customers (id INT, name STRING, region STRING) USING delta")
    tr.sql("CREATE TABLE shop.orders (id INT, customer_id INT, amount DECIMAL(10,2)) USING delta")
    tr.sql("INSERT INTO shop.customers VALUES (1, 'Ada', 'north'), (2, 'Brian', 'south'), (3, 'Chen', 'north'), "
           "(4, 'Dara', NULL)")
    tr.sql("INSERT INTO shop.orders VALUES (1, 1, 120.00), (2, 1, 35.50), (3, 2, 999.99), (4, 3, 10.00), "
           "(5, 4, 150.00), (6, 2, 35.50), (6, 2, 35.50)")


def run_dag(dag, title: str, conf: dict | None = None, *, quiet: bool = False) -> dict:
    """One ``dag.test()`` run, Airflow's output into the runs log; prints its summary (one line
    per task, with the note it left; ``quiet``: none); returns its state, every task's state,
    and its wall time."""
    started = time.monotonic()
    with output_to(runs_log(os.environ["AIRFLOW_HOME"])):  # Airflow's task logs, not the terminal
        run = dag.test(run_conf=conf)
    seconds = round(time.monotonic() - started, 1)
    from airflow.models import DagRun
    from airflow.utils.session import create_session

    with create_session() as session:
        run = session.query(DagRun).filter_by(dag_id=dag.dag_id, run_id=run.run_id).one()
        instances = run.get_task_instances(session=session)
        tasks = {ti.task_id: str(ti.state) for ti in instances}
        notes = {ti.task_id: ti.note for ti in instances if ti.note}
        durations = {ti.task_id: round(ti.duration, 2) for ti in instances if ti.duration is not None}
        state, run_note = str(run.state), run.note
    if not quiet:
        print(f"\n== {title}: run {state} in {seconds} s ==" + (f"\n   note: {run_note}" if run_note else ""))
        for task_id, task_state in sorted(tasks.items()):
            print(f"  {task_id:<34} {task_state:<10} {notes.get(task_id, '')}")
    return {"title": title, "state": state, "tasks": tasks, "seconds": seconds, "run_id": run.run_id,
            "task_seconds": durations, "notes": notes, "run_note": run_note}


def refusal(run: dict, conf: dict) -> str | None:
    """The plan task's refusal, when it failed ``run`` before any refresh task ran."""
    from airflow_trickle.errors import TrickleError
    from airflow_trickle.project.planning import select
    from airflow_trickle.project import load_project

    refreshes = {task: state for task, state in run["tasks"].items() if task != "plan"}
    if not (run["state"].endswith("failed") and run["tasks"]["plan"].endswith("failed")
            and all(state.endswith("upstream_failed") for state in refreshes.values())):
        return None
    try:  # the sentence the plan task logged
        select(load_project(HERE / "shop" / "trickle.yaml"), conf, manual=True)
    except TrickleError as err:
        return f"plan failed the run: refused: {err}"
    return None


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
    from airflow_trickle.refresh.full import pinned_query_sql

    report = {}
    for st in tr.catalog.list():
        stored = tr.read(st.name)
        expected = tr.spark.sql(pinned_query_sql(tr, st, st.frontier))
        matches = stored.exceptAll(expected).count() == 0 and expected.exceptAll(stored).count() == 0
        rows = sorted((json.dumps(r.asDict(), default=str, sort_keys=True) for r in stored.collect()))
        history = tr.history(st.name, limit=12)
        refreshes = [{"action": h.action, "initiated_by": h.initiated_by, "phases": h.phases,
                      "seconds": (h.end_time - h.start_time).total_seconds() if h.end_time and h.start_time else None}
                     for h in history if h.status != "ALERT"]
        report[st.name] = {"matches_query": matches, "rows": [json.loads(r) for r in rows], "refreshes": refreshes,
                           "location": st.location, "frontier": st.frontier,
                           "last_actions": [h.action for h in history if h.status != "ALERT"][:4],
                           "alerts": [h.reason for h in history if h.status == "ALERT"]}
    return report


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--warehouse", default=None, help="warehouse directory (default: a new temporary one)")
    parser.add_argument("--report", default=None, help="write a JSON report of the runs and tables here")
    parser.add_argument("--spark", choices=("connect", "submit"), default="connect",
                        help="refresh tasks over the Spark service (default) or as spark-submit jobs")
    parser.add_argument("--serve", action="store_true",
                        help="keep serving Airflow's UI after the example, until Ctrl-C")
    parser.add_argument("--first-run-only", action="store_true",
                        help="only the first DAG run (create and populate), then the checks")
    parser.add_argument("--s3", action="store_true", default=os.environ.get("TRICKLE_EXAMPLE_S3", "") not in ("", "0"),
                        help="the warehouse on a local s3proxy the example starts and stops")
    parser.add_argument("--spark-conf", type=json.loads, default={}, metavar="JSON",
                        help="extra Spark settings for the example's Spark, a JSON object (the test suite "
                             "passes its settings for tables of a few rows)")
    args = parser.parse_args()
    s3 = None
    if args.s3:
        sys.path.insert(0, str(HERE.parent))
        from tests.helpers.s3proxy import S3Server

        # Out again before Airflow loads its plugins: a checkout's root on sys.path shows Airflow
        # the checkout's airflow_trickle.egg-info, a second copy of the distribution, and the
        # Task SDK stops registering plugins at a name met twice -- the OpenLineage provider's,
        # listed after ours, then hears of no task.
        sys.path.remove(str(HERE.parent))

        local = Path(args.warehouse or tempfile.mkdtemp(prefix="trickle-example-s3-")).resolve()
        s3 = S3Server(local / "s3proxy").start()
        warehouse = s3.warehouse
        # how every part of the example reaches the bucket: the service, the tasks, the UI page
        os.environ["TRICKLE_STORAGE_OPTIONS"] = json.dumps(s3.storage_options)
        home = str(local / "_airflow")
        step(f"s3proxy at {s3.endpoint}, bucket {s3.bucket}")
    else:
        warehouse = os.path.abspath(args.warehouse or tempfile.mkdtemp(prefix="trickle-example-"))
        home = os.path.join(warehouse, "_airflow")
    print(f"warehouse: {warehouse}")
    try:
        tr, service = start_spark(warehouse, args.spark, args.spark_conf)
    except BaseException:
        if s3 is not None:
            s3.stop()
        raise
    server = None
    try:
        prepare_airflow(warehouse, home)
        server, url = start_api_server(home, warehouse)
        step(f"Airflow metadata DB ready; UI and REST API at {url} (user {UI_USER[0]}, password {UI_USER[1]})"
             if server else "Airflow metadata DB ready")
        code = run_example(tr, warehouse, args.report, first_run_only=args.first_run_only)
        if args.serve and server is not None:
            print(f"\nAirflow's UI: {url} (user {UI_USER[0]}, password {UI_USER[1]}); Ctrl-C stops it", flush=True)
            try:
                server.wait()
            except KeyboardInterrupt:  # the way to end --serve: stop everything, keep the exit code
                pass
        return code
    finally:
        tr.close()
        stop_api_server(server)
        if service is not None:
            from airflow_trickle.spark.service import stop_service

            stop_service(warehouse)
            step("Spark service stopped")
        if s3 is not None:
            s3.stop()
            step("s3proxy stopped")


def write_report(report: str, contents: dict) -> None:
    """The JSON report: ``contents`` and the OpenLineage events the runs' tasks wrote."""
    lineage = lineage_events(os.environ["AIRFLOW_HOME"])
    step(f"{len(lineage)} OpenLineage events read back")
    Path(report).write_text(json.dumps({**contents, "lineage": lineage}, indent=1, default=str))


def run_example(tr, warehouse: str, report: str | None, *, first_run_only: bool = False) -> int:
    from airflow.dag_processing.dagbag import DagBag

    create_sources(tr)
    step("sources created")
    dags = Path(os.environ["AIRFLOW__CORE__DAGS_FOLDER"])
    step(f"Airflow's own logs: {runs_log(os.environ['AIRFLOW_HOME'])}")
    with output_to(runs_log(os.environ["AIRFLOW_HOME"])):  # Airflow's task logs, not the terminal
        dagbag = DagBag(dag_folder=str(dags))
    if dagbag.import_errors:
        print(dagbag.import_errors, file=sys.stderr)
        return 1
    dag = dagbag.get_dag(DAG_ID)
    started = time.monotonic()
    runs = [run_dag(dag, "first run: create and populate")]
    if first_run_only:
        tables = check_tables(tr)
        step("stream tables checked against their queries")
        if report:
            write_report(report, {"runs": runs, "tables": tables})
        return 0 if runs[0]["state"].endswith("success") and all(t["matches_query"] for t in tables.values()) else 1

    tr.sql("INSERT INTO shop.orders VALUES (7, 3, 400.00), (8, NULL, 75.00)")
    tr.sql("UPDATE shop.orders SET amount = 20.00 WHERE id = 1")
    tr.sql("DELETE FROM shop.orders WHERE id = 4")
    tr.sql("UPDATE shop.customers SET region = 'west' WHERE id = 3")
    runs.append(run_dag(dag, "second run: differential refreshes"))

    tr.sql("INSERT INTO shop.orders VALUES (9, 1, 500.00)")
    runs.append(run_dag(dag, "manual run: tables = [shop.order_lines, shop.top_customers], mode = FULL",
                        {"tables": ["shop.order_lines", "shop.top_customers"], "mode": "FULL"}))

    bad = run_dag(dag, "a run for an unknown table", {"tables": ["shop.no_such_table"]}, quiet=True)
    refused = refusal(bad, {"tables": ["shop.no_such_table"]})
    print(f"\n== a run for an unknown table: {refused or 'NOT refused'} ==")

    before_edit = check_tables(tr)
    # a pull request edits a query in the project file: the next run ALTERs it in place
    project_file = dags / "shop" / "trickle.yaml"
    project_file.write_text(project_file.read_text().replace("WHERE total >= 200", "WHERE total >= 100"))
    with output_to(runs_log(os.environ["AIRFLOW_HOME"])):  # Airflow's task logs, not the terminal
        edited = DagBag(dag_folder=str(dags)).get_dag(DAG_ID)
    runs.append(run_dag(edited, "the project file edited (top_customers: total >= 100): ALTERed in place"))

    events = asset_events()
    print(f"\n== {len(events)} asset events; the newest ==")
    for event in events[:4]:
        print(f"  {event['asset']:<34} from {event['task']:<30} {event['extra']}")
    tables = check_tables(tr)
    step("stream tables checked against their queries")
    print()
    for name, info in tables.items():
        print(f"{name:<21} {'equals' if info['matches_query'] else 'DIFFERS FROM'} its query at its frontier "
              f"({len(info['rows'])} rows); newest refreshes {', '.join(info['last_actions'])}"
              + "".join(f"\n   ALERT: {alert}" for alert in info["alerts"]))
    print(f"\nfour DAG runs and the refusal in {time.monotonic() - started:.0f} s")
    if report:
        write_report(report, {"runs": runs, "refused": refused, "tables": tables, "before_edit": before_edit,
                              "asset_events": events})
    ok = all(r["state"].endswith("success") for r in runs) and refused and all(
        t["matches_query"] for t in [*tables.values(), *before_edit.values()])
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

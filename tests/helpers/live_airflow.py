"""A live Airflow -- API server, scheduler (LocalExecutor), DAG processor -- running a stream-table
DAG on its own ticks while a manual run is triggered; what happened, printed as JSON.

    python -m tests.helpers.live_airflow WORKDIR WAREHOUSE SPARK_CONNECT_ADDRESS DATABASE

``DATABASE.src`` must exist in the warehouse (the Spark service at the address serves it).

1. writes a project of two stream tables over ``DATABASE.src``, ``a`` and ``b``, both every ten
   minutes (the first scheduled run starts at once; the next would come after the test), whose
   tasks write their notes through the API server;
2. holds ``a``'s refresh lock, as a long refresh of ``a`` by another run would;
3. starts Airflow; the DAG is unpaused at creation, so the scheduler starts a scheduled run at
   once. Waits until that run's ``a`` task is running (waiting for the lock) and ``b`` is done;
4. triggers a manual FULL run of ``b`` through the REST API and waits for it to end;
5. releases the lock and waits for the scheduled run to end; prints the runs, their tasks and
   notes, and the lines of ``a``'s log that tell of the wait.

A separate process: Airflow reads its home and configuration once, at import.
"""
from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import requests

from airflow_trickle.refresh.lock import refresh_lock
from airflow_trickle.spark.service import free_port, host_port

DAG_ID = "trickle_live"
ADMIN, NOTER = ("admin", "an-admin-password"), ("noter", "a-noter-password")
PROJECT = """\
project: live
warehouse: {warehouse}
sources: [{db}.src]
defaults:
  schedule: 10m
  refresh_mode: DIFFERENTIAL
settings:
  differential_max_change_ratio: 1000.0
  differential_max_touched_ratio: 1000.0
  differential_max_time_ratio: 1000.0
spark:
  connection: trickle_spark
airflow:
  dag_id: {dag_id}
  notes_connection: trickle_notes
stream_tables:
  - name: {db}.a
    query: SELECT k, SUM(v) AS total FROM {db}.src GROUP BY k
  - name: {db}.b
    query: SELECT k, v FROM {db}.src WHERE v > 0
"""


class LiveAirflow:
    """Airflow's API server, scheduler and DAG processor, each a process group of its own."""

    def __init__(self, workdir: Path, warehouse: str, spark_address: str) -> None:
        self.home = workdir / "airflow"
        self.home.mkdir(parents=True)
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        passwords = self.home / "passwords.json"
        passwords.write_text(json.dumps(dict([ADMIN, NOTER])))
        host, port = host_port(spark_address)
        self.env = {
            **os.environ, "AIRFLOW_HOME": str(self.home), "AIRFLOW__CORE__DAGS_FOLDER": str(workdir / "dags"),
            "AIRFLOW__CORE__LOAD_EXAMPLES": "False", "AIRFLOW__CORE__EXECUTOR": "LocalExecutor",
            "AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION": "False",
            "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{self.home}/airflow.db",
            "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"{self.base}/execution/",
            "AIRFLOW__API__BASE_URL": self.base, "AIRFLOW__API__PORT": str(self.port),
            "AIRFLOW__API_AUTH__JWT_SECRET": "a-live-test-secret-long-enough-for-hs512-" * 2,
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": f"{ADMIN[0]}:admin,{NOTER[0]}:op",
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE": str(passwords),
            "AIRFLOW__SCHEDULER__SCHEDULER_HEARTBEAT_SEC": "1",
            # a task's calls to the API server (start, heartbeats, end) wait up to 5 s by default;
            # on two cores loaded by the suite's Spark JVMs the server's answers took longer (the
            # test's own login did), and a task whose start or heartbeats time out is killed or
            # left half-started -- Airflow's tolerance of a slow server, not what this test is about
            "AIRFLOW__WORKERS__EXECUTION_API_TIMEOUT": "60",
            "AIRFLOW__WORKERS__MAX_FAILED_HEARTBEATS": "10",
            "AIRFLOW_CONN_TRICKLE_SPARK": json.dumps({"conn_type": "spark_connect", "host": host, "port": port}),
            "AIRFLOW_CONN_TRICKLE_NOTES": json.dumps({"conn_type": "http", "host": "127.0.0.1", "port": self.port,
                                                      "login": NOTER[0], "password": NOTER[1]}),
            "TRICKLE_DAG_DEADLINES": "off",
        }
        self.processes: dict[str, subprocess.Popen] = {}
        self.session = requests.Session()

    def start(self) -> None:
        subprocess.run([sys.executable, "-m", "airflow", "db", "migrate"], check=True, env=self.env,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        for name, args in (("api-server", ["api-server", "--port", str(self.port)]), ("scheduler", ["scheduler"]),
                           ("dag-processor", ["dag-processor"])):
            with open(self.home / f"{name}.log", "wb") as log:
                self.processes[name] = subprocess.Popen(
                    [sys.executable, "-m", "airflow", *args], env=self.env, stdout=log, stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL, start_new_session=True)
        until(lambda: self._token(), 180, "the API server to answer")

    def stop(self) -> None:
        for process in self.processes.values():
            try:
                os.killpg(process.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        for process in self.processes.values():
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)

    def task_logs(self, run_id: str = "*", task_id: str = "*") -> list[Path]:
        """The log files of a task's tries (by default, of every task of every run)."""
        return sorted((self.home / "logs").glob(f"dag_id={DAG_ID}/run_id={run_id}/task_id={task_id}/*.log"))

    def task_log_lines(self, run_id: str, task_id: str, containing: str) -> list[str]:
        """The lines of the task's logs (every try) that contain ``containing``."""
        return [line for log in self.task_logs(run_id, task_id)
                for line in log.read_text(errors="replace").splitlines() if containing in line]

    def logs_tail(self, lines: int = 15) -> dict[str, str]:
        return {name: "\n".join((self.home / f"{name}.log").read_text(errors="replace").splitlines()[-lines:])
                for name in self.processes}

    def states(self) -> dict[str, dict]:
        """Every run and its task instances as Airflow's database holds them -- read from the
        database itself, so a failure report does not depend on a busy API server."""
        with sqlite3.connect(f"file:{self.home / 'airflow.db'}?mode=ro", uri=True, timeout=30) as db:
            runs = db.execute("SELECT run_id, run_type, state, start_date, end_date FROM dag_run ORDER BY id").fetchall()
            tasks = db.execute("SELECT run_id, task_id, state, try_number, start_date, end_date "
                               "FROM task_instance").fetchall()
        return {run_id: {"type": run_type, "state": state, "start": start, "end": end,
                         "tasks": {t: f"{s} (try {n}, {b} .. {e})" for r, t, s, n, b, e in tasks if r == run_id}}
                for run_id, run_type, state, start, end in runs}

    def task_log_problems(self, lines: int = 6) -> dict[str, list[str]]:
        """The last warning and error lines of every task log: why a task failed or was killed."""
        found = {}
        for log in self.task_logs():
            bad = [line[:400] for line in log.read_text(errors="replace").splitlines()
                   if '"level":"error"' in line or '"level":"warning"' in line]
            if bad:
                found[str(log.relative_to(self.home / "logs"))] = bad[-lines:]
        return found

    def _token(self) -> str | None:
        """A login token, or None while the API server is not answering yet (not listening, or
        listening but too busy to answer: on two loaded cores its first answer took over 5 s)."""
        try:
            response = self.session.post(f"{self.base}/auth/token", json=dict(zip(("username", "password"), ADMIN)),
                                         timeout=30)
        except (requests.ConnectionError, requests.Timeout):
            return None
        return response.json()["access_token"] if response.ok else None

    def api(self, method: str, path: str, **kwargs) -> dict:
        if "Authorization" not in self.session.headers:  # one login for every request
            self.session.headers["Authorization"] = f"Bearer {until(self._token, 180, 'a login token')}"
        response = self.session.request(method, f"{self.base}/api/v2{path}", timeout=30, **kwargs)
        response.raise_for_status()
        return response.json()

    def runs(self) -> list[dict]:
        return self.api("GET", f"/dags/{DAG_ID}/dagRuns", params={"order_by": "id"})["dag_runs"]

    def tasks(self, run_id: str) -> dict[str, dict]:
        found = self.api("GET", f"/dags/{DAG_ID}/dagRuns/{run_id}/taskInstances")["task_instances"]
        return {t["task_id"]: {k: t.get(k) for k in ("state", "start_date", "end_date", "note")} for t in found}


def until(check, seconds: float, what: str):
    """Poll ``check`` until it returns something true; raise naming ``what`` after ``seconds``."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        found = check()
        if found:
            return found
        time.sleep(1)
    raise TimeoutError(f"waited {seconds:.0f} s for {what}")


def main(workdir: str, warehouse: str, spark_address: str, db: str) -> None:
    work = Path(workdir)
    (work / "dags" / "live").mkdir(parents=True)
    (work / "dags" / "live" / "trickle.yaml").write_text(PROJECT.format(warehouse=warehouse, db=db, dag_id=DAG_ID))
    (work / "dags" / "trickle_live.py").write_text(
        "from pathlib import Path\n\nfrom airflow_trickle.dag_factory import stream_table_dag\n\n"
        "dag = stream_table_dag(Path(__file__).parent / 'live' / 'trickle.yaml')\n")
    airflow = LiveAirflow(work, warehouse, spark_address)
    a_task, b_task = f"{db}.a", f"{db}.b"
    out: dict = {"events": []}

    def event(text: str) -> None:
        out["events"].append([round(time.monotonic() - started, 1), text])
        print(f"[{out['events'][-1][0]:6.1f} s] {text}", flush=True)

    started = time.monotonic()
    try:
        with refresh_lock(warehouse, [f"{db}.a"]):
            airflow.start()
            event("Airflow started; a's refresh lock held")
            scheduled = until(lambda: next(iter(airflow.runs()), None), 240, "a scheduled run")["dag_run_id"]
            event(f"scheduled run {scheduled}")
            until(lambda: (lambda t: t.get(a_task, {}).get("state") == "running"
                           and t.get(b_task, {}).get("state") == "success")(airflow.tasks(scheduled)),
                  300, "the scheduled run's a task running and its b task done")
            event("scheduled run: a waits for its lock, b done")
            triggered = time.monotonic()
            manual = airflow.api("POST", f"/dags/{DAG_ID}/dagRuns", json={
                "logical_date": None, "conf": {"tables": [f"{db}.b"], "mode": "FULL"}})["dag_run_id"]
            event(f"manual run {manual} triggered")
            until(lambda: airflow.tasks(manual).get("plan", {}).get("state") not in (None, "scheduled", "queued"),
                  300, "the manual run's plan task to start")
            out["manual_started_after_s"] = round(time.monotonic() - triggered, 1)
            event("manual run started")
            final = until(lambda: (lambda r: r if r["state"] in ("success", "failed") else None)(
                airflow.api("GET", f"/dags/{DAG_ID}/dagRuns/{manual}")), 300, "the manual run to end")
            out["manual_ended_after_s"] = round(time.monotonic() - triggered, 1)
            event(f"manual run {final['state']}")
            out["scheduled_while_manual_ended"] = {
                "run": airflow.api("GET", f"/dags/{DAG_ID}/dagRuns/{scheduled}")["state"],
                "a": airflow.tasks(scheduled)[a_task]["state"]}
        event("a's refresh lock released")
        until(lambda: airflow.api("GET", f"/dags/{DAG_ID}/dagRuns/{scheduled}")["state"] in ("success", "failed"),
              300, "the scheduled run to end")
        event("scheduled run ended")
        runs = {r["dag_run_id"]: r for r in airflow.runs()}
        for key, run_id in (("scheduled", scheduled), ("manual", manual)):
            out[key] = {"run_id": run_id, "run_type": runs[run_id]["run_type"], "state": runs[run_id]["state"],
                        "note": runs[run_id].get("note"), "tasks": airflow.tasks(run_id)}
        out["a_log_wait"] = airflow.task_log_lines(scheduled, a_task, "being refreshed by another run")
        out["manual_a_log_note"] = airflow.task_log_lines(manual, a_task, "note")  # why a note is missing, should it be
    except Exception as err:  # the test prints what Airflow said and did
        out["error"] = f"{type(err).__name__}: {err}"
        for key, report in (("logs", airflow.logs_tail), ("task_log_problems", airflow.task_log_problems),
                            ("states", airflow.states)):
            try:
                out[key] = report()
            except Exception as failed:  # noqa: BLE001 - a report that cannot be made says why
                out[key] = f"{type(failed).__name__}: {failed}"
    finally:
        airflow.stop()
    print("RESULT " + json.dumps(out, default=str))


if __name__ == "__main__":
    main(*sys.argv[1:5])

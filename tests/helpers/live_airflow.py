"""A live Airflow -- API server, scheduler (LocalExecutor), DAG processor, triggerer -- running a
stream-table DAG on its own ticks while a manual run is triggered, then refreshing stream tables
on their source's commits; what happened, printed as JSON.

    python -m tests.helpers.live_airflow WORKDIR WAREHOUSE SPARK_CONNECT_ADDRESS DATABASE

``DATABASE.src`` and ``DATABASE.events`` must exist in the warehouse (the Spark service at the
address serves it).

1. writes a project of two stream tables over ``DATABASE.src``, ``a`` and ``b``, both every ten
   minutes (the first scheduled run starts at once; the next would come after the test), whose
   tasks write their notes through the API server;
2. holds ``a``'s refresh lock, as a long refresh of ``a`` by another run would;
3. starts Airflow; the DAG is unpaused at creation, so the scheduler starts a scheduled run at
   once. Waits until that run's ``a`` task is running (waiting for the lock) and ``b`` is done;
4. triggers a manual FULL run of ``b`` through the REST API and waits for it to end;
5. releases the lock and waits for the scheduled run to end; records the runs, their tasks and
   notes, and the lines of ``a``'s log that tell of the wait;
6. refresh on commit, a second project in the same Airflow: ``per_key`` (``on_commit``) over
   ``DATABASE.events`` and ``big_keys`` over it. Its watcher fired when the triggerer started it
   (nothing created yet), and that run created both. Then ``LATENCY_COMMITS`` single commits
   through Spark Connect, each timed from its Delta commit to the commit of the refresh that
   consumed it, and a burst of ``BURST_COMMITS`` commits in ``BURST_SECONDS`` (appended by
   delta-rs): how many refreshes and runs it made.

A separate process: Airflow reads its home and configuration once, at import.

Where this process may raise CPU priority (as root), Airflow's processes (and the tasks they
fork) and the Spark service run at nice ``FAVOURED_NICE`` while it works: the suite runs two
test processes on two cores, and the latency target is the system's on two cores, not on the
share a parallel test's Spark leaves it (in CI the refresh task took 1.75 times as long beside
the other worker's TPC-H as alone). Each of those processes leads a session of its own, and
where the kernel groups CPU time by session (``sched_autogroup``) the session's group gets the
nice value (a thread's own counts only inside its group); elsewhere every thread does. The
Spark service gets its priority back at the end.
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

import contextlib

import psutil
import requests

from airflow_trickle.refresh.lock import refresh_lock
from airflow_trickle.spark.service import free_port, host_port, read_service

DAG_ID = "trickle_live"
ADMIN, NOTER = ("admin", "an-admin-password"), ("noter", "a-noter-password")
#: What both projects share: DIFFERENTIAL whatever the change's size, the test's Spark service,
#: task notes through the API server.
SHARED = """\
settings:
  differential_max_change_ratio: 1000.0
  differential_max_touched_ratio: 1000.0
  differential_max_time_ratio: 1000.0
spark:
  connection: trickle_spark
airflow:
  dag_id: {dag_id}
  notes_connection: trickle_notes
"""
PROJECT = """\
project: live
warehouse: {warehouse}
sources: [{db}.src]
defaults:
  schedule: 10m
  refresh_mode: DIFFERENTIAL
""" + SHARED + """\
stream_tables:
  - name: {db}.a
    query: SELECT k, SUM(v) AS total FROM {db}.src GROUP BY k
  - name: {db}.b
    query: SELECT k, v FROM {db}.src WHERE v > 0
"""

ON_COMMIT_DAG_ID = "trickle_live_oc__on_commit"
ON_COMMIT_PROJECT = """\
project: live_oc
warehouse: {warehouse}
sources: [{db}.events]
defaults:
  refresh_mode: DIFFERENTIAL
""" + SHARED + """\
  on_commit: {{poll_interval: 1s, debounce: 1s, max_wait: 10s}}
stream_tables:
  - name: {db}.per_key
    query: SELECT k, SUM(v) AS total, COUNT(*) AS n FROM {db}.events GROUP BY k
    schedule: on_commit
  - name: {db}.big_keys
    query: SELECT k, total FROM {db}.per_key WHERE total > 10
    schedule: null
"""
#: The nice value of the live Airflow and the Spark service where it can be had (see the module docstring).
FAVOURED_NICE = -5


def may_favour() -> bool:
    """Whether this process may give others a higher CPU priority than its own (root may)."""
    try:
        current = os.getpriority(os.PRIO_PROCESS, 0)
        os.setpriority(os.PRIO_PROCESS, 0, current - 1)
        os.setpriority(os.PRIO_PROCESS, 0, current)
        return True
    except OSError:
        return False


def _favour_this_process() -> None:  # a child's preexec_fn: only async-signal-safe calls
    try:
        os.setpriority(os.PRIO_PROCESS, 0, FAVOURED_NICE)
    except OSError:
        pass


def _renice_session(pid: int, nice: int) -> None:
    """``pid``'s session at ``nice``: its autogroup where the kernel has them, else every thread
    of ``pid`` and of its descendants (Linux gives each thread a nice value of its own)."""
    try:
        if Path("/proc/sys/kernel/sched_autogroup_enabled").read_text().strip() == "1":
            Path(f"/proc/{pid}/autogroup").write_text(str(nice))
            return
    except OSError:
        pass
    root = psutil.Process(pid)
    for process in (root, *root.children(recursive=True)):
        with contextlib.suppress(psutil.Error, OSError):
            for thread in process.threads():
                with contextlib.suppress(OSError):
                    os.setpriority(os.PRIO_PROCESS, thread.id, nice)


@contextlib.contextmanager
def favoured(pid: int | None):
    """The process tree ``pid`` (the Spark service's JVM) at ``FAVOURED_NICE`` inside, back to 0 after."""
    if pid is None or not may_favour():
        yield False
        return
    _renice_session(pid, FAVOURED_NICE)
    try:
        yield True
    finally:
        _renice_session(pid, 0)


#: Commits whose latency is measured, one at a time; then a burst of this many in BURST_SECONDS.
LATENCY_COMMITS, BURST_COMMITS, BURST_SECONDS = 10, 20, 5.0


class LiveAirflow:
    """Airflow's API server, scheduler, DAG processor and (asked for) triggerer, each a process group of its own."""

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
        self.favoured = may_favour()

    def start(self, *, triggerer: bool = False) -> None:
        subprocess.run([sys.executable, "-m", "airflow", "db", "migrate"], check=True, env=self.env,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        for name, args in (("api-server", ["api-server", "--port", str(self.port)]), ("scheduler", ["scheduler"]),
                           ("dag-processor", ["dag-processor"]), *([("triggerer", ["triggerer"])] if triggerer else [])):
            with open(self.home / f"{name}.log", "wb") as log:
                self.processes[name] = subprocess.Popen(
                    [sys.executable, "-m", "airflow", *args], env=self.env, stdout=log, stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL, start_new_session=True,
                    preexec_fn=_favour_this_process if self.favoured else None)
            if self.favoured:
                _renice_session(self.processes[name].pid, FAVOURED_NICE)
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

    def task_logs(self, run_id: str = "*", task_id: str = "*", dag_id: str = "*") -> list[Path]:
        """The log files of a task's tries (by default, of every task of every run of every DAG)."""
        return sorted((self.home / "logs").glob(f"dag_id={dag_id}/run_id={run_id}/task_id={task_id}/*.log"))

    def task_log_lines(self, run_id: str, task_id: str, containing: str) -> list[str]:
        """The lines of the task's logs (every try) that contain ``containing``."""
        return [line for log in self.task_logs(run_id, task_id, DAG_ID)
                for line in log.read_text(errors="replace").splitlines() if containing in line]

    def logs_tail(self, lines: int = 15) -> dict[str, str]:
        return {name: "\n".join((self.home / f"{name}.log").read_text(errors="replace").splitlines()[-lines:])
                for name in self.processes}

    def states(self) -> dict[str, dict]:
        """Every run and its task instances as Airflow's database holds them -- read from the
        database itself, so a failure report does not depend on a busy API server."""
        with sqlite3.connect(f"file:{self.home / 'airflow.db'}?mode=ro", uri=True, timeout=30) as db:
            runs = db.execute("SELECT dag_id, run_id, run_type, state, start_date, end_date FROM dag_run "
                              "ORDER BY id").fetchall()
            tasks = db.execute("SELECT dag_id, run_id, task_id, state, try_number, start_date, end_date "
                               "FROM task_instance").fetchall()
        return {f"{dag_id}/{run_id}": {
            "type": run_type, "state": state, "start": start, "end": end,
            "tasks": {t: f"{s} (try {n}, {b} .. {e})" for d, r, t, s, n, b, e in tasks if (d, r) == (dag_id, run_id)}}
            for dag_id, run_id, run_type, state, start, end in runs}

    def task_log_problems(self, lines: int = 6) -> dict[str, list[str]]:
        """The last warning and error lines of every task log: why a task failed or was killed."""
        found = {}
        for log in self.task_logs():
            bad = [_problem(line) for line in log.read_text(errors="replace").splitlines()
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

    def active_runs(self, dag_id: str) -> list[dict]:
        return [r for r in self.runs(dag_id) if r["state"] in ("queued", "running")]

    def runs(self, dag_id: str = DAG_ID) -> list[dict]:
        return self.api("GET", f"/dags/{dag_id}/dagRuns", params={"order_by": "id"})["dag_runs"]

    def tasks(self, run_id: str, dag_id: str = DAG_ID) -> dict[str, dict]:
        found = self.api("GET", f"/dags/{dag_id}/dagRuns/{run_id}/taskInstances")["task_instances"]
        return {t["task_id"]: {k: t.get(k) for k in ("state", "start_date", "end_date", "note")} for t in found}


def until(check, seconds: float, what: str, interval: float = 1.0):
    """Poll ``check`` until it returns something true; raise naming ``what`` after ``seconds``."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        found = check()
        if found:
            return found
        time.sleep(interval)
    raise TimeoutError(f"waited {seconds:.0f} s for {what}")


def write_dag(work: Path, name: str, project_yaml: str) -> None:
    (work / "dags" / name).mkdir(parents=True)
    (work / "dags" / name / "trickle.yaml").write_text(project_yaml)
    (work / "dags" / f"trickle_{name}.py").write_text(
        "from pathlib import Path\n\nfrom airflow_trickle.dag_factory import stream_table_dag\n\n"
        f"dag = stream_table_dag(Path(__file__).parent / {name!r} / 'trickle.yaml')\n")


def main(workdir: str, warehouse: str, spark_address: str, db: str) -> None:
    """Both scenarios in one Airflow (its start is most of either's cost): the manual run during
    a scheduled one, then refresh on commit."""
    work = Path(workdir)
    write_dag(work, "live", PROJECT.format(warehouse=warehouse, db=db, dag_id=DAG_ID))
    write_dag(work, "live_oc", ON_COMMIT_PROJECT.format(warehouse=warehouse, db=db, dag_id="trickle_live_oc"))
    airflow = LiveAirflow(work, warehouse, spark_address)
    out: dict = {"events": []}
    started = time.monotonic()

    def event(text: str) -> None:
        out["events"].append([round(time.monotonic() - started, 1), text])
        print(f"[{out['events'][-1][0]:6.1f} s] {text}", flush=True)

    service = read_service(warehouse)
    try:
        with favoured(service.server_pid if service else None) as out["favoured"]:
            run_scenarios(airflow, warehouse, spark_address, db, out, event)
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


def run_scenarios(airflow: LiveAirflow, warehouse: str, spark_address: str, db: str, out: dict, event) -> None:
    with refresh_lock(warehouse, [f"{db}.a"]):
        airflow.start(triggerer=True)
        event("Airflow started; a's refresh lock held")
        manual_during_scheduled(airflow, db, out, event)
    event("a's refresh lock released")
    finish_scheduled(airflow, db, out, event)
    out["on_commit"] = refresh_on_commit(airflow, warehouse, spark_address, db, event)


def manual_during_scheduled(airflow: LiveAirflow, db: str, out: dict, event) -> None:
    """Steps 3-4: the scheduled run's a waits for its lock; a manual FULL run of b meanwhile."""
    a_task, b_task = f"{db}.a", f"{db}.b"
    scheduled = until(lambda: next(iter(airflow.runs()), None), 240, "a scheduled run")["dag_run_id"]
    out["scheduled_run_id"] = scheduled
    event(f"scheduled run {scheduled}")
    until(lambda: (lambda t: t.get(a_task, {}).get("state") == "running"
                   and t.get(b_task, {}).get("state") == "success")(airflow.tasks(scheduled)),
          300, "the scheduled run's a task running and its b task done")
    event("scheduled run: a waits for its lock, b done")
    triggered = time.monotonic()
    manual = airflow.api("POST", f"/dags/{DAG_ID}/dagRuns", json={
        "logical_date": None, "conf": {"tables": [f"{db}.b"], "mode": "FULL"}})["dag_run_id"]
    out["manual_run_id"] = manual
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


def finish_scheduled(airflow: LiveAirflow, db: str, out: dict, event) -> None:
    """Step 5: the scheduled run ends once a's lock is free; what both runs did."""
    a_task = f"{db}.a"
    scheduled, manual = out["scheduled_run_id"], out["manual_run_id"]
    until(lambda: airflow.api("GET", f"/dags/{DAG_ID}/dagRuns/{scheduled}")["state"] in ("success", "failed"),
          300, "the scheduled run to end")
    event("scheduled run ended")
    runs = {r["dag_run_id"]: r for r in airflow.runs()}
    for key, run_id in (("scheduled", scheduled), ("manual", manual)):
        out[key] = {"run_id": run_id, "run_type": runs[run_id]["run_type"], "state": runs[run_id]["state"],
                    "note": runs[run_id].get("note"), "tasks": airflow.tasks(run_id)}
    out["a_log_wait"] = airflow.task_log_lines(scheduled, a_task, "being refreshed by another run")
    out["manual_a_log_note"] = airflow.task_log_lines(manual, a_task, "note")  # why a note is missing, should it be


def refresh_on_commit(airflow: LiveAirflow, warehouse: str, spark_address: str, db: str, event) -> dict:
    """Refresh on commit: commits to ``db.events`` through Spark Connect, one at a time, each
    timed from its Delta commit to the commit of ``per_key``'s refresh that consumed it; then a
    burst. The stream tables' equality with their queries is the test's to check."""
    import pyarrow as pa
    from deltalake import DeltaTable, write_deltalake
    from pyspark.sql import SparkSession

    from airflow_trickle.catalog.model import utcnow
    from airflow_trickle.hooks.trickle import TrickleHook

    spark = SparkSession.builder.remote(spark_address).getOrCreate()
    catalog = TrickleHook(warehouse).catalog
    per_key, source = f"{db}.per_key", f"{db}.events"
    found: dict = {}

    def consumed() -> int:
        st = catalog.get(per_key)
        return st.frontier.get(source, -1) if st is not None else -1

    def newest_commit(location: str) -> tuple[int, float]:
        table = DeltaTable(location, without_files=True)
        return int(table.version()), table.history(1)[0]["timestamp"] / 1000.0

    # the watcher fired at its start (nothing created yet): that run created both stream tables
    until(lambda: catalog.get(f"{db}.big_keys") is not None and consumed() >= 0
          and not airflow.active_runs(ON_COMMIT_DAG_ID), 300, "the on-commit DAG's first run to create its tables")
    event("on-commit: stream tables created by the watcher's first run")
    source_location = next(d.source_location for d in catalog.dependencies(per_key) if d.source_name == source)
    table_location = catalog.get(per_key).location
    latencies, phases, refresh_phases = [], [], []
    for i in range(LATENCY_COMMITS):
        spark.sql(f"INSERT INTO {source} VALUES ({i % 4}, {i + 1})")
        version, committed_at = newest_commit(source_location)
        until(lambda: consumed() >= version, 120, f"per_key to consume version {version}", interval=0.1)
        _, refreshed_at = newest_commit(table_location)
        latencies.append(round(refreshed_at - committed_at, 2))
        event(f"on-commit: version {version} refreshed {latencies[-1]} s after its commit")
        until(lambda: not airflow.active_runs(ON_COMMIT_DAG_ID), 120, "the on-commit run to end", interval=0.2)
        run = airflow.runs(ON_COMMIT_DAG_ID)[-1]
        task = airflow.tasks(run["dag_run_id"], ON_COMMIT_DAG_ID)[per_key]
        refresh = next(r for r in catalog.history(per_key, limit=5) if r.action in ("DIFFERENTIAL", "FULL"))
        phases.append({key: round(_epoch(value) - committed_at, 2) for key, value in (
            ("run_queued", run["queued_at"]), ("run_started", run["start_date"]),
            ("task_started", task["start_date"]), ("refresh_started", refresh.start_time.isoformat()),
            ("task_ended", task["end_date"]))})
        refresh_phases.append(refresh.phases or {})
    found["latencies_s"], found["phases_s"], found["refresh_phases"] = latencies, phases, refresh_phases

    # the burst: a commit every BURST_SECONDS / BURST_COMMITS, appended by delta-rs -- another
    # kind of writer, and one that keeps the pace on a loaded host (a Spark INSERT took 0.4 s
    # idle and over 1 s in CI: four Spark writers made 20 commits in 10 s there)
    burst_started, burst_wall = time.monotonic(), utcnow()
    for i in range(BURST_COMMITS):
        time.sleep(max(0.0, burst_started + i * BURST_SECONDS / BURST_COMMITS - time.monotonic()))
        write_deltalake(source_location, pa.table({"k": pa.array([i % 5, None], pa.int32()),
                                                   "v": pa.array([-i if i % 3 else i, i], pa.int32())}), mode="append")
    found["burst_seconds"] = round(time.monotonic() - burst_started, 1)
    last, _ = newest_commit(source_location)
    until(lambda: consumed() >= last, 180, f"per_key to consume the burst's last version {last}", interval=0.2)
    until(lambda: not airflow.active_runs(ON_COMMIT_DAG_ID), 180, "the on-commit runs to end", interval=0.2)
    found["burst_refreshes"] = [f"{r.action} +{r.rows_inserted} -{r.rows_deleted}"
                                for r in catalog.history(per_key, limit=50)
                                if r.start_time and r.start_time >= burst_wall and r.action in ("DIFFERENTIAL", "FULL")]
    runs = airflow.runs(ON_COMMIT_DAG_ID)
    found["burst_runs"] = [r["dag_run_id"] for r in runs if r["queued_at"] and r["queued_at"] >= burst_wall.isoformat()]
    found["runs"] = {r["dag_run_id"]: {"type": r["run_type"], "state": r["state"]} for r in runs}
    found["tasks_of_last_run"] = airflow.tasks(runs[-1]["dag_run_id"], ON_COMMIT_DAG_ID)
    event(f"on-commit: the burst of {BURST_COMMITS} commits in {found['burst_seconds']} s: "
          f"{len(found['burst_refreshes'])} refreshes, {len(found['burst_runs'])} runs")
    found["watchers"] = watcher_states(catalog, db)
    spark.stop()
    return found


def _problem(line: str) -> str:
    """A task log's warning or error line, cut short -- but for a failure, its exception and the
    frames nearest to it in full (a failure's line is mostly the traceback, and the cause is last)."""
    try:
        entry = json.loads(line)
    except ValueError:
        return line[:400]
    details = entry.get("error_detail") or []
    if not details:
        return line[:400]
    return " | ".join(
        f"{d.get('exc_type')}: {str(d.get('exc_value'))[:1500]} at " + "; ".join(
            f"{f.get('filename')}:{f.get('lineno')} {f.get('name')}" for f in (d.get("frames") or [])[-4:])
        for d in details)


def _epoch(iso: str) -> float:
    from datetime import datetime

    return datetime.fromisoformat(iso).timestamp()


def watcher_states(catalog, db: str) -> dict[str, dict]:
    from airflow_trickle.catalog.model import utcnow
    from airflow_trickle.ops.overview import commit_watchers

    tables = [st for st in catalog.list() if st.name.startswith(f"{db}.")]
    return commit_watchers(catalog, tables, utcnow())


if __name__ == "__main__":
    main(*sys.argv[1:5])

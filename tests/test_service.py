"""The Spark service (``trickle serve``): one per warehouse, shared safely, failing clearly.

One service for the module's warehouse; the last two tests kill it (mid-refresh) and stop it.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from airflow_trickle import Trickle
from airflow_trickle.errors import TrickleError
from airflow_trickle.spark import service as svc
from tests.conftest import SERVICE_SETTINGS, TEST_SETTINGS
from tests.oracle import multiset

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="module")
def home(tmp_path_factory):
    warehouse = str(tmp_path_factory.mktemp("service-warehouse"))
    info = svc.start_detached(warehouse, port=0, master="local[2]", settings=SERVICE_SETTINGS)
    yield {"warehouse": warehouse, "info": info}
    svc.stop_service(warehouse)


def client(home) -> Trickle:
    return Trickle(home["warehouse"], remote=svc.read_service(home["warehouse"]).address, **TEST_SETTINGS,
                   service_token=home.get("token"))


def trickle_cli(*args, warehouse):
    return subprocess.run([sys.executable, "-m", "airflow_trickle.cli", "--warehouse", warehouse, *args],
                          capture_output=True, text=True, timeout=300, env={**os.environ, "PYTHONPATH": REPO})


def listening(pid: int) -> set[str]:
    """The addresses the process ``pid`` and its children listen on (TCP)."""
    import psutil

    root = psutil.Process(pid)
    return {c.laddr.ip.removeprefix("::ffff:") for p in [root, *root.children(recursive=True)]  # IPv4 on IPv6
            for c in p.net_connections(kind="inet") if c.status == psutil.CONN_LISTEN}


def test_the_service_records_itself_listens_on_loopback_only_and_refuses_a_second_one(home):
    info = home["info"]
    assert info.address.startswith("sc://127.0.0.1:") and svc.reachable(info.address)
    # the Connect server and the driver's own ports: nothing on another interface
    assert listening(info.server_pid) == {"127.0.0.1"}
    status = trickle_cli("serve", "--status", "--json", warehouse=home["warehouse"])
    assert status.returncode == 0 and json.loads(status.stdout)[0]["address"] == info.address
    assert json.loads(status.stdout)[0]["started_at"].endswith("+00:00")  # an ISO time, not an epoch float
    with pytest.raises(TrickleError, match=f"already runs for warehouse {home['warehouse']} at {info.address}"):
        svc.start_detached(home["warehouse"], port=0)
    second = trickle_cli("serve", "--port", "0", warehouse=home["warehouse"])
    assert second.returncode == 1 and "already" in second.stderr and "trickle serve --stop" in second.stderr


def test_an_unreachable_service_fails_at_once_naming_the_address(tmp_path):
    address = f"sc://127.0.0.1:{svc.free_port()}"
    started = time.monotonic()
    with pytest.raises(TrickleError, match=f"Spark service at {address} is not reachable.*trickle serve"):
        Trickle(str(tmp_path), remote=address).spark
    assert time.monotonic() - started < 5


def test_a_service_of_another_warehouse_is_refused(home, tmp_path):
    with pytest.raises(TrickleError, match=f"serves warehouse {home['warehouse']}, not {tmp_path}"):
        Trickle(str(tmp_path), remote=home["info"].address).spark


def test_the_cli_works_through_the_running_service(home):
    tr = client(home)
    tr.sql("CREATE DATABASE IF NOT EXISTS cli")
    tr.sql("CREATE TABLE cli.src (k INT, v INT) USING delta")
    tr.sql("INSERT INTO cli.src VALUES (1, 10), (2, 20)")
    tr.close()
    # an embedded Spark could not start on this master: the CLI must have used the service
    made = trickle_cli("--master", "no-such-master", "create", "cli.total", "--query",
                       "SELECT SUM(v) AS s FROM cli.src", "--json", warehouse=home["warehouse"])
    assert made.returncode == 0, made.stderr[-2000:]
    shown = trickle_cli("--master", "no-such-master", "sql", "SELECT s FROM cli.total", "--json",
                        warehouse=home["warehouse"])
    assert json.loads(shown.stdout) == [{"s": 30}]
    embedded = trickle_cli("--master", "no-such-master", "--embedded", "sql", "SELECT 1", warehouse=home["warehouse"])
    assert embedded.returncode != 0


def test_the_maintenance_task_works_through_the_service(home, monkeypatch):
    """The maintenance DAG's task (``airflow.maintenance``), run as Airflow runs it over a
    ``spark_connect`` connection: it maintains the project's tables that exist, in this process."""
    from airflow_trickle.operators.maintenance import StreamTableMaintenanceOperator
    from airflow_trickle.project import define_project

    host, port = home["info"].host_port
    monkeypatch.setenv("AIRFLOW_CONN_TRICKLE_SERVICE", json.dumps({"conn_type": "spark_connect",
                                                                    "host": f"sc://{host}", "port": port}))
    project = define_project("cli", warehouse=home["warehouse"], spark={"connection": "trickle_service"},
                             airflow={"maintenance": "@daily", "maintenance_retention_hours": 200},
                             stream_tables=[{"name": "cli.total", "query": "SELECT SUM(v) AS s FROM cli.src"},
                                            {"name": "cli.not_yet", "query": "SELECT k FROM cli.src"}])
    task = StreamTableMaintenanceOperator(task_id="maintain", project=project)
    done = task.execute({})
    assert [d["table"] for d in done if not d["table"].startswith("_trickle")] == ["cli.total"]
    total = next(d for d in done if d["table"] == "cli.total")
    assert total["active_files_after"] <= total["active_files_before"] and total["retained_hours"] >= 200


def test_concurrent_refreshes_share_the_service_and_never_apply_twice(home):
    """Four sessions at once, as four tasks of one DAG run: two stream tables (a MERGE and an
    append) over one source, each refreshed twice simultaneously while a fifth session keeps
    writing the source.  Each change lands exactly once: every table equals its query at the
    frontier it recorded.  ``TRICKLE_CONCURRENCY_ROUNDS=20`` runs twenty rounds (3 here)."""
    setup = client(home)
    setup.sql("CREATE DATABASE IF NOT EXISTS conc")
    setup.sql("CREATE TABLE conc.src (id INT, grp INT, amount INT) USING delta")
    setup.sql("INSERT INTO conc.src VALUES (1, 1, 10), (2, 2, 20), (3, NULL, 5)")
    queries = {"conc.totals": "SELECT grp, COUNT(*) AS n, SUM(amount) AS total FROM conc.src GROUP BY grp",
               "conc.big": "SELECT id, grp, amount FROM conc.src WHERE amount >= 10"}
    for name, query in queries.items():
        setup.create_stream_table(name, query, schedule=None)
    sessions = [client(home) for _ in range(4)]
    writer = client(home)
    try:
        for round_no in range(int(os.environ.get("TRICKLE_CONCURRENCY_ROUNDS", "3"))):
            base = 100 * (round_no + 1)
            setup.sql(f"INSERT INTO conc.src VALUES ({base}, {round_no % 2}, {base}), ({base + 1}, NULL, 50), "
                      f"({base + 1}, NULL, 50)")
            outcomes, errors = [], []

            def write():  # a writer racing the refreshes: what it commits meanwhile is the next round's
                try:
                    writer.sql(f"INSERT INTO conc.src VALUES ({base + 2}, 1, 70), ({base + 3}, NULL, 3)")
                    writer.sql(f"DELETE FROM conc.src WHERE id = {base - 100 + 2}")
                    writer.sql(f"UPDATE conc.src SET grp = {round_no % 3} WHERE id = {base + 2}")
                except Exception as err:  # noqa: BLE001 - reported below
                    errors.append(err)

            def refresh(tr, name):
                try:
                    outcomes.append((name, tr.refresh_stream_table(name).action))
                except Exception as err:  # noqa: BLE001 - reported below
                    errors.append(err)

            threads = [threading.Thread(target=refresh, args=(tr, name))
                       for tr, name in zip(sessions, ["conc.totals", "conc.totals", "conc.big", "conc.big"])]
            threads.append(threading.Thread(target=write))
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join(300)
            assert not errors, errors
            for name, query in queries.items():
                frontier = setup.get(name).frontier["conc.src"]
                pinned = query.replace("FROM conc.src", f"FROM conc.src VERSION AS OF {frontier}")
                assert multiset(setup.read(name)) == multiset(setup.sql(pinned)), (round_no, name, outcomes)
                actions = sorted(action for n, action in outcomes if n == name)
                assert len(actions) == 2 and "DIFFERENTIAL" in actions, actions
    finally:
        for tr in sessions:
            tr.close()
        writer.close()
        setup.close()


# the client reports the dead service once its short retries run out: that is the point here
@pytest.mark.filterwarnings("ignore:.*RETRIES_EXCEEDED")
def test_kill_trials_refreshes_killed_at_random_moments_are_exact_on_retry(home):
    """A few of ``tests/kill_trials.py``'s trials (``scripts/kill_trials.py`` runs a hundred):
    the client process killed mid-operation, then the retry checked against the oracle."""
    import random

    from tests import kill_trials

    tr = client(home)
    scenario = kill_trials.setup(tr, home["warehouse"], svc.read_service(home["warehouse"]).address, "kills",
                                 tables=("lines", "totals"))
    rng = random.Random(7)
    # each kill lands within the operation's own time, measured unkilled just before: a fixed
    # delay (0.5 to 6 s) missed both operations on an idle host, where they took less
    trials = [kill_trials.trial(tr, scenario, operation,
                                rng.uniform(0.1, 0.6) * kill_trials.measure(tr, scenario, operation, rng), rng)
              for operation in ("refresh", "alter")]
    assert [t.problems for t in trials] == [[], []]
    assert any(t.killed for t in trials), "every child had finished before its kill: the trials killed nothing"
    tr.close()


def test_kill_trials_a_classic_spark_killed_while_refreshing_a_cycle_to_its_fixpoint(home):
    """A child with its own classic Spark (which dies with it, mid-statement) refreshes a
    monotone cycle to its fixpoint and is killed; the retry leaves both members exact and
    ``reach`` equal to the paths of the edges."""
    import random

    from tests import kill_trials

    tr = client(home)
    scenario = kill_trials.setup(tr, home["warehouse"], svc.read_service(home["warehouse"]).address, "killcycle",
                                 tables=("hop", "reach"))
    rng = random.Random(11)
    result = kill_trials.trial(tr, scenario, "cycle", rng.uniform(1.0, 4.0), rng, session="classic")
    assert result.problems == []
    assert result.killed, "the child had finished before its kill: the trial killed nothing"
    tr.close()


@pytest.mark.filterwarnings("ignore:.*RETRIES_EXCEEDED")
def test_a_refresh_killed_with_the_service_is_exact_on_retry(home, monkeypatch):
    """The Spark service dies as a refresh starts to commit; the client fails within seconds, and
    after a restart the retry applies the change exactly once.

    The service is killed on entering the commit phase, before its first statement: a kill on a
    timer missed a small change's commit once it took less than the timer (0.3 s), and then
    killed the service after the test, under the next one.  ``kill_trials`` kills at random moments."""
    from airflow_trickle.refresh import phases

    tr = client(home)
    tr.sql("CREATE DATABASE IF NOT EXISTS crash")
    tr.sql("CREATE TABLE crash.src (id INT, grp INT) USING delta")
    tr.sql("INSERT INTO crash.src VALUES (1, 1), (2, 1), (3, 2)")
    query = "SELECT grp, COUNT(*) AS n FROM crash.src GROUP BY grp"
    tr.create_stream_table("crash.counts", query, schedule=None)
    tr.sql("INSERT INTO crash.src VALUES (4, 2), (5, 3)")
    server_pid = svc.read_service(home["warehouse"]).server_pid
    real_phase = phases.PhaseClock.phase

    def killing_phase(self, name):
        if name == "commit":
            os.kill(server_pid, signal.SIGKILL)
        return real_phase(self, name)

    monkeypatch.setattr(phases.PhaseClock, "phase", killing_phase)
    started = time.monotonic()
    with pytest.raises(Exception):
        tr.refresh_stream_table("crash.counts")
    assert time.monotonic() - started < 60
    monkeypatch.setattr(phases.PhaseClock, "phase", real_phase)
    deadline = time.monotonic() + 30
    while svc.read_service(home["warehouse"]) is not None and time.monotonic() < deadline:
        time.sleep(0.2)  # the serve process notices its server died and removes its record
    assert svc.read_service(home["warehouse"]) is None
    # restarted as a pod runs it: on every interface, with a token (the next test checks it)
    home["token"] = "token-" + os.urandom(8).hex()
    home["info"] = svc.start_detached(home["warehouse"], port=0, master="local[2]",
                                      settings={**SERVICE_SETTINGS, "service_bind_address": "0.0.0.0",
                                                "service_token": home["token"]})
    retry = client(home)
    result = retry.refresh_stream_table("crash.counts")
    assert result.status == "COMPLETED"
    assert multiset(retry.read("crash.counts")) == multiset(retry.sql(query))
    retry.sql("INSERT INTO crash.src VALUES (6, 3)")
    retry.refresh_stream_table("crash.counts")
    assert multiset(retry.read("crash.counts")) == multiset(retry.sql(query))
    retry.close()


def test_a_service_beyond_loopback_needs_its_token(home, tmp_path):
    """Bound beyond loopback only with a token (refused before anything starts otherwise); the
    service then refuses a session without it or with another one, and a client with it works
    -- the token never on a command line, in the service's record or in its logs."""
    refused = trickle_cli("serve", "--bind", "0.0.0.0", "--port", "0", warehouse=str(tmp_path))
    assert refused.returncode == 1 and "would listen on 0.0.0.0 without authentication" in refused.stderr
    assert not (tmp_path / svc.SERVICE_DIR).exists()
    info = svc.read_service(home["warehouse"])
    assert (info.bind, info.authenticated) == ("0.0.0.0", True)
    assert listening(info.server_pid) & {"0.0.0.0", "::"}  # every interface (IPv4, or IPv4 and IPv6)
    for token, why in ((None, "No authentication token provided"), ("wrong", "Invalid authentication token")):
        with pytest.raises(TrickleError, match=f"refused the session: .*{why}.*TRICKLE_SERVICE_TOKEN"):
            Trickle(home["warehouse"], remote=info.address, service_token=token).spark
    tr = client(home)
    assert tr.sql("SELECT 1 AS one").first().one == 1
    tr.close()
    import psutil

    server = psutil.Process(info.server_pid)
    assert home["token"] not in " ".join(server.cmdline())
    folder = svc.service_dir(home["warehouse"])
    assert all(home["token"] not in f.read_text(errors="replace") for f in folder.iterdir() if f.is_file())


def test_sigterm_stops_the_service_cleanly(home):
    info = svc.read_service(home["warehouse"])
    os.kill(info.pid, signal.SIGTERM)
    deadline = time.monotonic() + 30
    while svc.read_service(home["warehouse"]) is not None and time.monotonic() < deadline:
        time.sleep(0.2)
    assert svc.read_service(home["warehouse"]) is None
    assert not svc.reachable(info.address)
    assert not os.path.exists(os.path.join(home["warehouse"], svc.SERVICE_DIR, "service.json"))

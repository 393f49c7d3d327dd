"""Both refresh paths against a real multi-process Spark: a standalone master and one worker.

The Airflow DAG of a one-table project refreshes it DIFFERENTIALLY with ``dag.test()``: once with spark-submit to ``spark://127.0.0.1:<port>``, once through a Spark
service whose master is that cluster.  Executors run in the worker's JVM, as on any cluster.

Marked ``cluster`` (about five minutes on 2 cores), so the default run leaves it out:
``./run-tests.sh -m cluster tests/test_spark_cluster.py``.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from airflow_trickle.spark.service import free_port

REPO = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.cluster


def _spark_class() -> str:
    import pyspark

    return str(Path(pyspark.__file__).parent / "bin" / "spark-class")


def _wait_for(log: Path, text: str, process: subprocess.Popen, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if text in log.read_text(errors="replace"):
            return
        assert process.poll() is None, log.read_text(errors="replace")[-3000:]
        time.sleep(0.3)
    raise AssertionError(f"{text!r} not seen in {log}:\n" + log.read_text(errors="replace")[-3000:])


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """``spark://127.0.0.1:<port>`` of a standalone master with one 2-core worker."""
    logs = tmp_path_factory.mktemp("cluster")
    port = free_port()
    master_url = f"spark://127.0.0.1:{port}"
    env = {**os.environ, "SPARK_LOG_DIR": str(logs), "SPARK_WORKER_DIR": str(logs / "work")}
    processes = []
    try:
        master_log = logs / "master.log"
        processes.append(subprocess.Popen(
            [_spark_class(), "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1", "--port", str(port),
             "--webui-port", str(free_port())], stdout=open(master_log, "wb"), stderr=subprocess.STDOUT, env=env,
            start_new_session=True))
        _wait_for(master_log, "I have been elected leader", processes[0])
        processes.append(subprocess.Popen(
            [_spark_class(), "org.apache.spark.deploy.worker.Worker", master_url, "--host", "127.0.0.1",
             "--cores", "2", "--memory", "3g", "--webui-port", str(free_port())],
            stdout=open(logs / "worker.log", "wb"), stderr=subprocess.STDOUT, env=env, start_new_session=True))
        _wait_for(master_log, "Registering worker", processes[0])
        yield {"url": master_url, "log": master_log}
    finally:
        for process in reversed(processes):
            os.killpg(process.pid, signal.SIGTERM)
            process.wait(30)


@pytest.mark.parametrize("how", ["submit", "connect"])
def test_a_dag_refreshes_on_a_standalone_cluster(cluster, tmp_path, how):
    done = subprocess.run([sys.executable, "-m", "tests.helpers.cluster_dag", str(tmp_path / "wh"), how,
                           cluster["url"]],
                          cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO),
                                         "PATH": f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}"},
                          capture_output=True, text=True,
                          timeout=900)
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    assert done.returncode == 0 and lines, done.stdout[-3000:] + done.stderr[-3000:]
    outcome = json.loads(lines[-1])
    assert outcome["states"] == ["success"]
    assert outcome["actions"] == ["FULL", "DIFFERENTIAL"], outcome  # created (populated in full), then the DAG's delta
    assert outcome["equal"]
    # the work ran on the cluster: the master registered the refresh job or the service as an application
    app = "airflow_trickle refresh cl.totals" if how == "submit" else "airflow_trickle service"
    assert f"Registering app {app}" in cluster["log"].read_text(errors="replace")

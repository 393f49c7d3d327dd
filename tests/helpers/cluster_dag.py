"""A one-table project's DAG run with ``dag.test()``, its refresh on the given Spark.

    python -m tests.helpers.cluster_dag WAREHOUSE connect|submit MASTER

``submit``: every refresh task runs ``spark-submit --master MASTER``.  ``connect``: a Spark
service is started with ``MASTER`` as its master and the tasks work through it.  The stream
table is created (and populated) here, the sources change, and one DAG run refreshes it
differentially.  Prints one JSON line: the run's state, the refresh actions, and whether the
table equals its query.
Runs in a process of its own because Airflow reads its home and database once per process.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

QUERY = "SELECT grp, COUNT(*) AS n, SUM(amount) AS total FROM cl.src GROUP BY grp"


def main(warehouse: str, mode: str, master: str) -> int:
    home = Path(warehouse) / "_airflow"
    dags = home / "dags"
    dags.mkdir(parents=True, exist_ok=True)
    (dags / "project.yaml").write_text(textwrap.dedent(f"""\
        project: cl
        warehouse: {warehouse}
        sources: [cl.src]
        settings: {{differential_max_change_ratio: 1.0, differential_max_touched_ratio: 1000.0, differential_max_time_ratio: 1000.0, shuffle_partitions: 2}}
        spark: {{connection: trickle_spark}}
        airflow: {{dag_id: trickle_cl}}
        stream_tables:
          - name: cl.totals
            schedule: 1m
            query: {QUERY}
        """))
    (dags / "cl.py").write_text("from pathlib import Path\nfrom airflow_trickle.dag_factory import stream_table_dag\n"
                                "dag = stream_table_dag(Path(__file__).parent / 'project.yaml')\n")
    os.environ.update({"AIRFLOW_HOME": str(home), "AIRFLOW__CORE__DAGS_FOLDER": str(dags),
                       "AIRFLOW__CORE__LOAD_EXAMPLES": "False", "TRICKLE_DAG_DEADLINES": "off",
                       "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{home}/airflow.db"})
    subprocess.run([sys.executable, "-m", "airflow", "db", "migrate"], check=True, stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL)
    from airflow_trickle import Trickle
    from airflow_trickle.spark import service

    if mode == "connect":
        info = service.start_detached(warehouse, port=0, master=master, settings={"shuffle_partitions": 2})
        host, port = info.host_port
        os.environ["AIRFLOW_CONN_TRICKLE_SPARK"] = json.dumps({"conn_type": "spark_connect", "host": host,
                                                               "port": port})
        tr = Trickle(warehouse, remote=info.address, shuffle_partitions=2)
    else:
        os.environ["AIRFLOW_CONN_TRICKLE_SPARK"] = json.dumps({"conn_type": "spark", "host": master})
        tr = Trickle(warehouse, spark_master="local[1]", shuffle_partitions=2)
    try:
        tr.sql("CREATE DATABASE IF NOT EXISTS cl")
        tr.sql("CREATE TABLE cl.src (id INT, grp INT, amount INT) USING delta")
        tr.sql("INSERT INTO cl.src VALUES (1, 1, 10), (2, 1, 20), (3, NULL, 5)")
        tr.create_stream_table("cl.totals", QUERY, schedule="1m")
        tr.sql("INSERT INTO cl.src VALUES (4, 2, 7), (5, NULL, 1)")
        tr.sql("DELETE FROM cl.src WHERE id = 1")
        from airflow.dag_processing.dagbag import DagBag

        dag = DagBag(dag_folder=str(dags)).get_dag("trickle_cl")
        states = [str(dag.test().state)]
        stored = tr.read("cl.totals")
        expected = tr.sql(QUERY)
        equal = stored.exceptAll(expected).count() == 0 and expected.exceptAll(stored).count() == 0
        actions = [h.action for h in reversed(tr.history("cl.totals"))]
        print(json.dumps({"states": states, "actions": actions, "equal": equal}), flush=True)
    finally:
        tr.close()
        if mode == "connect":
            service.stop_service(warehouse)
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:4]))

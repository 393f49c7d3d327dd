"""A shared Hive metastore: stream tables created through the Spark service are registered there
by name, read by a second, separate Spark application, and dropped from both.

The module starts a standalone Hive Metastore 3.1.3 (Derby) on 127.0.0.1
(``tests/helpers/metastore.py``) and a Spark service with ``metastore_uri`` set; ``-m
metastore`` selects it.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from airflow_trickle import Trickle
from airflow_trickle.spark import service as svc
from tests.conftest import SERVICE_SETTINGS, TEST_SETTINGS
from tests.helpers.metastore import Metastore
from tests.oracle import multiset

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
pytestmark = pytest.mark.metastore


@pytest.fixture(scope="module")
def shared(tmp_path_factory):
    warehouse = str(tmp_path_factory.mktemp("metastore-warehouse"))
    with Metastore(tmp_path_factory.mktemp("metastore"), warehouse) as metastore:
        info = svc.start_detached(warehouse, port=0, master="local[2]",
                                  settings={**SERVICE_SETTINGS, "metastore_uri": metastore.uri})
        tr = Trickle(warehouse, remote=info.address, metastore_uri=metastore.uri, **TEST_SETTINGS)
        try:
            yield {"warehouse": warehouse, "uri": metastore.uri, "tr": tr}
        finally:
            tr.close()
            svc.stop_service(warehouse)


def second_app(shared, sql: str):
    """Rows of ``sql`` in a separate Spark application on the metastore (None: no such table)."""
    done = subprocess.run([sys.executable, "-m", "tests.helpers.second_app", shared["warehouse"], shared["uri"], sql],
                          cwd=REPO, env={**os.environ, "PYTHONPATH": REPO}, capture_output=True, text=True,
                          timeout=300)
    answer = done.stdout.strip().splitlines()[-1] if done.stdout.strip() else f"ERROR {done.stderr[-500:]}"
    if answer == "MISSING":
        return None
    assert not answer.startswith("ERROR"), answer
    return sorted((tuple(r) for r in json.loads(answer)), key=repr)


def test_a_stream_table_is_shared_by_name_through_the_metastore_and_dropped_from_both(shared):
    tr = shared["tr"]
    assert tr.spark.conf.get("spark.sql.catalogImplementation") == "hive"
    tr.sql("CREATE DATABASE IF NOT EXISTS shop")
    tr.sql("CREATE TABLE shop.orders (id INT, region STRING, amount INT) USING delta")
    tr.sql("INSERT INTO shop.orders VALUES (1, 'n', 10), (2, 's', 5), (3, 'n', NULL), (3, 'n', NULL)")
    query = "SELECT region, COUNT(*) AS n, SUM(amount) AS total FROM shop.orders GROUP BY region"
    tr.create_stream_table("shop.totals", query, schedule=None)
    tr.sql("INSERT INTO shop.orders VALUES (4, 's', 7)")
    tr.sql("DELETE FROM shop.orders WHERE id = 1")
    assert tr.refresh_stream_table("shop.totals").action == "DIFFERENTIAL"
    stored = multiset(tr.read("shop.totals"))
    assert stored == multiset(tr.sql(query))
    assert second_app(shared, "SELECT region, n, total FROM shop.totals") == [tuple(r) for r in stored]
    assert [f for f in tr.check() if f.severity == "ERROR"] == []
    assert tr.repair() == []  # catalog and storage agree: nothing to do
    tr.drop_stream_table("shop.totals")
    assert not tr.spark.catalog.tableExists("shop.totals")
    assert second_app(shared, "SELECT * FROM shop.totals") is None

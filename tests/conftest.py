"""Shared fixtures: one local Spark (with Delta) per test process and Spark mode, one warehouse each.

Tests isolate themselves by database name (``db`` fixture), not by warehouse: the warehouse
directory is fixed when the JVM starts.

Modules marked ``both_spark_modes`` run every test twice: on a classic embedded session
(``classic``) and through the Spark service over Spark Connect (``connect``: a service of the
test process's own, and no JVM in the test process for that warehouse).
"""
from __future__ import annotations

import os
import uuid

import pytest

import tempfile

os.environ.setdefault("PYSPARK_PYTHON", os.sys.executable)
# Airflow reads its home when first imported; keep tests away from ~/airflow.
os.environ.setdefault("AIRFLOW_HOME", tempfile.mkdtemp(prefix="trickle-airflow-home-"))
os.environ.setdefault("AIRFLOW__CORE__LOAD_EXAMPLES", "False")


SPARK_MODES = ("classic", "connect")
# Test tables are tiny, so any change is a large share of them: the cost model's change-ratio
# and touched-rows rules would turn every refresh FULL.  Tests of those rules set them per table.
TEST_SETTINGS = {"shuffle_partitions": 2, "differential_max_change_ratio": 1e9, "differential_max_touched_ratio": 1e9}


def pytest_configure(config):
    config.addinivalue_line("markers", "both_spark_modes: run on a classic session and over Spark Connect")


def pytest_generate_tests(metafunc):
    """Every test using Spark gets a ``spark_mode``: both for marked modules, ``classic`` else
    (the same value, so unmarked tests share the classic session)."""
    if "spark_mode" in metafunc.fixturenames:
        modes = SPARK_MODES if metafunc.definition.get_closest_marker("both_spark_modes") else SPARK_MODES[:1]
        metafunc.parametrize("spark_mode", modes, indirect=True, scope="session")


@pytest.fixture(scope="session")
def spark_mode(request) -> str:
    return request.param


@pytest.fixture(scope="session")
def warehouse(tmp_path_factory, spark_mode) -> str:
    return str(tmp_path_factory.mktemp(f"warehouse-{spark_mode}"))


@pytest.fixture(scope="session")
def service(warehouse, spark_mode):
    """The Spark service of the ``connect`` warehouse (None in ``classic`` mode)."""
    if spark_mode != "connect":
        yield None
        return
    from airflow_trickle.spark.service import start_detached, stop_service

    info = start_detached(warehouse, port=0, master="local[2]", settings={"shuffle_partitions": 2})
    yield info
    stop_service(warehouse)


@pytest.fixture(scope="session")
def tr(warehouse, service):
    from airflow_trickle import Trickle

    if service is not None:
        trickle = Trickle(warehouse=warehouse, remote=service.address, **TEST_SETTINGS)
    else:
        trickle = Trickle(warehouse=warehouse, spark_master="local[2]", **TEST_SETTINGS)
    trickle.spark  # start the JVM (or connect) once
    yield trickle
    trickle.close()


@pytest.fixture
def subprocess_env(service) -> dict:
    """Environment for a child process (CLI, worker) that should use the same Spark as ``tr``."""
    env = {**os.environ, "PYTHONPATH": os.path.dirname(os.path.dirname(os.path.abspath(__file__)))}
    if service is not None:
        env["TRICKLE_REMOTE"] = service.address
    else:
        env.pop("TRICKLE_REMOTE", None)
    return env


@pytest.fixture(scope="session")
def spark(tr):
    return tr.spark


@pytest.fixture
def db(tr) -> str:
    """A fresh database for one test."""
    name = f"t_{uuid.uuid4().hex[:10]}"
    tr.sql(f"CREATE DATABASE {name}")
    return name


def rows(frame) -> list[tuple]:
    """A DataFrame's rows as a sorted list of tuples (a multiset, comparable with ==)."""
    return sorted((tuple(r) for r in frame.collect()), key=repr)


def visible(tr, name: str) -> list[tuple]:
    return rows(tr.read(name))

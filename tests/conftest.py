"""Shared fixtures: one local Spark session (with Delta) per test process, one warehouse.

Tests isolate themselves by database name (``db`` fixture), not by warehouse: the warehouse
directory is fixed when the JVM starts.
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


@pytest.fixture(scope="session")
def warehouse(tmp_path_factory) -> str:
    return str(tmp_path_factory.mktemp("warehouse"))


@pytest.fixture(scope="session")
def tr(warehouse):
    from airflow_trickle import Trickle

    # Test tables are tiny, so any change is a large share of them: the cost model's change-ratio
    # and touched-rows rules would turn every refresh FULL.  Tests of those rules set them per table.
    trickle = Trickle(warehouse=warehouse, spark_master="local[2]", shuffle_partitions=2,
                      differential_max_change_ratio=1e9, differential_max_touched_ratio=1e9)
    trickle.spark  # start the JVM once
    yield trickle
    trickle.spark.stop()


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

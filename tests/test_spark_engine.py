"""The engine seam's hand-over of Arrow rows to Spark (``spark/engine.py``)."""
from __future__ import annotations

import pyarrow as pa
import pytest

from airflow_trickle.spark.engine import SparkEngine

pytestmark = pytest.mark.both_spark_modes


def test_rows_behind_empty_record_batches_reach_spark(spark):
    """A delta-rs scan with a filter yields one batch per data file, most of them empty."""
    schema = pa.schema([pa.field("id", pa.int64(), nullable=False), pa.field("name", pa.large_string())])
    empty = pa.record_batch([pa.array([], pa.int64()), pa.array([], pa.large_string())], schema=schema)
    full = pa.record_batch([pa.array([1, 2], pa.int64()), pa.array(["a", None], pa.large_string())], schema=schema)
    rows = pa.Table.from_batches([empty, empty, empty, full, empty, full], schema=schema)
    frame = SparkEngine(spark).local_relation(rows, "__test_batches")
    try:
        assert sorted(map(tuple, frame.collect()), key=str) == sorted([(1, "a"), (2, None)] * 2, key=str)
        assert spark.sql("SELECT COUNT(*) FROM __test_batches").first()[0] == 4
    finally:
        spark.catalog.dropTempView("__test_batches")


def test_a_large_local_relation_is_kept_out_of_the_plan_and_reads_the_same(spark, monkeypatch):
    """Over ``PLAN_HELD_MAX_ROWS`` rows, a classic session gets the rows as a dataset rather than
    in the plan (which Spark's optimizer walks in every rule); they read the same either way,
    NULLs and duplicates included, and the session's setting is left as it was."""
    from airflow_trickle.spark import engine

    rows = pa.table({"k": pa.array([1, 1, None, 3], pa.int64()), "v": pa.array(["a", "a", None, "c"])})
    before = spark.conf.get("spark.sql.execution.arrow.localRelationThreshold")
    plans = {}
    for limit in (100, 3):
        monkeypatch.setattr(engine, "PLAN_HELD_MAX_ROWS", limit)
        view = f"__test_rows_{limit}"
        frame = SparkEngine(spark).local_relation(rows, view)
        try:
            got = spark.sql(f"SELECT a.k, a.v, b.v AS w FROM {view} a JOIN {view} b ON a.k = b.k").collect()
            assert sorted(map(tuple, got), key=str) == sorted([(1, "a", "a")] * 4 + [(3, "c", "c")], key=str)
            assert sorted(map(tuple, frame.collect()), key=str) == sorted(
                [(1, "a"), (1, "a"), (None, None), (3, "c")], key=str)
        finally:
            spark.catalog.dropTempView(view)
        if not engine.is_connect(spark):
            plans[limit] = frame._jdf.queryExecution().analyzed().toString()
    assert spark.conf.get("spark.sql.execution.arrow.localRelationThreshold") == before
    if plans:
        assert "LocalRelation" in plans[100] and "LocalRelation" not in plans[3]


class _Conf:
    """A session's runtime settings as ``spark.conf`` shows them (classic and Connect alike)."""

    def __init__(self, **values):
        self.values = dict(values)

    def get(self, key, default):
        return self.values.get(key, default)

    def set(self, key, value):
        self.values[key] = value

    def unset(self, key):
        self.values.pop(key, None)


def test_settings_for_a_statement_leave_the_session_as_it_was_even_when_it_fails():
    """A key set for one statement comes back to the user's value, or goes where it had none --
    after a failure too (a commit's metadata left behind would tag the user's next write)."""
    from types import SimpleNamespace

    from airflow_trickle.spark.delta import refresh_commit
    from airflow_trickle.spark.engine import session_settings

    spark = SimpleNamespace(conf=_Conf(**{"user.key": "theirs"}))
    with session_settings(spark, {"user.key": "ours", "new.key": "ours"}):
        assert spark.conf.values == {"user.key": "ours", "new.key": "ours"}
    assert spark.conf.values == {"user.key": "theirs"}
    with pytest.raises(RuntimeError), session_settings(spark, {"user.key": "ours", "new.key": "ours"}):
        raise RuntimeError("the statement failed")
    assert spark.conf.values == {"user.key": "theirs"}

    metadata_key = "spark.databricks.delta.commitInfo.userMetadata"
    spark = SimpleNamespace(conf=_Conf(**{metadata_key: "the user's tag"}))
    with refresh_commit(spark, metadata={"refresh": 1}, txn_app_id="app", txn_version=7):
        assert spark.conf.values["spark.databricks.delta.write.txnVersion"] == "7"
        assert "refresh" in spark.conf.values[metadata_key]
    assert spark.conf.values == {metadata_key: "the user's tag"}

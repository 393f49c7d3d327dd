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

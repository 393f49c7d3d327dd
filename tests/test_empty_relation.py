"""An empty relation handed to a classic Spark session (``spark/engine.py``): the embedded
default.  A Connect session makes any ``createDataFrame`` a local relation; a classic one made an
empty Python list an RDD of Python rows, read by Python workers."""
from __future__ import annotations

import pyarrow as pa

from airflow_trickle.spark.engine import SparkEngine


def test_an_empty_relation_is_local_and_keeps_its_columns(spark):
    """An empty change or probe is handed to Spark as a local relation of Arrow's columns, not
    an RDD of Python rows (Spark started Python workers to read one: seconds on the refresh path)."""
    schema = pa.schema([pa.field("id", pa.int64()), pa.field("name", pa.large_string()),
                        pa.field("amount", pa.decimal128(12, 2))])
    frame = SparkEngine(spark).local_relation(schema.empty_table(), "__test_empty")
    try:
        assert [(f.name, f.dataType.simpleString()) for f in frame.schema.fields] == [
            ("id", "bigint"), ("name", "string"), ("amount", "decimal(12,2)")]
        assert spark.sql("SELECT COUNT(*) FROM __test_empty").first()[0] == 0
        plan = spark.sql("EXPLAIN SELECT * FROM __test_empty").first()[0]
        assert "ExistingRDD" not in plan and "LocalTableScan" in plan, plan
    finally:
        spark.catalog.dropTempView("__test_empty")

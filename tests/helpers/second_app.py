"""Another Spark application on the same metastore: ``python -m tests.helpers.second_app WAREHOUSE URI SQL``.

Prints the rows of ``SQL`` as one JSON list (or ``MISSING`` when it names a table the metastore
does not know): what a BI tool or a colleague's job on the metastore sees.
"""
import json
import sys

from airflow_trickle.config import TrickleConfig
from airflow_trickle.spark.session import build_session
from tests.conftest import CHILD_SPARK


def main(warehouse: str, uri: str, sql: str) -> None:
    spark = build_session(TrickleConfig(spark_master="local[1]", metastore_uri=uri, shuffle_partitions=1,
                                        spark_conf=CHILD_SPARK), warehouse)
    try:
        rows = spark.sql(sql).collect()
    except Exception as err:  # noqa: BLE001 - the table is unknown to the metastore
        print("MISSING" if "TABLE_OR_VIEW_NOT_FOUND" in str(err) else f"ERROR {err}", flush=True)
    else:
        print(json.dumps(sorted([list(r) for r in rows], key=repr), default=str), flush=True)
    spark.stop()


if __name__ == "__main__":
    main(*sys.argv[1:4])

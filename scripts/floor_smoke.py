"""A DIFFERENTIAL refresh of a join and an aggregate on this environment's Spark and Delta (the
jars resolved to match them), checked against its query: ``scripts/floor-check.sh``'s last step."""
from __future__ import annotations

import importlib.metadata
import sys
import tempfile

from airflow_trickle import Trickle


def main() -> int:
    with tempfile.TemporaryDirectory(prefix="trickle-floor-") as warehouse:
        # a change of a few rows to tables of a few rows: DIFFERENTIAL, not the cost rules' FULL
        tr = Trickle(warehouse, spark_master="local[2]", shuffle_partitions=2, differential_max_time_ratio=1e9)
        tr.sql("CREATE DATABASE s")
        tr.sql("CREATE TABLE s.o (id INT, cid INT, amount INT) USING delta")
        tr.sql("CREATE TABLE s.c (id INT, region STRING) USING delta")
        tr.sql("INSERT INTO s.o VALUES (1, 1, 10), (2, 1, 20), (3, 2, 5), (3, 2, 5), (4, NULL, 1)")
        tr.sql("INSERT INTO s.c VALUES (1, 'n'), (2, 's')")
        query = ("SELECT c.region, COUNT(*) AS n, SUM(o.amount) AS total FROM s.o o JOIN s.c c ON o.cid = c.id "
                 "GROUP BY c.region")
        tr.create_stream_table("s.t", query, schedule=None)
        tr.sql("INSERT INTO s.o VALUES (5, 2, 7)")
        tr.sql("DELETE FROM s.o WHERE id = 1")
        tr.sql("UPDATE s.c SET region = 'w' WHERE id = 2")
        result = tr.refresh_stream_table("s.t")
        stored, expected = (sorted(map(tuple, frame.collect())) for frame in (tr.read("s.t"), tr.sql(query)))
        tr.close()
    versions = {name: importlib.metadata.version(name) for name in ("apache-airflow", "pyspark", "delta-spark")}
    exact = (result.action, result.status, stored) == ("DIFFERENTIAL", "COMPLETED", expected)
    print(f"floor smoke on {versions}: {result.action} {result.status}, "
          f"{'equals' if stored == expected else 'DIFFERS FROM'} its query")
    return 0 if exact else 1


if __name__ == "__main__":
    sys.exit(main())

"""TPC-H 22/22 in DIFFERENTIAL: every query a stream table, exact after every cycle of refresh
functions, and every refresh a DIFFERENTIAL one (no silent FULL).

Scale factor 0.01 and one cycle in the suite (``TRICKLE_TPCH_CYCLES=3`` runs three;
``TRICKLE_TPCH_SCALE`` another scale).  The workload is ``tests/tpch.py``.
"""
from __future__ import annotations

import os
from pathlib import Path

from tests import tpch
from tests.oracle import both_multisets

CYCLES = int(os.environ.get("TRICKLE_TPCH_CYCLES", "1"))
SCALE = float(os.environ.get("TRICKLE_TPCH_SCALE", "0.01"))


def test_the_22_tpch_queries_stay_exact_and_differential(tr, warehouse):
    database = "tpch_oracle"
    tpch.load(tr, SCALE, Path(warehouse) / "tpch-data", database)
    queries = {f"{database}.{name}": tpch.for_database(sql, database) for name, sql in tpch.queries().items()}
    for name, sql in queries.items():
        tr.create_stream_table(name, sql, refresh_mode="DIFFERENTIAL", schedule=None)
        assert tr.get(name).effective_mode == "DIFFERENTIAL", name
    for cycle in range(CYCLES):
        tpch.refresh_functions(tr, cycle, database)
        for name, sql in queries.items():
            result = tr.refresh_stream_table(name)
            assert (result.status, result.action) == ("COMPLETED", "DIFFERENTIAL"), (cycle, name, result)
            stored, wanted = both_multisets(tr.read(name), tr.sql(sql))
            assert stored == wanted, (f"cycle {cycle}: {name} differs from its query: "
                                      f"missing {[r for r in wanted if r not in stored][:3]}, "
                                      f"extra {[r for r in stored if r not in wanted][:3]}")

"""TPC-H 22/22 in DIFFERENTIAL: every query a stream table, exact after every cycle of refresh
functions, and every refresh a DIFFERENTIAL one (no silent FULL).

Scale factor 0.01 and one cycle in the suite (``TRICKLE_TPCH_CYCLES=3`` runs three;
``TRICKLE_TPCH_SCALE`` another scale).  The workload is ``tests/tpch.py``.
"""
from __future__ import annotations

import os
from pathlib import Path

from tests import tpch

CYCLES = int(os.environ.get("TRICKLE_TPCH_CYCLES", "1"))
SCALE = float(os.environ.get("TRICKLE_TPCH_SCALE", "0.01"))


def test_the_22_tpch_queries_stay_exact_and_differential(tr, warehouse):
    database = "tpch_oracle"
    tpch.load(tr, SCALE, Path(warehouse) / "tpch-data", database)
    stream_tables = tpch.create_differential(tr, database)
    for cycle in range(CYCLES):
        tpch.refresh_functions(tr, cycle, database)
        tpch.refresh_and_check(tr, stream_tables, cycle)

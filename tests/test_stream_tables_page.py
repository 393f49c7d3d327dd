"""The Stream tables page (Airflow plugin) and the overview behind it: catalog and Delta logs only."""
from __future__ import annotations

import json
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import pytest

from airflow_trickle.catalog import CatalogStore, RefreshRecord
from airflow_trickle.catalog.model import Dependency, StreamTable, utcnow

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def warehouse(tmp_path):
    """A warehouse with a source Delta table and two stream tables in the catalog, written without Spark:
    ``db.lines`` (every minute, data 5 minutes old: stale) over ``db.src``, and ``db.totals``
    (CALCULATED from nothing downstream, an explicit 1h target) over ``db.lines``."""
    import pyarrow as pa
    from deltalake import write_deltalake

    source = tmp_path / "db.db" / "src"
    write_deltalake(str(source), pa.table({"k": [1, 2], "v": ["a", None]}))
    catalog = CatalogStore(str(tmp_path / "_trickle"))
    now = utcnow()
    catalog.insert(StreamTable(
        name="db.lines", st_id="1", defining_query="SELECT k, v FROM db.src WHERE k > 0",
        original_query="SELECT k, v FROM db.src WHERE k > 0", schedule="1m", refresh_mode="DIFFERENTIAL",
        effective_mode="DIFFERENTIAL", is_populated=True, data_timestamp=now - timedelta(minutes=5),
        output_columns=["k", "v"], location=str(tmp_path / "db.db" / "lines")),
        [Dependency(st_name="db.lines", source_name="db.src", source_type="TABLE", source_location=str(source))])
    catalog.insert(StreamTable(
        name="db.totals", st_id="2", defining_query="SELECT COUNT(*) AS n FROM db.lines",
        original_query="SELECT COUNT(*) AS n FROM db.lines", schedule=None, refresh_mode="FULL",
        effective_mode="FULL", mode_reason="chosen FULL", is_populated=True, data_timestamp=now,
        options={"freshness_seconds": 3600}, output_columns=["n"]),
        [Dependency(st_name="db.totals", source_name="db.lines", source_type="STREAM_TABLE")])
    for i in range(25):
        catalog.append_history(RefreshRecord(
            refresh_id=f"r{i}", st_name="db.lines", seq=i, action="DIFFERENTIAL", status="FAILED" if i == 3 else "COMPLETED",
            rows_inserted=i, rows_deleted=1, start_time=now - timedelta(minutes=30 - i), duration_ms=100 * i))
    catalog.append_history(RefreshRecord(
        refresh_id="m", st_name="db.lines", seq=24, action="FRESHNESS_MISS", status="ALERT", start_time=now,
        reason="stream table 'db.lines' missed its freshness target", initiated_by="DEADLINE trickle_p/run_7"))
    return str(tmp_path)


def test_overview_gives_age_against_target_and_recent_refreshes(warehouse):
    from airflow_trickle.ops.overview import operator_tree, overview

    catalog = CatalogStore(f"{warehouse}/_trickle")
    lines, totals = overview(catalog, utcnow())
    assert lines["name"] == "db.lines" and lines["target_s"] == 120 and lines["stale"]  # 2 x 1m, 5m old
    assert 299 <= lines["age_s"] < 330
    assert len(lines["recent"]) == 20 and lines["recent"][-1]["rows_inserted"] == 24  # oldest first
    assert lines["last"]["action"] == "DIFFERENTIAL" and lines["last"]["duration_ms"] == 2400
    assert lines["last_miss"]["initiated_by"] == "DEADLINE trickle_p/run_7"
    assert totals["target_s"] == 3600 and not totals["stale"] and totals["last"] is None
    tree = "\n".join(operator_tree(catalog, "db.lines"))
    assert "Scan db.src" in tree and "k > 0" in tree, tree
    assert operator_tree(catalog, "db.totals") == []  # FULL: recomputed, no tree


def test_the_page_needs_airflow_login_and_shows_every_stream_table(warehouse):
    """Airflow's API server (in a child process) mounts the plugin; anonymous requests are refused.
    The example's DAG, serialized beside it, draws the lineage of its tables in Airflow's own
    asset graph: source -> refresh task -> stream table -> refresh task -> stream table; and a run
    of it takes the notes a refresh task and the plan task write through the REST API."""
    done = subprocess.run([sys.executable, "-m", "tests.helpers.api_server", warehouse,
                           str(ROOT / "dags_example")], cwd=ROOT, capture_output=True, text=True, timeout=600)
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    assert lines, done.stdout[-3000:] + done.stderr[-3000:]
    result = json.loads(lines[-1][len("RESULT "):])
    assert result["anonymous_page"] == 401 and result["anonymous_data"] == 401
    assert result["bad_token"] in (401, 403)
    assert "<h1>Stream tables</h1>" in result["page"]
    (shown,) = result["data"]["warehouses"]
    assert shown["error"] is None
    assert [t["name"] for t in shown["stream_tables"]] == ["db.lines", "db.totals"]
    assert shown["stream_tables"][0]["stale"] and shown["stream_tables"][0]["target_s"] == 120
    assert any("Scan db.src" in line for line in result["tree"]["tree"])
    plugin = next(p for p in result["plugins"]["plugins"] if p["name"] == "airflow_trickle")
    assert plugin["external_views"][0]["href"] == "/trickle/" and plugin["external_views"][0]["name"] == "Stream tables"
    task, asset = "trickle_shop.shop.{}".format, "trickle/shop/shop.{}".format
    chain = result["lineage"][asset("top_customers")]
    for edge in ([asset("orders"), task("order_lines")], [asset("customers"), task("order_lines")],
                 [task("order_lines"), asset("order_lines")], [asset("order_lines"), task("customer_totals")],
                 [task("customer_totals"), asset("customer_totals")], [asset("customer_totals"), task("top_customers")],
                 [task("top_customers"), asset("top_customers")]):
        assert edge in chain, (edge, chain)
    # the atomic diamond is one task: it reads the sources and writes its three tables
    for name in ("big_orders", "region_revenue", "region_report"):
        diamond = result["lineage"][asset(name)]
        for edge in ([asset("orders"), task("atomic__region_report")], [task("atomic__region_report"), asset(name)]):
            assert edge in diamond, (edge, diamond)
    # notes, written through Airflow's REST API as a refresh task and the plan task do, read back
    notes = result["notes"]
    assert notes["trigger"] and notes["wrote"] == [True, True], notes
    assert notes["task_note"] == "DIFFERENTIAL +12 -3 rows in 1.4 s"
    assert notes["run_note"] == "manual run: shop.order_lines (mode AUTO)"
    assert notes["refused"] is False  # a wrong password: logged, never raised

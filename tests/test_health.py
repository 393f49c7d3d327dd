"""Change-feed health (``health.py``) on Delta tables written without Spark: the time left before
a VACUUM may delete an unread change, the alerts, BROKEN after files are gone, the page's column."""
from __future__ import annotations

import os
from datetime import timedelta
from types import SimpleNamespace

import pyarrow as pa
from deltalake import write_deltalake

from airflow_trickle.catalog import CatalogStore
from airflow_trickle.catalog.model import Dependency, StreamTable, utcnow
from airflow_trickle.config import TrickleConfig
from airflow_trickle.ops.health import health


def watched(tmp_path, *, change_feed=True, retention=None):
    """A source at version 0 and a DIFFERENTIAL stream table that has read it up to version 0."""
    source = str(tmp_path / "db.db" / "src")
    configuration = {"delta.enableChangeDataFeed": "true" if change_feed else "false"}
    if retention:
        configuration["delta.deletedFileRetentionDuration"] = retention
    write_deltalake(source, pa.table({"k": [1, 2]}), configuration=configuration)
    catalog = CatalogStore(str(tmp_path / "_trickle"))
    catalog.insert(StreamTable(
        name="db.reader", st_id="1", defining_query="SELECT k FROM db.src", original_query="SELECT k FROM db.src",
        schedule="1m", refresh_mode="DIFFERENTIAL", effective_mode="DIFFERENTIAL", is_populated=True,
        frontier={"db.src": 0}, output_columns=["k"]),
        [Dependency(st_name="db.reader", source_name="db.src", source_type="TABLE", source_location=source,
                    cdc_mode="cdf")])
    return source, SimpleNamespace(catalog=catalog, config=TrickleConfig())


def reader_of(env, **kwargs):
    (source,) = health(env, **kwargs)
    assert source.source == "db.src"
    return source, source.readers[0]


def test_a_reader_is_ok_then_at_risk_as_the_retention_runs_out_and_is_alerted_once(tmp_path):
    path, env = watched(tmp_path)
    source, reader = reader_of(env)
    assert (source.change_feed, source.latest_version, source.deleted_file_retention) == (True, 0, timedelta(days=7))
    assert (reader.status, reader.time_left) == ("OK", None) and "up to date" in reader.message
    write_deltalake(path, pa.table({"k": [3]}), mode="append")
    _, reader = reader_of(env)
    assert reader.status == "OK" and timedelta(days=6, hours=23) < reader.time_left <= timedelta(days=7)
    later = utcnow() + timedelta(days=6, hours=12)
    _, reader = reader_of(env, now=later)
    assert reader.status == "AT_RISK" and "may delete them in 11h" in reader.message, reader
    reader_of(env, now=later + timedelta(minutes=5))  # within the hour: no second alert
    alerts = [r for r in env.catalog.history("db.reader") if r.action == "CHANGE_FEED"]
    assert len(alerts) == 1 and alerts[0].status == "ALERT" and alerts[0].reason.startswith("change feed of db.src")
    _, reader = reader_of(env, now=utcnow() + timedelta(days=8), record_alerts=False)
    assert reader.status == "AT_RISK" and "the next VACUUM of db.src breaks it" in reader.message


def test_a_deleted_file_of_the_unread_window_is_broken(tmp_path):
    path, env = watched(tmp_path, retention="interval 2 hours")
    write_deltalake(path, pa.table({"k": [3]}), mode="append")
    source, reader = reader_of(env, record_alerts=False)
    assert source.deleted_file_retention == timedelta(hours=2) and reader.status == "AT_RISK"
    data = [f for f in os.listdir(path) if f.endswith(".parquet")]
    added = max(data, key=lambda f: os.path.getmtime(os.path.join(path, f)))
    os.remove(os.path.join(path, added))  # what VACUUM does once the retention has passed
    _, reader = reader_of(env, record_alerts=False)
    assert reader.status == "BROKEN" and "vacuumed" in reader.message and "runs FULL" in reader.message


def test_a_change_feed_turned_off_is_at_risk_and_the_page_shows_it(tmp_path):
    from airflow_trickle.ops.overview import overview

    path, env = watched(tmp_path, change_feed=False)
    write_deltalake(path, pa.table({"k": [3]}), mode="append")
    _, reader = reader_of(env, record_alerts=False)
    assert reader.status == "AT_RISK" and "change data feed of db.src is off" in reader.message
    (row,) = overview(env.catalog, utcnow())
    assert row["change_feed"]["status"] == "AT_RISK" and "is off" in row["change_feed"]["message"]

"""DIFFERENTIAL mode: what it refuses, when it falls back to FULL (and says why), crash safety."""
from __future__ import annotations

import logging

import pytest

from airflow_trickle.catalog import CatalogStore
from airflow_trickle.errors import RefreshError, UnsupportedConstructError
from airflow_trickle.refresh import apply, committer, decide, plan
from airflow_trickle.refresh.time_rule import delta_planner
from tests.oracle import multiset

pytestmark = pytest.mark.both_spark_modes


def make_sources(tr, db, rows=20):
    tr.sql(f"CREATE TABLE {db}.o (id INT, cid INT, amount INT) USING delta")
    tr.sql(f"INSERT INTO {db}.o SELECT CAST(id AS INT), CAST(id % 4 AS INT), CAST(id AS INT) FROM range({rows})")
    tr.sql(f"CREATE TABLE {db}.c (id INT, region STRING) USING delta")
    tr.sql(f"INSERT INTO {db}.c VALUES (0, 'n'), (1, 's'), (2, 'e')")


def assert_matches(tr, name, query):
    assert multiset(tr.read(name)) == multiset(tr.sql(query))


@pytest.mark.parametrize("query,construct", [
    ("SELECT o.id, c.region FROM {db}.o o LEFT JOIN {db}.c c ON o.cid > c.id", "LEFT JOIN without an equality"),
    ("SELECT o.id, c.region FROM {db}.o o JOIN {db}.o o2 ON o.id = o2.id RIGHT JOIN {db}.c c ON o.cid = c.id",
     "RIGHT JOIN after another join"),
    ("SELECT cid, COUNT(*) AS n, rank() OVER (ORDER BY COUNT(*)) AS r FROM {db}.o GROUP BY cid",
     "window function over an aggregate"),
    ("SELECT o.id FROM {db}.o o WHERE o.cid NOT IN (SELECT c.id FROM {db}.c c WHERE c.id > o.amount)",
     "correlated NOT IN"),
    ("SELECT o.id, (SELECT c.region FROM {db}.c c WHERE c.id = o.cid) AS r FROM {db}.o o", "without a single aggregate"),
    ("SELECT id FROM {db}.o LIMIT 5", "LIMIT without ORDER BY"),
    ("SELECT id, uuid() AS u FROM {db}.o", "uuid()"),
    ("SELECT cid, COUNT(*) AS n, (SELECT max(id) FROM {db}.c) AS m FROM {db}.o GROUP BY cid", "scalar subquery"),
])
def test_differential_rejects_what_it_cannot_maintain_at_create_time(tr, db, query, construct):
    make_sources(tr, db)
    name = f"{db}.rejected"
    with pytest.raises(UnsupportedConstructError) as raised:
        tr.create_stream_table(name, query.format(db=db), refresh_mode="DIFFERENTIAL")
    assert f"stream table '{name}'" in str(raised.value) and construct in str(raised.value)
    assert raised.value.construct and construct in raised.value.construct
    assert not tr.spark.catalog.tableExists(name) and tr.catalog.get(name) is None


def test_auto_takes_full_and_says_why(tr, db):
    make_sources(tr, db)
    name = f"{db}.auto"
    query = f"SELECT o.id, c.region FROM {db}.o o LEFT JOIN {db}.c c ON o.cid > c.id"
    st = tr.create_stream_table(name, query, refresh_mode="AUTO")
    assert st.effective_mode == "FULL" and "LEFT JOIN without an equality" in st.mode_reason
    tr.sql(f"INSERT INTO {db}.o VALUES (100, 3, 1)")
    result = tr.refresh_stream_table(name)
    assert result.action == "FULL" and "LEFT JOIN without an equality" in result.reason
    assert_matches(tr, name, query)
    assert tr.create_stream_table(f"{db}.auto_ok", f"SELECT id FROM {db}.o", refresh_mode="AUTO").effective_mode == "DIFFERENTIAL"


def test_large_changes_run_full_small_ones_differential(tr, db):
    make_sources(tr, db, rows=200)
    name = f"{db}.ratio"
    query = f"SELECT cid, SUM(amount) AS s FROM {db}.o GROUP BY cid"
    tr.create_stream_table(name, query, options={"differential_max_change_ratio": 0.15})
    tr.sql(f"UPDATE {db}.o SET amount = amount + 1 WHERE id < 100")  # 50% of the rows
    big = tr.refresh_stream_table(name)
    assert big.action == "FULL" and "change ratio" in big.reason
    tr.sql(f"UPDATE {db}.o SET amount = 0 WHERE id = 7")
    small = tr.refresh_stream_table(name)
    assert small.action == "DIFFERENTIAL"
    assert_matches(tr, name, query)
    assert [h.reason for h in tr.history(name) if h.action == "FULL" and h.initiated_by == "MANUAL"][0] == big.reason


def test_the_cost_model_sees_fan_out_and_a_strict_table_refuses(tr, db):
    make_sources(tr, db, rows=200)  # 4 customers of 50 rows each
    query = (f"SELECT o.id, g.total FROM {db}.o o "
             f"JOIN (SELECT cid, SUM(amount) AS total FROM {db}.o GROUP BY cid) g ON o.cid = g.cid")
    lenient, strict = f"{db}.fan", f"{db}.fan_strict"
    tr.create_stream_table(lenient, query, options={"differential_max_touched_ratio": 0.3})
    tr.create_stream_table(strict, query, options={"differential_max_touched_ratio": 0.3, "strict": True})
    # one changed row reaches its customer's 50 detail rows: observed fan-out ~50
    tr.sql(f"UPDATE {db}.o SET amount = amount + 1 WHERE id = 5")
    first = tr.refresh_stream_table(lenient)
    assert first.action == "DIFFERENTIAL" and first.rows_touched >= 50
    assert tr.refresh_stream_table(strict).action == "DIFFERENTIAL"
    # the next one-row change is expected to touch ~100 of 200 stored rows: FULL, and why
    tr.sql(f"UPDATE {db}.o SET amount = amount + 1 WHERE id = 6")
    second = tr.refresh_stream_table(lenient)
    assert second.action == "FULL" and "expected to touch" in second.reason, second.reason
    assert second.rows_estimated >= 60
    assert_matches(tr, lenient, query)
    # its commit carries the measured fan-out forward (a FULL measures none), counting itself
    from airflow_trickle.storage.deltalog import recorded_refreshes

    carried = recorded_refreshes(tr.catalog.at(tr.get(lenient).location))[0]["fanout"]
    assert carried["per_row"] == pytest.approx(first.rows_touched / first.changed_rows)
    assert carried["fulls_since"] == 1 and carried["remeasure_after"] >= 8, carried
    with pytest.raises(RefreshError, match="refused by the cost model"):
        tr.refresh_stream_table(strict)
    row = tr.history(lenient, limit=5)[0]
    assert row.action == "FULL" and row.rows_estimated == second.rows_estimated
    assert row.phases["commit"] > 0 and row.phases["rows_touched"] == second.rows_touched


def test_a_delta_measured_slower_than_recomputing_runs_full_with_the_times(tr, db):
    make_sources(tr, db, rows=50)
    name = f"{db}.timed"
    query = f"SELECT cid, COUNT(*) AS n, SUM(amount) AS s FROM {db}.o GROUP BY cid"
    # a delta may take 1% of the last FULL (the initial population): any delta is slower
    tr.create_stream_table(name, query, options={"differential_max_time_ratio": 0.01})
    tr.sql(f"UPDATE {db}.o SET amount = amount + 1 WHERE id = 5")
    first = tr.refresh_stream_table(name)  # no delta measured yet
    assert first.action == "DIFFERENTIAL" and first.changed_rows == 2  # an update: a delete and an insert
    tr.sql(f"UPDATE {db}.o SET amount = amount + 1 WHERE id = 6")
    second = tr.refresh_stream_table(name)
    assert second.action == "FULL", second
    assert second.reason.startswith("its DIFFERENTIAL refreshes took "), second.reason
    assert " (2 changed source rows), its FULL ones " in second.reason
    assert second.reason.endswith("recomputed (differential_max_time_ratio 0.01)")
    assert_matches(tr, name, query)
    rows = tr.history(name, limit=2)
    assert [r.action for r in rows] == ["FULL", "DIFFERENTIAL"] and rows[1].phases["changed_rows"] == 2
    assert rows[1].phases["planner"] == delta_planner(arranged=tr.config.arrangement_max_bytes > 0)
    assert "planner" not in rows[0].phases  # a FULL measures no delta
    cost = tr.explain(name)["cost"]  # what the rule knows and will do next
    assert cost.startswith("DIFFERENTIAL ") and cost.endswith(": a change of 1 row or more runs FULL"), cost


def test_insert_only_changes_are_appended_without_a_merge(tr, db):
    make_sources(tr, db)
    name = f"{db}.appended"
    query = f"SELECT o.id, o.amount, c.region FROM {db}.o o JOIN {db}.c c ON o.cid = c.id"
    tr.create_stream_table(name, query)

    def last_operation():
        return tr.spark.sql(f"DESCRIBE HISTORY {name} LIMIT 1").first().operation

    # new rows on both sides of the join, one a duplicate of a stored row (copy number 2)
    tr.sql(f"INSERT INTO {db}.o VALUES (5, 1, 5), (90, 3, 1), (91, 0, NULL)")
    tr.sql(f"INSERT INTO {db}.c VALUES (3, 'w'), (1, 's')")
    result = tr.refresh_stream_table(name)
    assert result.action == "DIFFERENTIAL" and last_operation() == "WRITE"
    assert result.rows_inserted == result.rows_touched > 0 and result.rows_deleted == 0
    assert_matches(tr, name, query)
    # a deletion needs the MERGE
    tr.sql(f"DELETE FROM {db}.o WHERE id = 5")
    assert tr.refresh_stream_table(name).action == "DIFFERENTIAL" and last_operation() == "MERGE"
    assert_matches(tr, name, query)
    # a replayed append is skipped by its transaction id
    tr.sql(f"INSERT INTO {db}.o VALUES (92, 1, 7)")
    stale, current = tr.get(name), decide.source_versions(tr.catalog, name)
    from airflow_trickle.catalog.model import utcnow

    first = apply.apply_refresh(tr, stale, "DIFFERENTIAL", current, refresh_id="a", data_timestamp=utcnow())
    replay = apply.apply_refresh(tr, stale, "DIFFERENTIAL", current, refresh_id="b", data_timestamp=utcnow())
    # customer 1 is in c twice, so the new order joins two rows
    assert first.rows_inserted == 2 and replay.rows_inserted == 0 and "already landed" in replay.reason
    assert_matches(tr, name, query)


def test_unreadable_change_feed_falls_back_to_full(tr, db):
    make_sources(tr, db)
    name = f"{db}.nocdf"
    query = f"SELECT cid, COUNT(*) AS n FROM {db}.o GROUP BY cid"
    tr.create_stream_table(name, query)
    tr.sql(f"ALTER TABLE {db}.o SET TBLPROPERTIES (delta.enableChangeDataFeed = false)")
    tr.sql(f"INSERT INTO {db}.o VALUES (50, 1, 1)")
    result = tr.refresh_stream_table(name)
    assert result.action == "FULL" and "change feed unavailable" in result.reason
    assert_matches(tr, name, query)


def test_killed_after_the_data_commit_nothing_applied_twice(tr, db, monkeypatch):
    make_sources(tr, db)
    name = f"{db}.crash"
    query = f"SELECT o.cid, c.region, o.amount FROM {db}.o o JOIN {db}.c c ON o.cid = c.id"
    tr.create_stream_table(name, query)
    tr.sql(f"INSERT INTO {db}.o VALUES (60, 1, 5), (61, 1, 5)")
    tr.sql(f"DELETE FROM {db}.o WHERE id = 2")

    def killed(self, st_name, change):
        raise OSError("killed after the data commit")

    with monkeypatch.context() as patch:
        patch.setattr(CatalogStore, "update", killed)
        with pytest.raises(RefreshError):
            tr.refresh_stream_table(name)
    assert_matches(tr, name, query)  # the data commit landed
    retried = tr.refresh_stream_table(name)
    assert retried.action == "NO_DATA" and "recovered frontier" in retried.reason
    assert_matches(tr, name, query)


def test_killed_before_the_data_commit_the_retry_applies_once(tr, db, monkeypatch):
    make_sources(tr, db)
    name = f"{db}.crash2"
    query = f"SELECT cid, SUM(amount) AS s, COUNT(*) AS n FROM {db}.o GROUP BY cid"
    tr.create_stream_table(name, query)
    tr.sql(f"INSERT INTO {db}.o VALUES (70, 2, 5)")

    def killed(*args, **kwargs):
        raise OSError("killed before the data commit")

    with monkeypatch.context() as patch:
        # the change is small: it would be committed by delta-rs (Spark's MERGE otherwise)
        patch.setattr(committer, "merge_locally", killed)
        patch.setattr(committer, "refresh_commit", killed)
        with pytest.raises(RefreshError):
            tr.refresh_stream_table(name)
    assert multiset(tr.read(name)) != multiset(tr.sql(query))  # nothing applied yet
    assert tr.refresh_stream_table(name).action == "DIFFERENTIAL"
    assert_matches(tr, name, query)
    assert tr.sql(f"DESCRIBE HISTORY {name} LIMIT 1").first().engineInfo.startswith("delta-rs")
    assert tr.explain(name)["commit"].startswith("delta-rs, for changes expected to touch at most 100,000")


def test_a_replayed_commit_is_skipped_by_its_transaction_id(tr, db):
    make_sources(tr, db)
    name = f"{db}.replay"
    query = f"SELECT cid, SUM(amount) AS s FROM {db}.o GROUP BY cid"
    tr.create_stream_table(name, query)
    tr.sql(f"INSERT INTO {db}.o VALUES (80, 3, 1000)")
    stale = tr.get(name)
    current = decide.source_versions(tr.catalog, name)
    from airflow_trickle.catalog.model import utcnow

    first = apply.apply_refresh(tr, stale, "DIFFERENTIAL", current, refresh_id="a", data_timestamp=utcnow())
    version_after_first = tr.spark.sql(f"DESCRIBE HISTORY {name} LIMIT 1").first().version
    # a retry that did not see the first commit computes the same change with the same number
    apply.apply_refresh(tr, stale, "DIFFERENTIAL", current, refresh_id="b", data_timestamp=utcnow())
    assert tr.spark.sql(f"DESCRIBE HISTORY {name} LIMIT 1").first().version == version_after_first
    assert first.rows_inserted >= 1
    assert_matches(tr, name, query)
    # ... and one that read newer source versions than the commit that landed records the
    # landed commit's frontier, so that the newer changes are applied by the next refresh
    tr.sql(f"INSERT INTO {db}.o VALUES (81, 3, 1)")
    newer = decide.source_versions(tr.catalog, name)
    skipped = apply.apply_refresh(tr, stale, "DIFFERENTIAL", newer, refresh_id="c", data_timestamp=utcnow())
    assert "already landed" in skipped.reason and skipped.frontier == current != newer
    assert tr.get(name).frontier == current
    assert tr.refresh_stream_table(name).action == "DIFFERENTIAL"
    assert_matches(tr, name, query)


def test_an_append_that_lost_a_race_records_the_winners_frontier(tr, db, monkeypatch):
    """Two refreshes of one bag table with the same refresh number, both appending: Delta skips
    the loser's INSERT (its transaction id landed), and the commit the loser finds after its
    start is the winner's.  It must record the winner's frontier, not its own (a concurrency
    trial over the Spark service lost a source change this way)."""
    from airflow_trickle.catalog.model import utcnow

    make_sources(tr, db)
    name = f"{db}.appended"
    query = f"SELECT id, cid, amount FROM {db}.o WHERE amount > 0"
    tr.create_stream_table(name, query)
    tr.sql(f"INSERT INTO {db}.o VALUES (90, 1, 5)")
    stale = tr.get(name)
    winner_versions = decide.source_versions(tr.catalog, name)
    storage_before = apply.latest_version(tr.catalog.at(stale.location))
    won = apply.apply_refresh(tr, stale, "DIFFERENTIAL", winner_versions, refresh_id="winner", data_timestamp=utcnow())
    assert won.rows_inserted == 1 and won.frontier == winner_versions
    tr.sql(f"INSERT INTO {db}.o VALUES (91, 1, 6)")  # the loser read one more insert
    loser_versions = decide.source_versions(tr.catalog, name)
    # the loser read the storage table's version before the winner's commit landed
    read_versions = iter([storage_before])
    real_latest_version = apply.latest_version
    monkeypatch.setattr(apply, "latest_version", lambda location: next(read_versions, None) or real_latest_version(location))
    lost = apply.apply_refresh(tr, stale, "DIFFERENTIAL", loser_versions, refresh_id="loser", data_timestamp=utcnow())
    assert "already landed" in lost.reason and lost.frontier == winner_versions != loser_versions
    assert tr.get(name).frontier == winner_versions
    monkeypatch.undo()
    assert tr.refresh_stream_table(name).action == "DIFFERENTIAL"  # the insert of id 91 is applied now
    assert_matches(tr, name, query)


def test_change_feed_health_warns_before_a_vacuum_and_the_refresh_recovers_after_it(tr, db):
    """Seed 004: a reader at risk is reported (and alerted) before a VACUUM breaks it; after a
    real VACUUM the report says BROKEN and the refresh runs FULL, exactly."""
    from datetime import timedelta

    make_sources(tr, db)
    name = f"{db}.watched"
    query = f"SELECT cid, SUM(amount) AS s FROM {db}.o GROUP BY cid"
    tr.create_stream_table(name, query)

    def report():
        return {s.source: s for s in tr.health()}[f"{db}.o"]

    def reader():
        return report().readers[0]

    first = report()
    assert first.change_feed and first.deleted_file_retention == timedelta(days=7)
    assert (first.readers[0].status, first.readers[0].time_left) == ("OK", None)
    tr.sql(f"UPDATE {db}.o SET amount = amount + 1 WHERE id = 1")  # change files, a removed data file
    unread = reader()
    assert unread.status == "OK" and timedelta(days=6) < unread.time_left <= timedelta(days=7)
    tr.sql(f"ALTER TABLE {db}.o SET TBLPROPERTIES (delta.deletedFileRetentionDuration = 'interval 2 hours')")
    at_risk = reader()
    assert at_risk.status == "AT_RISK" and at_risk.time_left <= timedelta(hours=2), at_risk
    alerts = [r for r in tr.history(name) if r.action == "CHANGE_FEED"]
    assert len(alerts) == 1 and alerts[0].status == "ALERT" and "may delete them in" in alerts[0].reason
    settings = {"spark.databricks.delta.retentionDurationCheck.enabled": "false",
                "spark.sql.sources.parallelPartitionDiscovery.parallelism": "8"}  # a 3 s VACUUM, not 38 s
    for key, value in settings.items():
        tr.spark.conf.set(key, value)
    try:
        tr.sql(f"VACUUM {db}.o RETAIN 0 HOURS")
    finally:
        for key in settings:
            tr.spark.conf.unset(key)
    broken = reader()
    assert broken.status == "BROKEN" and "vacuumed" in broken.message, broken
    result = tr.refresh_stream_table(name)
    assert result.action == "FULL" and "change feed unavailable" in result.reason, result
    assert_matches(tr, name, query)
    assert reader().status == "OK"


def newest_commit_and_feed(tr, name):
    """The stream table's newest commit (``DESCRIBE HISTORY``'s row) and the change feed it wrote,
    visible columns and change type, as a multiset."""
    newest = tr.sql(f"DESCRIBE HISTORY {name} LIMIT 1").first()
    columns = ", ".join(f"`{c}`" for c in tr.get(name).output_columns)
    return newest, multiset(tr.sql(
        f"SELECT {columns}, _change_type FROM table_changes('{name}', {newest.version}, {newest.version})"))


def test_delta_rs_and_spark_commit_the_same_rows_and_the_same_change_feed(tr, db, monkeypatch):
    """Small changes are committed by delta-rs (Spark resolves the MERGE, delta-rs applies it);
    with ``local_commit_max_rows = 0`` Spark's MERGE commits them.  Same sources, same changes
    (inserts, deletes, updates, NULL keys, duplicates, a group that vanishes and comes back):
    every table equals its query, and their commits' change feeds hold the same rows.  delta-rs
    reads the aggregate's stored rows two ways: the whole (small) table, or only the rows the
    change's keys name; the bag table's delta is resolved in this process against the stored
    copies it names (``refresh/local_bag.py``) either way."""
    from airflow_trickle.refresh import local_bag

    resolved_here = set()  # storage folders of the bag deltas resolved in this process
    real_resolved = local_bag.LocalBag.resolved

    def resolving(self, table):
        resolved = real_resolved(self, table)
        if resolved is not None and resolved is not False:
            resolved_here.add(table.table_uri.rstrip("/").rsplit("/", 1)[-1])
        return resolved

    monkeypatch.setattr(local_bag.LocalBag, "resolved", resolving)
    tr.sql(f"CREATE TABLE {db}.o (id INT, cid INT, amount INT) USING delta")
    tr.sql(f"INSERT INTO {db}.o VALUES (1, 1, 10), (2, 1, 20), (3, 2, 30), (4, NULL, 5), (4, NULL, 5), (5, 3, 7)")
    tr.sql(f"CREATE TABLE {db}.c (id INT, region STRING) USING delta")
    tr.sql(f"INSERT INTO {db}.c VALUES (1, 'n'), (2, 's'), (2, 's'), (3, NULL)")
    queries = {
        "agg": f"SELECT cid, COUNT(*) AS n, SUM(amount) AS s, MIN(amount) AS lo, MAX(amount) AS hi "
               f"FROM {db}.o GROUP BY cid",
        "bag": f"SELECT o.id, o.amount, c.region FROM {db}.o o JOIN {db}.c c ON o.cid = c.id",
    }
    for kind, query in queries.items():
        for how in ("local", "keys", "spark"):
            tr.create_stream_table(f"{db}.{kind}_{how}", query, schedule=None)
    batches = [  # group 3 vanishes in the first and comes back in the second
        [f"INSERT INTO {db}.o VALUES (6, 2, 1), (7, NULL, 9), (2, 1, 20)", f"DELETE FROM {db}.o WHERE id = 3",
         f"UPDATE {db}.o SET amount = amount + 100 WHERE cid = 1", f"DELETE FROM {db}.o WHERE cid = 3",
         f"UPDATE {db}.c SET region = 'w' WHERE id = 1"],
        [f"INSERT INTO {db}.o VALUES (8, 3, 4), (9, 3, 4)", f"DELETE FROM {db}.o WHERE cid IS NULL"],
        # only inserts: the bag table's delta only adds rows, an append (duplicates, a NULL key)
        [f"INSERT INTO {db}.o VALUES (10, 1, 3), (10, 1, 3), (11, NULL, 2), (12, 2, 8)"],
    ]
    for appends, batch in zip((False, False, True), batches):
        for statement in batch:
            tr.sql(statement)
        for kind, query in queries.items():
            feeds = {}
            for how in ("local", "keys", "spark"):
                name = f"{db}.{kind}_{how}"
                monkeypatch.setattr(tr.config, "local_commit_max_rows", 0 if how == "spark" else 100_000)
                monkeypatch.setattr(plan, "STORED_SHIPPED_WHOLE_ROWS", 0 if how == "keys" else 20_000)
                result = tr.refresh_stream_table(name)
                assert result.action == "DIFFERENTIAL", (name, result.reason)
                assert_matches(tr, name, query)
                newest, feeds[how] = newest_commit_and_feed(tr, name)
                assert newest.engineInfo.startswith("delta-rs") == (how != "spark"), (name, newest.engineInfo)
                if kind == "bag":  # an append is a WRITE (by delta-rs too), not a MERGE
                    assert (newest.operation == "WRITE") == appends, (name, newest.operation)
            assert feeds["local"] == feeds["keys"] == feeds["spark"], kind
    assert resolved_here == {"bag_local", "bag_keys"}, resolved_here


def test_a_full_refresh_s_small_result_is_written_by_delta_rs_as_spark_would_write_it(tr, db, monkeypatch):
    """A FULL refresh that replaces the stored rows (nothing reads the table) computes them with
    Spark and, where the table and the result hold at most ``local_commit_max_rows`` rows, writes
    them with delta-rs instead of Spark's INSERT OVERWRITE (``refresh/local_overwrite.py``); with
    0, Spark writes.  Same rows -- every type, NULLs, duplicate copies -- and the same change
    feed; a result that outgrew the limit is written by Spark; a replayed refresh number is
    skipped by its transaction id."""
    from airflow_trickle.catalog.model import utcnow

    tr.sql(f"CREATE TABLE {db}.t (id INT, k STRING, amount DECIMAL(12,2), ratio DOUBLE, day DATE, at TIMESTAMP) "
           f"USING delta")
    tr.sql(f"INSERT INTO {db}.t VALUES (1, 'a', 1.50, 0.5, DATE'2026-01-01', TIMESTAMP'2026-01-01 10:00:00'), "
           f"(2, 'a', 1.50, 0.5, DATE'2026-01-01', TIMESTAMP'2026-01-01 10:00:00'), (3, NULL, NULL, NULL, NULL, NULL), "
           f"(4, 'b', -2.25, 1e300, DATE'1999-12-31', TIMESTAMP'1999-12-31 23:59:59.123456')")
    queries = {"bag": f"SELECT k, amount, ratio, day, at FROM {db}.t",
               "agg": f"SELECT k, day, SUM(amount) AS s, COUNT(*) AS n, MAX(at) AS last, AVG(ratio) AS r "
                      f"FROM {db}.t GROUP BY k, day"}
    for kind, query in queries.items():
        for how in ("local", "spark"):
            tr.create_stream_table(f"{db}.{kind}_{how}", query, refresh_mode="FULL", schedule=None)
    batches = [
        [f"UPDATE {db}.t SET amount = amount + 1 WHERE id = 1", f"DELETE FROM {db}.t WHERE id = 4",
         f"INSERT INTO {db}.t VALUES (5, 'a', 1.50, 0.5, DATE'2026-01-01', TIMESTAMP'2026-01-01 10:00:00'), "
         f"(6, NULL, NULL, NULL, NULL, NULL)"],
        [f"DELETE FROM {db}.t WHERE k IS NULL", f"INSERT INTO {db}.t VALUES (7, 'c', 0.01, -0.0, NULL, NULL)"],
    ]
    for batch in batches:
        for statement in batch:
            tr.sql(statement)
        for kind, query in queries.items():
            feeds = {}
            for how in ("local", "spark"):
                name = f"{db}.{kind}_{how}"
                monkeypatch.setattr(tr.config, "local_commit_max_rows", 100_000 if how == "local" else 0)
                stored_before = tr.read(name).count()
                result = tr.refresh_stream_table(name)
                assert result.action == "FULL", (name, result.reason)
                assert_matches(tr, name, query)
                assert (result.rows_inserted, result.rows_deleted) == (tr.read(name).count(), stored_before), name
                newest, feeds[how] = newest_commit_and_feed(tr, name)
                assert newest.engineInfo.startswith("delta-rs") == (how == "local"), (name, newest.engineInfo)
            assert feeds["local"] == feeds["spark"], kind
    # a result above the limit (the table was within it): computed again and written by Spark
    name, query = f"{db}.bag_local", queries["bag"]
    monkeypatch.setattr(tr.config, "local_commit_max_rows", tr.read(name).count())
    tr.sql(f"INSERT INTO {db}.t VALUES (8, 'd', 2.00, 2.0, DATE'2026-02-02', NULL)")
    assert tr.refresh_stream_table(name).action == "FULL"
    assert_matches(tr, name, query)
    assert not tr.sql(f"DESCRIBE HISTORY {name} LIMIT 1").first().engineInfo.startswith("delta-rs")
    # a retry of a refresh whose delta-rs commit landed (but was never recorded) is skipped
    monkeypatch.setattr(tr.config, "local_commit_max_rows", 100_000)
    name, query = f"{db}.agg_local", queries["agg"]
    tr.sql(f"INSERT INTO {db}.t VALUES (9, 'e', 3.00, 3.0, DATE'2026-03-03', NULL)")
    stale, current = tr.get(name), decide.source_versions(tr.catalog, name)
    apply.apply_refresh(tr, stale, "FULL", current, refresh_id="a", data_timestamp=utcnow())
    landed = tr.sql(f"DESCRIBE HISTORY {name} LIMIT 1").first()
    assert landed.engineInfo.startswith("delta-rs")
    again = apply.apply_refresh(tr, stale, "FULL", current, refresh_id="b", data_timestamp=utcnow())
    assert "already landed" in again.reason
    assert tr.sql(f"DESCRIBE HISTORY {name} LIMIT 1").first().version == landed.version
    assert_matches(tr, name, query)


def test_bag_copies_numbered_without_a_shuffle_stay_exact_through_deltas_and_a_new_reader(tr, db):
    """A bag table's copies are numbered without a shuffle (unique negative numbers) by its first
    population and by a FULL refresh that overwrites it (nothing reads it); once a DIFFERENTIAL
    stream table reads it, a FULL refresh applies only its difference, by content: the copies
    that stay keep their numbers, and only the changed ones are inserted or deleted.  Duplicated
    rows gain and lose copies by DIFFERENTIAL refreshes in between, and every table equals its
    query."""
    tr.sql(f"CREATE TABLE {db}.o (id INT, cid INT, amount INT) USING delta")
    tr.sql(f"INSERT INTO {db}.o VALUES (1, 1, 10), (1, 1, 10), (1, 1, 10), (2, NULL, 5), (2, NULL, 5), (3, 2, 7)")
    name, query = f"{db}.bag", f"SELECT cid, amount FROM {db}.o"
    tr.create_stream_table(name, query, schedule=None, refresh_mode="DIFFERENTIAL")
    copies = lambda: sorted(r[0] for r in tr.sql(f"SELECT __trickle_dup FROM {name}").collect())  # noqa: E731
    assert all(n < 0 for n in copies()) and len(set(copies())) == 6  # unique, no ranking shuffle
    tr.sql(f"INSERT INTO {db}.o VALUES (8, 3, 3)")
    assert tr.refresh_stream_table(name, mode="FULL").action == "FULL"
    assert_matches(tr, name, query)
    assert all(n < 0 for n in copies()) and len(set(copies())) == 7
    steps = [
        (f"DELETE FROM {db}.o WHERE id = 2", "DIFFERENTIAL"),
        (f"INSERT INTO {db}.o VALUES (4, 1, 10), (5, NULL, 5)", "DIFFERENTIAL"),
        (f"UPDATE {db}.o SET amount = 10 WHERE id = 3", "DIFFERENTIAL"),
        (f"DELETE FROM {db}.o WHERE id = 1", "FULL"),
        (f"INSERT INTO {db}.o VALUES (6, 1, 10), (6, 1, 10)", "DIFFERENTIAL"),
    ]
    for statement, mode in steps:
        tr.sql(statement)
        assert tr.refresh_stream_table(name, mode=mode).action == mode
        assert_matches(tr, name, query)
        assert len(set(zip(*[[r[0] for r in tr.sql(f"SELECT {c} FROM {name}").collect()]
                             for c in ("__trickle_row_id", "__trickle_dup")]))) == len(copies())
    tr.create_stream_table(f"{db}.reader", f"SELECT cid, COUNT(*) AS n FROM {name} GROUP BY cid", schedule=None)
    tr.sql(f"INSERT INTO {db}.o VALUES (7, 2, 1), (7, 2, 1)")
    before = copies()
    diffed = tr.refresh_stream_table(name, mode="FULL")  # applied as its difference: two copies in
    assert (diffed.action, diffed.rows_inserted, diffed.rows_deleted) == ("FULL", 2, 0)
    assert_matches(tr, name, query)
    assert set(before) <= set(copies()) and len(copies()) == len(before) + 2
    assert tr.refresh_stream_table(f"{db}.reader").action in ("DIFFERENTIAL", "FULL")
    assert_matches(tr, f"{db}.reader", f"SELECT cid, COUNT(*) AS n FROM {db}.o GROUP BY cid")
    tr.sql(f"DELETE FROM {db}.o WHERE id = 7")
    diffed = tr.refresh_stream_table(name, mode="FULL")
    assert (diffed.action, diffed.rows_inserted, diffed.rows_deleted) == ("FULL", 0, 2)
    assert_matches(tr, name, query)
    assert copies() == before
    assert tr.refresh_stream_table(f"{db}.reader").action == "DIFFERENTIAL"
    assert_matches(tr, f"{db}.reader", f"SELECT cid, COUNT(*) AS n FROM {db}.o GROUP BY cid")


def typed_source(tr, db):
    """``{db}.typed``: a column of every primitive type and ``v INT``, with its change feed, empty;
    returns ``row(n, v)`` (the SQL of a row whose every column derives from ``n``) and the SQL
    of a row of NULLs with ``v = 1``."""
    columns = ("i INT, b BIGINT, sm SMALLINT, ti TINYINT, s STRING, f BOOLEAN, d DOUBLE, r FLOAT, dt DATE, "
               "ts TIMESTAMP, nt TIMESTAMP_NTZ, m DECIMAL(12,3), bin BINARY, v INT")
    tr.sql(f"CREATE TABLE {db}.typed ({columns}) USING delta TBLPROPERTIES (delta.enableChangeDataFeed = true)")

    def row(n: int, v: int) -> str:
        return (f"({n}, {n * 10_000_000_000}, {n % 300}, {n % 100}, 'k{n}é', {str(n % 2 == 0).lower()}, "
                f"{n}.25D, {n}.5F, DATE'2024-02-{n % 28 + 1:02d}', TIMESTAMP'2024-03-10 02:{n % 60:02d}:07.123456', "
                f"TIMESTAMP_NTZ'2024-03-31 23:{n % 60:02d}:59.000001', {n}.125BD, X'{n:04x}', {v})")

    return row, "(NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, 1)"


def test_a_bag_delta_is_resolved_here_with_every_type_nulls_and_duplicates(tr, db, caplog):
    """A bag table's delta is computed by Spark once and resolved in this process against the
    stored copies delta-rs reads (``refresh/local_bag.py``): copies gained are numbered after the
    highest stored one, copies lost are the highest-numbered.  Columns of every primitive type
    pass through unchanged (each value cast by Spark to the stored type), NULLs and duplicates
    included, the commit is delta-rs's, and the table equals its query after every refresh."""
    row, nulls = typed_source(tr, db)
    rows = [(n, n % 3) for n in range(8)] + [(2, 10), (2, 11), (5, 12)]  # i = 2: three copies, i = 5: two
    tr.sql(f"INSERT INTO {db}.typed VALUES {', '.join(row(n, v) for n, v in rows)}, {nulls}, {nulls}")
    name = f"{db}.bag"
    query = f"SELECT i, b, sm, ti, s, f, d, r, dt, ts, nt, m, bin FROM {db}.typed WHERE v >= 0"
    tr.create_stream_table(name, query, schedule=None, refresh_mode="DIFFERENTIAL")
    identities = f"SELECT __trickle_row_id, __trickle_dup FROM {name}"
    steps = [[f"DELETE FROM {db}.typed WHERE i = 2 AND v = 10"],  # one copy of three lost
             [f"INSERT INTO {db}.typed VALUES {row(5, 20)}, {row(5, 21)}, {row(9, 1)}, {nulls}",  # copies gained
              f"DELETE FROM {db}.typed WHERE i = 7"],  # (not an insert-only window: no append)
             [f"UPDATE {db}.typed SET v = -1 WHERE i = 5 AND v >= 20"],  # both lost again
             [f"UPDATE {db}.typed SET i = 9 WHERE i = 2"],  # two copies lost, two of another content gained
             [f"DELETE FROM {db}.typed WHERE i IS NULL"]]  # every copy of a content of NULLs
    for statement in steps:
        for sql in statement:
            tr.sql(sql)
        before = {tuple(r) for r in tr.sql(identities).collect()}
        with caplog.at_level(logging.INFO, logger="airflow_trickle"):
            caplog.clear()
            result = tr.refresh_stream_table(name)
        assert result.action == "DIFFERENTIAL", (statement, result.reason)
        assert "resolved here against" in caplog.text, statement
        assert tr.sql(f"DESCRIBE HISTORY {name} LIMIT 1").first().engineInfo.startswith("delta-rs")
        assert_matches(tr, name, query)
        after = [tuple(r) for r in tr.sql(identities).collect()]
        assert len(set(after)) == len(after), statement  # identities stay unique
        kept = before & set(after)  # a copy that stays keeps its number; every other one is new
        assert len(after) - len(kept) == result.rows_inserted and len(before) - len(kept) == result.rows_deleted


def test_the_stored_rows_a_small_change_matches_keep_every_type_however_they_are_read(tr, db, monkeypatch):
    """A small change is resolved against the stored rows it matches, read three ways: by delta-rs
    and shipped whole (a small table), by delta-rs by the change's keys, or by Spark (a table
    too large to read here).  Group keys of every primitive type pass through the matched rows
    unchanged (a timestamp shifted by a time zone, a decimal's scale, a float's precision would
    break the equality), with NULLs and a group that vanishes and comes back."""

    row, nulls = typed_source(tr, db)
    tr.sql(f"INSERT INTO {db}.typed VALUES {', '.join(row(n, n) for n in range(6))}, {nulls}")
    keys = "i, b, sm, ti, s, f, d, r, dt, ts, nt, m, bin"
    query = f"SELECT {keys}, COUNT(*) AS n, SUM(v) AS total FROM {db}.typed GROUP BY {keys}"
    ways = {"whole": {}, "by_keys": {"STORED_SHIPPED_WHOLE_ROWS": 0},
            "spark": {"STORED_SHIPPED_WHOLE_ROWS": 0, "STORED_READ_MAX_ROWS": 0}}
    for way in ways:
        tr.create_stream_table(f"{db}.typed_{way}", query, schedule=None, refresh_mode="DIFFERENTIAL")
    for batch in ([f"UPDATE {db}.typed SET v = v + 100 WHERE i % 2 = 0 OR i IS NULL",
                   f"INSERT INTO {db}.typed VALUES {row(1, 7)}, {row(9, 9)}", f"DELETE FROM {db}.typed WHERE i = 3"],
                  [f"INSERT INTO {db}.typed VALUES {row(3, 3)}, {nulls}", f"DELETE FROM {db}.typed WHERE i = 9"]):
        for statement in batch:
            tr.sql(statement)
        for way, limits in ways.items():
            for limit, value in {"STORED_SHIPPED_WHOLE_ROWS": plan.STORED_SHIPPED_WHOLE_ROWS,
                                 "STORED_READ_MAX_ROWS": plan.STORED_READ_MAX_ROWS, **limits}.items():
                monkeypatch.setattr(plan, limit, value)
            name = f"{db}.typed_{way}"
            assert tr.refresh_stream_table(name).action == "DIFFERENTIAL"
            assert tr.sql(f"DESCRIBE HISTORY {name} LIMIT 1").first().engineInfo.startswith("delta-rs"), way
            assert_matches(tr, name, query)


def test_a_refresh_plans_once(tr, db, monkeypatch):
    """The DVM plans a refresh once (``dvm/delta_plan.py``); the refresh layer executes that plan --
    here a top-K over an aggregate: its groups counted, its candidates and boundary probed, its MERGE."""
    from airflow_trickle.dvm import planner

    make_sources(tr, db)
    name = f"{db}.planned"
    query = f"SELECT cid, SUM(amount) AS s FROM {db}.o GROUP BY cid ORDER BY s DESC, cid LIMIT 2"
    tr.create_stream_table(name, query)
    tr.sql(f"INSERT INTO {db}.o VALUES (100, 3, 1)")
    calls = []
    real = planner.plan
    monkeypatch.setattr(planner, "plan", lambda *args, **kwargs: calls.append(args) or real(*args, **kwargs))
    result = tr.refresh_stream_table(name)
    assert result.action == "DIFFERENTIAL" and len(calls) == 1
    assert_matches(tr, name, query)


def test_a_top_k_decided_in_this_process_equals_the_one_spark_decides(tr, db, monkeypatch):
    """A top-K's candidates are collected once and its boundary, new rows and their changes are
    decided in this process (``refresh/local_topk.py``), committed by delta-rs -- or, with that
    turned off, probed and committed by Spark.  Both stay equal to the query through inserts,
    updates and deletes, NULLs in the ORDER BY columns (NULLS FIRST and LAST), strings beyond
    ASCII, decimals, duplicate rows, and a change that empties the top (a row left it: the query
    is read beyond the boundary)."""
    import random

    from airflow_trickle.refresh import local_topk

    tr.sql(f"CREATE TABLE {db}.t (id INT, s STRING, m DECIMAL(10,2), g INT) USING delta "
           "TBLPROPERTIES (delta.enableChangeDataFeed = true)")
    rng = random.Random(38)
    strings = ["a", "b", "é", "z", "Z", "ab", None]

    def rows(count: int) -> str:
        values = []
        for _ in range(count):
            s, m = rng.choice(strings), rng.choice([None, *range(-3, 6)])
            values.append(f"({rng.randrange(30)}, {'NULL' if s is None else repr(s)}, "
                          f"{'NULL' if m is None else f'{m}.5BD'}, {rng.randrange(4)})")
        return ", ".join(values)

    tr.sql(f"INSERT INTO {db}.t VALUES {rows(40)}")
    queries = {  # every output column ordered: the top k is one multiset (duplicates are equal rows)
        "rows": f"SELECT s, m, g FROM {db}.t ORDER BY m DESC NULLS LAST, s ASC NULLS FIRST, g LIMIT 6",
        "groups": (f"SELECT s, SUM(m) AS total, COUNT(*) AS n FROM {db}.t GROUP BY s "
                   "ORDER BY total DESC NULLS FIRST, n, s DESC NULLS LAST LIMIT 3"),
    }
    for way in ("here", "spark"):
        for kind, query in queries.items():
            tr.create_stream_table(f"{db}.{kind}_{way}", query, schedule=None, refresh_mode="DIFFERENTIAL")
    decided = []
    real = local_topk.top_copies
    monkeypatch.setattr(local_topk, "top_copies", lambda *a, **k: decided.append(1) or real(*a, **k))
    batches = [f"INSERT INTO {db}.t VALUES {rows(5)}", f"UPDATE {db}.t SET m = m + 1 WHERE id % 3 = 0",
               f"DELETE FROM {db}.t WHERE id % 5 = 1", f"INSERT INTO {db}.t VALUES {rows(3)}, {rows(3)}",
               f"UPDATE {db}.t SET s = NULL WHERE id % 4 = 2", f"DELETE FROM {db}.t WHERE m > 3.0"]
    for batch in batches:
        tr.sql(batch)
        for way in ("here", "spark"):
            monkeypatch.setattr(plan, "MAX_CANDIDATES", 100_000 if way == "here" else 0)
            for kind, query in queries.items():
                name = f"{db}.{kind}_{way}"
                assert tr.refresh_stream_table(name).action == "DIFFERENTIAL", name
                assert_matches(tr, name, query)
    assert decided, "no top-K was decided in this process"


def test_changes_to_stored_rows_spread_over_many_files_are_all_applied(tr, db, monkeypatch):
    """The stored rows a change names are read by delta-rs with a filter (tables too large to
    ship whole), one record batch per data file, most of them empty; handed to Spark, every
    row must arrive (PySpark 4.2 dropped them all behind two empty batches: deletes were lost
    once a bag table held a few files, ``spark/engine.frame_of``)."""
    from airflow_trickle.storage.deltalog import open_table

    monkeypatch.setattr(plan, "STORED_SHIPPED_WHOLE_ROWS", 0)
    tr.sql(f"CREATE TABLE {db}.o (id INT, cid INT, amount INT) USING delta")
    tr.sql(f"INSERT INTO {db}.o VALUES (0, 0, 0), (0, 0, 0)")
    name, query = f"{db}.bag", f"SELECT id, cid, amount FROM {db}.o"
    tr.create_stream_table(name, query, schedule=None, refresh_mode="DIFFERENTIAL")
    for batch in range(1, 6):  # a data file of the stored table each
        tr.sql(f"INSERT INTO {db}.o VALUES ({batch}, {batch}, 1), ({batch}, {batch}, 1), ({batch}, NULL, 2)")
        assert tr.refresh_stream_table(name).action == "DIFFERENTIAL"
    assert len(open_table(tr.catalog.at(tr.get(name).location)).file_uris()) >= 4
    for statement in (f"DELETE FROM {db}.o WHERE id IN (0, 5)", f"DELETE FROM {db}.o WHERE id = 3 AND cid IS NULL",
                      f"UPDATE {db}.o SET amount = 9 WHERE id = 4"):
        tr.sql(statement)
        result = tr.refresh_stream_table(name)
        assert result.action == "DIFFERENTIAL" and result.rows_deleted > 0, (statement, result)
        assert_matches(tr, name, query)

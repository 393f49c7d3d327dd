"""Create / refresh FULL / drop on real Spark + Delta, and the bad inputs of a definition."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from airflow_trickle.catalog import CatalogStore
from airflow_trickle.errors import (
    AlreadyExistsError,
    CycleError,
    DefinitionError,
    InvalidQueryError,
    InvalidRefreshModeError,
    InvalidScheduleError,
    RefreshError,
    StreamTableNotFoundError,
    UnknownSourceError,
    UnsupportedConstructError,
)
from tests.conftest import rows, visible

pytestmark = pytest.mark.both_spark_modes

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def orders(tr, db, values="(1, 1, 10), (2, 1, 20), (3, 2, 30), (4, NULL, 5), (4, NULL, 5)"):
    tr.sql(f"CREATE TABLE {db}.orders (id INT, cid INT, amount INT) USING delta")
    tr.sql(f"INSERT INTO {db}.orders VALUES {values}")
    return f"{db}.orders"


def expected(tr, query):
    return rows(tr.sql(query))


def test_create_populates_and_full_refresh_follows_changes(tr, db):
    orders(tr, db)
    query = f"SELECT id, cid, amount * 2 AS doubled FROM {db}.orders WHERE amount >= 5"
    st = tr.create_stream_table(f"{db}.big", query, refresh_mode="FULL", schedule="5m")
    assert st.is_populated and st.status == "ACTIVE" and st.schedule == "5m"
    assert visible(tr, f"{db}.big") == expected(tr, query)
    assert st.frontier == {f"{db}.orders": 1}

    tr.sql(f"UPDATE {db}.orders SET amount = 99 WHERE id = 1")
    tr.sql(f"DELETE FROM {db}.orders WHERE id = 3")
    tr.sql(f"INSERT INTO {db}.orders VALUES (5, 3, 50), (4, NULL, 5)")
    result = tr.refresh_stream_table(f"{db}.big")
    assert result.action == "FULL" and result.status == "COMPLETED"
    # nothing reads it, so the recomputed rows replaced the stored ones: 6 in, the 5 stored out
    assert (result.rows_inserted, result.rows_deleted) == (6, 5)
    assert visible(tr, f"{db}.big") == expected(tr, query)
    assert tr.get(f"{db}.big").frontier == {f"{db}.orders": 4}
    actions = [h.action for h in tr.history(f"{db}.big")]
    assert actions == ["FULL", "FULL"]


def test_no_data_when_no_source_has_a_new_version(tr, db):
    orders(tr, db)
    tr.create_stream_table(f"{db}.st", f"SELECT * FROM {db}.orders", refresh_mode="FULL",
                           options={"full_refresh_write": "merge"})
    result = tr.refresh_stream_table(f"{db}.st")
    assert result.action == "NO_DATA" and result.rows_inserted == 0
    tr.sql(f"INSERT INTO {db}.orders VALUES (9, 9, 9)")
    assert tr.refresh_stream_table(f"{db}.st").action == "FULL"
    assert tr.refresh_stream_table(f"{db}.st").action == "NO_DATA"
    forced = tr.refresh_stream_table(f"{db}.st", mode="FULL")
    assert forced.action == "FULL" and forced.rows_inserted == 0 and forced.rows_deleted == 0


def test_full_refresh_is_a_diff_where_a_differential_reader_reads_its_feed_and_an_overwrite_elsewhere(tr, db, spark):
    """A FULL refresh of a table a DIFFERENTIAL stream table reads changes only what changed (its
    change feed stays small); one nothing reads, or only stream tables that refresh FULL (they
    recompute from the rows, never from the feed), replaces its rows (cheaper); all are exact."""
    tr.sql(f"CREATE TABLE {db}.events (id INT, kind STRING, value INT) USING delta")
    tr.sql(f"INSERT INTO {db}.events SELECT CAST(id AS INT), CAST(id % 7 AS STRING), CAST(id * 3 AS INT) FROM range(1000)")
    query = f"SELECT id, kind, value FROM {db}.events"
    tr.create_stream_table(f"{db}.copy", query, refresh_mode="FULL")
    tr.create_stream_table(f"{db}.alone", query, refresh_mode="FULL")
    tr.create_stream_table(f"{db}.kinds", f"SELECT kind, COUNT(*) AS n FROM {db}.copy GROUP BY kind",
                           refresh_mode="DIFFERENTIAL", schedule=None)
    recount = f"SELECT kind, COUNT(*) AS n FROM {db}.alone GROUP BY kind"
    tr.create_stream_table(f"{db}.alone_kinds", recount, refresh_mode="FULL", schedule=None)
    tr.sql(f"UPDATE {db}.events SET value = -1 WHERE id = 500")

    def changes(name, version):
        return sorted((r.id, r.value, r._change_type) for r in spark.sql(
            f"SELECT id, value, _change_type FROM table_changes('{name}', {version}, {version})").collect())

    read = tr.refresh_stream_table(f"{db}.copy")
    assert changes(f"{db}.copy", read.table_version) == [(500, -1, "insert"), (500, 1500, "delete")]
    assert (read.rows_inserted, read.rows_deleted) == (1, 1)
    # a bag's difference: computed by Spark once, committed by delta-rs as a small change
    landed = spark.sql(f"DESCRIBE HISTORY {db}.copy LIMIT 1").first()
    assert landed.operation == "MERGE" and landed.engineInfo.startswith("delta-rs"), landed
    alone = tr.refresh_stream_table(f"{db}.alone")
    feed = changes(f"{db}.alone", alone.table_version)
    assert len(feed) == 2000 and (500, -1, "insert") in feed and (500, 1500, "delete") in feed
    assert (alone.rows_inserted, alone.rows_deleted) == (1000, 1000)
    for name in (f"{db}.copy", f"{db}.alone"):
        assert visible(tr, name) == expected(tr, query), name
    assert tr.refresh_stream_table(f"{db}.kinds").action == "DIFFERENTIAL"
    assert visible(tr, f"{db}.kinds") == expected(tr, f"SELECT kind, COUNT(*) AS n FROM {db}.events GROUP BY kind")
    assert tr.refresh_stream_table(f"{db}.alone_kinds").action == "FULL"
    assert visible(tr, f"{db}.alone_kinds") == expected(tr, recount)


def test_unaliased_expressions_are_stored_under_the_names_spark_gives_them(tr, db):
    """``SUM(amount)`` is stored as ``sum(amount)`` (a name Delta takes only with column mapping),
    refreshed DIFFERENTIALLY, and read by a downstream stream table through its change feed."""
    orders(tr, db)
    totals, doubled, big = f"{db}.totals", f"{db}.doubled", f"{db}.big_totals"
    queries = {
        totals: f"SELECT cid, SUM(amount), COUNT(*) FROM {db}.orders GROUP BY cid",
        doubled: f"SELECT id, amount * 2 FROM {db}.orders",
        big: f"SELECT cid, `sum(amount)` FROM {totals} WHERE `count(1)` > 1",
    }
    for name, query in queries.items():
        tr.create_stream_table(name, query, refresh_mode="DIFFERENTIAL", schedule=None)
    assert tr.read(totals).columns == ["cid", "sum(amount)", "count(1)"]
    assert tr.read(doubled).columns == ["id", "(amount * 2)"]
    tr.sql(f"UPDATE {db}.orders SET cid = 2 WHERE id = 1")
    tr.sql(f"INSERT INTO {db}.orders VALUES (6, 2, 7), (7, NULL, 1)")
    tr.sql(f"DELETE FROM {db}.orders WHERE id = 3")
    for name, query in queries.items():
        assert tr.refresh_stream_table(name).action == "DIFFERENTIAL", name
        assert visible(tr, name) == expected(tr, query), name
    # delta-rs does not write column mapping: these keep Spark's MERGE, and explain says why
    assert "delta-rs does not write this table: column mapping" in tr.explain(totals)["commit"]


def test_duplicates_and_nulls_keep_their_multiplicity(tr, db):
    tr.sql(f"CREATE TABLE {db}.src (id INT, a INT, b STRING) USING delta")
    tr.sql(f"INSERT INTO {db}.src VALUES (1, 1, NULL), (2, NULL, '1'), (3, 1, NULL), (4, 1, NULL), (5, NULL, NULL)")
    query = f"SELECT a, b FROM {db}.src"
    tr.create_stream_table(f"{db}.ab", query, refresh_mode="FULL")
    assert visible(tr, f"{db}.ab") == expected(tr, query)
    assert visible(tr, f"{db}.ab").count((1, None)) == 3
    tr.sql(f"DELETE FROM {db}.src WHERE id IN (3, 5)")
    tr.sql(f"INSERT INTO {db}.src VALUES (6, NULL, '1')")
    tr.refresh_stream_table(f"{db}.ab")
    assert visible(tr, f"{db}.ab") == expected(tr, query)
    assert visible(tr, f"{db}.ab").count((1, None)) == 2


def test_stream_table_over_stream_table_hides_the_hidden_columns(tr, db):
    orders(tr, db)
    tr.create_stream_table(f"{db}.a", f"SELECT * FROM {db}.orders WHERE amount > 5", refresh_mode="FULL")
    b = tr.create_stream_table(f"{db}.b", f"SELECT * FROM {db}.a", refresh_mode="FULL")
    assert b.output_columns == ["id", "cid", "amount"]
    assert tr.catalog.dependencies(f"{db}.b")[0].source_type == "STREAM_TABLE"
    tr.sql(f"INSERT INTO {db}.orders VALUES (7, 7, 70)")
    tr.refresh_stream_table(f"{db}.a")
    assert tr.refresh_stream_table(f"{db}.b").action == "FULL"
    assert visible(tr, f"{db}.b") == expected(tr, f"SELECT * FROM {db}.orders WHERE amount > 5")


def assert_nothing_created(tr, name):
    assert not tr.spark.catalog.tableExists(name)
    assert tr.catalog.get(name) is None
    assert tr.catalog.dependencies(name) == []


@pytest.mark.parametrize("query,mode,schedule,error,words", [
    ("SELECT id FROM {db}.orders WHERE", "FULL", "1m", InvalidQueryError, "does not parse"),
    ("SELECT nope FROM {db}.orders", "FULL", "1m", InvalidQueryError, "does not analyse"),
    ("SELECT * FROM {db}.missing", "FULL", "1m", UnknownSourceError, "unknown table '{db}.missing'"),
    ("SELECT * FROM {db}.orders", "SOMETIMES", "1m", InvalidRefreshModeError, "invalid refresh mode"),
    ("SELECT * FROM {db}.orders", "FULL", "every 5 minutes", InvalidScheduleError, "invalid schedule"),
    ("SELECT * FROM {db}.target", "FULL", "1m", CycleError, "reads the stream table itself"),
    ("SELECT id, rand() AS r FROM {db}.orders", "DIFFERENTIAL", "1m", UnsupportedConstructError, "rand()"),
    ("SELECT o.id, p.id FROM {db}.orders o JOIN {db}.orders p ON o.id = p.id", "FULL", "1m", InvalidQueryError, "unique"),
    ("SELECT id AS `a``b` FROM {db}.orders", "FULL", "1m", InvalidQueryError, "is not a valid column name"),
    ("SELECT * FROM {db}.plain", "FULL", "1m", UnknownSourceError, "not a Delta table"),
])
def test_bad_definitions_raise_naming_the_table_and_create_nothing(tr, db, query, mode, schedule, error, words):
    orders(tr, db)
    tr.sql(f"CREATE TABLE {db}.plain (id INT) USING parquet")
    name = f"{db}.target"
    with pytest.raises(error) as raised:
        tr.create_stream_table(name, query.format(db=db), refresh_mode=mode, schedule=schedule)
    assert f"stream table '{name}'" in str(raised.value)
    assert words.format(db=db) in str(raised.value)
    assert_nothing_created(tr, name)


def test_existing_names_are_refused(tr, db):
    orders(tr, db)
    tr.create_stream_table(f"{db}.st", f"SELECT * FROM {db}.orders", refresh_mode="FULL")
    with pytest.raises(AlreadyExistsError, match="stream table of this name"):
        tr.create_stream_table(f"{db}.st", f"SELECT id FROM {db}.orders", refresh_mode="FULL")
    with pytest.raises(AlreadyExistsError, match="a table of this name"):
        tr.create_stream_table(f"{db}.orders", f"SELECT id FROM {db}.st", refresh_mode="FULL")
    assert visible(tr, f"{db}.st") == expected(tr, f"SELECT * FROM {db}.orders")


def test_failed_initialization_leaves_nothing(tr, db):
    orders(tr, db)
    name = f"{db}.broken"
    with pytest.raises(RefreshError) as raised:
        tr.create_stream_table(name, f"SELECT id, amount DIV (amount - amount) AS q FROM {db}.orders", refresh_mode="FULL")
    assert f"stream table '{name}'" in str(raised.value)
    assert_nothing_created(tr, name)


def test_drop_refuses_dependents_unless_cascade(tr, db):
    orders(tr, db)
    tr.create_stream_table(f"{db}.a", f"SELECT * FROM {db}.orders", refresh_mode="FULL")
    tr.create_stream_table(f"{db}.b", f"SELECT id FROM {db}.a", refresh_mode="FULL")
    with pytest.raises(DefinitionError, match=f"{db}.b"):
        tr.drop_stream_table(f"{db}.a")
    tr.drop_stream_table(f"{db}.a", cascade=True)
    assert_nothing_created(tr, f"{db}.a")
    assert_nothing_created(tr, f"{db}.b")
    assert not os.path.exists(os.path.join(tr.warehouse, f"{db}.db", "a"))
    with pytest.raises(StreamTableNotFoundError):
        tr.drop_stream_table(f"{db}.a")
    tr.drop_stream_table(f"{db}.a", if_exists=True)
    # the name is free again
    tr.create_stream_table(f"{db}.a", f"SELECT id FROM {db}.orders", refresh_mode="FULL")


def test_alter_schedule_mode_and_status(tr, db):
    orders(tr, db)
    name = f"{db}.st"
    tr.create_stream_table(name, f"SELECT * FROM {db}.orders", refresh_mode="FULL")
    assert tr.alter_stream_table(name, schedule="*/10 * * * *").schedule == "*/10 * * * *"
    with pytest.raises(InvalidScheduleError, match=name):
        tr.alter_stream_table(name, schedule="soon")
    # a bad value beside a new query refuses the whole ALTER before the query is replaced
    with pytest.raises(InvalidScheduleError, match=name):
        tr.alter_stream_table(name, query=f"SELECT id FROM {db}.orders", schedule="soon")
    with pytest.raises(DefinitionError, match="unknown option 'stric'"):
        tr.alter_stream_table(name, query=f"SELECT id FROM {db}.orders", options={"stric": True})
    assert tr.get(name).original_query == f"SELECT * FROM {db}.orders"
    assert tr.alter_stream_table(name, status="SUSPENDED").status == "SUSPENDED"
    tr.sql(f"INSERT INTO {db}.orders VALUES (8, 8, 8)")
    skipped = tr.refresh_stream_table(name)
    assert skipped.action == "SKIP" and "SUSPENDED" in skipped.reason
    assert tr.alter_stream_table(name, status="ACTIVE").status == "ACTIVE"
    assert tr.refresh_stream_table(name).action == "FULL"
    with pytest.raises(InvalidRefreshModeError):
        tr.alter_stream_table(name, status="PAUSED")


def test_a_crash_after_the_data_commit_is_recovered_without_double_apply(tr, db, monkeypatch):
    orders(tr, db)
    name = f"{db}.st"
    query = f"SELECT cid, amount FROM {db}.orders"
    tr.create_stream_table(name, query, refresh_mode="FULL")
    tr.sql(f"INSERT INTO {db}.orders VALUES (10, 1, 1)")

    real_update = CatalogStore.update

    def crash_on_frontier_update(self, st_name, change):
        raise OSError("killed between the data commit and the catalog update")

    monkeypatch.setattr(CatalogStore, "update", crash_on_frontier_update)
    with pytest.raises(RefreshError):
        tr.refresh_stream_table(name)
    monkeypatch.setattr(CatalogStore, "update", real_update)
    assert tr.get(name).frontier == {f"{db}.orders": 1}  # the catalog is behind the data

    result = tr.refresh_stream_table(name)
    assert result.action == "NO_DATA" and "recovered frontier" in result.reason
    assert tr.get(name).frontier == {f"{db}.orders": 2}
    assert visible(tr, name) == expected(tr, query)


def test_error_count_and_suspension(tr, db):
    orders(tr, db)
    name = f"{db}.fragile"
    tr.create_stream_table(name, f"SELECT id, amount DIV cid AS q FROM {db}.orders WHERE cid IS NOT NULL", refresh_mode="FULL")
    tr.sql(f"INSERT INTO {db}.orders VALUES (20, 0, 1)")
    for attempt in range(1, 4):
        with pytest.raises(RefreshError, match=name):
            tr.refresh_stream_table(name)
        assert tr.get(name).consecutive_errors == attempt
    assert tr.get(name).status == "ERROR"
    assert tr.refresh_stream_table(name).action == "SKIP"
    failed = [h for h in tr.history(name) if h.status == "FAILED"]
    assert len(failed) == 3 and "DIVIDE_BY_ZERO" in failed[0].error_message.upper().replace(" ", "_")


def run_cli(*args, warehouse, env, check=True):
    proc = subprocess.run([sys.executable, "-m", "airflow_trickle.cli", "--warehouse", warehouse, "--master", "local[1]",
                           *args], capture_output=True, text=True, env=env, timeout=300)
    if check:
        assert proc.returncode == 0, proc.stderr[-2000:]
    return proc


def test_cli_create_status_refresh_and_errors(tr, db, warehouse, subprocess_env):
    orders(tr, db)
    proc = run_cli("create", f"{db}.cli_st", "--query", f"SELECT id, amount FROM {db}.orders", "--mode", "FULL",
                   "--schedule", "2m", "--json", warehouse=warehouse, env=subprocess_env)
    status = json.loads(proc.stdout)
    assert status[0]["name"] == f"{db}.cli_st" and status[0]["is_populated"] and status[0]["schedule"] == "2m"
    assert visible(tr, f"{db}.cli_st") == expected(tr, f"SELECT id, amount FROM {db}.orders")
    bad = run_cli("create", f"{db}.cli_bad", "--query", "SELECT FROM WHERE", warehouse=warehouse, env=subprocess_env,
                  check=False)
    assert bad.returncode == 1 and f"stream table '{db}.cli_bad'" in bad.stderr and "does not parse" in bad.stderr


def test_two_refresh_jobs_in_two_processes_at_once(tr, db, warehouse, subprocess_env):
    for side in ("a", "b"):
        tr.sql(f"CREATE TABLE {db}.src_{side} (id INT, cid INT, amount INT) USING delta")
        tr.sql(f"INSERT INTO {db}.src_{side} VALUES (1, 1, 1)")
        tr.create_stream_table(f"{db}.st_{side}", f"SELECT cid, sum(amount) AS total FROM {db}.src_{side} GROUP BY cid",
                               refresh_mode="FULL")
    workers = [subprocess.Popen([sys.executable, "-m", "tests.helpers.worker", warehouse, f"{db}.src_{side}",
                                 f"{db}.st_{side}", "3"], cwd=REPO, env=subprocess_env, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True) for side in ("a", "b")]
    outputs = [w.communicate(timeout=600) for w in workers]
    for worker, (out, err) in zip(workers, outputs):
        assert worker.returncode == 0, err[-3000:]
        assert out.count("FULL COMPLETED") == 3, out
    for side in ("a", "b"):
        name = f"{db}.st_{side}"
        assert visible(tr, name) == expected(tr, f"SELECT cid, sum(amount) AS total FROM {db}.src_{side} GROUP BY cid")
        assert len([h for h in tr.history(name) if h.action == "FULL" and h.status == "COMPLETED"]) == 4


def test_tables_made_by_another_application_are_visible_by_name(tr, db, warehouse, subprocess_env):
    # --embedded: another Spark application with a catalog of its own, even beside a service
    run_cli("--embedded", "sql", f"CREATE TABLE {db}.made_elsewhere USING delta AS SELECT 42 AS x",
            warehouse=warehouse, env=subprocess_env)
    assert rows(tr.sql(f"SELECT * FROM {db}.made_elsewhere")) == [(42,)]


def test_a_create_racing_another_sessions_sync_of_the_warehouse_succeeds(tr, db, service):
    """Another task's session on the same Spark syncs the warehouse while a stream table's
    storage is made: a managed CREATE committed the table and registered its name after, and a
    sync in between registered it first (the create failed with TABLE_OR_VIEW_ALREADY_EXISTS:
    34 of 40 creates against a sync in a loop, and once in CI)."""
    import threading

    from airflow_trickle.model import StorageLayout
    from airflow_trickle.spark.delta import table_location
    from airflow_trickle.spark.session import sync_warehouse_tables
    from airflow_trickle.storage.tables import create_storage_table

    if service is not None:  # the product's own: pyspark's builder marks the process as Connect
        from airflow_trickle.spark.session import connect_session

        other = connect_session(service.address, tr.config)
    else:
        other = tr.spark.newSession()
    stop, failures = threading.Event(), []

    def sync_in_a_loop():
        while not stop.is_set():
            try:
                sync_warehouse_tables(other, tr.location)
            except Exception as err:  # noqa: BLE001 - reported below
                failures.append(f"sync: {err}")

    syncer = threading.Thread(target=sync_in_a_loop)
    syncer.start()
    names = [f"{db}.made_{i}" for i in range(8)]
    try:
        for name in names:
            try:
                create_storage_table(tr.spark, name, [("a", "INT"), ("b", "STRING")], StorageLayout())
            except Exception as err:  # noqa: BLE001 - reported below
                failures.append(f"{name}: {str(err)[:200]}")
    finally:
        stop.set()
        syncer.join()
    assert failures == []
    for name in names:  # where a managed table would be, with its columns, seen by both sessions
        assert table_location(tr.spark, name).rstrip("/").endswith(f"{db}.db/{name.split('.')[1]}")
        assert [f.name for f in other.table(name).schema.fields][:2] == ["a", "b"]
    with pytest.raises(AlreadyExistsError):
        create_storage_table(tr.spark, names[0], [("a", "INT")], StorageLayout())


def clustering_of(tr, name) -> list[str]:
    return list(tr.sql(f"DESCRIBE DETAIL {name}").first()["clusteringColumns"] or [])


def test_cluster_by_clusters_the_storage_and_refreshes_stay_exact(tr, db):
    """``options: cluster_by`` makes the storage table a liquid-clustered Delta table: created so,
    kept by a REINITIALIZE that replaces it, changed and turned off by ALTER, reclustered by
    maintain. delta-rs does not write clustered tables (writer features ``clustering``,
    ``domainMetadata``), so every commit goes through Spark, and the refreshes stay exact over
    random changes with NULL keys and duplicates."""
    from tests.oracle import drive, workload

    load = workload(tr, db, ["o", "c"], {})
    name = f"{db}.per_region"
    query = (f"SELECT c.region, COUNT(*) AS n, SUM(o.amount) AS total FROM {db}.o o "
             f"JOIN {db}.c c ON o.cid = c.id GROUP BY c.region")
    load.stream_table("per_region", query, options={"cluster_by": ["Region"]})
    assert clustering_of(tr, name) == ["region"]
    explained = tr.explain(name)
    assert "delta-rs does not write this table" in explained["commit"] and "clustering" in explained["commit"]
    drive(load, ["o", "c"])
    tr.maintain([name])
    load.check(name)
    # ALTER: the clustering columns, then none; the stored rows and the refreshes are untouched
    assert tr.alter_stream_table(name, options={"cluster_by": "n, region"}).options.cluster_by == ("n", "region")
    assert clustering_of(tr, name) == ["n", "region"]
    tr.sql(f"INSERT INTO {db}.o VALUES (9, 1, 7, 1.00), (9, NULL, NULL, NULL)")
    assert tr.refresh_stream_table(name).action == "DIFFERENTIAL"
    load.check(name)
    # a new query whose columns change: the replaced table keeps the clustering it can
    wider = query.replace("COUNT(*) AS n", "COUNT(*) AS n, MAX(o.id) AS top")
    tr.alter_stream_table(name, query=wider)
    load.queries[name] = wider
    load.check(name)
    assert clustering_of(tr, name) == ["n", "region"]
    tr.alter_stream_table(name, options={"cluster_by": []})
    assert clustering_of(tr, name) == [] and tr.get(name).options.to_dict() == {"cluster_by": []}
    # refused, naming the table, with nothing changed or created
    with pytest.raises(DefinitionError, match=f"stream table '{name}': cannot cluster by 'nope': no such output"):
        tr.alter_stream_table(name, options={"cluster_by": ["nope"]})
    with pytest.raises(DefinitionError, match="cannot cluster by 'regions': no such output column"):
        tr.create_stream_table(f"{db}.refused", f"SELECT region, COLLECT_LIST(id) AS ids FROM {db}.c GROUP BY region",
                               options={"cluster_by": ["regions"]})
    with pytest.raises(DefinitionError, match="Delta clusters only by columns of a number, string, date or"):
        tr.create_stream_table(f"{db}.refused", f"SELECT region, COLLECT_LIST(id) AS ids FROM {db}.c GROUP BY region",
                               options={"cluster_by": ["ids"]})
    assert_nothing_created(tr, f"{db}.refused")
    with pytest.raises(DefinitionError, match="option 'cluster_by' must be a list of distinct output column names"):
        tr.create_stream_table(f"{db}.refused", f"SELECT * FROM {db}.c", options={"cluster_by": ["id", "ID"]})
    assert clustering_of(tr, name) == []

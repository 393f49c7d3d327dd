"""Atomic diamond groups, the error policy (retries, auto-suspend, schema changes)."""
from __future__ import annotations

from types import SimpleNamespace

import pytest

from airflow_trickle.location import Location
from airflow_trickle.errors import CycleError, DefinitionError, RefreshError, UnsupportedConstructError
from airflow_trickle.refresh import refresh_stream_table
from airflow_trickle.spark.engine import SparkEngine
from tests.conftest import rows, visible

pytestmark = pytest.mark.both_spark_modes


def oracle(tr, name: str) -> list[tuple]:
    """The stream table's defining query at its frontier versions."""
    from airflow_trickle.refresh.full import pinned_query_sql

    st = tr.get(name)
    return rows(tr.spark.sql(pinned_query_sql(tr, st, st.frontier)))


@pytest.fixture
def diamond(tr, db):
    """a -> b, a -> c, (b, c) -> d atomic; e reads b from outside the group.

    c divides by (v - 3): a row with v = 3 makes c's refresh fail (Spark's ANSI mode).
    """
    tr.sql(f"CREATE TABLE {db}.a (k INT, v INT) USING delta")
    tr.sql(f"INSERT INTO {db}.a VALUES (1, 1), (2, 5), (2, 5), (3, NULL)")
    tr.create_stream_table(f"{db}.b", f"SELECT k, v FROM {db}.a WHERE v IS NULL OR v < 100", schedule=None)
    tr.create_stream_table(f"{db}.c", f"SELECT k, 10 / (v - 3) AS r FROM {db}.a", schedule=None)
    tr.create_stream_table(f"{db}.d", f"SELECT b.k, b.v, c.r FROM {db}.b b JOIN {db}.c c ON b.k = c.k",
                           schedule="1m", options={"diamond_consistency": "atomic"})
    tr.create_stream_table(f"{db}.e", f"SELECT k, COUNT(*) AS n FROM {db}.b GROUP BY k", schedule="1m")
    return db


def test_diamond_groups_lists_members_convergence_and_epoch(tr, diamond):
    import json
    import subprocess
    import sys

    db = diamond
    wanted = [{"name": f"group:{db}.b+{db}.c+{db}.d", "members": [f"{db}.b", f"{db}.c", f"{db}.d"],
               "convergence_points": [f"{db}.d"], "consistency": "atomic", "schedule_policy": "fastest",
               "epoch": 0, "last_status": None, "last_error": None}]
    assert [g for g in tr.diamond_groups() if f"{db}.d" in g["members"]] == wanted
    listed = subprocess.run([sys.executable, "-m", "airflow_trickle.cli", "--warehouse", tr.warehouse, "--json",
                             "diamonds"], capture_output=True, text=True, check=True).stdout
    assert [g for g in json.loads(listed) if f"{db}.d" in g["members"]] == wanted


def test_downstream_reads_upstreams_at_their_refresh_versions_and_records_them(tr, diamond):
    from airflow_trickle.storage.deltalog import recorded_refreshes

    db = diamond
    tr.sql(f"INSERT INTO {db}.a VALUES (6, 8)")
    tr.refresh_group(f"{db}.d")
    read = tr.history(f"{db}.d", limit=1)[0].frontier_to
    for upstream in (f"{db}.b", f"{db}.c"):
        assert read[upstream] == recorded_refreshes(tr.catalog.at(tr.get(upstream).location))[0]["version"]
    assert visible(tr, f"{db}.d") == oracle(tr, f"{db}.d")


def test_failed_member_restores_committed_members_and_keeps_the_epoch(tr, diamond):
    db = diamond
    names = [f"{db}.{t}" for t in "bcde"]
    tr.sql(f"INSERT INTO {db}.a VALUES (4, 7)")
    done = tr.refresh_group(f"{db}.d")
    assert done.epoch == 1 and [r.action for r in done.results] == ["DIFFERENTIAL"] * 3

    before = {n: visible(tr, n) for n in names}
    frontier_b = tr.get(f"{db}.b").frontier
    tr.sql(f"INSERT INTO {db}.a VALUES (5, 3), (1, 9)")  # b can refresh; c divides by zero
    with pytest.raises(RefreshError, match=rf"atomic group .* failed at {db}\.c: .*restored {db}\.b"):
        tr.refresh_group(f"{db}.d")
    assert {n: visible(tr, n) for n in names} == before
    assert tr.get(f"{db}.b").frontier == frontier_b
    assert [h.action for h in tr.history(f"{db}.b", limit=2)] == ["RESTORE", "DIFFERENTIAL"]
    (group,) = [g for g in tr.diamond_groups() if f"{db}.d" in g["members"]]
    assert group["epoch"] == 1 and group["last_status"] == "ROLLED_BACK" and "divide" in group["last_error"].lower()

    # e (outside the group) reads b's change feed across the undone commit and the undo
    assert tr.refresh_stream_table(f"{db}.e").action in ("DIFFERENTIAL", "NO_DATA")
    assert visible(tr, f"{db}.e") == oracle(tr, f"{db}.e")

    tr.sql(f"DELETE FROM {db}.a WHERE v = 3")
    retried = tr.refresh_group(f"{db}.d")
    assert retried.epoch == 2
    assert tr.refresh_stream_table(f"{db}.e").action == "DIFFERENTIAL"
    for name in names:
        assert visible(tr, name) == oracle(tr, name), name
    assert (1, 9, 10 / 6) in visible(tr, f"{db}.d")


def test_three_failures_suspend_and_active_resumes(tr, db):
    name = f"{db}.ratio"
    tr.sql(f"CREATE TABLE {db}.a (k INT, v INT) USING delta")
    tr.sql(f"INSERT INTO {db}.a VALUES (1, 1)")
    tr.create_stream_table(name, f"SELECT k, 10 / (v - 3) AS r FROM {db}.a", schedule="1m")
    tr.sql(f"INSERT INTO {db}.a VALUES (2, 3)")
    for attempt in (1, 2):
        with pytest.raises(RefreshError, match="(?i)divide") as err:
            tr.refresh_stream_table(name)
        assert "suspended" not in str(err.value)
        assert tr.get(name).consecutive_errors == attempt and tr.get(name).status == "ACTIVE"
    with pytest.raises(RefreshError, match="suspended after 3 consecutive failures"):
        tr.refresh_stream_table(name)
    assert tr.get(name).status == "ERROR"
    alert = tr.history(name, limit=1)[0]
    assert (alert.action, alert.status) == ("SUSPEND", "ALERT") and "divide" in alert.error_message.lower()

    skipped = tr.refresh_stream_table(name)  # refreshes stop
    assert (skipped.action, skipped.status) == ("SKIP", "SKIPPED") and "status is ERROR" in skipped.reason

    tr.sql(f"DELETE FROM {db}.a WHERE v = 3")
    tr.alter_stream_table(name, status="ACTIVE")
    assert tr.get(name).consecutive_errors == 0
    resumed = tr.refresh_stream_table(name)
    # the window still holds the inserted-then-deleted bad row: its delta cannot be evaluated,
    # so the refresh recomputes and says why
    assert (resumed.action, resumed.status) == ("FULL", "COMPLETED") and "failed to evaluate" in resumed.reason
    assert visible(tr, name) == oracle(tr, name) == [(1, -5.0)]


@pytest.mark.parametrize("committer", ["spark", "delta-rs"])
def test_a_concurrent_commit_conflict_is_retried(tr, db, committer, monkeypatch):
    """The refresh's first commit loses a race with a concurrent writer -- Spark's INSERT (the
    table kept with ``placement: spark``) or delta-rs's append -- and the retry lands it once."""
    from deltalake.exceptions import CommitFailedError

    from airflow_trickle.refresh import local_overwrite

    name = f"{db}.copy"
    tr.sql(f"CREATE TABLE {db}.a (k INT) USING delta")
    tr.create_stream_table(name, f"SELECT k FROM {db}.a", schedule="1m",
                           options={"placement": "spark"} if committer == "spark" else None)
    tr.sql(f"INSERT INTO {db}.a VALUES (1), (1), (NULL)")
    failures = []

    class ConcurrentAppendException(Exception):
        """What a lost commit race looks like from Spark: Delta's error condition on the exception."""

        def getCondition(self):
            return "DELTA_CONCURRENT_APPEND"

    class FlakySpark:
        """Fails the first write of the refresh (a MERGE or an append) like a concurrent writer would."""

        def __getattr__(self, attr):
            return getattr(tr.spark, attr)

        def sql(self, text):
            if text.lstrip().upper().startswith(("MERGE", "INSERT")) and not failures:
                failures.append(text)
                raise ConcurrentAppendException("Files were added by a concurrent update")
            return tr.spark.sql(text)

    def flaky_delta_rs(table, rows, **kwargs):
        if not failures:
            failures.append(kwargs["mode"])
            raise CommitFailedError("a concurrent transaction won the commit")
        return write_deltalake(table, rows, **kwargs)

    write_deltalake = local_overwrite.write_deltalake
    monkeypatch.setattr(local_overwrite, "write_deltalake", flaky_delta_rs)
    spark = FlakySpark() if committer == "spark" else tr.spark
    env = SimpleNamespace(spark=spark, engine=SparkEngine(spark), catalog=tr.catalog, config=tr.config)
    tr.config.retry_backoff_seconds, backoff = 0.01, tr.config.retry_backoff_seconds
    try:
        result = refresh_stream_table(env, name)
    finally:
        tr.config.retry_backoff_seconds = backoff
    assert failures and result.action == "DIFFERENTIAL" and result.rows_inserted == 3
    assert failures[0] == "append" if committer == "delta-rs" else failures[0].startswith("INSERT")
    assert visible(tr, name) == oracle(tr, name)
    assert tr.get(name).consecutive_errors == 0


def test_source_schema_changes(tr, db):
    name = f"{db}.narrow"
    tr.sql(f"CREATE TABLE {db}.a (k INT, v INT) USING delta")
    tr.sql(f"INSERT INTO {db}.a VALUES (1, 10)")
    tr.create_stream_table(name, f"SELECT k, v FROM {db}.a", schedule="1m")

    # an unused column added: remembered, refreshes stay differential
    tr.sql(f"ALTER TABLE {db}.a ADD COLUMNS (note STRING)")
    tr.sql(f"INSERT INTO {db}.a VALUES (2, 20, 'x')")
    assert tr.refresh_stream_table(name).action == "DIFFERENTIAL"
    assert visible(tr, name) == [(1, 10), (2, 20)]

    # a used column changes type: the output changes, so the table is reinitialized
    tr.sql(f"CREATE OR REPLACE TABLE {db}.a USING delta AS SELECT k, CAST(v AS BIGINT) AS v, note FROM {db}.a")
    result = tr.refresh_stream_table(name)
    assert result.action == "REINITIALIZE" and "output columns change" in result.reason
    assert [f.dataType.simpleString() for f in tr.read(name).schema.fields] == ["int", "bigint"]
    assert visible(tr, name) == oracle(tr, name)

    # a used column removed: a clear error, and the table is marked for reinitialization
    tr.sql(f"CREATE OR REPLACE TABLE {db}.a USING delta AS SELECT k, note FROM {db}.a")
    with pytest.raises(RefreshError, match=rf"no longer has column\(s\) v"):
        tr.refresh_stream_table(name)
    assert tr.get(name).needs_reinit


def test_alter_query_rebuilds_and_repopulates(tr, db):
    name = f"{db}.pick"
    tr.sql(f"CREATE TABLE {db}.a (k INT, v INT) USING delta")
    tr.sql(f"INSERT INTO {db}.a VALUES (1, 10), (2, 20), (2, 20)")
    tr.create_stream_table(name, f"SELECT k FROM {db}.a WHERE v > 15", schedule="1m")
    tr.create_stream_table(f"{db}.reader", f"SELECT k FROM {name}", schedule="1m")
    with pytest.raises(DefinitionError, match=rf"changes the output columns .* while {db}\.reader reads it"):
        tr.alter_stream_table(name, query=f"SELECT k, v FROM {db}.a")
    assert tr.get(name).original_query == f"SELECT k FROM {db}.a WHERE v > 15"  # refused: nothing changed
    tr.alter_stream_table(name, query=f"SELECT k FROM {db}.a WHERE v < 15")
    assert visible(tr, name) == oracle(tr, name) == [(1,)]
    assert tr.refresh_stream_table(f"{db}.reader").action in ("DIFFERENTIAL", "FULL")
    assert visible(tr, f"{db}.reader") == [(1,)]


READER = """
import json, os, sys, time
from deltalake import DeltaTable
location, stop = sys.argv[1], sys.argv[2]
seen = {}
while not os.path.exists(stop):
    try:
        table = DeltaTable(location)
        data = table.to_pyarrow_table()
        seen[table.version()] = [data.num_rows, sorted(c for c in data.column_names if not c.startswith("__trickle"))]
    except Exception as err:  # a read racing a commit: try again
        seen.setdefault("errors", []).append(str(err)[:200])
    time.sleep(0.02)
print(json.dumps(seen))
"""


def test_alter_query_replaces_the_rows_in_one_commit_and_readers_never_see_an_empty_table(tr, db, tmp_path):
    """Seed 003: readers of a stream table whose query is altered see the old rows or the new
    ones.  Another process reads the storage table (delta-rs) throughout three ALTERs: same
    columns (an overwrite: nothing reads the table), new columns (an atomic replace), a new layout
    (bag -> aggregate)."""
    import json
    import subprocess
    import sys

    from airflow_trickle.storage.deltalog import latest_version

    name = f"{db}.shown"
    tr.sql(f"CREATE TABLE {db}.a (k INT, v INT) USING delta")
    tr.sql(f"INSERT INTO {db}.a VALUES (1, 10), (2, 20), (2, 20), (3, NULL)")
    tr.create_stream_table(name, f"SELECT k, v FROM {db}.a WHERE v > 0", schedule="1m")
    location = tr.get(name).location
    stop = tmp_path / "stop"
    reader = subprocess.Popen([sys.executable, "-c", READER, location, str(stop)], stdout=subprocess.PIPE, text=True)
    operations = []
    try:
        for query in (f"SELECT k, v FROM {db}.a WHERE v > 15",                 # same columns: overwritten
                      f"SELECT k, v, v * 2 AS w FROM {db}.a WHERE v > 15",     # new columns: replaced
                      f"SELECT k, COUNT(*) AS n, SUM(v) AS s FROM {db}.a GROUP BY k"):  # new layout
            before = latest_version(Location(location))
            tr.alter_stream_table(name, query=query)
            # one data commit; the definition the storage table carries may follow in a
            # metadata-only commit (no data file changes)
            done = [r["operation"] for r in tr.sql(f"DESCRIBE HISTORY {name}").collect() if r["version"] > before]
            data = [op for op in done if op != "SET TBLPROPERTIES"]
            assert len(data) == 1 and len(done) <= 2, (query, done)
            operations.append(data[0])
            assert visible(tr, name) == oracle(tr, name), query
            assert not tr.get(name).needs_reinit
    finally:
        stop.touch()
        seen = json.loads(reader.communicate(timeout=60)[0])
    assert operations == ["WRITE", "CREATE OR REPLACE TABLE AS SELECT", "CREATE OR REPLACE TABLE AS SELECT"]
    assert visible(tr, name) == [(1, 1, 10), (2, 2, 40), (3, 1, None)]
    errors = seen.pop("errors", [])
    assert len(errors) < 5, errors
    assert len(seen) >= 2, seen  # the reader saw the table change under it
    assert all(count > 0 for count, _ in seen.values()), seen  # never an empty table
    assert {tuple(columns) for _, columns in seen.values()} <= {("k", "v"), ("k", "v", "w"), ("k", "n", "s")}
    # the replaced table (nullable identity columns, new layout) refreshes DIFFERENTIALly
    tr.sql(f"INSERT INTO {db}.a VALUES (1, 5), (4, 1)")
    assert tr.refresh_stream_table(name).action == "DIFFERENTIAL"
    assert visible(tr, name) == oracle(tr, name) == [(1, 2, 15), (2, 2, 40), (3, 1, None), (4, 1, 1)]


def test_monotone_cycle_refreshes_to_a_fixpoint(tr, db):
    """Transitive closure as a cycle: hop = edges ∪ (reach ⋈ edges), reach = hop."""
    tr.config.allow_circular = True
    try:
        tr.sql(f"CREATE TABLE {db}.edges (src INT, dst INT) USING delta")
        tr.sql(f"INSERT INTO {db}.edges VALUES (1, 2), (2, 3), (3, 4)")
        tr.create_stream_table(f"{db}.hop", f"SELECT src, dst FROM {db}.edges", schedule="1m")
        tr.create_stream_table(f"{db}.reach", f"SELECT src, dst FROM {db}.hop", schedule="1m")
        tr.alter_stream_table(f"{db}.hop", query=(  # closes the cycle hop -> reach -> hop
            f"SELECT src, dst FROM {db}.edges UNION ALL "
            f"SELECT r.src, e.dst FROM {db}.reach r JOIN {db}.edges e ON r.dst = e.src"))
        closure = [(1, 2), (1, 3), (1, 4), (2, 3), (2, 4), (3, 4)]
        assert visible(tr, f"{db}.hop") == visible(tr, f"{db}.reach") == closure
        for name in (f"{db}.hop", f"{db}.reach"):
            assert visible(tr, name) == oracle(tr, name), name
        assert all(f"{db}.hop" not in g["members"] for g in tr.diamond_groups())  # a cycle is no diamond

        tr.sql(f"DELETE FROM {db}.edges WHERE src = 2")
        result = tr.refresh_stream_table(f"{db}.reach")
        assert "reached its fixpoint" in result.reason and result.rows_deleted == 4
        assert visible(tr, f"{db}.hop") == visible(tr, f"{db}.reach") == [(1, 2), (3, 4)]

        with pytest.raises(UnsupportedConstructError, match=rf"not monotone: stream table '{db}\.reach' uses GROUP BY"):
            tr.alter_stream_table(f"{db}.reach", query=f"SELECT src, MAX(dst) AS dst FROM {db}.hop GROUP BY src")

        # a cycle in the data: UNION ALL re-derives its own rows forever; the refresh gives up
        tr.config.max_fixpoint_iterations = 2
        tr.sql(f"INSERT INTO {db}.edges VALUES (4, 3)")
        with pytest.raises(RefreshError, match="did not reach a fixpoint in 2 passes"):
            tr.refresh_stream_table(f"{db}.hop")
    finally:
        tr.config.allow_circular, tr.config.max_fixpoint_iterations = False, 10
    with pytest.raises(CycleError, match="allow_circular"):
        tr.alter_stream_table(f"{db}.reach", query=f"SELECT src, dst FROM {db}.hop WHERE src > 0")


def test_a_cycle_elsewhere_does_not_block_other_definitions(tr, db):
    tr.config.allow_circular = True
    try:
        tr.sql(f"CREATE TABLE {db}.a (k INT) USING delta")
        tr.create_stream_table(f"{db}.p", f"SELECT k FROM {db}.a", schedule="1m")
        tr.create_stream_table(f"{db}.q", f"SELECT k FROM {db}.p", schedule="1m")
        tr.alter_stream_table(f"{db}.p", query=f"SELECT k FROM {db}.a UNION ALL SELECT k FROM {db}.q WHERE k < 0")
    finally:
        tr.config.allow_circular = False
    tr.create_stream_table(f"{db}.elsewhere", f"SELECT k FROM {db}.a", schedule="1m")  # not refused
    with pytest.raises(CycleError, match=rf"cycle: {db}\.q -> {db}\.p -> {db}\.q"):
        tr.alter_stream_table(f"{db}.q", query=f"SELECT k + 1 AS k FROM {db}.p")


def test_maintain_compacts_and_vacuums_without_breaking_a_reader_that_is_behind(tr, db):
    """``maintain`` shrinks a storage table that took many refreshes, and its VACUUM keeps what a
    downstream stream table that has not refreshed since still needs (it stays DIFFERENTIAL)."""
    tr.sql(f"CREATE TABLE {db}.src (k INT, v INT) USING delta")
    tr.sql(f"INSERT INTO {db}.src VALUES (1, 1), (2, 2)")
    up, down = f"{db}.up", f"{db}.down"
    tr.create_stream_table(up, f"SELECT k, v FROM {db}.src WHERE v > 0", schedule=None)
    tr.create_stream_table(down, f"SELECT k, COUNT(*) AS n, SUM(v) AS s FROM {db}.up GROUP BY k", schedule=None)
    for i in range(4):  # up refreshes four times (appends add files, a MERGE rewrites); down not at all
        tr.sql(f"INSERT INTO {db}.src VALUES ({i + 3}, {i + 1})")
        if i == 3:
            tr.sql(f"UPDATE {db}.src SET v = v + 1 WHERE k = 1")
        assert tr.refresh_stream_table(up).action == "DIFFERENTIAL"
    (storage,) = [m for m in tr.maintain([up], retention_hours=0) if m.table == up]
    assert storage.active_files_after == 1 < storage.active_files_before
    assert storage.retained_hours > 0 and down in storage.note  # stretched for the reader behind
    assert storage.files_on_disk_after > storage.active_files_after  # the files of down's version kept
    assert tr.refresh_stream_table(down).action == "DIFFERENTIAL"
    assert visible(tr, down) == oracle(tr, down)
    # down has no reader: the asked retention applies and only its active files stay on disk
    tr.sql(f"DELETE FROM {db}.src WHERE k = 3")
    for name in (up, down):
        assert tr.refresh_stream_table(name).action == "DIFFERENTIAL"
    tr.config.history_retention_days = 3650  # the pruning runs (the shared warehouse's history is all younger)
    try:
        done = {m.table: m for m in tr.maintain([up, down], retention_hours=0)}
    finally:
        tr.config.history_retention_days = None
    assert done[down].retained_hours == 0 and done[down].files_on_disk_after == done[down].active_files_after
    assert {"_trickle.stream_tables", "_trickle.refresh_history"} <= set(done)
    assert done["_trickle.refresh_history"].note.endswith("; 0 history rows older than 3650 days removed")
    tr.sql(f"INSERT INTO {db}.src VALUES (9, 9)")
    for name in (up, down):
        assert tr.refresh_stream_table(name).action == "DIFFERENTIAL"
        assert visible(tr, name) == oracle(tr, name)

"""Join deltas that probe arrangements, against the full-recompute oracle (tests/oracle.py).

The arrangements are turned on for every input (``arrangement_min_rows`` 0) in a folder of the
test's own.  Random batches of inserts, deletes, key-moving updates and emptied tables, with
NULL keys and duplicates, drive stream tables over inner, three-way, aggregated and LEFT
joins, a top-K whose touched groups are recomputed from probes, and EXISTS, NOT EXISTS and a
correlated aggregate (an aggregate of one table joined by its group key, probed through it),
and an aggregate of an outer join under another aggregate (TPC-H q13's shape);
between batches the arrangements are left warm, wiped (a restart, an eviction, another worker)
or left behind by a table that refreshes less often, and after every refresh each stream table
equals its query.
"""
from __future__ import annotations

import logging
import re
import shutil

import pytest
from hypothesis import given

from airflow_trickle.refresh.lookup import ReadPath
from tests.oracle import STRATEGIES, batches, oracle_settings, workload

QUERIES = {
    "three": "SELECT o.id, c.region, x.v FROM {db}.o o, {db}.c c, {db}.x x WHERE o.cid = c.id AND x.k = c.id",
    "agg": "SELECT x.v, COUNT(*) AS n, SUM(o.amount) AS s, MAX(o.price) AS m FROM {db}.o o "
           "JOIN {db}.c c ON o.cid = c.id JOIN {db}.x x ON x.k = c.id GROUP BY x.v",
    # refreshed every other batch: it shares the arrangement of c by id (with the columns id,
    # region) with ``inner``, at an older frontier
    "lagging": "SELECT o.id, o.amount, c.region FROM {db}.o o LEFT JOIN {db}.c c ON o.cid = c.id",
    "inner": "SELECT c.region, o.cid FROM {db}.c c JOIN {db}.o o ON o.cid = c.id WHERE c.region IS NOT NULL",
    # a top-K over a join's aggregate: its touched groups are recomputed from probes of o by
    # cid (the first GROUP BY column) and of c by id, at the old and at the new versions, by
    # the groups counted (a NULL cid among o's changes touches the NULL group: not looked up)
    "top": "SELECT o.cid, c.region, SUM(o.amount) AS s, COUNT(*) AS n FROM {db}.o o JOIN {db}.c c "
           "ON o.cid = c.id GROUP BY o.cid, c.region ORDER BY n DESC, s DESC, cid, region LIMIT 2",
    # the same over customers' ids (never NULL): the groups are looked up by the ids the changes
    # hold (o's cids, c's ids), at both versions, without counting them first
    "top_customers": "SELECT c.id, c.region, SUM(o.amount) AS s, COUNT(*) AS n FROM {db}.c c JOIN {db}.o o "
                     "ON o.cid = c.id GROUP BY c.id, c.region ORDER BY n DESC, s DESC, id, region LIMIT 2",
    # x reaches the group column only through o (x.k = o.id, o.cid = c.id): a change of x looks o
    # up by its keys, at both versions, and their cids are the groups to look up
    "top_lines": "SELECT c.id, SUM(x.v) AS s, COUNT(*) AS n FROM {db}.c c JOIN {db}.o o ON o.cid = c.id "
                 "JOIN {db}.x x ON x.k = o.id WHERE o.amount > 3 GROUP BY c.id ORDER BY s DESC, n DESC, id LIMIT 3",
    # subqueries planned as joins with an aggregate of one table grouped by the key: probed
    # through that table (c's change looks up o by cid), and the aggregate's own touched groups
    # recomputed from o probed by its change's keys
    "exists": "SELECT c.region, COUNT(*) AS n FROM {db}.c c WHERE EXISTS "
              "(SELECT 1 FROM {db}.o o WHERE o.cid = c.id AND o.amount > 5) GROUP BY c.region",
    "per_key": "SELECT o.id, o.amount FROM {db}.o o WHERE o.amount > "
               "(SELECT AVG(o2.amount) FROM {db}.o o2 WHERE o2.cid = o.cid)",
    "not_exists": "SELECT c.id, c.region FROM {db}.c c WHERE NOT EXISTS (SELECT 1 FROM {db}.o o WHERE o.cid = c.id)",
    # TPC-H q13's shape: an aggregate of an outer join under another aggregate; o's change is
    # the LEFT join's outer term (c and o looked up by its cids), and the inner aggregate's
    # touched groups are recomputed from c and o looked up by the cids and ids the changes hold
    "nested": "SELECT n, COUNT(*) AS customers FROM (SELECT c.id, COUNT(o.id) AS n FROM {db}.c c "
              "LEFT JOIN {db}.o o ON c.id = o.cid GROUP BY c.id) t GROUP BY n",
    # TPC-H q19's shape: the join equality in every disjunct of an OR; each side's change and
    # rows found are narrowed in Arrow by what its own columns must satisfy (refresh/narrowing.py)
    "filtered": "SELECT c.region, SUM(o.amount) AS s, COUNT(*) AS n FROM {db}.o o, {db}.c c "
                "WHERE (o.cid = c.id AND o.price >= 1.5 AND c.region LIKE 'n%') "
                "OR (o.cid = c.id AND o.amount BETWEEN 2 AND 7 AND c.region IN ('s', 'e')) "
                "OR (o.cid = c.id AND o.price IS NULL AND c.region NOT LIKE 's%') GROUP BY c.region",
}


def test_join_deltas_through_warm_stale_and_missing_arrangements(tr, db, tmp_path, monkeypatch, caplog):
    folder = tmp_path / "arrangements"
    monkeypatch.setattr(tr.config, "arrangement_min_rows", 0)
    monkeypatch.setattr(tr.config, "arrangement_dir", str(folder))
    tables = ["o", "c", "x"]
    load = workload(tr, db, tables, QUERIES)
    lagging = f"{db}.lagging"
    seen = []
    paths: dict[str, list] = {}  # table -> how the parts of its deltas were read (refresh/lookup.PartPath)

    def refresh(names) -> None:
        for name in names:
            result = tr.refresh_stream_table(name)
            assert result.status == "COMPLETED", result
            assert result.action in ("NO_DATA", "DIFFERENTIAL"), (name, result.action, result.reason)
            paths.setdefault(name.split(".")[-1], []).extend(result.paths)
            load.check(name)

    @oracle_settings
    @given(batches({t: STRATEGIES[t] for t in tables}))
    def run(batch):
        arrangements = ["warm", "lag", "wiped"][len(seen) % 3]
        seen.append(arrangements)
        if arrangements == "wiped":
            shutil.rmtree(folder, ignore_errors=True)
        load.apply(batch)
        with caplog.at_level(logging.INFO, logger="airflow_trickle"):
            refresh([n for n in load.queries if n != lagging or arrangements != "lag"])

    run()
    refresh([lagging])
    probed = {table: [p for p in found if p.path is ReadPath.PROBED] for table, found in paths.items()}
    every = [p for found in probed.values() for p in found]
    assert every and all(p.rows >= 0 for p in every), "no join delta probed an arrangement"
    # the history records the plan, and how each part was read, as the result holds them
    load.insert("o", [(90, 1, 2, None)])
    result = tr.refresh_stream_table(f"{db}.three")
    [recorded] = tr.history(f"{db}.three", limit=1)
    assert result.plan.parts and recorded.plan == {**result.plan.to_dict(), "taken": [p.to_dict() for p in result.paths]}
    assert {p["path"] for p in recorded.plan["parts"]} <= {"probed", "read once", "scanned"}
    load.check(f"{db}.three")
    assert any(p.part.startswith("touched groups") for p in probed["top"]), \
        "no aggregate's touched groups were recomputed from probes"
    assert any("through an aggregate" in p.detail for p in every), \
        "no term probed an input through the aggregate it changes"
    assert any(p.part.endswith("groups by cid") for p in probed["exists"] + probed["per_key"]), \
        "no subquery's aggregate was recomputed from probes"
    assert any(p.part.endswith("change, outer") and re.match(r" \([oc] recomputed for its keys\)", p.detail)
               for p in probed["lagging"] + probed["nested"]), "no outer term probed its inputs"
    assert any(p.part.startswith("groups by") and "from the changes" in p.detail for p in probed["nested"]), \
        "no inner aggregate's groups were looked up by the changes' keys"
    assert any(p.part == "groups by id" and re.match(r" \(\d+ from the changes\)", p.detail)
               for p in probed["top_customers"]), \
        "no top-K's groups were looked up by the changes' keys without counting them"
    assert any(p.part == "groups by id" and re.match(r" \(\d+ from the changes, x through o\)", p.detail)
               for p in probed["top_lines"]), "no change reached its groups through another input"
    narrowed = [(int(kept), int(read)) for p in every for kept, read in re.findall(r"\((\d+) of (\d+) rows\)", p.detail)]
    assert any(kept < read for kept, read in narrowed), "no change was narrowed by its block's filter"
    text = caplog.text  # what the arrangements did: in the log
    assert "built at" in text
    assert "caught up" in text or "warm" in text
    assert "wiped" in seen and "lag" in seen


def test_a_change_reaches_its_groups_through_the_input_between(tr, db, tmp_path, monkeypatch, caplog):
    """x meets the group column c.id only through o (x.k = o.id, o.cid = c.id): the keys of its
    change look o up, at both versions, and the cids found are groups recomputed -- beside a
    change of o on other customers, an order moving to another customer, and x rows whose order
    has no customer (a NULL cid touches no group) or fails the filter."""
    monkeypatch.setattr(tr.config, "arrangement_min_rows", 0)
    monkeypatch.setattr(tr.config, "arrangement_dir", str(tmp_path / "arrangements"))
    load = workload(tr, db, ["o", "c", "x"], {"top_lines": QUERIES["top_lines"]})
    name = f"{db}.top_lines"
    none = {"insert": [], "delete": [], "move": [], "empty": False}
    steps = [
        # x's new rows meet order 2 (customer 1), order 4 (no customer) and order 3 (amount NULL);
        # o's change is a new order of customer 3
        {"x": {**none, "insert": [(2, 9), (4, 1), (3, 5)]}, "o": {**none, "insert": [(6, 3, 5, "1.00")]}},
        # x's rows of order 1 (customer 1) go; order 6 moves from customer 3 to customer 2
        {"x": {**none, "delete": [1]}, "o": {**none, "move": [(6, 2)]}},
        # x alone: its rows of order 2 (customer 1) change their value
        {"x": {**none, "move": [(2, 6)]}},
    ]
    for step in steps:
        load.apply(step)
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="airflow_trickle"):
            result = tr.refresh_stream_table(name)
        assert (result.status, result.action) == ("COMPLETED", "DIFFERENTIAL"), result
        assert any(p.path is ReadPath.PROBED and p.part == "groups by id"
                   and re.match(r" \(\d+ from the changes, x through o\)", p.detail) for p in result.paths), result.paths
        load.check(name)


@pytest.mark.both_spark_modes
def test_arrangements_off_and_unprobeable_terms_keep_the_scans(tr, db, tmp_path, monkeypatch):
    """With ``arrangement_max_bytes`` 0 nothing is probed; a key that is a string is not
    arranged, and the term keeps its scans; both stay exact."""
    folder = tmp_path / "arrangements"
    monkeypatch.setattr(tr.config, "arrangement_min_rows", 0)
    monkeypatch.setattr(tr.config, "arrangement_dir", str(folder))
    load = workload(tr, db, ["o", "c"], {
        "by_string": "SELECT a.id, b.id AS other FROM {db}.c a JOIN {db}.c b ON a.region = b.region",
        "equi": "SELECT o.id, c.region FROM {db}.o o JOIN {db}.c c ON o.cid = c.id",
    })
    load.insert("c", [(7, "n"), (8, None)])
    load.insert("o", [(9, 3, 1, None), (10, None, 2, None)])
    by_string = tr.refresh_stream_table(f"{db}.by_string")
    assert by_string.action == "DIFFERENTIAL", by_string
    # the string key is read from the log and planned scanned: no build tried, no fallback
    assert any(p.path is ReadPath.SCANNED and "cannot arrange by region of type string" in p.reason
               for p in by_string.plan.parts), by_string.plan.parts
    assert not by_string.plan.fallbacks, by_string.plan.fallbacks
    load.refresh_all()
    assert any(folder.iterdir())
    monkeypatch.setattr(tr.config, "arrangement_max_bytes", 0)
    shutil.rmtree(folder)
    load.insert("o", [(11, 1, 3, "2.00")])
    load.insert("c", [(1, "w")])
    load.refresh_all()
    assert not folder.exists()


def refresh_through(tr, name: str, query: str, changes: list[str]) -> None:
    """Run each statement of ``changes``, then refresh ``name``: DIFFERENTIAL and equal to ``query``."""
    from tests.oracle import multiset

    for statement in changes:
        tr.sql(statement)
        result = tr.refresh_stream_table(name)
        assert result.action == "DIFFERENTIAL", (statement, result.reason)
        assert multiset(tr.read(name)) == multiset(tr.sql(query)), statement


def test_a_source_with_column_mapping_is_not_arranged(tr, db, tmp_path, monkeypatch, caplog):
    """delta-rs 1.6 reads a column-mapped table by logical names, which its data files do not
    hold (a column made or renamed under the mapping is stored under a physical name of its
    own): under the legacy protocol (reader version 2) every such value comes back NULL, without
    an error.  An arrangement of such a table would be empty and a probe through it would find no
    partner.  It is refused at build, the term keeps its scans, and the stream table stays exact
    through changes on both sides."""
    monkeypatch.setattr(tr.config, "arrangement_min_rows", 0)
    monkeypatch.setattr(tr.config, "arrangement_dir", str(tmp_path / "arrangements"))
    tr.sql(f"CREATE TABLE {db}.o (id INT, cid INT, amount INT) USING delta "
           f"TBLPROPERTIES ('delta.enableChangeDataFeed' = 'true')")
    tr.sql(f"INSERT INTO {db}.o VALUES (1, 1, 10), (2, 2, 20), (3, NULL, 5), (3, NULL, 5)")
    tr.sql(f"CREATE TABLE {db}.c (id INT, region STRING) USING delta TBLPROPERTIES ('delta.enableChangeDataFeed' = "
           f"'true', 'delta.minReaderVersion' = '2', 'delta.minWriterVersion' = '5', 'delta.columnMapping.mode' = 'name')")
    tr.sql(f"INSERT INTO {db}.c VALUES (1, 'n'), (2, 's'), (2, 's')")
    query = f"SELECT o.id, o.amount, c.region FROM {db}.o o JOIN {db}.c c ON o.cid = c.id"
    name = f"{db}.joined"
    tr.create_stream_table(name, query, schedule=None)
    changes = [f"INSERT INTO {db}.o VALUES (4, 1, 40), (5, 2, 50)", f"DELETE FROM {db}.o WHERE id = 1",
               f"UPDATE {db}.c SET region = 'w' WHERE id = 2", f"INSERT INTO {db}.c VALUES (1, NULL)"]
    with caplog.at_level(logging.INFO, logger="airflow_trickle"):
        refresh_through(tr, name, query, changes)
    assert "delta-rs does not read its rows as Spark does (column mapping)" in caplog.text


def test_a_source_with_deletion_vectors_has_its_change_read_by_spark(tr, db, tmp_path, monkeypatch, caplog):
    """delta-rs 1.6.6 reads the change feed of a commit that deleted rows by deletion vectors
    itself (no ``_change_data`` files: Spark's DELETE writes none) -- and where a vector names
    rows past the file's first row group, it panics in a thread that cannot unwind, which aborts
    the whole process (the Airflow task, the Spark service).  Such a source's change is read by
    Spark, and the stream table stays exact through deletes, updates and inserts on it."""
    monkeypatch.setattr(tr.config, "arrangement_min_rows", 0)
    monkeypatch.setattr(tr.config, "arrangement_dir", str(tmp_path / "arrangements"))
    tr.sql(f"CREATE TABLE {db}.o (id BIGINT, cid INT, note STRING) USING delta TBLPROPERTIES "
           f"('delta.enableChangeDataFeed' = 'true', 'delta.enableDeletionVectors' = 'true')")
    tr.sql("SET parquet.block.size = 65536")  # row groups of ~64 KiB: vectors reach past the first
    try:
        tr.sql(f"INSERT INTO {db}.o SELECT id, CAST(id % 50 AS INT), CONCAT('note ', id, ' ', uuid()) "
               f"FROM range(0, 20000) AS t(id) DISTRIBUTE BY 1")
    finally:
        tr.sql("RESET parquet.block.size")
    tr.sql(f"CREATE TABLE {db}.c (id INT, region STRING) USING delta TBLPROPERTIES ('delta.enableChangeDataFeed' = 'true')")
    tr.sql(f"INSERT INTO {db}.c SELECT CAST(id AS INT), CONCAT('r', id % 7) FROM range(0, 50) AS t(id)")
    tr.sql(f"INSERT INTO {db}.c VALUES (3, NULL), (3, NULL)")
    query = f"SELECT o.id, o.note, c.region FROM {db}.o o JOIN {db}.c c ON o.cid = c.id"
    name = f"{db}.joined"
    tr.create_stream_table(name, query, schedule=None)
    changes = [f"DELETE FROM {db}.o WHERE id % 997 = 5", f"UPDATE {db}.o SET cid = 3 WHERE id % 1009 = 7",
               f"INSERT INTO {db}.o VALUES (20001, NULL, 'n'), (20002, 3, NULL), (20002, 3, NULL)",
               f"DELETE FROM {db}.c WHERE id = 4"]
    # The suite turns Delta's data skipping off (tables of one or two files); Delta 4.4 then
    # refuses to scan a table with deletion vectors ("a non-pinned table snapshot").
    tr.sql("SET spark.databricks.delta.stats.skipping = true")
    try:
        with caplog.at_level(logging.INFO, logger="airflow_trickle"):
            refresh_through(tr, name, query, changes)
    finally:
        tr.sql("SET spark.databricks.delta.stats.skipping = false")
    assert "delta-rs does not read its change feed as Spark does (reader features deletionVectors)" in caplog.text

"""Recursive CTEs in DIFFERENTIAL (``dvm/recursive.py``) against the oracle: after every refresh
each stream table equals its query on the sources (multiset equality), under random inserts,
deletes and updates with NULLs and duplicate rows; insert-only windows are appended."""
from __future__ import annotations

import logging
import random
import shutil

import pytest

from airflow_trickle.storage.deltalog import newest_refresh
from tests.oracle import both_multisets

# over the Spark service by default (the path Airflow tasks take); classic too when asked
pytestmark = pytest.mark.both_spark_modes

PATHS = ("WITH RECURSIVE r(src, dst) AS (SELECT src, dst FROM {db}.edges "
         "UNION ALL SELECT r.src, e.dst FROM r JOIN {db}.edges e ON r.dst = e.src) SELECT src, dst FROM r")
#: A hierarchy walked down from its roots; the outer query aggregates the recursive CTE.
LEVELS = ("WITH RECURSIVE tree(id, root, depth) AS ("
          "SELECT p.id, p.id, 0 FROM {db}.people p JOIN {db}.roots o ON p.id = o.id "
          "UNION ALL SELECT p.id, t.root, t.depth + 1 FROM tree t JOIN {db}.people p ON p.boss = t.id "
          "WHERE p.active) "
          "SELECT root, depth, COUNT(*) AS n FROM tree GROUP BY root, depth")
#: A recursive term that reads the CTE alone.
REPEATS = ("WITH RECURSIVE c(id, k) AS (SELECT id, 0 FROM {db}.edges WHERE dst IS NOT NULL "
           "UNION ALL SELECT id, k + 1 FROM c WHERE k < 2) SELECT id, k FROM c")


def _change(tr, db: str, rng: random.Random, *, insert_only: bool) -> None:
    def node(low=1, high=7):
        return "NULL" if rng.random() < 0.1 else str(rng.randint(low, high))

    edges = []
    for _ in range(rng.randint(1, 3)):
        a, b = sorted(rng.sample(range(1, 8), 2))  # src < dst: the graph has no cycle
        edges.append(f"({rng.randint(1, 9)}, {a}, {b if rng.random() > 0.1 else 'NULL'})")
    tr.sql(f"INSERT INTO {db}.edges VALUES {', '.join(edges + edges[:1])}")  # a duplicate row
    people = [f"({i}, {rng.randint(0, i - 1) if rng.random() > 0.15 else 'NULL'}, {rng.random() > 0.2})"
              for i in rng.sample(range(2, 14), rng.randint(1, 3))]
    tr.sql(f"INSERT INTO {db}.people VALUES {', '.join(people)}")
    if insert_only:
        return
    tr.sql(f"DELETE FROM {db}.edges WHERE src = {node()}")
    tr.sql(f"UPDATE {db}.edges SET dst = dst + 1 WHERE id = {rng.randint(1, 9)} AND dst < 7")
    tr.sql(f"UPDATE {db}.people SET active = NOT active WHERE id = {rng.randint(1, 13)}")
    tr.sql(f"DELETE FROM {db}.people WHERE id = {rng.randint(1, 13)}")
    if rng.random() < 0.5:
        tr.sql(f"INSERT INTO {db}.roots VALUES ({rng.randint(1, 13)})")
    else:
        tr.sql(f"DELETE FROM {db}.roots WHERE id = {rng.randint(1, 13)}")


def test_recursive_ctes_stay_exact_under_random_change(tr, db, tmp_path, monkeypatch, caplog):
    """The recursions read the rows of E their seeds reach, looked up in an arrangement of E
    (``refresh/arranged_recursion.py``): built at the first refresh, caught up after, wiped
    before the last batch (a restart) and built again."""
    folder = tmp_path / "arrangements"
    monkeypatch.setattr(tr.config, "arrangement_dir", str(folder))
    tr.sql(f"CREATE TABLE {db}.edges (id INT, src INT, dst INT) USING delta")
    tr.sql(f"CREATE TABLE {db}.people (id INT, boss INT, active BOOLEAN) USING delta")
    tr.sql(f"CREATE TABLE {db}.roots (id INT) USING delta")
    tr.sql(f"INSERT INTO {db}.edges VALUES (1, 1, 2), (2, 2, 3), (3, 3, 4), (4, 2, 4), (4, 2, 4), (5, 4, NULL)")
    tr.sql(f"INSERT INTO {db}.people VALUES (0, NULL, true), (1, 0, true), (2, 1, true), (3, 1, false), "
           f"(4, 2, true), (4, 2, true), (5, NULL, true)")
    tr.sql(f"INSERT INTO {db}.roots VALUES (0), (5)")
    queries = {f"{db}.{name}": text.format(db=db) for name, text in
               (("paths", PATHS), ("levels", LEVELS), ("repeats", REPEATS))}
    for name, query in queries.items():
        tr.create_stream_table(name, query, schedule=None, refresh_mode="DIFFERENTIAL")
        assert "Recursive" in tr.explain(name)["text"], name
    rng = random.Random(3)
    for batch in range(3):
        _change(tr, db, rng, insert_only=batch == 1)
        if batch == 2:
            shutil.rmtree(folder, ignore_errors=True)
        for name, query in queries.items():
            with caplog.at_level(logging.INFO, logger="airflow_trickle"):
                result = tr.refresh_stream_table(name)
            assert result.action == "DIFFERENTIAL", (batch, name, result.reason)
            stored, wanted = both_multisets(tr.read(name), tr.sql(query))
            assert stored == wanted, (batch, name)
        if batch == 1:  # an insert-only window: the bag tables were appended (semi-naive), not merged
            for name in (f"{db}.paths", f"{db}.repeats"):
                metrics = newest_refresh(tr.catalog.at(tr.get(name).location))["metrics"]
                assert "numOutputRows" in metrics and "numTargetRowsInserted" not in metrics, (name, metrics)
    text = caplog.text
    assert "keys of the changes reach" in text and "levels (unrolled)" in text, "no recursion read the rows of E it reaches"
    assert "stored rows joined by E's change, read by delta-rs" in text  # paths: r stored whole
    # built at the old versions and caught up to the new in each refresh (changes this large
    # against tables this small compact it), and built again once wiped
    assert "(none kept)" in text and text.count("built at") >= 3


@pytest.mark.parametrize("query, refused", [
    ("WITH RECURSIVE r(a) AS (SELECT src FROM {db}.e UNION ALL SELECT e.dst FROM r JOIN {db}.e e ON r.a = e.src "
     "JOIN {db}.e f ON f.src = e.src) SELECT a FROM r", "joins more than one other table"),
    ("WITH RECURSIVE r(a, n) AS (SELECT src, 1 FROM {db}.e UNION ALL "
     "SELECT r.a, r.n + 1 FROM r LEFT JOIN {db}.e ON r.a = e.dst WHERE r.n < 3) SELECT a, n FROM r", "LEFT JOIN"),
])
def test_recursive_ctes_beyond_linear_monotone_terms_run_full_with_the_reason(tr, db, query, refused):
    tr.sql(f"CREATE TABLE {db}.e (src INT, dst INT) USING delta")
    tr.sql(f"INSERT INTO {db}.e VALUES (1, 2), (2, 3)")
    st = tr.create_stream_table(f"{db}.st", query.format(db=db), schedule=None, refresh_mode="AUTO")
    assert st.effective_mode == "FULL" and refused in st.mode_reason, st.mode_reason
    tr.sql(f"INSERT INTO {db}.e VALUES (3, 4)")
    assert tr.refresh_stream_table(f"{db}.st").action == "FULL"
    stored, wanted = both_multisets(tr.read(f"{db}.st"), tr.sql(query.format(db=db)))
    assert stored == wanted

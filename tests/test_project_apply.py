"""``trickle plan`` / ``apply`` on a real warehouse: a project of a join and a chain, edited as a
pull request would edit it, applied in place, removed tables pruned, ownership kept, and an apply
interrupted at any catalog write converging when run again."""
from __future__ import annotations

import json
import random

import pytest
import yaml

from airflow_trickle.cli import main
from airflow_trickle.catalog.store import CatalogStore
from airflow_trickle.errors import DefinitionError
from airflow_trickle.project import define_project
from airflow_trickle.project.apply import apply_project, plan_for
from airflow_trickle.project.plan import Change, Schema
from airflow_trickle.refresh.full import pinned_query_sql
from tests.conftest import rows, visible


def exact(tr, *names: str) -> None:
    """Each stream table equals its defining query at its frontier versions (multisets)."""
    for name in names:
        st = tr.get(name)
        assert visible(tr, name) == rows(tr.spark.sql(pinned_query_sql(tr, st, st.frontier))), name


@pytest.fixture
def shop(tr, db):
    tr.sql(f"CREATE TABLE {db}.orders (id INT, cust INT, amount INT) USING delta")
    tr.sql(f"CREATE TABLE {db}.customers (id INT, region STRING) USING delta")
    tr.sql(f"INSERT INTO {db}.orders VALUES (1, 1, 10), (2, 1, 3), (3, 2, 7), (3, 2, 7), (4, NULL, 5), (5, 3, NULL)")
    tr.sql(f"INSERT INTO {db}.customers VALUES (1, 'eu'), (2, 'us'), (3, NULL)")
    return db


def tables(db: str, **edits) -> list[dict]:
    """The project's stream tables: a join, and a chain of two aggregates over it."""
    declared = {
        "lines": f"SELECT o.id, c.region, o.amount FROM {db}.orders o JOIN {db}.customers c ON o.cust = c.id "
                 "WHERE o.amount > 0",
        "by_region": f"SELECT region, COUNT(*) AS n, SUM(amount) AS total FROM {db}.lines GROUP BY region",
        "big": f"SELECT region, total FROM {db}.by_region WHERE total > 5",
    }
    declared.update(edits)
    return [{"name": f"{db}.{name}", "query": query, "schedule": "5m"} for name, query in declared.items() if query]


#: The cost model's bounds off: the tables hold a few rows, and the test asks for DIFFERENTIAL.
SETTINGS = {"differential_max_change_ratio": 1e9, "differential_max_touched_ratio": 1e9,
            "differential_max_time_ratio": 1e9, "differential_ratio_min_rows": 0}


def project(tr, db, name="shop", **keys):
    keys.setdefault("stream_tables", tables(db))
    return define_project(name, warehouse=tr.warehouse, settings=SETTINGS, **keys)


def refresh(tr, name: str) -> str:
    result = tr.refresh_stream_table(name)
    assert result.status == "COMPLETED", result
    return result.action


def test_plan_and_apply_create_alter_in_place_prune_and_keep_ownership(tr, shop, tmp_path, capsys):
    db = shop
    names = [f"{db}.lines", f"{db}.by_region", f"{db}.big"]
    first = project(tr, db)
    assert [t.change for t in plan_for(tr, first).tables] == [Change.CREATE] * 3
    # the first apply through the command line, from the project file
    file = tmp_path / "trickle.yaml"
    file.write_text(yaml.safe_dump({"project": "shop", "warehouse": tr.warehouse, "settings": SETTINGS,
                                    "stream_tables": tables(db)}))
    assert main(["apply", str(file), "--json"]) == 0
    assert [(d["stream_table"], d["done"]) for d in json.loads(capsys.readouterr().out)] == [
        (n, "CREATED") for n in names]
    exact(tr, *names)
    assert {(tr.get(n).owner, tr.get(n).owner_file) for n in names} == {("shop", str(file.resolve()))}
    assert main(["plan", str(file)]) == 0
    assert capsys.readouterr().out == "project shop: 3 stream tables, 3 unchanged, nothing to do\n"

    # a reformatted query, with a comment, is no change
    reformatted = project(tr, db, stream_tables=tables(db, big=f"select region,\n  total -- the sum\n"
                                                                f"from {db}.by_region where total > 5"))
    assert not plan_for(tr, reformatted).has_changes and apply_project(tr, reformatted) == []

    # an edited filter: ALTERed in place, its readers not reinitialized, DIFFERENTIAL afterwards
    edited = project(tr, db, stream_tables=tables(
        db, lines=f"SELECT o.id, c.region, o.amount FROM {db}.orders o JOIN {db}.customers c ON o.cust = c.id "
                  "WHERE o.amount > 4"))
    plan = plan_for(tr, edited)
    assert [(t.name, t.change, t.schema) for t in plan.of(Change.ALTER)] == [(f"{db}.lines", Change.ALTER, Schema.SAME)]
    id_before = tr.get(f"{db}.lines").st_id
    assert [(a.name, a.done, a.detail) for a in apply_project(tr, edited)] == [(f"{db}.lines", "ALTERED", "query")]
    assert tr.get(f"{db}.lines").st_id == id_before and tr.get(f"{db}.lines").owner == "shop"
    tr.sql(f"INSERT INTO {db}.orders VALUES (6, 2, 20), (7, 1, 1), (8, NULL, 9)")
    tr.sql(f"DELETE FROM {db}.orders WHERE id = 1")
    assert [refresh(tr, n) for n in names] == ["DIFFERENTIAL", "DIFFERENTIAL", "DIFFERENTIAL"]
    assert all(r.action != "REINITIALIZE" for n in names[1:] for r in tr.history(n, limit=10))
    exact(tr, *names)

    # a new column: compatible, the reader goes on refreshing DIFFERENTIAL
    widened = project(tr, db, stream_tables=tables(
        db, lines=f"SELECT o.id, c.region, o.amount, o.cust FROM {db}.orders o JOIN {db}.customers c "
                  "ON o.cust = c.id WHERE o.amount > 4"))
    table = plan_for(tr, widened).of(Change.ALTER)[0]
    assert (table.schema, table.schema_detail, table.reinitialized) == (Schema.COMPATIBLE, "adds cust", ())
    apply_project(tr, widened)
    tr.sql(f"UPDATE {db}.orders SET amount = 30 WHERE id = 3")
    assert [refresh(tr, n) for n in names] == ["DIFFERENTIAL", "DIFFERENTIAL", "DIFFERENTIAL"]
    exact(tr, *names)

    # a changed column type: incompatible, the reader that uses it reinitializes
    retyped = project(tr, db, stream_tables=tables(
        db, lines=widened.stream_tables[f"{db}.lines"].query,
        by_region=f"SELECT region, COUNT(*) AS n, CAST(SUM(amount) AS DOUBLE) AS total FROM {db}.lines GROUP BY region"))
    table = plan_for(tr, retyped).of(Change.ALTER)[0]
    assert table.schema == Schema.INCOMPATIBLE and table.schema_detail == "total: bigint -> double"
    assert [(r.name, r.rows) for r in table.reinitialized] == [(f"{db}.big", len(visible(tr, f"{db}.big")))]
    apply_project(tr, retyped)
    assert refresh(tr, f"{db}.big") == "REINITIALIZE"
    exact(tr, *names)
    assert dict(tr.read(f"{db}.big").dtypes)["total"] == "double"

    # a table taken out of the file: reported, kept without prune, dropped with it
    shorter = project(tr, db, stream_tables=[t for t in tables(db, lines=widened.stream_tables[f"{db}.lines"].query,
                                                               by_region=retyped.stream_tables[f"{db}.by_region"].query)
                                             if not t["name"].endswith(".big")])
    assert [(t.name, t.change) for t in plan_for(tr, shorter).tables if t.change != Change.UNCHANGED] == \
        [(f"{db}.big", Change.REMOVE)]
    assert [(a.name, a.done) for a in apply_project(tr, shorter)] == [(f"{db}.big", "KEPT")]
    assert tr.catalog.get(f"{db}.big") is not None
    assert [(a.name, a.done) for a in apply_project(tr, shorter, prune=True)] == [(f"{db}.big", "DROPPED")]
    assert tr.catalog.get(f"{db}.big") is None and not tr.spark.catalog.tableExists(f"{db}.big")

    # a second project claiming a table is refused, naming the owner; nothing changes
    rival_lines = f"SELECT o.id, c.region, o.amount, o.cust FROM {db}.orders o JOIN {db}.customers c ON o.cust = c.id"
    rival = project(tr, db, name="rival", stream_tables=[{"name": f"{db}.lines", "query": rival_lines},
                                                         {"name": f"{db}.other", "query": f"SELECT id FROM {db}.orders"}])
    with pytest.raises(DefinitionError, match=rf"{db}\.lines: owned by project 'shop'"):
        apply_project(tr, rival)
    assert tr.catalog.get(f"{db}.other") is None and tr.get(f"{db}.lines").owner == "shop"
    assert [a.done for a in apply_project(tr, rival, adopt=True, prune=False)] == ["ALTERED", "CREATED"]
    assert tr.get(f"{db}.lines").owner == "rival"
    exact(tr, f"{db}.lines", f"{db}.other")
    assert refresh(tr, f"{db}.by_region") in ("DIFFERENTIAL", "NO_DATA")  # the shop's reader goes on
    exact(tr, f"{db}.by_region")


class Killed(BaseException):
    """A stand-in for the process dying: no ``except Exception`` handler takes it."""


def test_an_apply_interrupted_at_any_catalog_write_converges_when_run_again(tr, shop, monkeypatch):
    """v1 -> v2 changes a query, creates a table and prunes one; each trial interrupts the apply
    at a random catalog write, runs it again, checks every table, then applies v1 back the same way."""
    db = shop
    v1 = project(tr, db, stream_tables=tables(db, big=None), deploy={"prune": True})
    v2 = project(tr, db, stream_tables=tables(
        db, by_region=None, big=f"SELECT region, SUM(amount) AS total FROM {db}.lines WHERE amount > 6 GROUP BY region",
        lines=f"SELECT o.id, c.region, o.amount FROM {db}.orders o JOIN {db}.customers c ON o.cust = c.id"),
        deploy={"prune": True})
    apply_project(tr, v1)
    writes = {"count": 0, "kill_at": None}
    for method in ("insert", "replace", "update", "delete", "append_history"):
        original = getattr(CatalogStore, method)

        def counted(self, *args, _original=original, **kwargs):
            writes["count"] += 1
            if writes["count"] == writes["kill_at"]:
                raise Killed(f"killed at catalog write {writes['count']}")
            return _original(self, *args, **kwargs)

        monkeypatch.setattr(CatalogStore, method, counted)
    writes["count"] = 0
    apply_project(tr, v2)  # uninterrupted, to count the writes of one direction
    total = writes["count"]
    apply_project(tr, v1)
    assert total > 5
    for kill_at in sorted(random.Random(7).sample(range(1, total + 1), 3)):
        for target in (v2, v1):
            writes.update(count=0, kill_at=kill_at)
            with pytest.raises(Killed):
                apply_project(tr, target)
            writes.update(kill_at=None)
            apply_project(tr, target)
            assert not plan_for(tr, target, analyse=False).has_changes, kill_at
            declared = list(target.stream_tables)
            assert sorted(st.name for st in tr.catalog.list() if st.name.startswith(db)) == sorted(declared)
            # no refresh first: one would populate a table the interrupted apply left half made
            assert all(tr.get(name).is_populated for name in declared)
            exact(tr, *declared)

"""The catalog rebuilt from the data (``repair.py``): definitions carried by the storage tables,
``check`` and ``repair`` after the catalog is lost, damaged, or left behind."""
from __future__ import annotations

import json
import os
import shutil
from datetime import datetime, timezone

from airflow_trickle.catalog import Dependency, StreamTable
from airflow_trickle.model import Identity, StorageLayout, Strategy
from airflow_trickle.names import quote_string
from airflow_trickle.storage.definitions import DEFINITION_KEY, definition_properties, rows_from_record
from airflow_trickle.spark.session import CATALOG_DIR
from tests.conftest import rows


def test_definition_round_trips_through_the_storage_property():
    st = StreamTable(name="shop.t", st_id="abc", defining_query="SELECT `a` FROM `shop`.`o` WHERE n <> \"it's \\\\\"",
                     original_query="SELECT a FROM shop.o WHERE n <> \"it's \\\\\"", schedule="5m",
                     refresh_mode="DIFFERENTIAL", effective_mode="DIFFERENTIAL", output_columns=["a"],
                     storage=StorageLayout(identity=Identity.BAG, strategy=Strategy.BAG, columns=[("a", "int")]),
                     options={"freshness_seconds": 120}, created_at=datetime(2026, 1, 2, tzinfo=timezone.utc))
    deps = [Dependency(st_name="shop.t", source_name="shop.o", source_type="TABLE", source_location="/w/shop.db/o",
                       columns_used=["a", "n"], cdc_mode="cdf", schema_fingerprint="f1")]
    record = json.loads(definition_properties(st, deps)[DEFINITION_KEY])
    newest = {"seq": 4, "frontier": {"shop.o": 7}, "data_timestamp": "2026-01-03T00:00:00+00:00", "version": 5}
    rebuilt, rebuilt_deps = rows_from_record(record, "/w/shop.db/t", newest)
    for key in ("name", "st_id", "defining_query", "original_query", "schedule", "refresh_mode", "effective_mode",
                "output_columns", "storage", "options", "created_at"):
        assert getattr(rebuilt, key) == getattr(st, key), key
    assert (rebuilt.frontier, rebuilt.refresh_seq, rebuilt.is_populated) == ({"shop.o": 7}, 4, True)
    assert rebuilt.location == "/w/shop.db/t" and rebuilt_deps == deps


def test_quote_string_escapes_what_spark_unescapes():
    assert quote_string("it's a \\ test") == "'it\\'s a \\\\ test'"


def _ours(findings, db):
    return [f for f in findings if f.stream_table.startswith(f"{db}.")]


def test_catalog_lost_damaged_or_behind_is_rebuilt_from_the_storage_tables(tr, db, warehouse, capsys):
    from airflow_trickle import Trickle
    from airflow_trickle.cli import main

    tr.sql(f"CREATE TABLE {db}.o (id INT, cid INT, amount INT, note STRING) USING delta")
    tr.sql(f"INSERT INTO {db}.o VALUES (1, 1, 10, NULL), (2, 1, 5, 'x'), (3, 2, 7, \"it's a \\\\ test\")")
    kept, totals = f"{db}.kept", f"{db}.totals"
    queries = {kept: f"SELECT id, cid, amount FROM {db}.o WHERE note IS NULL OR note <> \"it's a \\\\ test\"",
               totals: f"SELECT cid, COUNT(*) AS n, SUM(amount) AS s FROM {db}.kept GROUP BY cid"}
    tr.create_stream_table(kept, queries[kept], schedule="5m")
    tr.create_stream_table(totals, queries[totals], schedule=None, options={"freshness_seconds": 600})
    tr.sql(f"INSERT INTO {db}.o VALUES (4, 2, 1, NULL)")
    for name in (kept, totals):
        assert tr.refresh_stream_table(name).action == "DIFFERENTIAL"
    tr.alter_stream_table(kept, schedule="2m")  # the definition in storage follows the catalog
    assert _ours(tr.check(), db) == []
    before = {name: tr.get(name) for name in (kept, totals)}

    catalog_dir = os.path.join(warehouse, CATALOG_DIR)
    aside = f"{catalog_dir}.kept-by-test"
    shutil.copytree(catalog_dir, aside)
    try:
        # 1. the catalog directory is gone: a new process sees an empty catalog
        shutil.rmtree(catalog_dir)
        fresh = Trickle(spark=tr.spark, config=tr.config)
        lost = _ours(fresh.check(), db)
        assert sorted((f.stream_table, f.severity) for f in lost) == [(kept, "ERROR"), (totals, "ERROR")], lost
        actions = [a for a in fresh.repair() if (a["stream_table"] or "").startswith(f"{db}.")]
        assert sorted((a["stream_table"], a["action"]) for a in actions) == [
            (kept, "rebuilt catalog rows from storage"), (totals, "rebuilt catalog rows from storage")]
        for name, old in before.items():
            new = fresh.get(name)
            for key in ("st_id", "defining_query", "original_query", "schedule", "refresh_mode", "effective_mode",
                        "output_columns", "storage", "options", "frontier", "refresh_seq", "is_populated", "location"):
                assert getattr(new, key) == getattr(old, key), (name, key)
        assert sorted((d.st_name, d.source_name) for d in fresh.catalog.dependencies() if d.st_name.startswith(db)) \
            == [(kept, f"{db}.o"), (totals, kept)]
        assert _ours(fresh.check(), db) == []
        # ... and the rebuilt catalog refreshes differentially and exactly
        tr.sql(f"UPDATE {db}.o SET cid = 3 WHERE id = 1")
        tr.sql(f"DELETE FROM {db}.o WHERE id = 2")
        for name in (kept, totals):
            assert fresh.refresh_stream_table(name).action == "DIFFERENTIAL"
            assert rows(fresh.read(name)) == rows(tr.sql(queries[name]))

        # 2. a catalog table is damaged: moved aside, made again, refilled (here from the CLI:
        #    on a local warehouse check and repair need no Spark)
        log = os.path.join(catalog_dir, "stream_tables", "_delta_log")
        for entry in os.listdir(log):
            if entry.endswith(".json"):
                with open(os.path.join(log, entry), "w") as damaged:
                    damaged.write("not json\n")
        capsys.readouterr()
        assert main(["--warehouse", warehouse, "--embedded", "repair", "--json"]) == 0
        repaired = json.loads(capsys.readouterr().out)
        assert any("moved the unreadable catalog table stream_tables" in a["action"] for a in repaired), repaired
        assert {a["stream_table"] for a in repaired} >= {kept, totals}
        fresh = Trickle(spark=tr.spark, config=tr.config)
        assert fresh.get(kept).refresh_seq == before[kept].refresh_seq + 1

        # 3. the catalog is behind its storage (a refresh killed between its data commit and
        #    the catalog update): check warns, repair brings it up to the newest refresh commit
        newest = fresh.get(kept)
        fresh.catalog.update(kept, lambda row: (setattr(row, "refresh_seq", row.refresh_seq - 1),
                                                setattr(row, "frontier", before[kept].frontier)))
        assert main(["--warehouse", warehouse, "--embedded", "check", "--json"]) == 1
        behind = [f for f in json.loads(capsys.readouterr().out) if f["stream_table"] == kept]
        assert [f["severity"] for f in behind] == ["WARNING"] and "behind" in behind[0]["problem"]
        fresh.repair()
        assert (fresh.get(kept).refresh_seq, fresh.get(kept).frontier) == (newest.refresh_seq, newest.frontier)
        assert _ours(fresh.check(), db) == []
    finally:
        shutil.rmtree(catalog_dir, ignore_errors=True)
        shutil.move(aside, catalog_dir)

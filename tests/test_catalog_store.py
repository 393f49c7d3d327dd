"""The catalog's ALTER is one commit: interrupted at any write, readers see the old definition
with its edges or the new one with its edges, never a mix (no JVM: the catalog is delta-rs)."""
from __future__ import annotations

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake

from airflow_trickle.catalog import store as store_module
from airflow_trickle.catalog.model import Dependency, StreamTable, _schemas
from airflow_trickle.catalog.store import CatalogStore


def _row(name: str, query: str) -> StreamTable:
    return StreamTable(name=name, st_id="id-" + name, defining_query=query, original_query=query, schedule=None,
                       refresh_mode="DIFFERENTIAL", effective_mode="DIFFERENTIAL", output_columns=["x"])


def _edges(name: str, *sources: str) -> list[Dependency]:
    return [Dependency(st_name=name, source_name=s, source_type="TABLE", source_location=f"/wh/{s}") for s in sources]


def _seen(catalog: CatalogStore, name: str) -> tuple[str, list[str]]:
    return catalog.get(name).defining_query, sorted(d.source_name for d in catalog.dependencies(name))


class Interrupted(Exception):
    pass


def _interrupt_write(monkeypatch, prefix: str) -> list[str]:
    """Make the catalog's first write described as ``prefix...`` fail as a killed process would."""
    writes = []
    real = CatalogStore._retry

    def retry(self, action, *, what):
        writes.append(what)
        if what.startswith(prefix) and not any(w.startswith(prefix) for w in writes[:-1]):
            raise Interrupted(what)
        return real(self, action, what=what)

    monkeypatch.setattr(CatalogStore, "_retry", retry)
    return writes


#: An ALTER's catalog writes, in order: the new edges beside the old, the row (the switch), the
#: old edges removed.
ALTER_WRITES = ["register dependencies of db.st", "replace db.st", "remove the replaced dependencies of db.st"]


@pytest.mark.parametrize("interrupted_write", [0, 1, 2])
def test_an_interrupted_alter_leaves_the_old_or_the_new_definition_whole(tmp_path, monkeypatch, interrupted_write):
    catalog = CatalogStore(str(tmp_path / "_trickle"))
    catalog.insert(_row("db.st", "SELECT x FROM db.a JOIN db.b"), _edges("db.st", "db.a", "db.b"))
    catalog.insert(_row("db.other", "SELECT x FROM db.a"), _edges("db.other", "db.a"))
    old = ("SELECT x FROM db.a JOIN db.b", ["db.a", "db.b"])
    new = ("SELECT x FROM db.b JOIN db.c", ["db.b", "db.c"])
    assert _seen(catalog, "db.st") == old

    writes = _interrupt_write(monkeypatch, ALTER_WRITES[interrupted_write])
    with pytest.raises(Interrupted):
        catalog.replace(_row("db.st", new[0]), _edges("db.st", "db.b", "db.c"))
    assert writes == ALTER_WRITES[:interrupted_write + 1]
    monkeypatch.undo()

    fresh = CatalogStore(str(tmp_path / "_trickle"))  # another process's view
    assert _seen(fresh, "db.st") == (old if interrupted_write <= 1 else new)
    assert sorted((d.st_name, d.source_name) for d in fresh.dependencies()) == sorted(
        [("db.other", "db.a")] + [("db.st", s) for s in _seen(fresh, "db.st")[1]])

    # repeating the ALTER (or a later one) finishes it and leaves only the new edges on disk
    fresh.replace(_row("db.st", new[0]), _edges("db.st", "db.b", "db.c"))
    assert _seen(fresh, "db.st") == new
    stored = DeltaTable(fresh.path("dependencies")).to_pyarrow_table().to_pylist()
    assert sorted(r["source_name"] for r in stored if r["st_name"] == "db.st") == ["db.b", "db.c"]


def test_a_create_interrupted_before_its_row_leaves_no_edges_seen(tmp_path, monkeypatch):
    catalog = CatalogStore(str(tmp_path / "_trickle"))
    catalog.ensure()  # the catalog tables exist: the interrupted write is the create's own
    writes = _interrupt_write(monkeypatch, "register db.st")  # the edges land, the row does not
    with pytest.raises(Interrupted):
        catalog.insert(_row("db.st", "SELECT x FROM db.a"), _edges("db.st", "db.a"))
    assert writes == ["register dependencies of db.st", "register db.st"]
    monkeypatch.undo()
    assert catalog.get("db.st") is None and catalog.dependencies() == []
    catalog.insert(_row("db.st", "SELECT x FROM db.b"), _edges("db.st", "db.b"))
    assert _seen(catalog, "db.st") == ("SELECT x FROM db.b", ["db.b"])
    stored = DeltaTable(catalog.path("dependencies")).to_pyarrow_table().to_pylist()
    assert [r["source_name"] for r in stored] == ["db.b"]  # the orphan edge was removed with the next write


def test_a_catalog_written_before_definition_ids_gains_the_column_and_keeps_its_edges(tmp_path):
    """Rows without a definition id (an older version's catalog) are one definition: they stay
    visible, and the first ALTER replaces them."""
    root = tmp_path / "_trickle"
    schemas = _schemas()
    for table, schema in schemas.items():
        old = pa.schema([f for f in schema if f.name != "definition_id"])
        rows = {"stream_tables": [{**_row("db.st", "SELECT x FROM db.a").to_row()}],
                "dependencies": [d.to_row() for d in _edges("db.st", "db.a")]}.get(table, [])
        data = pa.Table.from_pylist([{f.name: r.get(f.name) for f in old} for r in rows], schema=old)
        write_deltalake(str(root / table), data)
    catalog = CatalogStore(str(root))
    assert _seen(catalog, "db.st") == ("SELECT x FROM db.a", ["db.a"])
    assert "definition_id" in {f.name for f in DeltaTable(catalog.path("dependencies")).schema().fields}
    catalog.replace(_row("db.st", "SELECT x FROM db.b"), _edges("db.st", "db.b"))
    assert _seen(catalog, "db.st") == ("SELECT x FROM db.b", ["db.b"])
    stored = DeltaTable(catalog.path("dependencies")).to_pyarrow_table().to_pylist()
    assert [r["source_name"] for r in stored] == ["db.b"]


def test_the_other_definitions_predicate_treats_rows_without_an_id_as_sql_does():
    assert store_module._other_definitions("db.st", ["a"]) == (
        "st_name = 'db.st' AND (definition_id IS NULL OR NOT definition_id IN ('a'))")
    assert store_module._other_definitions("d'b", [None, "a"], alias="t.") == (
        "t.st_name = 'd''b' AND NOT (t.definition_id IS NULL OR t.definition_id IN ('a'))")


def test_reads_open_each_data_file_once_and_still_see_every_writer(tmp_path, monkeypatch):
    """A catalog table updated row by row holds one small file per stream table: reads keep the
    rows of each (immutable) file and the table's handle, yet see other writers' commits, a
    compaction, and a catalog table moved aside and made again."""
    import shutil

    import pyarrow.parquet as pq

    reads = []
    real_read = pq.read_table
    monkeypatch.setattr(pq, "read_table", lambda path, *a, **k: reads.append(path) or real_read(path, *a, **k))
    root = str(tmp_path / "_trickle")
    reader, writer = CatalogStore(root), CatalogStore(root)
    for i in range(5):
        writer.insert(_row(f"db.t{i}", f"SELECT {i} AS x"), _edges(f"db.t{i}", "db.a"))

    reads.clear()
    assert [st.name for st in reader.list()] == [f"db.t{i}" for i in range(5)]
    assert len(reads) == 5  # one file per registered row
    reads.clear()
    assert reader.get("db.t3").defining_query == "SELECT 3 AS x"
    assert reads == []  # nothing changed: no file read again

    def set_query(st):
        st.defining_query = "SELECT 33 AS x"

    writer.update("db.t3", set_query)  # rewrites the one file holding the row
    reads.clear()
    assert reader.get("db.t3").defining_query == "SELECT 33 AS x"
    assert len(reads) == 1
    assert reader.get("db.t1").defining_query == "SELECT 1 AS x"

    writer.compact_all(retention_hours=0)
    reads.clear()
    assert [st.defining_query for st in reader.list()] == ["SELECT 0 AS x", "SELECT 1 AS x", "SELECT 2 AS x",
                                                           "SELECT 33 AS x", "SELECT 4 AS x"]
    assert len(reads) == 1  # the compacted file
    writer.delete("db.t0")
    assert reader.get("db.t0") is None and len(reader.list()) == 4

    # Moved aside (as `trickle repair` does with an unreadable table) and made again, empty.
    shutil.move(writer.path("stream_tables"), writer.path("stream_tables") + ".aside")
    fresh = CatalogStore(root)
    fresh.insert(_row("db.new", "SELECT 7 AS x"), [])
    assert [st.name for st in reader.list()] == ["db.new"]
    # Deleted and made again (its directory may get the freed inode back): seen as new too.
    shutil.rmtree(writer.path("stream_tables"))
    fresh = CatalogStore(root)
    fresh.insert(_row("db.newer", "SELECT 8 AS x"), [])
    assert [st.name for st in reader.list()] == ["db.newer"]


def test_within_one_refresh_each_catalog_table_is_caught_up_once_and_its_own_writes_are_seen(tmp_path, monkeypatch):
    """Inside ``reused_handles`` (one refresh) a catalog table's log is listed at its first read
    and after this catalog writes, not at every read; its own writes -- an update, a history row
    -- are read back at once; another writer's commit is seen from the next refresh on."""
    from datetime import datetime, timedelta, timezone

    from deltalake import DeltaTable as RealDeltaTable

    from airflow_trickle.catalog.model import RefreshRecord
    from airflow_trickle.storage.deltalog import reused_handles

    root = str(tmp_path / "_trickle")
    catalog, other = CatalogStore(root), CatalogStore(root)
    for name in ("db.a", "db.b"):
        other.insert(_row(name, "SELECT 1 AS x"), _edges(name, "db.src"))
    catches = []
    real = RealDeltaTable.update_incremental
    monkeypatch.setattr(RealDeltaTable, "update_incremental", lambda self, *a, **k: catches.append(1) or real(self, *a, **k))

    def set_query(text):
        def change(st):
            st.defining_query = text
        return change

    assert catalog.dependencies("db.a")  # both tables' handles opened, outside a refresh
    with reused_handles():
        catches.clear()
        for _ in range(5):
            assert [d.source_name for d in catalog.dependencies("db.a")] == ["db.src"]
        assert len(catches) == 2  # stream_tables and dependencies, once each
        other.update("db.b", set_query("SELECT 2 AS x"))  # another process, meanwhile
        catalog.update("db.a", set_query("SELECT 3 AS x"))
        assert catalog.get("db.a").defining_query == "SELECT 3 AS x"  # its own write, read back
        # (its update read the newest version: the other writer's commit is in it too)
        assert catalog.get("db.b").defining_query == "SELECT 2 AS x"
        catalog.set_schema_fingerprint("db.a", "db.src", "f1")  # a write through a handle of its own
        assert [d.schema_fingerprint for d in catalog.dependencies("db.a")] == ["f1"]
        now = datetime.now(timezone.utc)
        catalog.append_history(RefreshRecord(refresh_id="r1", st_name="db.a", seq=1, action="FULL", status="COMPLETED",
                                             start_time=now, end_time=now))
        assert [r.refresh_id for r in catalog.history("db.a")] == ["r1"]
        later = now + timedelta(seconds=1)
        other.append_history(RefreshRecord(refresh_id="r2", st_name="db.a", seq=2, action="FULL",
                                           status="COMPLETED", start_time=later, end_time=later))
        assert [r.refresh_id for r in catalog.history("db.a")] == ["r1"]  # as of its last catch-up
    assert [r.refresh_id for r in catalog.history("db.a")] == ["r2", "r1"]  # the next reads see it
    catches.clear()
    catalog.get("db.a"), catalog.get("db.a")
    assert len(catches) == 2  # outside a refresh, every read catches up

    # A catalog on an object store (no directory identity) opens its tables afresh at every
    # read, except within one refresh: opened once there, and afresh after its own writes.
    from airflow_trickle.catalog import tables

    monkeypatch.setattr(tables, "_directory_identity", lambda path: None)
    opens = []
    monkeypatch.setattr(CatalogStore, "_table",
                        lambda self, table, real=CatalogStore._table: opens.append(table) or real(self, table))
    catalog.get("db.a"), catalog.get("db.a")
    assert opens == ["stream_tables", "stream_tables"]
    with reused_handles():
        opens.clear()
        for _ in range(3):
            assert [d.source_name for d in catalog.dependencies("db.a")] == ["db.src"]
        assert opens == ["stream_tables", "dependencies"]
        catalog.update("db.a", set_query("SELECT 4 AS x"))
        assert catalog.get("db.a").defining_query == "SELECT 4 AS x"
        other.update("db.b", set_query("SELECT 5 AS x"))
        assert catalog.get("db.b").defining_query == "SELECT 2 AS x"  # as of its last read
    assert catalog.get("db.b").defining_query == "SELECT 5 AS x"


def test_history_is_the_newest_rows_of_the_table_newest_first(tmp_path):
    from datetime import datetime, timedelta, timezone

    from airflow_trickle.catalog.model import RefreshRecord

    catalog = CatalogStore(str(tmp_path / "_trickle"))
    start = datetime(2026, 11, 27, 12, tzinfo=timezone.utc)
    for i in range(6):
        for name in ("db.a", "db.b"):
            catalog.append_history(RefreshRecord(refresh_id=f"{name}-{i}", st_name=name, seq=i, action="FULL",
                                                 status="COMPLETED", start_time=start + timedelta(minutes=i),
                                                 end_time=start + timedelta(minutes=i, seconds=5)))
    # one with the same start and a later end, and one not started (counts as the newest)
    catalog.append_history(RefreshRecord(refresh_id="db.a-3b", st_name="db.a", seq=3, action="NO_DATA",
                                         status="COMPLETED", start_time=start + timedelta(minutes=3),
                                         end_time=start + timedelta(minutes=3, seconds=9)))
    catalog.append_history(RefreshRecord(refresh_id="db.a-x", st_name="db.a", seq=9, action="NONE", status="FAILED"))
    assert [r.refresh_id for r in catalog.history("db.a", limit=5)] == ["db.a-x", "db.a-5", "db.a-4", "db.a-3b", "db.a-3"]
    every = [r.refresh_id for r in catalog.history(None, limit=3)]
    assert every[0] == "db.a-x" and set(every[1:]) == {"db.a-5", "db.b-5"}  # the two -5 rows tie
    assert len(catalog.history("db.b", limit=100)) == 6 and catalog.history("db.c") == []


def test_old_history_is_pruned_but_each_table_keeps_its_newest_rows(tmp_path):
    from datetime import datetime, timedelta, timezone

    from airflow_trickle.catalog.model import RefreshRecord

    catalog = CatalogStore(str(tmp_path / "_trickle"))
    now = datetime(2026, 11, 27, 12, tzinfo=timezone.utc)
    ages = {"db.busy": range(0, 60, 2), "db.idle": (40, 50, 55)}  # days ago
    for name, days in ages.items():
        for age in days:
            catalog.append_history(RefreshRecord(refresh_id=f"{name}-{age}", st_name=name, seq=age, action="FULL",
                                                 status="COMPLETED", start_time=now - timedelta(days=age)))
    catalog.append_history(RefreshRecord(refresh_id="never-started", st_name="db.busy", seq=0, action="NONE",
                                         status="FAILED"))
    removed = catalog.prune_history(now - timedelta(days=30), keep_newest=2)
    left = {name: [r.refresh_id for r in catalog.history(name, limit=100)] for name in ages}
    # busy: its rows of the last 30 days stay (0..30: 16 rows; 30 is not before the cutoff) and the
    # one without a start; idle: its newest two
    assert left["db.busy"] == ["never-started"] + [f"db.busy-{age}" for age in range(0, 31, 2)]
    assert left["db.idle"] == ["db.idle-40", "db.idle-50"]
    assert removed == 14 + 1
    assert catalog.prune_history(now - timedelta(days=30), keep_newest=2) == 0  # nothing more to do


def test_a_catalog_table_compacts_itself_once_it_holds_many_files(tmp_path, monkeypatch):
    """Each write appends a file; past ``_COMPACT_AFTER_FILES`` the writer compacts the table
    (counted on its kept read handle), and every row is still there."""
    from airflow_trickle.catalog import tables

    monkeypatch.setattr(tables, "_COMPACT_AFTER_FILES", 3)
    catalog = CatalogStore(str(tmp_path / "_trickle"))
    for i in range(6):
        catalog.insert(_row(f"db.t{i}", f"SELECT {i} AS x"), _edges(f"db.t{i}", "db.a"))
    files = len(DeltaTable(catalog.path("stream_tables")).file_uris())
    assert files <= 3, files
    assert [st.name for st in catalog.list()] == [f"db.t{i}" for i in range(6)]

"""Catalog writes from concurrent refreshes lose no update (no JVM: the catalog is delta-rs).

Refresh processes write the catalog at the same moments -- the frontier, the error count, the
history.  Each write is a read-modify-write committed optimistically; a process that loses the
race must start again from the new state, never write back a row computed from the old one.
Here four processes increment counters on shared and own rows as fast as they can, so almost
every commit conflicts with another; the totals must come out exact.
"""
from __future__ import annotations

import multiprocessing

from airflow_trickle.catalog.model import RefreshRecord, StreamTable, utcnow
from airflow_trickle.catalog.store import CatalogStore

WORKERS, ROUNDS = 4, 12


def _row(name: str) -> StreamTable:
    return StreamTable(name=name, st_id=name, defining_query="SELECT 1 AS x", original_query="SELECT 1 AS x",
                       schedule=None, refresh_mode="FULL", effective_mode="FULL", output_columns=["x"])


def _worker(root: str, worker: int, start, conflicts) -> None:
    from airflow_trickle.catalog import tables as store

    is_conflict = store._is_conflict

    def counted(err) -> bool:
        if is_conflict(err):
            with conflicts.get_lock():
                conflicts.value += 1
            return True
        return False

    store._is_conflict = counted
    catalog = CatalogStore(root, write_attempts=200)
    start.wait()
    for round_no in range(ROUNDS):
        def bump(row):
            row.consecutive_errors += 1

        catalog.update("db.shared", bump)
        catalog.update(f"db.own{worker}", lambda row: setattr(row, "refresh_seq", row.refresh_seq + 1))
        catalog.append_history(RefreshRecord(refresh_id=f"{worker}-{round_no}", st_name="db.shared", seq=round_no,
                                             action="FULL", status="COMPLETED", start_time=utcnow()))


def test_concurrent_catalog_writes_lose_no_update(tmp_path):
    root = str(tmp_path / "_trickle")
    catalog = CatalogStore(root)
    for name in ["db.shared"] + [f"db.own{w}" for w in range(WORKERS)]:
        catalog.insert(_row(name), [])
    context = multiprocessing.get_context("spawn")
    start, conflicts = context.Barrier(WORKERS), context.Value("i", 0)
    workers = [context.Process(target=_worker, args=(root, w, start, conflicts)) for w in range(WORKERS)]
    for process in workers:
        process.start()
    for process in workers:
        process.join(600)
    assert [p.exitcode for p in workers] == [0] * WORKERS
    assert conflicts.value > 0, "no write conflicted with another: the test raced nothing"
    assert catalog.get("db.shared").consecutive_errors == WORKERS * ROUNDS
    assert [catalog.get(f"db.own{w}").refresh_seq for w in range(WORKERS)] == [ROUNDS] * WORKERS
    history = catalog.history("db.shared", limit=1000)
    assert sorted(r.refresh_id for r in history) == sorted(f"{w}-{r}" for w in range(WORKERS) for r in range(ROUNDS))

"""Read and write the catalog with delta-rs: milliseconds, and no JVM.

Without a JVM, the Airflow layer reads the catalog at task start to decide whether Spark is
needed.  Updates of a stream table's row are read-modify-write transactions, retried whole when
a concurrent commit fails Delta's conflict check (``tables.py``).
"""
from __future__ import annotations

import logging
import uuid
from dataclasses import asdict
from datetime import timezone
from typing import Callable

from airflow_trickle.catalog.model import Dependency, GroupState, RefreshRecord, StreamTable, utcnow
from airflow_trickle.catalog.tables import _NEWEST_FIRST, TABLES, DeltaTables, _select  # noqa: F401 - TABLES re-exported
from airflow_trickle.errors import CatalogError

log = logging.getLogger(__name__)


class CatalogStore(DeltaTables):
    """The catalog of one warehouse: ``<root>/stream_tables``, ``dependencies``, ``refresh_history``."""

    def exists(self) -> bool:
        """Whether the warehouse has a catalog yet (a read that would create none)."""
        from deltalake import DeltaTable

        return DeltaTable.is_deltatable(self.path("stream_tables"), storage_options=self.storage_options)

    def state(self) -> tuple[list[StreamTable], list[Dependency]]:
        """Every stream-table row and dependency row; none for a warehouse that has no catalog
        yet (and none is created: a plan of a new warehouse writes nothing)."""
        return (self.list(), self.dependencies()) if self.exists() else ([], [])

    # -- stream tables ------------------------------------------------------------------------

    def get(self, name: str) -> StreamTable | None:
        rows = self._rows("stream_tables", [("name", "=", name)])
        return StreamTable.from_row(rows[0]) if rows else None

    def list(self) -> list[StreamTable]:
        return sorted((StreamTable.from_row(r) for r in self._rows("stream_tables")), key=lambda s: s.name)

    def insert(self, st: StreamTable, dependencies: list[Dependency]) -> None:
        """Register a new stream table with its dependencies.

        The edges are written first, under a new definition id, and count only once the row
        that carries the same id lands: a create interrupted in between leaves no edges that
        any reader sees (and the next write of the name's edges removes them).
        """
        now = utcnow()
        st.created_at = st.created_at or now
        st.updated_at = now
        st.definition_id = uuid.uuid4().hex
        self._put_dependencies(st, dependencies, keep=[st.definition_id])
        self._append("stream_tables", [st.to_row()], f"register {st.name}")

    def replace(self, st: StreamTable, dependencies: list[Dependency]) -> None:
        """Replace a stream table's row and its dependencies (ALTER of the defining query).

        The catalog change takes effect in one commit: the new edges are added beside the old
        ones under a new definition id, and the row's commit switches to that id (readers see
        only the edges of the row's id, see :meth:`dependencies`).  Interrupted before the row's
        commit, the old row and its edges stand untouched; after it, the old edges are removed,
        which is housekeeping only.
        """
        current = self.get(st.name)
        previous = current.definition_id if current is not None else None
        st.definition_id = uuid.uuid4().hex
        self._put_dependencies(st, dependencies, keep=[previous, st.definition_id])
        st.updated_at = utcnow()

        def attempt() -> None:
            (self._table("stream_tables").merge(self._arrow("stream_tables", [st.to_row()]), "t.name = s.name",
                                                source_alias="s", target_alias="t")
             .when_matched_update_all().when_not_matched_insert_all().execute())

        self._retry(attempt, what=f"replace {st.name}")
        self._retry(lambda: self._table("dependencies").delete(_other_definitions(st.name, [st.definition_id])),
                    what=f"remove the replaced dependencies of {st.name}")

    def _put_dependencies(self, st: StreamTable, dependencies: list[Dependency], *, keep: list[str | None]) -> None:
        """Add ``st``'s edges under its definition id and remove the name's edges of any
        definition not in ``keep``, in one commit (retried as a whole on conflict)."""
        for dependency in dependencies:
            dependency.definition_id = st.definition_id
        stale = _other_definitions(st.name, keep)
        if not dependencies:
            self._retry(lambda: self._table("dependencies").delete(stale), what=f"unregister dependencies of {st.name}")
            return

        def attempt() -> None:
            (self._table("dependencies").merge(
                self._arrow("dependencies", [d.to_row() for d in dependencies]),
                "t.st_name = s.st_name AND t.source_name = s.source_name AND t.definition_id = s.definition_id",
                source_alias="s", target_alias="t")
             .when_matched_update_all().when_not_matched_insert_all()
             .when_not_matched_by_source_delete(_other_definitions(st.name, keep, alias="t."))
             .execute())

        self._retry(attempt, what=f"register dependencies of {st.name}")
        self._maybe_compact("dependencies")

    def update(self, name: str, change: Callable[[StreamTable], None]) -> StreamTable:
        """Apply ``change`` to the stored row of ``name`` and write it back (retried on conflict)."""

        def attempt() -> StreamTable:
            # through the kept handle, brought up to date (a fresh open replays the log: ~20 ms
            # of every refresh); the lock keeps other threads' reads off it meanwhile
            with self._read_lock:
                table = self._read_handle("stream_tables", newest=True)
                rows = _select(table, "stream_tables", [("name", "=", name)], self._file_rows)
                if not rows:
                    raise CatalogError(f"stream table {name!r} vanished from the catalog during an update")
                st = StreamTable.from_row(rows[0])
                change(st)
                st.updated_at = utcnow()
                (table.merge(self._arrow("stream_tables", [st.to_row()]), "t.name = s.name",
                             source_alias="s", target_alias="t")
                 .when_matched_update_all().execute())
            return st

        result = self._retry(attempt, what=f"update {name}")
        self._maybe_compact("stream_tables")
        return result

    def delete(self, name: str) -> None:
        """Remove the stream table's row and its dependency rows."""
        literal = name.replace("'", "''")
        self._retry(lambda: self._table("stream_tables").delete(f"name = '{literal}'"), what=f"unregister {name}")
        self._retry(lambda: self._table("dependencies").delete(f"st_name = '{literal}'"),
                    what=f"unregister dependencies of {name}")

    # -- dependencies -------------------------------------------------------------------------

    def dependencies(self, name: str | None = None) -> list[Dependency]:
        """The edges of ``name`` (or of every stream table): the dependency rows that carry their
        stream table's current definition id.  The rows are read first: edges are written
        before the row that adopts them, so whatever row is read, its edges are there."""
        filters = [("st_name", "=", name)] if name is not None else None
        current = {r["name"]: r["definition_id"] for r in self._rows("stream_tables", [("name", "=", name)]
                                                                       if name is not None else None)}
        return [Dependency.from_row(r) for r in self._rows("dependencies", filters)
                if r["st_name"] in current and r["definition_id"] == current[r["st_name"]]]

    # -- consistency groups -------------------------------------------------------------------

    def groups(self) -> list[GroupState]:
        return sorted((GroupState(**r) for r in self._rows("consistency_groups")), key=lambda g: g.name)

    def record_group_attempt(self, name: str, members: list[str], convergence_points: list[str], *,
                             succeeded: bool, error: str | None = None) -> GroupState:
        """Count a finished attempt of a group: its epoch advances only when it succeeded."""

        def attempt() -> GroupState:
            table = self._table("consistency_groups")
            rows = _select(table, "consistency_groups", [("name", "=", name)], self._file_rows)
            state = GroupState(**rows[0]) if rows else GroupState(name, members, convergence_points)
            state.members, state.convergence_points = list(members), list(convergence_points)
            state.epoch += 1 if succeeded else 0
            state.last_status = "COMPLETED" if succeeded else "ROLLED_BACK"
            state.last_error = None if succeeded else error
            state.updated_at = utcnow()
            (table.merge(self._arrow("consistency_groups", [asdict(state)]), "t.name = s.name",
                         source_alias="s", target_alias="t")
             .when_matched_update_all().when_not_matched_insert_all().execute())
            return state

        result = self._retry(attempt, what=f"record attempt of group {name}")
        self._maybe_compact("consistency_groups")
        return result

    # -- history ------------------------------------------------------------------------------

    def set_schema_fingerprint(self, st_name: str, source_name: str, fingerprint: str) -> None:
        """Remember the schema of ``source_name`` that ``st_name`` was last built against."""
        predicate = f"st_name = '{_literal(st_name)}' AND source_name = '{_literal(source_name)}'"
        self._retry(lambda: self._table("dependencies").update(new_values={"schema_fingerprint": fingerprint},
                                                               predicate=predicate),
                    what=f"update schema fingerprint of {source_name} for {st_name}")

    def append_history(self, record: RefreshRecord) -> None:
        self._append("refresh_history", [record.to_row()], f"record refresh of {record.st_name}")

    def prune_history(self, older_than, *, keep_newest: int = 100) -> int:
        """Delete the history rows that started before ``older_than`` (a UTC datetime), except
        each stream table's newest ``keep_newest`` (the cost model and the Stream tables page
        read the recent ones, however old); returns how many rows went."""
        rows = self._rows("refresh_history", order_by=_NEWEST_FIRST)
        seen: dict[str, int] = {}
        kept_old: list[str] = []  # old rows among their table's newest: spared by id
        old = 0
        for row in rows:
            seen[row["st_name"]] = rank = seen.get(row["st_name"], 0) + 1
            if row["start_time"] is not None and row["start_time"] < older_than:
                old += 1
                if rank <= keep_newest:
                    kept_old.append(row["refresh_id"])
        if old == len(kept_old):
            return 0
        predicate = f"start_time < '{older_than.astimezone(timezone.utc).strftime('%Y-%m-%d %H:%M:%S.%f')}'"
        if kept_old:
            predicate += " AND refresh_id NOT IN (" + ", ".join(f"'{_literal(i)}'" for i in kept_old) + ")"
        metrics = self._retry(lambda: self._table("refresh_history").delete(predicate),
                              what="remove old refresh history")
        return int((metrics or {}).get("num_deleted_rows", old - len(kept_old)))

    def history(self, name: str | None = None, limit: int = 20) -> list[RefreshRecord]:
        """The newest ``limit`` history rows (of ``name``), newest first; a row not yet started
        or ended counts as newest.  Sorted and cut in Arrow: the history only grows, and only
        the rows returned become Python objects."""
        filters = [("st_name", "=", name)] if name is not None else None
        rows = self._rows("refresh_history", filters, order_by=_NEWEST_FIRST, limit=limit)
        return [RefreshRecord.from_row(r) for r in rows]


def _literal(text: str) -> str:
    return text.replace("'", "''")


def _other_definitions(name: str, keep: list[str | None], *, alias: str = "") -> str:
    """A predicate on dependency rows (of the table aliased ``alias``): ``name``'s rows whose
    definition id is not in ``keep`` (None stands for rows written before ids existed)."""
    column = f"{alias}definition_id"
    ids = ", ".join(f"'{_literal(k)}'" for k in keep if k is not None)
    known = f"{column} IN ({ids})" if ids else "FALSE"
    # SQL's NULL: NOT (NULL IN (...)) is not true, so rows without an id need their own test
    other = f"NOT ({column} IS NULL OR {known})" if None in keep else f"({column} IS NULL OR NOT {known})"
    return f"{alias}st_name = '{_literal(name)}' AND {other}"

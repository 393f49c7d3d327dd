"""Read and write the catalog Delta tables, safely when several jobs write at once.

Two refresh jobs may commit to the catalog at the same moment.  History rows are blind
appends, which never conflict in Delta.  Updates of a stream table's row are read-modify-write
transactions that Delta's optimistic concurrency may reject; they are retried from the read.
"""
from __future__ import annotations

import os
import random
import time
from typing import Callable, Iterable

from airflow_trickle.catalog.model import (
    DEPENDENCIES_DDL,
    REFRESH_HISTORY_DDL,
    STREAM_TABLES_DDL,
    Dependency,
    RefreshRecord,
    StreamTable,
    utcnow,
)
from airflow_trickle.errors import CatalogError
from airflow_trickle.spark.delta import is_conflict

_TABLES = {
    "stream_tables": STREAM_TABLES_DDL,
    "dependencies": DEPENDENCIES_DDL,
    "refresh_history": REFRESH_HISTORY_DDL,
}


class CatalogStore:
    """The catalog of one warehouse: ``<root>/stream_tables``, ``dependencies``, ``refresh_history``."""

    def __init__(self, spark, root: str, *, write_attempts: int = 8):
        self.spark = spark
        self.root = root.rstrip("/")
        self.write_attempts = write_attempts
        self._schemas = {}
        self._ensured = False

    # -- plumbing ---------------------------------------------------------------------------

    def path(self, table: str) -> str:
        return f"{self.root}/{table}"

    def _ref(self, table: str) -> str:
        return f"delta.`{self.path(table)}`"

    def ensure(self) -> None:
        """Create the catalog tables that do not exist yet (idempotent, safe to race)."""
        if self._ensured:
            return
        for table, ddl in _TABLES.items():
            if not self._exists_on_disk(table):
                self._retry(lambda t=table, d=ddl: self.spark.sql(
                    f"CREATE TABLE IF NOT EXISTS {self._ref(t)} ({d}) USING delta"
                ), what=f"create catalog table {table}")
        self._ensured = True

    def _exists_on_disk(self, table: str) -> bool:
        path = self.path(table)
        if "://" in path and not path.startswith("file:"):
            return False  # let CREATE TABLE IF NOT EXISTS decide on remote storage
        return os.path.isdir(os.path.join(path.removeprefix("file:"), "_delta_log"))

    def _schema(self, table: str):
        if table not in self._schemas:
            from pyspark.sql.types import StructType

            self._schemas[table] = StructType.fromDDL(_TABLES[table])
        return self._schemas[table]

    def _frame(self, table: str, rows: Iterable[dict]):
        schema = self._schema(table)
        tuples = [tuple(row.get(f.name) for f in schema.fields) for row in rows]
        return self.spark.createDataFrame(tuples, schema=schema)

    def _read(self, table: str):
        self.ensure()
        return self.spark.read.format("delta").load(self.path(table))

    def _retry(self, action: Callable[[], object], *, what: str):
        """Run ``action``; on a Delta conflict, back off and run it again from the start."""
        for attempt in range(1, self.write_attempts + 1):
            try:
                return action()
            except Exception as err:  # noqa: BLE001 - classified below
                if not is_conflict(err) or attempt == self.write_attempts:
                    if is_conflict(err):
                        raise CatalogError(f"{what}: gave up after {attempt} conflicting attempts: {err}") from err
                    raise
                time.sleep(min(2.0, 0.05 * 2 ** attempt) * (0.5 + random.random()))
        raise AssertionError("unreachable")

    def _delta(self, table: str):
        from delta.tables import DeltaTable

        return DeltaTable.forPath(self.spark, self.path(table))

    # -- stream tables ------------------------------------------------------------------------

    def get(self, name: str) -> StreamTable | None:
        from pyspark.sql import functions as F

        rows = self._read("stream_tables").where(F.col("name") == name).collect()
        return StreamTable.from_row(rows[0]) if rows else None

    def list(self) -> list[StreamTable]:
        return sorted((StreamTable.from_row(r) for r in self._read("stream_tables").collect()), key=lambda s: s.name)

    def insert(self, st: StreamTable, dependencies: list[Dependency]) -> None:
        """Register a new stream table with its dependencies."""
        now = utcnow()
        st.created_at = st.created_at or now
        st.updated_at = now
        self.ensure()
        self._retry(lambda: self._frame("stream_tables", [st.to_row()]).write.format("delta").mode("append")
                    .save(self.path("stream_tables")), what=f"register {st.name}")
        if dependencies:
            self._retry(lambda: self._frame("dependencies", [d.to_row() for d in dependencies]).write
                        .format("delta").mode("append").save(self.path("dependencies")),
                        what=f"register dependencies of {st.name}")

    def update(self, name: str, change: Callable[[StreamTable], None]) -> StreamTable:
        """Apply ``change`` to the stored row of ``name`` and write it back (retried on conflict)."""
        from pyspark.sql import functions as F

        def attempt() -> StreamTable:
            st = self.get(name)
            if st is None:
                raise CatalogError(f"stream table {name!r} vanished from the catalog during an update")
            change(st)
            st.updated_at = utcnow()
            source = self._frame("stream_tables", [st.to_row()])
            (self._delta("stream_tables").alias("t")
             .merge(source.alias("s"), F.col("t.name") == F.col("s.name"))
             .whenMatchedUpdateAll().execute())
            return st

        return self._retry(attempt, what=f"update {name}")

    def delete(self, name: str) -> None:
        """Remove the stream table's row and its dependency rows."""
        from pyspark.sql import functions as F

        self.ensure()
        self._retry(lambda: self._delta("stream_tables").delete(F.col("name") == name), what=f"unregister {name}")
        self._retry(lambda: self._delta("dependencies").delete(F.col("st_name") == name),
                    what=f"unregister dependencies of {name}")

    # -- dependencies -------------------------------------------------------------------------

    def dependencies(self, name: str | None = None) -> list[Dependency]:
        from pyspark.sql import functions as F

        frame = self._read("dependencies")
        if name is not None:
            frame = frame.where(F.col("st_name") == name)
        return [Dependency.from_row(r) for r in frame.collect()]

    # -- history ------------------------------------------------------------------------------

    def append_history(self, record: RefreshRecord) -> None:
        self.ensure()
        self._retry(lambda: self._frame("refresh_history", [record.to_row()]).write.format("delta")
                    .mode("append").save(self.path("refresh_history")), what=f"record refresh of {record.st_name}")

    def history(self, name: str | None = None, limit: int = 20) -> list[RefreshRecord]:
        from pyspark.sql import functions as F

        frame = self._read("refresh_history")
        if name is not None:
            frame = frame.where(F.col("st_name") == name)
        rows = frame.orderBy(F.col("start_time").desc(), F.col("seq").desc()).limit(limit).collect()
        return [RefreshRecord.from_row(r) for r in rows]

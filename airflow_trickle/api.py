"""The Python API: ``Trickle`` mirrors pg_trickle's SQL API on Spark + Delta.

>>> tr = Trickle(warehouse="/tmp/wh")
>>> tr.spark.sql("CREATE TABLE shop.orders (id INT, amount INT) USING delta")
>>> tr.create_stream_table("shop.big_orders", "SELECT * FROM shop.orders WHERE amount > 100")
>>> tr.refresh_stream_table("shop.big_orders").action
'NO_DATA'
"""
from __future__ import annotations

import os
import uuid
from functools import cached_property

from airflow_trickle.catalog import CatalogStore, Dependency, RefreshRecord, StreamTable
from airflow_trickle.config import STATUSES, TrickleConfig
from airflow_trickle.definition import Definition, analyze, mode_choice, normalize_refresh_mode
from airflow_trickle.errors import (
    DefinitionError,
    InvalidRefreshModeError,
    StreamTableNotFoundError,
    TrickleError,
    UnsupportedConstructError,
)
from airflow_trickle.names import qualify_name
from airflow_trickle.refresh import RefreshResult, refresh_stream_table
from airflow_trickle.schedule import parse_schedule
from airflow_trickle.spark.delta import table_location
from airflow_trickle.spark.session import CATALOG_DIR, build_session, default_warehouse, sync_warehouse_tables

_UNSET = object()


class Trickle:
    """Stream tables of one warehouse.

    ``Trickle(warehouse=DIR)`` starts an embedded local Spark session with Delta (tables under
    DIR); ``Trickle(spark=session)`` uses the caller's session (a cluster, a real metastore),
    with the catalog under ``warehouse`` or else the session's ``spark.sql.warehouse.dir``.
    """

    def __init__(self, warehouse: str | None = None, *, spark=None, config: TrickleConfig | None = None, **settings):
        self.config = config or TrickleConfig.from_env(warehouse=warehouse, **settings)
        if warehouse is not None:
            self.config.warehouse = warehouse
        self._spark = spark
        if self._spark is None and not self.config.warehouse:
            raise TrickleError("no warehouse given: pass warehouse=DIR, set TRICKLE_WAREHOUSE, or pass spark=session")
        if self.config.warehouse and "://" not in self.config.warehouse:
            self.config.warehouse = os.path.abspath(self.config.warehouse)

    # -- sessions and catalog -----------------------------------------------------------------

    @property
    def spark(self):
        """The Spark session (started on first use for the embedded default)."""
        if self._spark is None:
            self._spark = build_session(self.config, self.config.warehouse)
            sync_warehouse_tables(self._spark, self.warehouse)
        return self._spark

    @property
    def warehouse(self) -> str:
        if not self.config.warehouse:
            self.config.warehouse = default_warehouse(self._spark).removeprefix("file:")
        return self.config.warehouse

    @cached_property
    def catalog(self) -> CatalogStore:
        return CatalogStore(f"{self.warehouse.rstrip('/')}/{CATALOG_DIR}",
                            write_attempts=self.config.catalog_write_attempts)

    def sync(self) -> None:
        """See tables that other applications created in the warehouse since this session started."""
        sync_warehouse_tables(self.spark, self.warehouse)

    def sql(self, statement: str):
        """Run Spark SQL against the warehouse (a convenience for sources and ad-hoc reads)."""
        self.sync()
        return self.spark.sql(statement)

    # -- lifecycle ----------------------------------------------------------------------------

    def create_stream_table(self, name: str, query: str, schedule: str | None = _UNSET,
                            refresh_mode: str | None = None, initialize: bool = True,
                            options: dict | None = None) -> StreamTable:
        """Validate, create the storage table, register it, and (``initialize``) populate it.

        Every check runs before anything is written; if a later step fails, everything it
        created is removed again, so a failed create leaves no table and no catalog row.
        """
        from airflow_trickle.storage import create_storage_table, drop_storage_table

        self.sync()
        schedule = self.config.default_schedule if schedule is _UNSET else schedule
        registered = {st.name: st.output_columns for st in self.catalog.list()}
        edges = [(d.source_name, d.st_name) for d in self.catalog.dependencies()]
        definition = analyze(self.spark, name=name, query=query, schedule=schedule,
                             refresh_mode=refresh_mode or self.config.default_refresh_mode,
                             stream_tables=registered, edges=edges)
        st = _stream_table_row(definition, options or {})
        if st.effective_mode == "DIFFERENTIAL":
            from airflow_trickle.dvm.apply import storage_layout

            columns = {s.name: [c for c, _ in s.columns] for s in definition.sources.values()}
            st.storage = {**st.storage, **storage_layout(self.spark, st.defining_query, columns, {})}
        st.storage["columns"] = definition.output_columns
        cdc_modes = self._prepare_change_feeds(definition)
        create_storage_table(self.spark, st.name, definition.output_columns, st.storage)
        try:
            st.location = table_location(self.spark, st.name)
            self.catalog.insert(st, [_dependency_row(definition, source, self._location(source), cdc_modes[source.name])
                                     for source in definition.sources.values()])
            if initialize:
                refresh_stream_table(self, st.name, initiated_by="INITIAL")
        except BaseException:
            self._forget(st.name)
            drop_storage_table(self.spark, st.name)
            raise
        return self.get(st.name)

    def _prepare_change_feeds(self, definition: Definition) -> dict[str, str]:
        """How each source's changes will be read; turns Change Data Feed on where allowed.

        With ``cdc_mode = auto`` (default) or ``cdf``, a base table without CDF gets
        ``delta.enableChangeDataFeed = true`` (its later changes are then read from the feed);
        with ``snapshot``, changes are the difference of two versions.  Stream tables always
        have CDF.
        """
        from airflow_trickle.names import quote_name
        from airflow_trickle.spark.delta import table_properties

        modes = {}
        for source in definition.sources.values():
            if source.kind == "STREAM_TABLE":
                modes[source.name] = "cdf"
                continue
            if self.config.cdc_mode == "snapshot" or definition.effective_mode == "FULL":
                modes[source.name] = "snapshot"
                continue
            if table_properties(self.spark, source.name).get("delta.enableChangeDataFeed", "false").lower() != "true":
                self.spark.sql(f"ALTER TABLE {quote_name(source.name)} SET TBLPROPERTIES (delta.enableChangeDataFeed = true)")
            modes[source.name] = "cdf"
        return modes

    def _location(self, source) -> str:
        if source.kind == "STREAM_TABLE":
            return self.get(source.name).location
        return table_location(self.spark, source.name)

    def drop_stream_table(self, name: str, *, if_exists: bool = False, cascade: bool = False) -> None:
        """Drop the stream table, its storage and catalog rows.

        Refuses while other stream tables read it, unless ``cascade`` (which drops them first).
        """
        from airflow_trickle.graph import build_graph, downstream_of, topological_order

        qualified = qualify_name(name)
        if self.catalog.get(qualified) is None:
            if if_exists:
                return
            raise StreamTableNotFoundError("no such stream table", stream_table=qualified)
        deps = self.catalog.dependencies()
        graph = build_graph([(d.source_name, d.st_name) for d in deps])
        dependents = sorted(downstream_of(graph, qualified))
        if dependents and not cascade:
            raise DefinitionError(f"other stream tables read it: {', '.join(dependents)}", stream_table=qualified,
                                  hint="drop them first or pass cascade=True")
        for victim in reversed(topological_order(graph, dependents)):
            self._drop_one(victim)
        self._drop_one(qualified)

    def _drop_one(self, name: str) -> None:
        from airflow_trickle.storage import drop_storage_table

        self._forget(name)
        drop_storage_table(self.spark, name)

    def _forget(self, name: str) -> None:
        try:
            self.catalog.delete(name)
        except Exception:  # noqa: BLE001 - nothing registered yet
            pass

    def refresh_stream_table(self, name: str, mode: str | None = None, *, initiated_by: str = "MANUAL") -> RefreshResult:
        """Refresh once.  ``mode``: None/AUTO (the engine chooses), FULL, DIFFERENTIAL or REINITIALIZE."""
        self.sync()
        return refresh_stream_table(self, qualify_name(name), mode=mode, initiated_by=initiated_by)

    def alter_stream_table(self, name: str, *, schedule: str | None = _UNSET, refresh_mode: str = _UNSET,
                           status: str = _UNSET, options: dict | None = None) -> StreamTable:
        """Change schedule, refresh mode, status (ACTIVE resumes and clears the error count) or options."""
        qualified = qualify_name(name)
        st = self.get(qualified)
        if schedule is not _UNSET:
            parse_schedule(schedule, stream_table=qualified)
        new_mode = effective = reason = None
        if refresh_mode is not _UNSET:
            new_mode = normalize_refresh_mode(refresh_mode, stream_table=qualified)
            blockers = st.storage.get("blockers", [])
            if new_mode == "DIFFERENTIAL" and blockers:
                raise UnsupportedConstructError(f"cannot be maintained in DIFFERENTIAL mode: {blockers[0]}",
                                                construct=blockers[0], stream_table=qualified)
            effective, reason = mode_choice(new_mode, blockers)
        if status is not _UNSET:
            status = str(status).upper()
            if status not in STATUSES:
                raise InvalidRefreshModeError(f"invalid status {status!r}", stream_table=qualified,
                                              hint=f"use one of {', '.join(STATUSES)}")

        def change(row: StreamTable) -> None:
            if schedule is not _UNSET:
                row.schedule = parse_schedule(schedule).text
            if new_mode is not None:
                row.refresh_mode, row.effective_mode, row.mode_reason = new_mode, effective, reason
            if status is not _UNSET:
                row.status = status
                if status == "ACTIVE":
                    row.consecutive_errors = 0
            if options:
                row.options = {**row.options, **options}

        return self.catalog.update(qualified, change)

    # -- inspection ---------------------------------------------------------------------------

    def get(self, name: str) -> StreamTable:
        qualified = qualify_name(name)
        st = self.catalog.get(qualified)
        if st is None:
            raise StreamTableNotFoundError("no such stream table", stream_table=qualified)
        return st

    def status(self, name: str | None = None) -> list[dict]:
        """One summary row per stream table (pg_trickle's ``pgt_status``)."""
        from airflow_trickle.catalog.model import utcnow

        tables = [self.get(name)] if name else self.catalog.list()
        now = utcnow()
        return [{
            "name": st.name,
            "status": st.status,
            "refresh_mode": st.refresh_mode,
            "effective_mode": st.effective_mode,
            "schedule": st.schedule,
            "is_populated": st.is_populated,
            "data_timestamp": st.data_timestamp,
            "staleness_s": round((now - st.data_timestamp).total_seconds(), 1) if st.data_timestamp else None,
            "consecutive_errors": st.consecutive_errors,
            "frontier": st.frontier,
            "mode_reason": st.mode_reason,
        } for st in tables]

    def history(self, name: str | None = None, limit: int = 20) -> list[RefreshRecord]:
        return self.catalog.history(qualify_name(name) if name else None, limit)

    def explain(self, name: str) -> dict:
        """The operator tree, the strategy per operator and the delta SQL of a stream table.

        For a FULL table: why it is FULL, and the recompute query.
        """
        from airflow_trickle.dvm.explain import explain

        self.sync()
        return explain(self, self.get(name))

    def read(self, name: str):
        """The stream table's rows without its hidden columns, as a DataFrame."""
        st = self.get(name)
        self.sync()
        from airflow_trickle.names import quote_name

        return self.spark.table(quote_name(st.name)).select(*[f"`{c}`" for c in st.output_columns])


def _stream_table_row(definition: Definition, options: dict) -> StreamTable:
    return StreamTable(
        name=definition.name,
        st_id=uuid.uuid4().hex,
        defining_query=definition.defining_query,
        original_query=definition.original_query,
        schedule=definition.schedule.text,
        refresh_mode=definition.refresh_mode,
        effective_mode=definition.effective_mode,
        mode_reason=definition.mode_reason,
        output_columns=[c for c, _ in definition.output_columns],
        storage={**definition.storage, "blockers": definition.blockers},
        options=options,
    )


def _dependency_row(definition: Definition, source, location: str, cdc_mode: str) -> Dependency:
    return Dependency(st_name=definition.name, source_name=source.name, source_type=source.kind,
                      source_location=location, columns_used=definition.columns_used.get(source.name),
                      cdc_mode=cdc_mode, schema_fingerprint=source.fingerprint)

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
from airflow_trickle.spark.session import (
    CATALOG_DIR,
    build_session,
    connect_session,
    default_warehouse,
    sync_warehouse_tables,
)

_UNSET = object()


class Trickle:
    """Stream tables of one warehouse.

    ``Trickle(warehouse=DIR)`` starts an embedded local Spark session with Delta (tables under
    DIR); ``Trickle(remote="sc://host:port")`` works through the Spark service (``trickle serve``)
    instead, with no JVM in this process; ``Trickle(spark=session)`` uses the caller's session,
    classic or Spark Connect (a cluster, a real metastore), with the catalog under ``warehouse``
    or else the session's ``spark.sql.warehouse.dir``.
    """

    def __init__(self, warehouse: str | None = None, *, spark=None, remote: str | None = None,
                 config: TrickleConfig | None = None, **settings):
        self.config = config or TrickleConfig.from_env(warehouse=warehouse, **settings)
        if warehouse is not None:
            self.config.warehouse = warehouse
        if spark is not None and remote is not None:
            raise TrickleError("pass spark=session or remote=address, not both")
        self._spark = spark
        self.remote = remote
        if self._spark is None and self.remote is None and not self.config.warehouse:
            raise TrickleError("no warehouse given: pass warehouse=DIR, set TRICKLE_WAREHOUSE, or pass spark=session")
        if self.config.warehouse and "://" not in self.config.warehouse:
            self.config.warehouse = os.path.abspath(self.config.warehouse)

    # -- sessions and catalog -----------------------------------------------------------------

    @property
    def spark(self):
        """The Spark session (started on first use for the embedded default)."""
        if self._spark is None:
            if self.remote is not None:
                self._spark = connect_session(self.remote, self.config, warehouse=self.config.warehouse)
            else:
                self._spark = build_session(self.config, self.config.warehouse)
            sync_warehouse_tables(self._spark, self.warehouse)
        return self._spark

    def close(self) -> None:
        """Stop this object's Spark session (over Connect: release it; the service keeps running)."""
        if self._spark is not None:
            self._spark.stop()
            self._spark = None

    @property
    def warehouse(self) -> str:
        if not self.config.warehouse:
            spark = self._spark if self._spark is not None else self.spark
            self.config.warehouse = default_warehouse(spark).removeprefix("file:")
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
        st.storage["dup_type"] = "bigint"  # copy numbers per refresh: appends never read the table
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
        """Refresh once.  ``mode``: None/AUTO (the engine chooses), FULL, DIFFERENTIAL or REINITIALIZE.

        A stream table on a (monotone) cycle is refreshed with the whole cycle to its fixpoint;
        the result is its own last refresh, with the number of passes in ``reason``.
        """
        from airflow_trickle.graph import cycle_members

        self.sync()
        qualified = qualify_name(name)
        members = cycle_members(self._graph(), qualified)
        if not members:
            return refresh_stream_table(self, qualified, mode=mode, initiated_by=initiated_by)
        from airflow_trickle.refresh.cycle import refresh_to_fixpoint

        fixpoint = refresh_to_fixpoint(self, members, mode=mode, initiated_by=initiated_by)
        results = fixpoint.results[qualified]
        last = results[-1]
        last.rows_inserted = sum(r.rows_inserted for r in results)
        last.rows_deleted = sum(r.rows_deleted for r in results)
        last.action = next((r.action for r in results if r.action != "NO_DATA"), last.action)
        last.reason = (f"cycle {' -> '.join(members + members[:1])} reached its fixpoint in {fixpoint.passes} "
                       f"pass{'es' if fixpoint.passes > 1 else ''}")
        return last

    def _graph(self):
        from airflow_trickle.graph import build_graph

        return build_graph([(d.source_name, d.st_name) for d in self.catalog.dependencies()],
                           stream_tables=[st.name for st in self.catalog.list()])

    def refresh_group(self, members: str | list[str], *, group: list[str] | None = None,
                      convergence_points: list[str] | None = None, mode: str | None = None,
                      initiated_by: str = "MANUAL"):
        """Refresh an atomic diamond group all-or-nothing (see :mod:`airflow_trickle.refresh.group`).

        ``members``: the members in refresh order, or the name of one member, meaning its whole
        atomic group as :meth:`diamond_groups` lists it.
        """
        from airflow_trickle.refresh.group import refresh_group

        self.sync()
        if isinstance(members, str):
            member = qualify_name(members)
            found = [g for g in self.diamond_groups() if member in g["members"] and g["consistency"] == "atomic"]
            if not found:
                raise TrickleError("is not a member of an atomic diamond group", stream_table=member,
                                   hint="set options={'diamond_consistency': 'atomic'} on the convergence point")
            members, convergence_points = found[0]["members"], found[0]["convergence_points"]
        members = [qualify_name(m) for m in members]
        return refresh_group(self, members, group=group, convergence_points=convergence_points, mode=mode,
                             initiated_by=initiated_by)

    def diamond_groups(self) -> list[dict]:
        """Diamond groups of the registered stream tables: members, convergence points, epochs.

        A group is ``atomic`` when one of its convergence points has ``diamond_consistency =
        'atomic'`` (its members then refresh all-or-nothing); otherwise ``none``.
        """
        from airflow_trickle.graph import build_graph, consistency_groups
        from airflow_trickle.refresh.group import group_name

        tables = {st.name: st for st in self.catalog.list()}
        graph = build_graph([(d.source_name, d.st_name) for d in self.catalog.dependencies()], stream_tables=tables)
        atomic = {n for n, st in tables.items() if st.options.get("diamond_consistency") == "atomic"}
        epochs = {g.name: g for g in self.catalog.groups()}
        found = [(g, "atomic") for g in consistency_groups(graph, atomic=atomic) if g.convergence_points]
        grouped = {m for g, _ in found for m in g.members}
        found += [(g, "none") for g in consistency_groups(graph)
                  if g.convergence_points and not grouped & set(g.members)]
        result = []
        for group, consistency in found:
            name = group_name(group.members)
            state = epochs.get(name)
            policies = {tables[p].options.get("diamond_schedule_policy", "fastest") for p in group.convergence_points}
            result.append({"name": name, "members": group.members, "convergence_points": group.convergence_points,
                           "consistency": consistency, "schedule_policy": "slowest" if "slowest" in policies
                           else "fastest", "epoch": state.epoch if state else 0,
                           "last_status": state.last_status if state else None,
                           "last_error": state.last_error if state else None})
        return result

    def alter_stream_table(self, name: str, *, query: str = _UNSET, schedule: str | None = _UNSET,
                           refresh_mode: str = _UNSET, status: str = _UNSET, options: dict | None = None) -> StreamTable:
        """Change the defining query, schedule, refresh mode, status (ACTIVE resumes and clears the
        error count) or options.

        A new ``query`` is validated like a create (nothing changes if it is refused), then the
        storage is rebuilt and repopulated; its output columns may change only while no other
        stream table reads it.  With ``allow_circular``, a query may close a cycle of monotone
        queries, which then refreshes to a fixpoint.
        """
        qualified = qualify_name(name)
        st = self.get(qualified)
        if query is not _UNSET:
            st = self._replace_query(st, query, None if refresh_mode is _UNSET else refresh_mode)
            refresh_mode = _UNSET
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

    def _replace_query(self, st: StreamTable, query: str, refresh_mode: str | None) -> StreamTable:
        from airflow_trickle.storage import create_storage_table

        self.sync()
        tables = self.catalog.list()
        dependencies = self.catalog.dependencies()
        definition = analyze(
            self.spark, name=st.name, query=query, schedule=st.schedule, refresh_mode=refresh_mode or st.refresh_mode,
            stream_tables={t.name: t.output_columns for t in tables},
            edges=[(d.source_name, d.st_name) for d in dependencies if d.st_name != st.name],
            replacing=st.name, allow_circular=self.config.allow_circular,
            queries={t.name: t.defining_query for t in tables})
        readers = sorted({d.st_name for d in dependencies if d.source_name == st.name})
        stored = [(f.name, f.dataType.simpleString()) for f in self.read(st.name).schema.fields]
        if readers and stored != definition.output_columns:
            raise DefinitionError(
                f"the new query changes the output columns ({stored} -> {definition.output_columns}) "
                f"while {', '.join(readers)} read{'s' if len(readers) == 1 else ''} it", stream_table=st.name,
                hint="keep the columns, or drop the readers first")
        new = _stream_table_row(definition, st.options)
        new.st_id, new.refresh_seq, new.created_at = st.st_id, st.refresh_seq, st.created_at
        if new.effective_mode == "DIFFERENTIAL":
            from airflow_trickle.dvm.apply import storage_layout

            columns = {s.name: [c for c, _ in s.columns] for s in definition.sources.values()}
            new.storage = {**new.storage, **storage_layout(self.spark, new.defining_query, columns, {})}
        new.storage["columns"] = definition.output_columns
        new.storage["dup_type"] = "bigint"
        cdc_modes = self._prepare_change_feeds(definition)
        create_storage_table(self.spark, st.name, definition.output_columns, new.storage, replace=True)
        new.location = table_location(self.spark, st.name)
        self.catalog.replace(new, [_dependency_row(definition, source, self._location(source), cdc_modes[source.name])
                                   for source in definition.sources.values()])
        self.refresh_stream_table(st.name, initiated_by="ALTER")
        return self.get(st.name)

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

"""The Python API: ``Trickle`` mirrors pg_trickle's SQL API on Spark + Delta.

>>> tr = Trickle(warehouse="/tmp/wh")
>>> tr.spark.sql("CREATE TABLE shop.orders (id INT, amount INT) USING delta")
>>> tr.create_stream_table("shop.big_orders", "SELECT * FROM shop.orders WHERE amount > 100")
>>> tr.refresh_stream_table("shop.big_orders").action
'NO_DATA'
"""
from __future__ import annotations

import os
from functools import cached_property

from airflow_trickle.definition import lifecycle
from airflow_trickle.catalog import CatalogStore, RefreshRecord, StreamTable
from airflow_trickle.config import TrickleConfig
from airflow_trickle.errors import StreamTableNotFoundError, TrickleError
from airflow_trickle.names import qualify_name
from airflow_trickle.refresh import RefreshResult, refresh_stream_table
from airflow_trickle.spark.session import (
    CATALOG_DIR,
    build_session,
    connect_session,
    default_warehouse,
    sync_warehouse_tables,
)

_UNSET = lifecycle.UNSET


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
        if config is not None and settings:
            raise TrickleError(f"pass settings in config= or as keywords, not both ({', '.join(sorted(settings))} "
                               "given beside config=)")
        unknown = sorted(set(settings) - set(TrickleConfig.__dataclass_fields__) - {"warehouse"})
        if unknown:
            raise TrickleError(f"unknown setting{'s' * (len(unknown) > 1)} {', '.join(map(repr, unknown))}",
                               hint="the settings are TrickleConfig's fields (docs/configuration.md)")
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
            sync_warehouse_tables(self._spark, self.location)
        return self._spark

    @property
    def engine(self):
        """The Spark session behind the seam the refresh path uses (``spark/engine.py``)."""
        from airflow_trickle.spark.engine import SparkEngine

        spark = self.spark
        if getattr(self, "_engine", None) is None or self._engine.spark is not spark:
            self._engine = SparkEngine(spark)
        return self._engine

    def close(self) -> None:
        """Stop this object's Spark session (over Connect: release it; the service keeps running)."""
        if self._spark is not None:
            self._spark.stop()
            self._spark = None

    def __enter__(self) -> "Trickle":
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    @property
    def warehouse(self) -> str:
        if not self.config.warehouse:
            spark = self._spark if self._spark is not None else self.spark
            self.config.warehouse = default_warehouse(spark).removeprefix("file:")
        return self.config.warehouse

    @property
    def location(self):
        """The warehouse with its storage options (:class:`~airflow_trickle.location.Location`)."""
        self.warehouse  # noqa: B018 - the session's warehouse when none was configured
        return self.config.location

    @cached_property
    def catalog(self) -> CatalogStore:
        return CatalogStore(self.location.child(CATALOG_DIR), write_attempts=self.config.catalog_write_attempts)

    def sync(self) -> None:
        """See tables that other applications created in the warehouse since this session started."""
        sync_warehouse_tables(self.spark, self.location)

    def sql(self, statement: str):
        """Run Spark SQL against the warehouse (a convenience for sources and ad-hoc reads)."""
        self.sync()
        return self.spark.sql(statement)

    # -- lifecycle ----------------------------------------------------------------------------

    def create_stream_table(self, name: str, query: str, schedule: str | None = _UNSET,
                            refresh_mode: str | None = None, initialize: bool = True,
                            options: dict | None = None, owner: tuple[str, str | None] | None = None) -> StreamTable:
        """Validate, create the storage table, register it, and (``initialize``) populate it.

        Every check runs before anything is written; if a later step fails, everything it
        created is removed again, so a failed create leaves no table and no catalog row.
        ``owner``: ``(project, project file)`` that declares it (``trickle apply`` sets it).
        """
        return lifecycle.create(self, name, query, schedule=self.config.default_schedule if schedule is _UNSET
                                else schedule, refresh_mode=refresh_mode, initialize=initialize,
                                options=options or {}, owner=owner)

    def drop_stream_table(self, name: str, *, if_exists: bool = False, cascade: bool = False) -> None:
        """Drop the stream table, its storage and catalog rows.

        Refuses while other stream tables read it, unless ``cascade`` (which drops them first).
        """
        lifecycle.drop(self, name, if_exists=if_exists, cascade=cascade)

    def refresh_stream_table(self, name: str, mode: str | None = None, *, initiated_by: str = "MANUAL") -> RefreshResult:
        """Refresh once.  ``mode``: None/AUTO (the engine chooses), FULL, DIFFERENTIAL or REINITIALIZE.

        A stream table on a (monotone) cycle is refreshed with the whole cycle to its fixpoint;
        the result is its own last refresh, with the number of passes in ``reason``.
        """
        from airflow_trickle.graph import cycle_members
        from airflow_trickle.model import RunMode
        from airflow_trickle.storage.deltalog import reused_handles

        qualified = qualify_name(name)
        mode = RunMode.parse(mode or RunMode.AUTO, what="refresh mode", stream_table=qualified).requested
        self.sync()
        with reused_handles():  # the graph's catalog reads serve the refresh's too
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
        atomic = {n for n, st in tables.items() if st.options.is_atomic}
        epochs = {g.name: g for g in self.catalog.groups()}
        found = [(g, "atomic") for g in consistency_groups(graph, atomic=atomic) if g.convergence_points]
        grouped = {m for g, _ in found for m in g.members}
        found += [(g, "none") for g in consistency_groups(graph)
                  if g.convergence_points and not grouped & set(g.members)]
        result = []
        for group, consistency in found:
            name = group_name(group.members)
            state = epochs.get(name)
            policies = {tables[p].options.schedule_policy for p in group.convergence_points}
            result.append({"name": name, "members": group.members, "convergence_points": group.convergence_points,
                           "consistency": consistency, "schedule_policy": "slowest" if "slowest" in policies
                           else "fastest", "epoch": state.epoch if state else 0,
                           "last_status": state.last_status if state else None,
                           "last_error": state.last_error if state else None})
        return result

    def alter_stream_table(self, name: str, *, query: str = _UNSET, schedule: str | None = _UNSET,
                           refresh_mode: str = _UNSET, status: str = _UNSET, options: dict | None = None,
                           replace_options: bool = False, reinitialize_readers: bool = False,
                           owner=_UNSET) -> StreamTable:
        """Change the defining query, schedule, refresh mode, status (ACTIVE resumes and clears the
        error count), options or owner.

        A new ``query`` is validated like a create (nothing changes if it is refused), then the
        storage is rebuilt and repopulated in one commit; its output columns may change only while
        no other stream table reads it, or, with ``reinitialize_readers``, where no reader uses a
        removed column (the readers whose output changes reinitialize at their next refresh).
        ``replace_options``: ``options`` are the table's options whole, not changes to them.
        With ``allow_circular``, a query may close a cycle of monotone queries, which then
        refreshes to a fixpoint.
        """
        return lifecycle.alter(self, name, query=query, schedule=schedule, refresh_mode=refresh_mode, status=status,
                               options=options, replace_options=replace_options,
                               reinitialize_readers=reinitialize_readers, owner=owner)

    # -- the catalog against the data ---------------------------------------------------------

    def check(self) -> list:
        """Every disagreement between the catalog, the storage tables and the sources (frontiers,
        columns, definitions, change feeds), as :class:`~airflow_trickle.ops.repair.Finding` s; empty
        when all agree.  Changes nothing; on a local warehouse it starts no Spark."""
        from airflow_trickle.ops.repair import check

        return check(self)

    def repair(self, *, from_storage: bool = False) -> list[dict]:
        """Rebuild what the catalog lost from the storage tables (rows, dependencies, frontiers),
        and write the catalog's definition where a storage table lacks it; ``from_storage``: where
        the two disagree, the storage table's definition wins.  Returns what was done."""
        from airflow_trickle.ops.repair import repair

        return repair(self, from_storage=from_storage)

    def health(self, *, record_alerts: bool = True) -> list:
        """Change-feed health per source and reader (:class:`~airflow_trickle.ops.health.SourceHealth`):
        the change feed on or off, the oldest version in the log, the retentions, and for each
        reader the time left before a VACUUM may delete a change it has not read.  Readers AT_RISK
        or BROKEN get an ALERT row in the history (``record_alerts``).  No Spark."""
        from airflow_trickle.ops.health import health

        return health(self, record_alerts=record_alerts)

    def arrangements(self) -> list[dict]:
        """The join arrangements kept in ``arrangement_dir`` (``docs/how-it-works.md``) -- by every
        process and warehouse that shares the folder, within its one ``arrangement_max_bytes`` --
        most recently used first, and nothing when they are turned off."""
        from airflow_trickle.refresh.lookup import arrangements_of

        kept = arrangements_of(self.config)
        return kept.kept() if kept is not None else []

    def maintain(self, names: list[str] | None = None, *, retention_hours: float | None = None) -> list:
        """Compact (OPTIMIZE) and VACUUM the storage of ``names`` (default: all stream tables) with
        a retention that keeps what every reader still needs, and compact the catalog; one
        :class:`~airflow_trickle.ops.maintain.Maintained` per table."""
        from airflow_trickle.ops.maintain import maintain

        self.sync()
        return maintain(self, [qualify_name(n) for n in names] if names else None, retention_hours=retention_hours)

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

        from airflow_trickle.ops.overview import commit_watchers, freshness_targets

        tables = [self.get(name)] if name else self.catalog.list()
        now = utcnow()
        targets = freshness_targets(self.catalog)  # the Airflow UI's Stream tables page uses the same
        watchers = commit_watchers(self.catalog, tables, now)
        return [{
            "name": st.name,
            "status": st.status,
            "refresh_mode": st.refresh_mode,
            "effective_mode": st.effective_mode,
            "schedule": st.schedule,
            "is_populated": st.is_populated,
            "data_timestamp": st.data_timestamp,
            "staleness_s": round((now - st.data_timestamp).total_seconds(), 1) if st.data_timestamp else None,
            "freshness_target_s": targets[st.name].total_seconds() if targets.get(st.name) else None,
            "consecutive_errors": st.consecutive_errors,
            "frontier": st.frontier,
            "mode_reason": st.mode_reason,
            **({"watcher": watchers[st.name]["message"]} if st.name in watchers else {}),
        } for st in tables]

    def history(self, name: str | None = None, limit: int = 20) -> list[RefreshRecord]:
        return self.catalog.history(qualify_name(name) if name else None, limit)

    def explain(self, name: str) -> dict:
        """The operator tree, the strategy per operator and the delta SQL of a stream table.

        For a FULL table: why it is FULL, and the recompute query.
        """
        from airflow_trickle.ops.explain import explain

        self.sync()
        return explain(self, self.get(name))

    def read(self, name: str):
        """The stream table's rows without its hidden columns, as a DataFrame."""
        st = self.get(name)
        self.sync()
        from airflow_trickle.names import quote_name

        return self.spark.table(quote_name(st.name)).select(*[f"`{c}`" for c in st.output_columns])


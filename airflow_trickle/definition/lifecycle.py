"""Create, alter and drop stream tables: validation first, then storage, then the catalog.

Every check runs before anything is written (``definition/analysis.py``).  Creating and replacing a
defining query share one step, :func:`install`: the storage layout is chosen, change feeds are
prepared, the storage table is created (or replaced, keeping its history) and the catalog rows
are written; the storage table carries the definition too (``storage/definitions.py``).  ``env`` is the
:class:`~airflow_trickle.api.Trickle` facade (``spark``, ``catalog``, ``config``, ``sync``,
``get``, ``refresh_stream_table``).
"""
from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass

from airflow_trickle.catalog import Dependency, StreamTable
from airflow_trickle.catalog.model import utcnow
from airflow_trickle.options import TableOptions
from airflow_trickle.storage.tables import clustering_columns
from airflow_trickle.definition.analysis import Definition, analyze, check_static, mode_choice
from airflow_trickle.errors import DefinitionError, StreamTableNotFoundError, UnsupportedConstructError
from airflow_trickle.model import CdcMode, RefreshMode, SourceType, Status, StorageLayout
from airflow_trickle.names import qualify_name, quote_name
from airflow_trickle.refresh import refresh_stream_table
from airflow_trickle.storage.definitions import definition_properties, record_definition
from airflow_trickle.storage.lease import lease_of
from airflow_trickle.schedule import parse_schedule
from airflow_trickle.spark.delta import table_location, table_properties

log = logging.getLogger(__name__)

#: "Not given" for alter's keyword arguments (None is a meaningful schedule).
UNSET = object()


def create(env, name: str, query: str, *, schedule, refresh_mode, initialize: bool, options: dict,
           owner: tuple[str, str | None] | None = None) -> StreamTable:
    """Validate, create the storage table, register it, and (``initialize``) populate it.
    ``owner``: the project (and its file) that declares it, registered in the same row.

    If a step after the storage table's creation fails, everything created is removed again, so
    a failed create leaves no table and no catalog row.
    """
    from airflow_trickle.storage.tables import drop_storage_table

    # What needs no Spark is refused before Spark starts (a bad schedule should not cost a JVM).
    check_static(name, query, schedule, refresh_mode or env.config.default_refresh_mode)
    options = TableOptions.parse(options, stream_table=qualify_name(name))
    env.sync()
    definition = analyze(env.spark, name=name, query=query, schedule=schedule,
                         refresh_mode=refresh_mode or env.config.default_refresh_mode,
                         stream_tables={st.name: st.output_columns for st in env.catalog.list()},
                         edges=[(d.source_name, d.st_name) for d in env.catalog.dependencies()])
    st = stream_table_row(definition, options)
    st.owner, st.owner_file = owner or (None, None)
    clustering_columns(options.clustering, definition.output_columns, stream_table=st.name)  # refused before a write
    with lease_of(env, [st.name]):
        try:
            install(env, st, definition, replace=False)
            if initialize:
                refresh_stream_table(env, st.name, initiated_by="INITIAL")
        except BaseException:
            forget(env, st.name)
            drop_storage_table(env.spark, st.name, env.catalog)
            raise
    log.info("created stream table %s (%s, runs %s)", st.name, st.refresh_mode, st.effective_mode)
    return env.get(st.name)


def install(env, st: StreamTable, definition: Definition, *, replace: bool) -> None:
    """Choose the storage layout, prepare the sources' change feeds and write the catalog rows:
    the step create and ALTER ... query share.

    A create makes the (empty) storage table.  ALTER (``replace``) leaves the stored rows as they
    are and marks the row ``needs_reinit``: the refresh that follows replaces them with the new
    query's in one Delta commit (a diff when the columns stay, an atomic replace when they
    change), so readers see the old rows, then the new -- never an empty table; an ALTER
    interrupted before that refresh is finished by the next one.
    """
    from airflow_trickle.storage.tables import create_storage_table

    if st.effective_mode == RefreshMode.DIFFERENTIAL:
        from airflow_trickle.dvm.apply import storage_layout

        def types_of(probe_sql: str) -> dict[str, str]:  # Spark analyses the probe; it runs nothing
            return {f.name: f.dataType.simpleString() for f in env.spark.sql(probe_sql).schema.fields}

        columns = {s.name: [c for c, _ in s.columns] for s in definition.sources.values()}
        st.storage = storage_layout(st.defining_query, columns, types_of)
    st.storage.columns = list(definition.output_columns)
    st.storage.blockers = list(definition.blockers)
    st.storage.dup_type = "bigint"  # copy numbers per refresh: appends never read the table
    cdc_modes = prepare_change_feeds(env, definition)
    dependencies = [_dependency_row(definition, source, _location(env, source), cdc_modes[source.name])
                    for source in definition.sources.values()]
    st.created_at = st.created_at or utcnow()
    if replace:
        st.needs_reinit = True
    else:  # the definition travels with the data from the start (``storage/definitions.py``)
        create_storage_table(env.spark, st.name, definition.output_columns, st.storage,
                             properties=definition_properties(st, dependencies),
                             cluster_by=clustering_columns(st.options.clustering, definition.output_columns,
                                                           stream_table=st.name))
    st.location = table_location(env.spark, st.name)
    if replace:
        env.catalog.replace(st, dependencies)
    else:
        env.catalog.insert(st, dependencies)


def prepare_change_feeds(env, definition: Definition) -> dict[str, CdcMode]:
    """How each source's changes will be read; turns Change Data Feed on where allowed.

    With ``cdc_mode = auto`` (default) or ``cdf``, a base table without CDF gets
    ``delta.enableChangeDataFeed = true`` (its later changes are then read from the feed);
    with ``snapshot``, changes are the difference of two versions.  Stream tables always
    have CDF.
    """
    modes = {}
    for source in definition.sources.values():
        if source.kind == SourceType.STREAM_TABLE:
            modes[source.name] = CdcMode.CDF
            continue
        if env.config.cdc_mode == CdcMode.SNAPSHOT or definition.effective_mode == RefreshMode.FULL:
            modes[source.name] = CdcMode.SNAPSHOT
            continue
        if table_properties(env.spark, source.name).get("delta.enableChangeDataFeed", "false").lower() != "true":
            log.info("turning on the change data feed of %s", source.name)
            env.spark.sql(f"ALTER TABLE {quote_name(source.name)} SET TBLPROPERTIES (delta.enableChangeDataFeed = true)")
        modes[source.name] = CdcMode.CDF
    return modes


def _location(env, source) -> str:
    if source.kind == SourceType.STREAM_TABLE:
        return env.get(source.name).location
    return table_location(env.spark, source.name)


def drop(env, name: str, *, if_exists: bool, cascade: bool) -> None:
    """Drop the stream table, its storage and catalog rows.

    Refuses while other stream tables read it, unless ``cascade`` (which drops them first).
    """
    from airflow_trickle.graph import build_graph, downstream_of, topological_order

    qualified = qualify_name(name)
    if env.catalog.get(qualified) is None:
        if if_exists:
            return
        raise StreamTableNotFoundError("no such stream table", stream_table=qualified)
    graph = build_graph([(d.source_name, d.st_name) for d in env.catalog.dependencies()])
    dependents = sorted(downstream_of(graph, qualified))
    if dependents and not cascade:
        raise DefinitionError(f"other stream tables read it: {', '.join(dependents)}", stream_table=qualified,
                              hint="drop them first or pass cascade=True")
    for victim in [*reversed(topological_order(graph, dependents)), qualified]:
        _drop_one(env, victim)


def _drop_one(env, name: str) -> None:
    from airflow_trickle.storage.tables import drop_storage_table

    with lease_of(env, [name]):
        forget(env, name)
        drop_storage_table(env.spark, name, env.catalog)
    log.info("dropped stream table %s", name)


def forget(env, name: str) -> None:
    """Remove ``name``'s catalog rows, if any."""
    try:
        env.catalog.delete(name)
    except Exception:  # noqa: BLE001 - safe: a create that failed before registering has no rows
        log.debug("no catalog rows to remove for %s", name, exc_info=True)


def alter(env, name: str, *, query=UNSET, schedule=UNSET, refresh_mode=UNSET, status=UNSET,
          options: dict | None = None, replace_options: bool = False, reinitialize_readers: bool = False,
          owner=UNSET) -> StreamTable:
    """Change the defining query, schedule, refresh mode, status (ACTIVE resumes and clears the
    error count), options or owner.  Every value is checked before anything changes.

    ``replace_options``: ``options`` are the table's options whole (unset what they leave out),
    not changes to them.  ``reinitialize_readers``: a new query may change the output columns
    while other stream tables read it; a reader whose output that changes reinitializes at its
    next refresh (one that uses a removed column is still refused).  ``owner``: ``(project,
    file)`` or None (``project/apply.py``)."""
    qualified = qualify_name(name)
    st = env.get(qualified)
    # Every value that needs no Spark is checked before the query (the one step that writes
    # data) is replaced: a bad schedule must not leave a half-applied ALTER behind.
    if schedule is not UNSET:
        schedule = parse_schedule(schedule, stream_table=qualified).text
    new_mode = (None if refresh_mode is UNSET
                else RefreshMode.parse(refresh_mode, what="refresh mode", stream_table=qualified))
    if status is not UNSET:
        status = Status.parse(status, what="status", stream_table=qualified)
    options = TableOptions.parse(options, stream_table=qualified)
    if options.cluster_by is not None and query is UNSET:  # a new query's columns are checked with it
        clustering_columns(options.cluster_by, _typed_columns(env, st), stream_table=qualified)
    with lease_of(env, [qualified]):
        return _alter(env, st, qualified, query, schedule, new_mode, status, options,
                      _AlterHow(replace_options, reinitialize_readers, owner))


@dataclass(frozen=True)
class _AlterHow:
    """How an ALTER treats options, readers and the owner (see :func:`alter`)."""

    replace_options: bool
    reinitialize_readers: bool
    owner: object


def _alter(env, st: StreamTable, qualified: str, query, schedule, new_mode, status, options,
           how: _AlterHow) -> StreamTable:
    clustered_by = st.options.clustering
    if query is not UNSET:
        st = replace_query(env, st, query, new_mode, options, replace_options=how.replace_options,
                           reinitialize_readers=how.reinitialize_readers)
        new_mode = None  # the new query's row already carries the mode
    if options.cluster_by is not None and options.cluster_by != clustered_by:
        from airflow_trickle.storage.tables import alter_clustering_sql

        # the storage first: a clustering Delta refuses leaves the catalog row as it was
        env.spark.sql(alter_clustering_sql(qualified, clustering_columns(options.cluster_by, _typed_columns(env, st),
                                                                         stream_table=qualified)))
    effective = reason = None
    if new_mode is not None:
        blockers = st.storage.blockers
        if new_mode == RefreshMode.DIFFERENTIAL and blockers:
            raise UnsupportedConstructError(f"cannot be maintained in DIFFERENTIAL mode: {blockers[0]}",
                                            construct=blockers[0], stream_table=qualified)
        effective, reason = mode_choice(new_mode, blockers)

    def change(row: StreamTable) -> None:
        if schedule is not UNSET:
            row.schedule = schedule
        if new_mode is not None:
            row.refresh_mode, row.effective_mode, row.mode_reason = new_mode, effective, reason
        if status is not UNSET:
            row.status = status
            if status == Status.ACTIVE:
                row.consecutive_errors = 0
        if options or how.replace_options:
            row.options = options if how.replace_options else row.options.merged(options)
        if how.owner is not UNSET:
            row.owner, row.owner_file = how.owner or (None, None)

    altered = env.catalog.update(qualified, change)
    if schedule is not UNSET or new_mode is not None or options or how.replace_options:
        record_definition(env, qualified)
    return altered


def _typed_columns(env, st: StreamTable) -> list[tuple[str, str]]:
    """The visible columns and their Spark types: as the catalog row records them, or (a row
    written before it did) as the storage table has them."""
    if st.storage.columns:
        return [tuple(c) for c in st.storage.columns]
    return [(f.name, f.dataType.simpleString()) for f in env.read(st.name).schema.fields]


def replacement(env, st: StreamTable, query: str, refresh_mode: str | None = None) -> Definition:
    """The definition ``query`` would give ``st``, validated like a create; nothing is written."""
    env.sync()
    tables = env.catalog.list()
    return analyze(
        env.spark, name=st.name, query=query, schedule=st.schedule, refresh_mode=refresh_mode or st.refresh_mode,
        stream_tables={t.name: t.output_columns for t in tables},
        edges=[(d.source_name, d.st_name) for d in env.catalog.dependencies() if d.st_name != st.name],
        replacing=st.name, allow_circular=env.config.allow_circular,
        queries={t.name: t.defining_query for t in tables})


def stored_output_columns(env, st: StreamTable) -> list[tuple[str, str]]:
    """The visible columns of ``st``'s storage table and their Spark types."""
    return [(f.name, f.dataType.simpleString()) for f in env.read(st.name).schema.fields]


def replace_query(env, st: StreamTable, query: str, refresh_mode: str | None,
                  options: TableOptions | None = None, *, replace_options: bool = False,
                  reinitialize_readers: bool = False) -> StreamTable:
    """Validate ``query`` like a create (nothing changes if it is refused), then replace the
    stored rows with the new query's in one commit (see :func:`install`).  The output columns
    may change only while nothing reads it, or (``reinitialize_readers``) where no reader uses a
    column the change removes.  ``options``: those the same ALTER sets (the new clustering is
    checked against the new query's columns and made by the replace)."""
    definition = replacement(env, st, query, refresh_mode)
    dependencies = env.catalog.dependencies()
    readers = sorted({d.st_name for d in dependencies if d.source_name == st.name})
    stored = stored_output_columns(env, st)
    if readers and stored != definition.output_columns:
        kept = {c for c, _ in definition.output_columns}
        broken = sorted({d.st_name for d in dependencies if d.source_name == st.name
                         and any(c not in kept for c in d.columns_used or [])})
        if not reinitialize_readers or broken:
            raise DefinitionError(
                f"the new query changes the output columns ({stored} -> {definition.output_columns}) "
                f"while {', '.join(broken or readers)} read{'s' if len(broken or readers) == 1 else ''} it",
                stream_table=st.name, hint="keep the columns, or drop the readers first")
    new_options = (options if replace_options else st.options.merged(options)) if options is not None else st.options
    clustering_columns(new_options.clustering, definition.output_columns, stream_table=st.name)
    new = stream_table_row(definition, new_options)
    new.st_id, new.refresh_seq, new.created_at = st.st_id, st.refresh_seq, st.created_at
    new.owner, new.owner_file = st.owner, st.owner_file
    # what is stored is still the old query's rows at the old frontier, until the refresh below
    new.is_populated, new.frontier, new.data_timestamp = st.is_populated, dict(st.frontier), st.data_timestamp
    new.output_columns = list(st.output_columns)
    install(env, new, definition, replace=True)
    env.refresh_stream_table(st.name, initiated_by="ALTER")
    record_definition(env, st.name)
    return env.get(st.name)


def stream_table_row(definition: Definition, options: TableOptions) -> StreamTable:
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
        storage=StorageLayout(strategy=None, blockers=list(definition.blockers)),
        options=options or TableOptions(),
    )


def _dependency_row(definition: Definition, source, location: str, cdc_mode: CdcMode) -> Dependency:
    return Dependency(st_name=definition.name, source_name=source.name, source_type=source.kind,
                      source_location=location, columns_used=definition.columns_used.get(source.name),
                      cdc_mode=cdc_mode, schema_fingerprint=source.fingerprint)

"""What a source's schema change means for a stream table, and whether its storage must change.

A changed schema that leaves the query's output as it was (an unused column added, say) is
remembered and ignored; one that changes the output's columns or types needs REINITIALIZE
(``decide.after_schema_check``); one that removes a column the query uses cannot be refreshed
at all.  Spark analyses the query here; it runs no job.
"""
from __future__ import annotations

import logging

from airflow_trickle.catalog import StreamTable
from airflow_trickle.errors import RefreshError
from airflow_trickle.names import quote_name
from airflow_trickle.refresh.full import pinned_query_sql
from airflow_trickle.spark.delta import schema_fingerprint, visible_columns
from airflow_trickle.storage.errors import UNREADABLE

log = logging.getLogger(__name__)

#: ``(source, location) -> (its Delta schema as the log states it, its visible columns as Spark
#: analysed them then)``: what :func:`source_visible_columns` remembers in this process.
_ANALYSED: dict[tuple[str, str], tuple[str, list[tuple[str, str]]]] = {}


def source_visible_columns(env, dep) -> list[tuple[str, str]]:
    """The visible columns of the source ``dep`` reads and their Spark types, as it is now.

    Spark's analysis of a table costs ~10 ms a source (a plan through py4j or Spark Connect)
    and every refresh asks for it; the Delta schema in the source's log, read with the handle
    the refresh opened for its versions (``storage.deltalog.reused_handles``), costs nothing and
    changes whenever Spark's answer can.  So Spark is asked again only when the log's schema
    differs from the one last analysed; a source delta-rs cannot open is always asked."""
    from airflow_trickle.storage.deltalog import open_table

    if not dep.source_location:  # no location: Spark alone says
        return visible_columns(env.spark, dep.source_name)
    try:
        logged = open_table(env.catalog.at(dep.source_location)).schema().to_json()
    except UNREADABLE:  # not a table delta-rs reads: Spark alone says
        return visible_columns(env.spark, dep.source_name)
    key = (dep.source_name, dep.source_location)
    seen = _ANALYSED.get(key)
    if seen is not None and seen[0] == logged:
        return list(seen[1])
    columns = visible_columns(env.spark, dep.source_name)
    _ANALYSED[key] = (logged, columns)
    return list(columns)


def source_schema_change(env, st: StreamTable) -> str | None:
    """Why ``st`` must be reinitialized because a source's schema changed, or None.

    A changed schema that leaves the query's output as it was (an unused column added, say) is
    remembered and ignored; one that changes the output's columns or types needs REINITIALIZE;
    one that removes a column the query uses cannot be refreshed at all.
    """
    changed = []
    for dep in env.catalog.dependencies(st.name):
        columns = source_visible_columns(env, dep)
        fingerprint = schema_fingerprint(columns)
        if dep.schema_fingerprint in (None, fingerprint):
            continue
        names = {c for c, _ in columns}
        missing = [c for c in (dep.columns_used or []) if c not in names]
        if missing:
            env.catalog.update(st.name, lambda row: setattr(row, "needs_reinit", True))
            raise RefreshError(f"source '{dep.source_name}' no longer has column(s) {', '.join(missing)} that the "
                               "defining query uses", stream_table=st.name,
                               hint="restore the column, or drop and recreate the stream table")
        changed.append((dep, fingerprint))
    if not changed:
        return None
    output = [(f.name, f.dataType.simpleString()) for f in env.spark.sql(pinned_query_sql(env, st, {})).schema.fields]
    stored = stored_output(env, st)
    names = ", ".join(dep.source_name for dep, _ in changed)
    if output != stored:
        return f"source schema changed ({names}); the output columns change: {stored} -> {output}"
    for dep, fingerprint in changed:
        env.catalog.set_schema_fingerprint(st.name, dep.source_name, fingerprint)
    return None


def stored_columns(env, st: StreamTable) -> list[tuple[str, str]]:
    """The storage table's columns, hidden ones included, and their types, as stored."""
    return [(f.name, f.dataType.simpleString()) for f in env.spark.table(quote_name(st.name)).schema.fields]


def stored_output(env, st: StreamTable) -> list[tuple[str, str]]:
    """The storage table's visible columns and their types, as stored."""
    return [(name, kind) for name, kind in stored_columns(env, st) if name in st.output_columns]


def remember_source_schemas(env, st: StreamTable) -> None:
    for dep in env.catalog.dependencies(st.name):
        env.catalog.set_schema_fingerprint(st.name, dep.source_name,
                                           schema_fingerprint(source_visible_columns(env, dep)))


def storage_changes(env, st: StreamTable) -> bool:
    """Whether a REINITIALIZE must replace the storage table: the query's output (a source's
    schema changed, or ALTER gave it a new query) or the hidden columns (a new layout) differ
    from the stored table's.  ``st.output_columns`` becomes the new output either way."""
    schema = env.spark.sql(pinned_query_sql(env, st, {})).schema
    wanted = [(f.name, f.dataType.simpleString()) for f in schema.fields]
    wanted += [(c, kind.lower()) for c, kind in st.storage.hidden_columns()]
    stored = stored_columns(env, st)
    st.output_columns = [f.name for f in schema.fields]
    if wanted == stored:
        return False
    log.info("%s: the storage table's columns change (%s -> %s); replaced in one commit", st.name, stored, wanted)
    return True

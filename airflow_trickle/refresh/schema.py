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

log = logging.getLogger(__name__)


def source_schema_change(env, st: StreamTable) -> str | None:
    """Why ``st`` must be reinitialized because a source's schema changed, or None.

    A changed schema that leaves the query's output as it was (an unused column added, say) is
    remembered and ignored; one that changes the output's columns or types needs REINITIALIZE;
    one that removes a column the query uses cannot be refreshed at all.
    """
    changed = []
    for dep in env.catalog.dependencies(st.name):
        columns = visible_columns(env.spark, dep.source_name)
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
                                           schema_fingerprint(visible_columns(env.spark, dep.source_name)))


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

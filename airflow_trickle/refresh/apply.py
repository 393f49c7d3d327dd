"""Apply a decided refresh with Spark: compute the change and commit it with its frontier.

The order of writes is what makes a refresh safe to kill at any point:

1. the data MERGE (or append) commits atomically *with* the new frontier and refresh number in
   its commit metadata, under an idempotent Delta transaction id ``(stream table id, refresh
   number)``;
2. only then is the catalog row updated (the engine appends the history row after that).

A crash between 1 and 2 is repaired by the next refresh, which reads the frontier back from
the storage table's newest refresh commit (``decide.recover_frontier``); a retried commit with
the same refresh number is skipped by Delta.  Nothing is applied twice, nothing is lost.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime

from airflow_trickle.catalog import StreamTable
from airflow_trickle.catalog.model import utcnow
from airflow_trickle.deltalog import has_no_data_files, latest_version, recorded_refreshes, row_count
from airflow_trickle.errors import RefreshError
from airflow_trickle.model import Action, RefreshMode
from airflow_trickle.names import quote_name
from airflow_trickle.refresh.cost import (ObservedTimes, full_is_cheaper, observed_times, slower_than_full,
                                          touched_rows_matter)
from airflow_trickle.refresh.decide import change_estimate
from airflow_trickle.refresh.failures import is_change_feed_unavailable, is_evaluation_error, short, with_retries
from airflow_trickle.refresh.full import full_merge_sql, numbered_rows_sql
from airflow_trickle.refresh.local_merge import merge_locally
from airflow_trickle.refresh.phases import PhaseClock
from airflow_trickle.repair import definition_properties
from airflow_trickle.spark.delta import refresh_commit
from airflow_trickle.sql.parse import DIALECT, parse_query
from airflow_trickle.sql.rewrite import hoist_nested_ctes, pin_sources
from airflow_trickle.storage import replace_storage_sql

log = logging.getLogger(__name__)


@dataclass
class Applied:
    """What the commit did."""

    action: Action
    reason: str | None
    rows_inserted: int
    rows_deleted: int
    seq: int
    frontier: dict[str, int]
    table_version: int
    rows_estimated: int | None
    rows_touched: int | None
    #: Source rows the window changed (the sources' commit metrics), when the logs said.
    changed_rows: int | None = None


def apply_refresh(env, st: StreamTable, action: Action, current: dict[str, int], *, refresh_id: str,
                  data_timestamp, clock: PhaseClock | None = None, newest: dict | None = None) -> Applied:
    """Compute and commit the change for ``action``; then record the new state in the catalog.

    ``newest`` is the record of the storage table's newest refresh commit: the fan-out it
    observed feeds the cost model.  The action may change on the way: to REINITIALIZE when a
    source's schema changed the output, to FULL when the cost model or the delta says so.
    """
    from airflow_trickle.dvm import drop_scratch_views

    scratch: list[str] = []  # temporary views the commit reads (a top-K's candidates)
    try:
        return _apply(env, st, action, current, refresh_id=refresh_id, data_timestamp=data_timestamp,
                      clock=clock or PhaseClock(), newest=newest, scratch=scratch)
    finally:
        drop_scratch_views(env, scratch)


def _apply(env, st: StreamTable, action: Action, current: dict[str, int], *, refresh_id: str, data_timestamp,
           clock: PhaseClock, newest: dict | None, scratch: list[str]) -> Applied:
    from airflow_trickle.dvm import differential_append, differential_merge

    seq = st.refresh_seq + 1
    reason = None
    merge_sql = None
    appending = False
    if action != Action.REINITIALIZE:
        with clock.phase("schema"):
            changed = _source_schema_change(env, st)
        if changed:
            env.catalog.update(st.name, lambda row: setattr(row, "needs_reinit", True))
            action, reason = Action.REINITIALIZE, changed
    with clock.phase("versions"):
        estimate = change_estimate(env.catalog, st, current, newest)
        # what the table's own refreshes took; not for a strict table, which asked for the delta
        # whatever it costs (a measured time, unlike an estimate, is no reason to refuse it)
        observed = (recent_times(env, st)
                    if action == Action.DIFFERENTIAL and estimate is not None and not is_strict(st) else None)
    if action == Action.DIFFERENTIAL:
        too_costly = estimate and full_is_cheaper(
            estimate, max_change_ratio=table_setting(env, st, "differential_max_change_ratio"),
            max_touched_ratio=(table_setting(env, st, "differential_max_touched_ratio")
                               if touched_rows_matter(st.storage.strategy) else float("inf")))
        if not too_costly and observed is not None:
            too_costly = slower_than_full(estimate.changed_rows, observed,
                                          max_time_ratio=table_setting(env, st, "differential_max_time_ratio"))
        if too_costly and is_strict(st):
            raise RefreshError(f"DIFFERENTIAL refused by the cost model: {too_costly}", stream_table=st.name,
                               hint="the stream table is strict (options: strict); refresh it FULL, or drop the "
                                    "option to let the cost model fall back to FULL")
        with clock.phase("plan"):
            append_sql = None if too_costly else differential_append(env, st, current, scratch=scratch)
            appending = append_sql is not None
            merge_sql, fallback = ((append_sql, None) if appending else
                                   (None, too_costly) if too_costly
                                   else differential_merge(env, st, current, scratch=scratch))
        if merge_sql is None:
            if is_strict(st):
                raise RefreshError(f"DIFFERENTIAL impossible: {fallback}", stream_table=st.name,
                                   hint="the stream table is strict (options: strict); refresh it FULL")
            action, reason = Action.FULL, fallback
            log.info("%s: FULL instead of DIFFERENTIAL: %s", st.name, fallback)
    replacing = action == Action.REINITIALIZE and _storage_changes(env, st)
    # A FULL refresh into empty storage (the first population) has nothing to diff against: a
    # plain INSERT writes the same rows without the MERGE's scans and joins.  Only a table the
    # catalog has never seen populated is worth the log read (after a crash it may hold data).
    filling = (merge_sql is None and not replacing and not st.is_populated
               and has_no_data_files(st.location))
    appending = appending or filling
    # Any other FULL recompute replaces the stored rows in one INSERT OVERWRITE when no stream
    # table reads this one's change feed (the diffing MERGE joins new and stored rows first).
    overwriting = (merge_sql is None and not replacing and not filling and full_overwrites(env, st))
    metadata = {"seq": seq, "frontier": current, "action": action, "refresh_id": refresh_id,
                "data_timestamp": data_timestamp.isoformat()}
    if estimate is not None:
        metadata["changed_rows"] = estimate.changed_rows

    txn_app_id = f"airflow_trickle:{st.st_id}"

    def commit(sql: str):
        with refresh_commit(env.spark, metadata=metadata, txn_app_id=txn_app_id, txn_version=seq):
            return env.spark.sql(hoist_nested_ctes(sql)).first()

    def merge(sql: str):
        """A small change through delta-rs where it applies, else Spark's MERGE."""
        if estimate is not None and estimate.touched_rows <= env.config.local_commit_max_rows:
            metrics = merge_locally(env.spark, st.location, sql, metadata=metadata, txn_app_id=txn_app_id,
                                    txn_version=seq, max_rows=env.config.local_commit_max_rows)
            if metrics is not False:
                return metrics
        return commit(sql)

    try:
        with clock.phase("commit"):
            if merge_sql:
                sql = merge_sql
            elif replacing:
                sql = replace_storage_sql(st.name, full_rows_sql(env, st, current), st.output_columns, st.storage,
                                          definition_properties(st, env.catalog.dependencies(st.name)))
            elif filling:
                sql = fill_storage_sql(env, st, current)
            else:
                sql = full_refresh_sql(env, st, current, overwrite=overwriting)
            rewriting = replacing or overwriting  # every stored row goes
            metrics = _committed(env, st, merge if merge_sql and not appending else commit, sql, refresh_id,
                                 inserting=appending or rewriting, rewriting=rewriting)
    except Exception as err:  # noqa: BLE001 - only an unreadable change feed or a change-row error is recovered
        evaluation = is_evaluation_error(err)
        if merge_sql is None or not (evaluation or is_change_feed_unavailable(err)):
            raise
        if evaluation:
            # Spark may evaluate an expression on change rows that cancel out (or on rows the
            # plan filters later); the FULL recompute evaluates only the current rows.
            action, reason = Action.FULL, f"the delta failed to evaluate ({short(err)[:200]}); recomputed"
        else:
            action, reason = Action.FULL, f"change feed unavailable ({short(err)[:200]}); recomputed"
        log.warning("%s: %s", st.name, reason)
        metadata["action"] = action
        with clock.phase("commit"):
            overwriting = full_overwrites(env, st)
            metrics = _committed(env, st, commit, full_refresh_sql(env, st, current, overwrite=overwriting), refresh_id,
                                 inserting=overwriting, rewriting=overwriting)
    touched = None
    if metrics is None:  # Delta skipped the commit: this (table, refresh number) already landed
        inserted = deleted = 0
        reason = "this refresh's commit had already landed; skipped by its transaction id"
        # The commit that landed (an earlier attempt, killed before it could record it) may have
        # consumed other versions than this attempt read: its frontier is what storage holds.
        landed = next((r for r in recorded_refreshes(st.location) if r.get("seq") == seq), None)
        if landed is not None and landed.get("frontier") is not None:
            current = {name: int(version) for name, version in landed["frontier"].items()}
            if landed.get("data_timestamp"):
                data_timestamp = datetime.fromisoformat(landed["data_timestamp"])
    else:
        updated = int(metrics["num_updated_rows"] or 0)
        inserted = int(metrics["num_inserted_rows"] or 0) + updated
        deleted = int(metrics["num_deleted_rows"] or 0) + updated
        touched = inserted + deleted - updated
    with clock.phase("record"):
        table_version = latest_version(st.location)
        if action == Action.REINITIALIZE:
            _remember_source_schemas(env, st)

        def record(row: StreamTable) -> None:
            row.frontier, row.refresh_seq, row.is_populated, row.needs_reinit = current, seq, True, False
            row.output_columns = list(st.output_columns)
            row.consecutive_errors = 0
            mark_fresh(row, data_timestamp)

        env.catalog.update(st.name, record)
    return Applied(action=action, reason=reason, rows_inserted=inserted, rows_deleted=deleted, seq=seq,
                   frontier=current, table_version=table_version,
                   rows_estimated=(estimate.touched_rows if estimate and st.effective_mode == RefreshMode.DIFFERENTIAL
                                   else None),
                   rows_touched=touched, changed_rows=estimate.changed_rows if estimate is not None else None)


def mark_fresh(row: StreamTable, data_timestamp) -> None:
    row.data_timestamp = data_timestamp
    row.last_refresh_at = utcnow()


def _source_schema_change(env, st: StreamTable) -> str | None:
    """Why ``st`` must be reinitialized because a source's schema changed, or None.

    A changed schema that leaves the query's output as it was (an unused column added, say) is
    remembered and ignored; one that changes the output's columns or types needs REINITIALIZE;
    one that removes a column the query uses cannot be refreshed at all.
    """
    from airflow_trickle.definition import _visible_columns, schema_fingerprint

    changed = []
    for dep in env.catalog.dependencies(st.name):
        columns = _visible_columns(env.spark, dep.source_name)
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
    stored = _stored_output(env, st)
    names = ", ".join(dep.source_name for dep, _ in changed)
    if output != stored:
        return f"source schema changed ({names}); the output columns change: {stored} -> {output}"
    for dep, fingerprint in changed:
        env.catalog.set_schema_fingerprint(st.name, dep.source_name, fingerprint)
    return None


def _stored_columns(env, st: StreamTable) -> list[tuple[str, str]]:
    """The storage table's columns, hidden ones included, and their types, as stored."""
    return [(f.name, f.dataType.simpleString()) for f in env.spark.table(quote_name(st.name)).schema.fields]


def _stored_output(env, st: StreamTable) -> list[tuple[str, str]]:
    """The storage table's visible columns and their types, as stored."""
    return [(name, kind) for name, kind in _stored_columns(env, st) if name in st.output_columns]


def _remember_source_schemas(env, st: StreamTable) -> None:
    from airflow_trickle.definition import _visible_columns, schema_fingerprint

    for dep in env.catalog.dependencies(st.name):
        env.catalog.set_schema_fingerprint(st.name, dep.source_name,
                                           schema_fingerprint(_visible_columns(env.spark, dep.source_name)))


def full_rows_sql(env, st: StreamTable, current: dict[str, int]) -> str:
    """The stream table's rows at ``current``, visible and hidden columns: a FULL refresh's source."""
    from airflow_trickle.dvm import full_source

    source = full_source(env, st, current)
    return source if source is not None else numbered_rows_sql(pinned_query_sql(env, st, current), st.output_columns)


def full_refresh_sql(env, st: StreamTable, current: dict[str, int], *, overwrite: bool | None = None) -> str:
    """The statement of a FULL refresh into populated storage: recompute at ``current``, then
    replace the stored rows (INSERT OVERWRITE) or MERGE only the difference in, as
    :func:`full_overwrites` decides unless ``overwrite`` says."""
    if full_overwrites(env, st) if overwrite is None else overwrite:
        return fill_storage_sql(env, st, current, overwrite=True)
    return full_merge_sql(st.name, full_rows_sql(env, st, current), st.output_columns + st.storage.state_names())


def fill_storage_sql(env, st: StreamTable, current: dict[str, int], *, overwrite: bool = False) -> str:
    """The INSERT of a FULL refresh into empty storage (or, ``overwrite``, in place of every stored
    row): the recomputed rows, every column named."""
    columns = ", ".join(f"`{c}`" for c in st.output_columns + [name for name, _ in st.storage.hidden_columns()])
    return (f"INSERT {'OVERWRITE TABLE' if overwrite else 'INTO'} {quote_name(st.name)} ({columns}) "
            f"SELECT {columns} FROM ({full_rows_sql(env, st, current)}) AS __full")


def full_overwrites(env, st: StreamTable) -> bool:
    """Whether a FULL refresh of ``st`` replaces its stored rows (INSERT OVERWRITE) rather than
    MERGE the difference in (``full_refresh_write``: ``auto``, ``merge`` or ``overwrite``).

    Both leave the same rows.  The MERGE joins the recomputed rows with the stored ones to
    change only what differs, so its change feed holds only real changes -- what a stream table
    reading this one needs to stay cheap; the overwrite skips that join (at TPC-H SF 1 the MERGE
    made a FULL refresh cost 1.1-2.3x a plain INSERT OVERWRITE, the overwrite ~1.2x) and its
    change feed holds every row removed and added.  ``auto`` overwrites
    unless another stream table reads this one.
    """
    how = str(st.options.get("full_refresh_write", env.config.full_refresh_write)).lower()
    if how != "auto":
        return how == "overwrite"
    return not any(dep.source_name == st.name and dep.source_type == "STREAM_TABLE"
                   for dep in env.catalog.dependencies())


def _committed(env, st: StreamTable, run, sql: str, refresh_id: str, *, inserting: bool, rewriting: bool) -> dict | None:
    """Run ``run(sql)`` with retries; its MERGE-shaped metrics, or None when Delta skipped it.

    An INSERT or a CTAS (``inserting``) returns no metrics: they are read from its commit; one
    that replaced every stored row (``rewriting``) deleted as many as were stored before.
    """
    version_before = latest_version(st.location) if inserting else None
    stored_before = row_count(st.location) if rewriting else 0
    metrics = with_retries(env.config, lambda: run(sql))
    return _written_metrics(st, version_before, refresh_id, deleted=stored_before) if inserting else metrics


def _written_metrics(st: StreamTable, version_before: int, refresh_id: str, *, deleted: int = 0) -> dict | None:
    """MERGE-shaped metrics of the append or replace just run, or None when Delta skipped it
    (its transaction id had landed already).  A replace removed every row stored before.

    The commit is found by this refresh's id, not as "the newest commit": a refresh racing
    this one may have committed the same refresh number meanwhile, and then Delta skipped this
    append -- taking that commit's rows for this one's would record this refresh's frontier
    over the other's data (a concurrency trial caught exactly that).
    """
    if latest_version(st.location) == version_before:
        return None
    landed = next((r for r in recorded_refreshes(st.location)
                   if r["version"] > version_before and r.get("refresh_id") == refresh_id), None)
    if landed is None:
        return None
    inserted = int(landed["metrics"].get("numOutputRows") or 0)
    return {"num_inserted_rows": inserted, "num_updated_rows": 0, "num_deleted_rows": deleted}


def table_setting(env, st: StreamTable, name: str) -> float:
    """A cost-model ratio: the table's own option, else the deployment's setting."""
    return float(st.options.get(name, getattr(env.config, name)))


def recent_times(env, st: StreamTable) -> ObservedTimes:
    """What the table's recent DIFFERENTIAL and FULL refreshes took (its newest history rows)."""
    return observed_times(env.catalog.history(st.name, limit=50))


def is_strict(st: StreamTable) -> bool:
    """Whether the table never falls back to FULL (``options: strict``)."""
    return str(st.options.get("strict", "")).lower() in ("1", "true", "yes", "on")


def pinned_query_sql(env, st: StreamTable, versions: dict[str, int]) -> str:
    """The defining query reading each source at ``versions``, hidden columns of upstreams removed."""
    hidden = {}
    for dep in env.catalog.dependencies(st.name):
        if dep.source_type == "STREAM_TABLE":
            upstream = env.catalog.get(dep.source_name)
            if upstream is not None:
                hidden[dep.source_name] = upstream.output_columns
    return pin_sources(parse_query(st.defining_query, stream_table=st.name), versions, hidden).sql(DIALECT)


def _storage_changes(env, st: StreamTable) -> bool:
    """Whether a REINITIALIZE must replace the storage table: the query's output (a source's
    schema changed, or ALTER gave it a new query) or the hidden columns (a new layout) differ
    from the stored table's.  ``st.output_columns`` becomes the new output either way."""
    schema = env.spark.sql(pinned_query_sql(env, st, {})).schema
    wanted = [(f.name, f.dataType.simpleString()) for f in schema.fields]
    wanted += [(c, kind.lower()) for c, kind in st.storage.hidden_columns()]
    stored = _stored_columns(env, st)
    st.output_columns = [f.name for f in schema.fields]
    if wanted == stored:
        return False
    log.info("%s: the storage table's columns change (%s -> %s); replaced in one commit", st.name, stored, wanted)
    return True

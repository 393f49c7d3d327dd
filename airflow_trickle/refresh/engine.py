"""One refresh of one stream table, from action choice to history row.

The order of writes is what makes a refresh safe to kill at any point:

1. the data MERGE commits atomically *with* the new frontier and refresh number in its commit
   metadata, under an idempotent Delta transaction id ``(stream table id, refresh number)``;
2. only then is the catalog row updated and a history row appended.

A crash between 1 and 2 is repaired by the next refresh, which reads the frontier back from
the storage table's newest refresh commit (:func:`recover_frontier`); a retried commit with the
same refresh number is skipped by Delta.  Nothing is applied twice, nothing is lost.
"""
from __future__ import annotations

import random
import time
import uuid
from dataclasses import dataclass, field
from typing import Protocol

from airflow_trickle.catalog import CatalogStore, RefreshRecord, StreamTable
from airflow_trickle.catalog.model import utcnow
from airflow_trickle.config import TrickleConfig
from airflow_trickle.errors import RefreshError, StreamTableNotFoundError, TrickleError
from airflow_trickle.names import quote_name
from airflow_trickle.refresh.cost import ChangeEstimate, full_is_cheaper, observed_fanout
from airflow_trickle.refresh.full import full_merge_sql, numbered_rows_sql
from airflow_trickle.refresh.phases import PhaseClock
from airflow_trickle.deltalog import changed_rows, latest_version, recorded_refreshes, row_count
from airflow_trickle.spark.delta import refresh_commit
from airflow_trickle.sql.parse import DIALECT, parse_query
from airflow_trickle.sql.rewrite import pin_sources

MANUAL_MODES = ("FULL", "DIFFERENTIAL", "REINITIALIZE")


class Environment(Protocol):
    spark: object
    catalog: CatalogStore
    config: TrickleConfig


@dataclass
class RefreshResult:
    """What one refresh did."""

    name: str
    action: str  # NO_DATA | FULL | DIFFERENTIAL | REINITIALIZE | SKIP
    status: str  # COMPLETED | SKIPPED | FAILED
    rows_inserted: int = 0
    rows_deleted: int = 0
    duration_ms: int = 0
    reason: str | None = None
    seq: int = 0
    frontier: dict[str, int] = field(default_factory=dict)
    table_version: int | None = None
    refresh_id: str = ""
    #: Milliseconds per phase and Spark jobs (``refresh/phases.py``).
    phases: dict = field(default_factory=dict)
    #: Stored rows the cost model expected the delta to touch, and those it did touch.
    rows_estimated: int | None = None
    rows_touched: int | None = None


def refresh_stream_table(env: Environment, name: str, *, mode: str | None = None,
                         initiated_by: str = "MANUAL", cheap_only: bool = False) -> RefreshResult | None:
    """Refresh ``name`` once.  ``mode``: ``None``/``AUTO`` (choose), FULL, DIFFERENTIAL, REINITIALIZE.

    ``cheap_only`` finishes only the outcomes known from Delta logs and the catalog alone
    (NO_DATA, or SKIP of a suspended table) and returns ``None``, recording nothing, when the
    refresh needs Spark: the Airflow task uses it to end without starting a Spark job.
    """
    started = time.monotonic()
    start_time = utcnow()
    requested = _requested_mode(mode, name)
    refresh_id = uuid.uuid4().hex
    clock = PhaseClock()
    with clock.phase("catalog"):
        st = env.catalog.get(name)
        if st is None:
            raise StreamTableNotFoundError("no such stream table", stream_table=name)
        st, recovered, newest = recover_frontier(env, st)

    def finish(action: str, status: str, reason: str | None, error: str | None = None, **extra) -> RefreshResult:
        clock.close()
        result = RefreshResult(name=name, action=action, status=status, reason=reason, refresh_id=refresh_id,
                               duration_ms=int((time.monotonic() - started) * 1000), phases=clock.to_dict(),
                               **extra)
        env.catalog.append_history(RefreshRecord(
            refresh_id=refresh_id, st_name=name, seq=result.seq, action=action, status=status,
            rows_inserted=result.rows_inserted, rows_deleted=result.rows_deleted, start_time=start_time,
            end_time=utcnow(), duration_ms=result.duration_ms, reason=reason, error_message=error,
            initiated_by=initiated_by,
            frontier_from=st.frontier, frontier_to=result.frontier or st.frontier, data_timestamp=start_time,
            phases={**result.phases, **({"rows_touched": result.rows_touched} if result.rows_touched is not None
                                        else {})},
            rows_estimated=result.rows_estimated,
        ))
        return result

    if cheap_only and st.status == "ACTIVE" and (requested is not None or not st.is_populated or st.needs_reinit):
        return None
    if st.status != "ACTIVE":
        return finish("SKIP", "SKIPPED", f"status is {st.status}; alter_stream_table(status='ACTIVE') resumes it",
                      seq=st.refresh_seq, frontier=st.frontier)

    action = None
    try:
        with clock.phase("versions"):
            current = source_versions(env, name)
            action, reason = choose_action(st, current, requested)
            if action == "DIFFERENTIAL" and requested is None and _only_empty_commits(env, st, current):
                action, reason = "NO_DATA", "the new source versions changed no rows"
        if recovered:
            reason = f"{reason}; {recovered}" if reason else recovered
        if action == "NO_DATA":
            def fresh(row: StreamTable) -> None:
                _mark_fresh(row, start_time)
                row.frontier = current  # versions without changes are consumed

            with clock.phase("record"):
                env.catalog.update(name, fresh)
            return finish("NO_DATA", "COMPLETED", reason, seq=st.refresh_seq, frontier=current)
        if cheap_only:
            return None
        clock.track_jobs(env.spark, f"airflow_trickle-{refresh_id}")
        applied = apply_refresh(env, st, action, current, refresh_id=refresh_id, data_timestamp=start_time,
                                clock=clock, newest=newest)
    except TrickleError as err:
        clock.close()
        message = str(err)
        if _record_failure(env, st, message, lambda: finish(action or "NONE", "FAILED", None, error=message)):
            raise RefreshError(f"{err.cause}; {_suspended(env)}", stream_table=name, hint=err.hint) from err
        raise
    except Exception as err:  # noqa: BLE001 - wrapped with the stream table's name
        clock.close()
        failure = RefreshError(f"{(action or 'refresh').lower()} refresh failed: {_short(err)}", stream_table=name)
        if _record_failure(env, st, str(failure), lambda: finish(action or "NONE", "FAILED", None,
                                                                 error=str(failure))):
            failure = RefreshError(f"{failure.cause}; {_suspended(env)}", stream_table=name)
        raise failure from err
    action = applied.pop("action")
    return finish(action, "COMPLETED", applied.pop("reason", None) or reason, **applied)


def source_versions(env: Environment, name: str) -> dict[str, int]:
    """The version of every source of ``name`` a refresh reads now (Delta logs, no Spark).

    A base table is read at its newest version.  An upstream stream table is read at the
    version its latest refresh committed (delayed view semantics, seed 002 §6): never at an
    intermediate commit such as the empty table a REINITIALIZE replaces its storage with.
    """
    versions = {}
    for dep in env.catalog.dependencies(name):
        version = None
        if dep.source_type == "STREAM_TABLE":
            version = next((r["version"] for r in recorded_refreshes(dep.source_location, limit=5)), None)
        versions[dep.source_name] = latest_version(dep.source_location) if version is None else version
    return versions


def _only_empty_commits(env: Environment, st: StreamTable, current: dict[str, int]) -> bool:
    from airflow_trickle.deltalog import only_empty_commits

    locations = {dep.source_name: dep.source_location for dep in env.catalog.dependencies(st.name)}
    try:
        return all(only_empty_commits(locations[source], st.frontier[source], version)
                   for source, version in current.items() if version != st.frontier.get(source))
    except Exception:  # noqa: BLE001 - unknown: read the change feed
        return False


def choose_action(st: StreamTable, current: dict[str, int], requested: str | None) -> tuple[str, str | None]:
    """The refresh action and why (seed 002 §7), before any data is read."""
    if st.needs_reinit or requested == "REINITIALIZE":
        return "REINITIALIZE", "requested" if requested == "REINITIALIZE" else "a source changed its schema"
    if not st.is_populated:
        return "FULL", "initial population"
    if requested is None and current == st.frontier:
        return "NO_DATA", "no source has a new version"
    if requested == "FULL":
        return "FULL", "requested"
    if st.effective_mode == "FULL":
        if requested == "DIFFERENTIAL":
            raise RefreshError(f"cannot refresh DIFFERENTIAL: {st.mode_reason}", stream_table=st.name)
        return "FULL", st.mode_reason
    return "DIFFERENTIAL", None


def apply_refresh(env: Environment, st: StreamTable, action: str, current: dict[str, int], *,
                  refresh_id: str, data_timestamp, clock: PhaseClock | None = None, newest: dict | None = None) -> dict:
    """Compute and commit the change for ``action``; then record the new state in the catalog.

    ``newest`` is the record of the storage table's newest refresh commit: the fan-out it
    observed feeds the cost model.
    """
    from airflow_trickle.dvm import differential_append, differential_merge

    clock = clock or PhaseClock()
    seq = st.refresh_seq + 1
    reason = None
    merge_sql = None
    appending = False
    if action != "REINITIALIZE":
        with clock.phase("schema"):
            changed = _source_schema_change(env, st)
        if changed:
            env.catalog.update(st.name, lambda row: setattr(row, "needs_reinit", True))
            action, reason = "REINITIALIZE", changed
    with clock.phase("versions"):
        estimate = change_estimate(env, st, current, newest)
    if action == "DIFFERENTIAL":
        too_costly = estimate and full_is_cheaper(
            estimate, max_change_ratio=float(st.options.get("differential_max_change_ratio",
                                                            env.config.differential_max_change_ratio)),
            max_touched_ratio=float(st.options.get("differential_max_touched_ratio",
                                                   env.config.differential_max_touched_ratio)))
        if too_costly and _is_strict(st):
            raise RefreshError(f"DIFFERENTIAL refused by the cost model: {too_costly}", stream_table=st.name,
                               hint="the stream table is strict (options: strict); refresh it FULL, or drop the "
                                    "option to let the cost model fall back to FULL")
        with clock.phase("plan"):
            append_sql = None if too_costly else differential_append(env, st, current)
            appending = append_sql is not None
            merge_sql, fallback = ((append_sql, None) if appending else
                                   (None, too_costly) if too_costly else differential_merge(env, st, current))
        if merge_sql is None:
            if _is_strict(st):
                raise RefreshError(f"DIFFERENTIAL impossible: {fallback}", stream_table=st.name,
                                   hint="the stream table is strict (options: strict); refresh it FULL")
            action, reason = "FULL", fallback
    if action == "REINITIALIZE":
        _reinitialize_storage(env, st)
    metadata = {"seq": seq, "frontier": current, "action": action, "refresh_id": refresh_id,
                "data_timestamp": data_timestamp.isoformat()}
    if estimate is not None:
        metadata["changed_rows"] = estimate.changed_rows

    def commit(sql: str):
        with refresh_commit(env.spark, metadata=metadata, txn_app_id=f"airflow_trickle:{st.st_id}", txn_version=seq):
            return env.spark.sql(sql).first()

    version_before = latest_version(st.location) if appending else None
    try:
        with clock.phase("commit"):
            metrics = with_retries(env, lambda: commit(merge_sql or full_refresh_sql(env, st, current)))
            if appending:  # an INSERT returns no metrics: read them from its commit
                metrics = _append_metrics(st, version_before)
    except Exception as err:  # noqa: BLE001 - only an unreadable change feed or a change-row error is recovered
        if merge_sql is None or not (_change_feed_unavailable(err) or _evaluation_error(err)):
            raise
        if _evaluation_error(err):
            # Spark may evaluate an expression on change rows that cancel out (or on rows the
            # plan filters later); the FULL recompute evaluates only the current rows.
            action, reason = "FULL", f"the delta failed to evaluate ({_short(err)[:200]}); recomputed"
        else:
            action, reason = "FULL", f"change feed unavailable ({_short(err)[:200]}); recomputed"
        metadata["action"] = action
        with clock.phase("commit"):
            metrics = with_retries(env, lambda: commit(full_refresh_sql(env, st, current)))
    touched = None
    if metrics is None:  # Delta skipped the commit: this (table, refresh number) already landed
        inserted = deleted = 0
        reason = "this refresh's commit had already landed; skipped by its transaction id"
    else:
        updated = int(metrics["num_updated_rows"] or 0)
        inserted = int(metrics["num_inserted_rows"] or 0) + updated
        deleted = int(metrics["num_deleted_rows"] or 0) + updated
        touched = inserted + deleted - updated
    with clock.phase("record"):
        table_version = latest_version(st.location)
        if action == "REINITIALIZE":
            _remember_source_schemas(env, st)

        def record(row: StreamTable) -> None:
            row.frontier, row.refresh_seq, row.is_populated, row.needs_reinit = current, seq, True, False
            row.consecutive_errors = 0
            _mark_fresh(row, data_timestamp)

        env.catalog.update(st.name, record)
    return {"action": action, "reason": reason, "rows_inserted": inserted, "rows_deleted": deleted, "seq": seq,
            "frontier": current, "table_version": table_version,
            "rows_estimated": estimate.touched_rows if estimate and st.effective_mode == "DIFFERENTIAL" else None,
            "rows_touched": touched}


#: Exception names and messages of errors worth retrying: a concurrent Delta commit, transient I/O.
_RETRYABLE = ("ConcurrentAppendException", "ConcurrentDeleteReadException", "ConcurrentDeleteDeleteException",
              "ConcurrentTransactionException", "MetadataChangedException", "ProtocolChangedException",
              "ConcurrentModificationException", "DELTA_CONCURRENT_", "SocketTimeoutException",
              "Connection reset", "Too many requests", "SlowDown")


def is_retryable(err: BaseException) -> bool:
    text = f"{type(err).__name__}: {err}"
    return any(marker in text for marker in _RETRYABLE)


def with_retries(env: Environment, action):
    """Run ``action``; retry a retryable error with exponential backoff and jitter.

    Safe for refresh commits: a retry recomputes the change against the same frontier under the
    same transaction id, so a commit that did land is skipped, never applied twice.
    """
    attempts = max(1, int(env.config.refresh_attempts))
    for attempt in range(1, attempts + 1):
        try:
            return action()
        except Exception as err:  # noqa: BLE001 - classified here
            if attempt == attempts or not is_retryable(err):
                raise
            time.sleep(env.config.retry_backoff_seconds * 2 ** (attempt - 1) * (0.5 + random.random()))
    raise AssertionError("unreachable")


def _source_schema_change(env: Environment, st: StreamTable) -> str | None:
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
    stored = [(f.name, f.dataType.simpleString()) for f in env.spark.table(quote_name(st.name)).schema.fields
              if f.name in st.output_columns]
    names = ", ".join(dep.source_name for dep, _ in changed)
    if output != stored:
        return f"source schema changed ({names}); the output columns change: {stored} -> {output}"
    for dep, fingerprint in changed:
        env.catalog.set_schema_fingerprint(st.name, dep.source_name, fingerprint)
    return None


def _remember_source_schemas(env: Environment, st: StreamTable) -> None:
    from airflow_trickle.definition import _visible_columns, schema_fingerprint

    for dep in env.catalog.dependencies(st.name):
        env.catalog.set_schema_fingerprint(st.name, dep.source_name,
                                           schema_fingerprint(_visible_columns(env.spark, dep.source_name)))


def full_refresh_sql(env: Environment, st: StreamTable, current: dict[str, int]) -> str:
    """The MERGE of a FULL refresh: recompute at ``current``, apply only the difference."""
    from airflow_trickle.dvm import full_source

    source = full_source(env, st, current)
    if source is None:
        source = numbered_rows_sql(pinned_query_sql(env, st, current), st.output_columns)
    return full_merge_sql(st.name, source, st.output_columns + [c for c, _ in st.storage.get("state", [])])


def _append_metrics(st: StreamTable, version_before: int) -> dict | None:
    """MERGE-shaped metrics of the append just run, or None when Delta skipped it (its
    transaction id had landed already)."""
    if latest_version(st.location) == version_before:
        return None
    newest = recorded_refreshes(st.location, limit=1)
    inserted = int((newest[0]["metrics"] if newest else {}).get("numOutputRows") or 0)
    return {"num_inserted_rows": inserted, "num_updated_rows": 0, "num_deleted_rows": 0}


def change_estimate(env: Environment, st: StreamTable, current: dict[str, int],
                    newest: dict | None) -> ChangeEstimate | None:
    """The change of the window ``st.frontier -> current`` as the cost model sees it (Delta logs
    only: the sources' commit metrics and file statistics), or None when the logs cannot say."""
    changed = total = 0
    try:
        for dep in env.catalog.dependencies(st.name):
            old, new = st.frontier.get(dep.source_name), current.get(dep.source_name)
            total += row_count(dep.source_location)
            if old is not None and new is not None and new > old:
                changed += changed_rows(dep.source_location, old, new)
        stored = row_count(st.location) if st.location else 0
    except Exception:  # noqa: BLE001 - no estimate: let the delta run
        return None
    return ChangeEstimate(changed_rows=changed, source_rows=total, stored_rows=stored,
                          fanout=observed_fanout(newest))


def _is_strict(st: StreamTable) -> bool:
    return str(st.options.get("strict", "")).lower() in ("1", "true", "yes", "on")


def _evaluation_error(err: Exception) -> bool:
    """A data-dependent expression error (ANSI mode): division by zero, overflow, a bad cast."""
    text = str(err)
    return any(marker in text for marker in (
        "DIVIDE_BY_ZERO", "ARITHMETIC_OVERFLOW", "CAST_INVALID_INPUT", "CAST_OVERFLOW", "NUMERIC_VALUE_OUT_OF_RANGE",
        "INVALID_ARRAY_INDEX", "DATETIME_OVERFLOW", "SparkArithmeticException", "SparkNumberFormatException",
    ))


def _change_feed_unavailable(err: Exception) -> bool:
    text = str(err)
    return any(marker in text for marker in (
        "DELTA_MISSING_CHANGE_DATA", "DELTA_CHANGE_DATA_FEED", "CHANGE_DATA_FEED", "change data",
        "FileNotFoundException", "DELTA_FILE_NOT_FOUND", "FILE_NOT_FOUND", "DELTA_VERSIONS_NOT_CONTIGUOUS",
        "cdc", "readChangeFeed",
    ))


def pinned_query_sql(env: Environment, st: StreamTable, versions: dict[str, int]) -> str:
    """The defining query reading each source at ``versions``, hidden columns of upstreams removed."""
    hidden = {}
    for dep in env.catalog.dependencies(st.name):
        if dep.source_type == "STREAM_TABLE":
            upstream = env.catalog.get(dep.source_name)
            if upstream is not None:
                hidden[dep.source_name] = upstream.output_columns
    return pin_sources(parse_query(st.defining_query, stream_table=st.name), versions, hidden).sql(DIALECT)


def recover_frontier(env: Environment, st: StreamTable) -> tuple[StreamTable, str | None, dict | None]:
    """Bring the catalog up to the newest refresh committed in the storage table.

    A refresh killed after its data commit but before its catalog update left the catalog one
    refresh behind; the frontier in the data commit is the truth.  Returns the stream table,
    what was recovered (or None), and the newest refresh commit's record.
    """
    records = [r for r in recorded_refreshes(st.location) if isinstance(r.get("seq"), int)]
    # the newest commit decides: after a group rollback, a RESTORE commit (carrying the restored
    # frontier under a higher number) supersedes the refresh it undid
    newest = max(records, key=lambda r: r["version"], default=None)
    if newest is None or newest["seq"] <= st.refresh_seq:
        return st, None, newest

    def repair(row: StreamTable) -> None:
        row.frontier = {k: int(v) for k, v in newest["frontier"].items()}
        row.refresh_seq = newest["seq"]
        row.is_populated = True
        row.needs_reinit = False

    repaired = env.catalog.update(st.name, repair)
    return repaired, f"recovered frontier of refresh {newest['seq']} from storage commit {newest['version']}", newest


def _reinitialize_storage(env: Environment, st: StreamTable) -> None:
    from airflow_trickle.storage import create_storage_table

    schema = env.spark.sql(pinned_query_sql(env, st, {})).schema
    columns = [(f.name, f.dataType.simpleString()) for f in schema.fields]
    stored = [(f.name, f.dataType.simpleString()) for f in env.spark.table(quote_name(st.name)).schema.fields
              if f.name in st.output_columns]
    if columns != stored:
        create_storage_table(env.spark, st.name, columns, st.storage, replace=True)
        names = [c for c, _ in columns]
        env.catalog.update(st.name, lambda row: setattr(row, "output_columns", names))
        st.output_columns = names


def _mark_fresh(row: StreamTable, data_timestamp) -> None:
    row.data_timestamp = data_timestamp
    row.last_refresh_at = utcnow()


def _record_failure(env: Environment, st: StreamTable, message: str, record_history) -> bool:
    """Count the failure and log it; at ``max_consecutive_errors`` suspend the table (status
    ERROR) and raise an alert: a ``SUSPEND`` row with status ``ALERT`` in the history.

    Returns True when this failure suspended the table.
    """
    limit = env.config.max_consecutive_errors
    suspended = []

    def count(row: StreamTable) -> None:
        row.consecutive_errors += 1
        if row.consecutive_errors >= limit and row.status == "ACTIVE":
            row.status = "ERROR"
            suspended.append(row.consecutive_errors)

    try:
        env.catalog.update(st.name, count)
        record_history()
        if suspended:
            now = utcnow()
            env.catalog.append_history(RefreshRecord(
                refresh_id=uuid.uuid4().hex, st_name=st.name, seq=st.refresh_seq, action="SUSPEND", status="ALERT",
                start_time=now, end_time=now, reason=_suspended(env), error_message=message, initiated_by="ENGINE",
                frontier_from=st.frontier, frontier_to=st.frontier))
    except Exception:  # noqa: BLE001 - never hide the refresh error behind a bookkeeping error
        pass
    return bool(suspended)


def _suspended(env: Environment) -> str:
    return (f"suspended after {env.config.max_consecutive_errors} consecutive failures; "
            "alter_stream_table(status='ACTIVE') resumes it")


def _requested_mode(mode: str | None, name: str) -> str | None:
    if mode is None or str(mode).upper() == "AUTO":
        return None
    value = str(mode).upper()
    if value not in MANUAL_MODES:
        from airflow_trickle.errors import InvalidRefreshModeError

        raise InvalidRefreshModeError(f"invalid refresh mode {mode!r}", stream_table=name,
                                      hint="use AUTO, FULL, DIFFERENTIAL or REINITIALIZE")
    return value


def _short(err: Exception) -> str:
    return str(err).strip().split("\n")[0][:500]

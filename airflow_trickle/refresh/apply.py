"""Apply a decided refresh with Spark: compute the change and commit it with its frontier.

The order of writes is what makes a refresh safe to kill at any point:

1. the data MERGE (or append) commits atomically *with* the new frontier and refresh number in
   its commit metadata, under an idempotent Delta transaction id ``(stream table id, refresh
   number)``;
2. only then is the catalog row updated (the engine appends the history row after that).

A crash between 1 and 2 is repaired by the next refresh, which reads the frontier back from
the storage table's newest refresh commit (``decide.recover_frontier``); a retried commit with
the same refresh number is skipped by Delta.  Nothing is applied twice, nothing is lost.

The action is made final by ``decide.py`` as the refresh learns more (a source's schema, the
cost model's estimate, a delta that cannot be planned, a commit that failed); the DVM plans the
delta once and ``differential.py`` executes the plan; ``writers.py`` says how rows reach storage.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from datetime import datetime

from airflow_trickle.catalog import StreamTable
from airflow_trickle.catalog.model import utcnow
from airflow_trickle.storage.deltalog import latest_version, recorded_refreshes, row_count
from airflow_trickle.dvm.base import Unsupported
from airflow_trickle.model import Action, RefreshMode
from airflow_trickle.refresh.cost import MeasuredFanout, carried_fanout
from airflow_trickle.refresh.decide import (Decision, after_failure, after_schema_check, by_cost_model, change_estimate,
                                            without_delta)
from airflow_trickle.refresh.arranged import plan_lookups, probe_inputs
from airflow_trickle.refresh.lookup import PartPath, ProbeReport, arrangements_on
from airflow_trickle.refresh.probe_groups import probe_groups
from airflow_trickle.refresh.arranged_recursion import RecursionLookups
from airflow_trickle.refresh.differential import Prepared, drop_views, is_append, plan_differential, statement
from airflow_trickle.refresh.failures import with_retries
from airflow_trickle.refresh.commit_tag import CommitTag
from airflow_trickle.refresh.committer import Commits, DeltaRsCommitter, SparkCommitter
from airflow_trickle.refresh.phases import PhaseClock
from airflow_trickle.refresh.plan import Committer, ExecutionPlan, Fallback, PlannedPart, plan_execution
from airflow_trickle.refresh.schema import remember_source_schemas, source_schema_change
from airflow_trickle.refresh.time_rule import ObservedTimes, delta_planner, observed_times
from airflow_trickle.refresh.writers import choose_writer, full_writer
from airflow_trickle.storage.lease import fence

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
    #: A DIFFERENTIAL's :func:`~airflow_trickle.refresh.time_rule.delta_planner`: what its time measured.
    planner: int | None = None
    #: A DIFFERENTIAL of a top-K that recomputed its rows from the query (a row left the top k).
    beyond_boundary: bool = False
    #: How the refresh was planned to run, and where it departed (``refresh/plan.py``).
    plan: ExecutionPlan | None = None
    #: How each part of the delta was read (``refresh/lookup.PartPath``).
    paths: tuple[PartPath, ...] = ()


def apply_refresh(env, st: StreamTable, action: Action, current: dict[str, int], *, refresh_id: str,
                  data_timestamp, clock: PhaseClock | None = None, fanout: MeasuredFanout | None = None,
                  reason: str | None = None) -> Applied:
    """Compute and commit the change for ``action``; then record the new state in the catalog.

    ``fanout`` is the one the newest refresh commit that measured it observed or carried forward
    (None: none did; ``decide.recover_frontier``): it feeds the cost model, and a FULL refresh's
    commit carries it forward (``cost.carried_fanout``).  The action may change on the way, as
    ``decide.py`` says: to REINITIALIZE when a source's schema changed the output, to FULL when
    the cost model or the delta says so.
    """
    scratch: list[str] = []  # temporary views the commit reads (a top-K's candidates)
    try:
        return _apply(env, st, Decision(Action(action), reason, current), refresh_id=refresh_id,
                      data_timestamp=data_timestamp, clock=clock or PhaseClock(), fanout=fanout, scratch=scratch)
    finally:
        drop_views(env, scratch)


def _apply(env, st: StreamTable, decision: Decision, *, refresh_id: str, data_timestamp, clock: PhaseClock,
           fanout: MeasuredFanout | None, scratch: list[str]) -> Applied:
    seq = st.refresh_seq + 1
    current, asked = decision.current, decision.action
    if decision.action != Action.REINITIALIZE:
        with clock.phase("schema"):
            changed = source_schema_change(env, st)
        if changed:
            env.catalog.update(st.name, lambda row: setattr(row, "needs_reinit", True))
        decision = after_schema_check(decision, changed)
    with clock.phase("versions"):
        estimate = change_estimate(env.catalog, st, current, fanout)
        # what the table's own refreshes took; not for a strict table, which asked for the delta
        # whatever it costs (a measured time, unlike an estimate, is no reason to refuse it)
        observed = (recent_times(env, st) if decision.action == Action.DIFFERENTIAL and estimate is not None
                    and not st.options.is_strict else None)
    decision = by_cost_model(decision, st, estimate, observed, env.config)
    with clock.phase("versions"):  # from the Delta logs, like the estimate
        execution = plan_execution(env, st, decision.action, estimate)
    delta_sql, appending, resolved_here, beyond_boundary = None, False, None, False
    paths: list[PartPath] = []  # how each part of the delta was read
    parts: list[PlannedPart] = []  # ... as planned
    if decision.action == Action.DIFFERENTIAL:
        planned, why_not = _differential_sql(env, st, current, scratch, clock, parts, paths)
        if planned is None:
            decision = without_delta(decision, st, why_not)
        else:
            (prepared, appending) = planned
            delta_sql, resolved_here, beyond_boundary = prepared.sql, prepared.local, prepared.beyond_boundary
    metadata = {"seq": seq, "frontier": current, "action": decision.action, "refresh_id": refresh_id,
                "data_timestamp": data_timestamp.isoformat()}
    if estimate is not None:
        metadata["changed_rows"] = estimate.changed_rows

    def carry_fanout() -> None:
        """A FULL commit measures no fan-out: it carries the last one measured forward."""
        carried = carried_fanout(fanout, observed) if decision.action == Action.FULL else None
        if carried is not None:
            metadata["fanout"] = carried

    carry_fanout()

    # every commit carries the refresh's metadata and transaction id, after the lease's fence
    tag = CommitTag(metadata, f"airflow_trickle:{st.st_id}", seq,
                    fence=lambda: fence(env.catalog.location, st.name, env.config.lease_seconds))
    commits = Commits(SparkCommitter(env, tag), DeltaRsCommitter(env, st, tag))
    local, allowed = execution.commit.committer is Committer.DELTA_RS, execution.delta_rs_allowed
    try:
        with clock.phase("commit"):
            writer = choose_writer(env, st, decision.action, current, delta_sql=delta_sql, appending=appending,
                                   local=local, delta_rs=allowed,
                                   resolved=resolved_here.resolved if resolved_here is not None else None)
            execution = execution.written_by(writer)
            metrics = _committed(env, st, writer, commits, refresh_id)
    except Exception as err:  # noqa: BLE001 - only what decide.after_failure recovers is recovered
        recovered = after_failure(decision, st, err) if delta_sql is not None else None
        if recovered is None:
            raise
        decision = recovered
        metadata["action"] = decision.action
        carry_fanout()
        with clock.phase("commit"):
            writer = full_writer(env, st, current, delta_rs=allowed)
            execution = execution.written_by(writer)
            metrics = _committed(env, st, writer, commits, refresh_id)
    action = decision.action
    reason = decision.reason if action != asked else None  # else the engine records why it asked
    touched = None
    if metrics is None:  # Delta skipped the commit: this (table, refresh number) already landed
        inserted = deleted = 0
        reason = "this refresh's commit had already landed; skipped by its transaction id"
        # The commit that landed (an earlier attempt, killed before it could record it) may have
        # consumed other versions than this attempt read: its frontier is what storage holds.
        landed = next((r for r in recorded_refreshes(env.catalog.at(st.location)) if r.get("seq") == seq), None)
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
        table_version = latest_version(env.catalog.at(st.location))
        if action == Action.REINITIALIZE:
            remember_source_schemas(env, st)

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
                   rows_touched=touched, changed_rows=estimate.changed_rows if estimate is not None else None,
                   planner=current_planner(env) if action == Action.DIFFERENTIAL else None,
                   beyond_boundary=beyond_boundary and action == Action.DIFFERENTIAL,
                   plan=replace(execution, action=action).with_parts(parts if action == Action.DIFFERENTIAL else ())
                   .with_fallbacks([f for f in (p.fallback() for p in paths) if f is not None]
                                   + [Fallback("commit", str(Committer.DELTA_RS), str(Committer.SPARK), cause)
                                      for cause in commits.fallbacks]),
                   paths=tuple(paths) if action == Action.DIFFERENTIAL else ())


def _differential_sql(env, st: StreamTable, current: dict[str, int], scratch: list[str], clock: PhaseClock,
                      parts: list[PlannedPart], paths: list[PartPath]) -> tuple[tuple[Prepared, bool] | None, str | None]:
    """``((the statement applying the delta, whether it is an append), None)``, planned once,
    its join inputs probed where the plan says (``refresh/arranged.py``) and executed up to the
    commit (``refresh/differential.py``), or ``(None, why not)``; how each part of the delta is
    planned to read its inputs goes into ``parts``, how it did into ``paths``."""
    with clock.phase("plan"):
        plan, why_not = plan_differential(env, st, current)
    if plan is None:
        return None, why_not
    with clock.phase("probe"):
        lookups = plan_lookups(env, plan, scratch)
        parts += lookups.parts
        versions, probed = probe_inputs(env, plan, lookups)
    clock.move(probed.build_ms, "probe", "arrange")
    for line in probed.lines():
        log.info("%s: %s", st.name, line)
    groups = ProbeReport()  # the touched groups looked up, and the ms spent building their arrangements
    built: list[int] = []  # ms spent building arrangements for recursions (not the delta's cost)
    recursions = RecursionLookups(env, plan, scratch, built)
    try:
        with clock.phase("plan"):
            return (statement(env, plan, scratch, versions,
                              probe_groups=lambda block, v: probe_groups(env, plan, block, v, scratch, groups),
                              look_up_reach=recursions),
                    is_append(plan)), None
    except Unsupported as err:
        return None, f"cannot maintain differentially: {err}"
    finally:
        clock.move(sum(built) + groups.build_ms, "plan", "arrange")
        paths += probed.paths + groups.paths
        for line in groups.lines() + recursions.lines:
            log.info("%s: %s", st.name, line)


def mark_fresh(row: StreamTable, data_timestamp) -> None:
    row.data_timestamp = data_timestamp
    row.last_refresh_at = utcnow()


def _committed(env, st: StreamTable, writer, commits: Commits, refresh_id: str) -> dict | None:
    """Write with ``writer`` through ``commits``, with retries; its MERGE-shaped metrics, or
    None when Delta skipped it.

    An INSERT or a CTAS (``writer.inserting``) returns no metrics: they are read from its commit;
    one that replaced every stored row (``writer.rewriting``) deleted as many as were stored before.
    """
    version_before = latest_version(env.catalog.at(st.location)) if writer.inserting else None
    stored_before = row_count(env.catalog.at(st.location)) if writer.rewriting else 0
    metrics = with_retries(env.config, lambda: writer.write(commits))
    if writer.inserting:
        return _written_metrics(env.catalog.at(st.location), version_before, refresh_id, deleted=stored_before)
    return metrics


def _written_metrics(location, version_before: int, refresh_id: str, *, deleted: int = 0) -> dict | None:
    """MERGE-shaped metrics of the append or replace just run, or None when Delta skipped it
    (its transaction id had landed already).  A replace removed every row stored before.

    The commit is found by this refresh's id, not as "the newest commit": a refresh racing
    this one may have committed the same refresh number meanwhile, and then Delta skipped this
    append -- taking that commit's rows for this one's would record this refresh's frontier
    over the other's data (a concurrency trial caught exactly that).
    """
    if latest_version(location) == version_before:
        return None
    landed = next((r for r in recorded_refreshes(location)
                   if r["version"] > version_before and r.get("refresh_id") == refresh_id), None)
    if landed is None:
        return None
    inserted = int(landed["metrics"].get("numOutputRows") or 0)
    return {"num_inserted_rows": inserted, "num_updated_rows": 0, "num_deleted_rows": deleted}


def current_planner(env) -> int:
    """The :func:`~airflow_trickle.refresh.time_rule.delta_planner` a DIFFERENTIAL runs under now."""
    return delta_planner(arrangements_on(env.config))


def recent_times(env, st: StreamTable) -> ObservedTimes:
    """What the table's recent DIFFERENTIAL and FULL refreshes took (its newest history rows;
    a DIFFERENTIAL only when measured under the current planner)."""
    return observed_times(env.catalog.history(st.name, limit=50), planner=current_planner(env))

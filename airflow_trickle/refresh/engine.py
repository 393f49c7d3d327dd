"""One refresh of one stream table: decide, apply, record.

* :mod:`~airflow_trickle.refresh.decide` chooses the action from the catalog and Delta logs
  (no Spark);
* :mod:`~airflow_trickle.refresh.apply` computes and commits the change with Spark, frontier
  in the commit (the crash-safety argument is in its docstring);
* :mod:`~airflow_trickle.refresh.failures` classifies errors, retries, and suspends a table
  after repeated failures.

Every refresh, whatever its outcome, ends with one history row (:class:`_Recorder`).
"""
from __future__ import annotations

import logging
import time
import uuid
from dataclasses import dataclass, field, fields
from typing import Protocol

from airflow_trickle.catalog import CatalogStore, RefreshRecord
from airflow_trickle.catalog.model import utcnow
from airflow_trickle.config import TrickleConfig
from airflow_trickle.errors import RefreshError, TrickleError
from airflow_trickle.model import Action, Outcome, RunMode
from airflow_trickle.refresh.apply import apply_refresh, mark_fresh
from airflow_trickle.refresh.decide import Decision, Loaded, decide, load
from airflow_trickle.refresh.failures import record_failure, short, suspended_text
from airflow_trickle.refresh.lookup import PartPath
from airflow_trickle.refresh.plan import ExecutionPlan
from airflow_trickle.refresh.phases import PhaseClock, format_phases
from airflow_trickle.storage.deltalog import reused_handles
from airflow_trickle.storage.lease import lease_of

log = logging.getLogger(__name__)


class Environment(Protocol):
    spark: object
    engine: object  # a SparkEngine over ``spark``
    catalog: CatalogStore
    config: TrickleConfig


@dataclass
class RefreshResult:
    """What one refresh did."""

    name: str
    action: Action
    status: Outcome
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
    #: Source rows the window changed, from the sources' commit metrics (None when unknown).
    changed_rows: int | None = None
    #: What a DIFFERENTIAL's time was measured under (``refresh.time_rule.delta_planner``).
    planner: int | None = None
    #: A top-K's DIFFERENTIAL that recomputed its rows from the query (a row left the top k).
    beyond_boundary: bool = False
    #: How the refresh was planned to run, and where it departed (``refresh/plan.py``).
    plan: ExecutionPlan | None = None
    #: How each part of a DIFFERENTIAL's delta was read (``refresh/lookup.PartPath``).
    paths: tuple[PartPath, ...] = ()


class _Recorder:
    """Times one refresh and writes its history row when it ends."""

    def __init__(self, catalog, name: str, initiated_by: str):
        self.catalog, self.name, self.initiated_by = catalog, name, initiated_by
        self.started = time.monotonic()
        self.start_time = utcnow()
        self.refresh_id = uuid.uuid4().hex
        self.clock = PhaseClock()
        self.loaded: Loaded | None = None

    def finish(self, action: Action, status: Outcome, reason: str | None, error: str | None = None,
               **extra) -> RefreshResult:
        self.clock.close()
        st = self.loaded.st
        result = RefreshResult(name=self.name, action=action, status=status, reason=reason,
                               refresh_id=self.refresh_id, duration_ms=int((time.monotonic() - self.started) * 1000),
                               phases=self.clock.to_dict(), **extra)
        phases = dict(result.phases)
        if result.rows_touched is not None:
            phases["rows_touched"] = result.rows_touched
        if result.changed_rows is not None:  # with the time it took, the cost model's measurement
            phases["changed_rows"] = result.changed_rows
        if result.planner is not None:  # ... and what it measured
            phases["planner"] = result.planner
        if result.beyond_boundary:  # ... and whether that was a recompute of the top-K
            phases["beyond_boundary"] = 1
        self.catalog.append_history(RefreshRecord(
            refresh_id=self.refresh_id, st_name=self.name, seq=result.seq, action=action, status=status,
            rows_inserted=result.rows_inserted, rows_deleted=result.rows_deleted, start_time=self.start_time,
            end_time=utcnow(), duration_ms=result.duration_ms, reason=reason, error_message=error,
            initiated_by=self.initiated_by, frontier_from=st.frontier, frontier_to=result.frontier or st.frontier,
            data_timestamp=self.start_time, phases=phases, rows_estimated=result.rows_estimated,
            plan=({**result.plan.to_dict(), "taken": [p.to_dict() for p in result.paths]}
                  if result.plan is not None else None)))
        log.info("%s: %s %s in %d ms (%s)%s", self.name, action, status, result.duration_ms,
                 format_phases(result.phases), f": {reason}" if reason else "")
        return result

    def finish_without_spark(self, decision: Decision) -> RefreshResult:
        """Record SKIP, or NO_DATA (whose source versions are consumed: they changed nothing)."""
        st = self.loaded.st
        if decision.action == Action.SKIP:
            return self.finish(Action.SKIP, Outcome.SKIPPED, decision.reason, seq=st.refresh_seq, frontier=st.frontier)

        def fresh(row) -> None:
            mark_fresh(row, self.start_time)
            row.frontier = decision.current

        with self.clock.phase("record"):
            self.catalog.update(self.name, fresh)
        return self.finish(Action.NO_DATA, Outcome.COMPLETED, decision.reason, seq=st.refresh_seq,
                           frontier=decision.current)


def refresh_stream_table(env: Environment, name: str, *, mode: RunMode | str | None = None,
                         initiated_by: str = "MANUAL") -> RefreshResult:
    """Refresh ``name`` once.  ``mode``: None/AUTO (choose), FULL, DIFFERENTIAL, REINITIALIZE."""
    requested = RunMode.parse(mode or RunMode.AUTO, what="refresh mode", stream_table=name).requested
    # one writer at a time on an object store: what is read below (frontier, refresh number)
    # must not change until the commit (``storage/lease.py``)
    with lease_of(env, [name]), reused_handles():
        return _refresh(env, name, requested, initiated_by)


def _refresh(env: Environment, name: str, requested: RunMode | None, initiated_by: str) -> RefreshResult:
    run = _Recorder(env.catalog, name, initiated_by)
    with run.clock.phase("catalog"):
        run.loaded = load(env.catalog, name)
    st = run.loaded.st
    action = None
    try:
        with run.clock.phase("versions"):
            decision = decide(env.catalog, run.loaded, requested)
        action = decision.action
        if not decision.needs_spark:
            return run.finish_without_spark(decision)
        run.clock.track_jobs(env.engine, f"airflow_trickle-{run.refresh_id}")
        applied = apply_refresh(env, st, decision.action, decision.current, refresh_id=run.refresh_id,
                                data_timestamp=run.start_time, clock=run.clock, fanout=run.loaded.fanout)
    except Exception as err:  # noqa: BLE001 - every failure is recorded, then raised naming the stream table
        run.clock.close()
        failure = err if isinstance(err, TrickleError) else RefreshError(
            f"{(action or 'refresh').lower()} refresh failed: {short(err)}", stream_table=name)
        log.error("%s", failure)
        if record_failure(env.catalog, env.config, st, str(failure),
                          lambda: run.finish(action or Action.NONE, Outcome.FAILED, None, error=str(failure))):
            raise RefreshError(f"{failure.cause}; {suspended_text(env.config)}", stream_table=name,
                               hint=failure.hint) from err
        if failure is err:
            raise
        raise failure from err
    outcome = {f.name: getattr(applied, f.name) for f in fields(applied)}
    return run.finish(outcome.pop("action"), Outcome.COMPLETED, outcome.pop("reason") or decision.reason, **outcome)


def refresh_without_spark(catalog, name: str, *, initiated_by: str) -> RefreshResult | None:
    """Finish a refresh whose outcome the catalog and the Delta logs decide alone -- NO_DATA, or
    SKIP of a table that is not ACTIVE -- and return it; ``None`` (nothing recorded) when the
    refresh needs Spark.  The Airflow task calls it before starting any Spark work."""
    run = _Recorder(catalog, name, initiated_by)
    with run.clock.phase("catalog"):
        run.loaded = load(catalog, name)
    with run.clock.phase("versions"):
        decision = decide(catalog, run.loaded, None)
    return None if decision.needs_spark else run.finish_without_spark(decision)

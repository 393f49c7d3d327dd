"""Decide what a refresh does, from the catalog and the Delta logs alone -- no Spark.

Everything here reads the catalog (delta-rs) and the sources' transaction logs, so an Airflow
task calls it directly to finish the cheap outcomes -- ``NO_DATA``, ``SKIP`` of a suspended
table -- in milliseconds, without a Spark job (``engine.refresh_without_spark``).

* :func:`load` reads the stream table and repairs its frontier from its storage table's newest
  refresh commit when a crash left the catalog behind (:func:`recover_frontier`);
* :func:`decide` reads the sources' versions and chooses the action (:func:`choose_action`);
* :func:`change_estimate` sizes the window for the cost model;
* :func:`after_schema_check`, :func:`by_cost_model`, :func:`without_delta` and
  :func:`after_failure` make the action final as a refresh learns more (a changed source
  schema, the cost model's estimate, a delta that cannot be planned, a commit that failed):
  the appliers receive the final :class:`Decision` and never choose an action themselves.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, replace

from airflow_trickle.catalog import StreamTable
from airflow_trickle.storage.deltalog import (changed_rows, latest_version, newest_of, only_empty_commits,
                                      recorded_refreshes, row_count)
from airflow_trickle.dvm.planner import is_top_k
from airflow_trickle.errors import RefreshError, StreamTableNotFoundError
from airflow_trickle.model import Action, RefreshMode, RunMode, SourceType, Status
from airflow_trickle.refresh.cost import (ChangeEstimate, MeasuredFanout, full_is_cheaper, observed_fanout,
                                          touched_rows_matter)
from airflow_trickle.refresh.time_rule import REMEASURE_AFTER, ObservedTimes, slower_than_full
from airflow_trickle.storage.errors import UNREADABLE

log = logging.getLogger(__name__)


@dataclass
class Loaded:
    """A stream table as a refresh starts from it."""

    st: StreamTable
    #: What :func:`recover_frontier` repaired, or None.
    recovered: str | None
    #: Stored rows touched per changed source row, from the newest refresh commit that measured
    #: it or carried it forward (:func:`~airflow_trickle.refresh.cost.observed_fanout`; None: none
    #: did).  Feeds the cost model.
    fanout: MeasuredFanout | None


@dataclass(frozen=True)
class Decision:
    """The action of a refresh, why, and the source versions it refreshes to."""

    action: Action
    reason: str | None
    current: dict[str, int]

    @property
    def needs_spark(self) -> bool:
        return self.action not in (Action.NO_DATA, Action.SKIP)


def load(catalog, name: str) -> Loaded:
    st = catalog.get(name)
    if st is None:
        raise StreamTableNotFoundError("no such stream table", stream_table=name)
    return recover_frontier(catalog, st)


def decide(catalog, loaded: Loaded, requested: RunMode | None) -> Decision:
    """The action for ``loaded`` (SKIP when it is not ACTIVE); raises RefreshError when the
    requested mode is impossible."""
    st = loaded.st
    if st.status != Status.ACTIVE:
        return Decision(Action.SKIP, f"status is {st.status}; alter_stream_table(status='ACTIVE') resumes it",
                        dict(st.frontier))
    current = source_versions(catalog, st.name)
    action, reason = choose_action(st, current, requested)
    if action == Action.DIFFERENTIAL and requested is None and _only_empty_commits(catalog, st, current):
        action, reason = Action.NO_DATA, "the new source versions changed no rows"
    if loaded.recovered:
        reason = f"{reason}; {loaded.recovered}" if reason else loaded.recovered
    log.info("%s: %s%s", st.name, action, f" ({reason})" if reason else "")
    return Decision(action, reason, current)


def source_versions(catalog, name: str) -> dict[str, int]:
    """The version of every source of ``name`` a refresh reads now.

    A base table is read at its newest version.  An upstream stream table is read at the
    version its latest refresh committed (delayed view semantics, seed 002 §6): never at a
    commit that is not a refresh's (a group's put-back, a user's write).
    """
    versions = {}
    for dep in catalog.dependencies(name):
        version = None
        if dep.source_type == SourceType.STREAM_TABLE:
            version = next((r["version"] for r in recorded_refreshes(catalog.at(dep.source_location), limit=5)), None)
        versions[dep.source_name] = latest_version(catalog.at(dep.source_location)) if version is None else version
    return versions


def _only_empty_commits(catalog, st: StreamTable, current: dict[str, int]) -> bool:
    locations = {dep.source_name: dep.source_location for dep in catalog.dependencies(st.name)}
    try:
        return all(only_empty_commits(catalog.at(locations[source]), st.frontier[source], version)
                   for source, version in current.items() if version != st.frontier.get(source))
    except UNREADABLE:  # "unknown" means the change feed is read
        log.debug("%s: could not tell whether the new commits are empty", st.name, exc_info=True)
        return False


def choose_action(st: StreamTable, current: dict[str, int], requested: RunMode | None) -> tuple[Action, str | None]:
    """The refresh action and why (seed 002 §7), before any data is read.

    >>> from airflow_trickle.catalog import StreamTable
    >>> st = StreamTable("s.t", "id", "q", "q", None, "AUTO", "DIFFERENTIAL", is_populated=True, frontier={"s.a": 3})
    >>> choose_action(st, {"s.a": 3}, None)
    (<Action.NO_DATA: 'NO_DATA'>, 'no source has a new version')
    >>> choose_action(st, {"s.a": 4}, None)
    (<Action.DIFFERENTIAL: 'DIFFERENTIAL'>, None)
    """
    if st.needs_reinit or requested == RunMode.REINITIALIZE:
        return Action.REINITIALIZE, "requested" if requested == RunMode.REINITIALIZE else "a source changed its schema"
    if not st.is_populated:
        return Action.FULL, "initial population"
    if requested is None and current == st.frontier:
        return Action.NO_DATA, "no source has a new version"
    if requested == RunMode.FULL:
        return Action.FULL, "requested"
    if st.effective_mode == RefreshMode.FULL:
        if requested == RunMode.DIFFERENTIAL:
            raise RefreshError(f"cannot refresh DIFFERENTIAL: {st.mode_reason}", stream_table=st.name)
        return Action.FULL, st.mode_reason
    return Action.DIFFERENTIAL, None


def change_estimate(catalog, st: StreamTable, current: dict[str, int],
                    fanout: MeasuredFanout | None) -> ChangeEstimate | None:
    """The change of the window ``st.frontier -> current`` as the cost model sees it (Delta logs
    only: the sources' commit metrics and file statistics), or None when the logs cannot say."""
    changed = total = 0
    try:
        for dep in catalog.dependencies(st.name):
            old, new = st.frontier.get(dep.source_name), current.get(dep.source_name)
            total += row_count(catalog.at(dep.source_location))
            if old is not None and new is not None and new > old:
                changed += changed_rows(catalog.at(dep.source_location), old, new)
        stored = row_count(catalog.at(st.location)) if st.location else 0
    except UNREADABLE:  # without an estimate the delta runs (no FULL fallback)
        log.debug("%s: no change estimate", st.name, exc_info=True)
        return None
    return ChangeEstimate(changed_rows=changed, source_rows=total, stored_rows=stored,
                          fanout=fanout.per_row if fanout is not None else None,
                          fanout_due=fanout is not None and fanout.is_due)


def recover_frontier(catalog, st: StreamTable) -> Loaded:
    """Bring the catalog up to the newest refresh committed in the storage table.

    A refresh killed after its data commit but before its catalog update left the catalog one
    refresh behind; the frontier in the data commit is the truth.
    """
    records = recorded_refreshes(catalog.at(st.location))
    newest, fanout = newest_of(records), observed_fanout(records)
    if newest is None or newest["seq"] <= st.refresh_seq:
        return Loaded(st, None, fanout)

    def repair(row: StreamTable) -> None:
        row.frontier = {k: int(v) for k, v in newest["frontier"].items()}
        row.refresh_seq = newest["seq"]
        row.is_populated = True
        row.needs_reinit = False

    repaired = catalog.update(st.name, repair)
    recovered = f"recovered frontier of refresh {newest['seq']} from storage commit {newest['version']}"
    log.warning("%s: %s", st.name, recovered)
    return Loaded(repaired, recovered, fanout)


# -- the action made final: every change of action a refresh makes is chosen here ----------------

def after_schema_check(decision: Decision, changed: str | None) -> Decision:
    """REINITIALIZE when a source's schema changed the query's output (``changed`` says how)."""
    if changed is None or decision.action == Action.REINITIALIZE:
        return decision
    return replace(decision, action=Action.REINITIALIZE, reason=changed)


def by_cost_model(decision: Decision, st: StreamTable, estimate: ChangeEstimate | None,
                  observed: ObservedTimes | None, config) -> Decision:
    """FULL instead of DIFFERENTIAL when the cost model expects recomputing to be cheaper
    (``refresh/cost.py``); a strict table (``options: strict``) refuses instead."""
    if decision.action != Action.DIFFERENTIAL or not estimate:
        return decision
    options = st.options
    # A fan-out no refresh has measured is assumed to be 1; after REMEASURE_AFTER FULL refreshes
    # in a row the delta runs once to measure it (else the assumption would decide for good) --
    # unless the time rule has measured it far slower than recomputing (cost.remeasure_after).
    # A measured one is measured again when its FULL commits have carried it far enough
    # (cost.carried_fanout).
    remeasure = (estimate.fanout is None and observed is not None and observed.fulls_since >= REMEASURE_AFTER
                 or estimate.fanout_due)
    too_costly = full_is_cheaper(
        estimate, max_change_ratio=options.ratio("differential_max_change_ratio", config),
        max_touched_ratio=(options.ratio("differential_max_touched_ratio", config)
                           if touched_rows_matter(st.storage.strategy, top_k=is_top_k(st.defining_query))
                           and not remeasure else float("inf")),
        min_rows=int(config.differential_ratio_min_rows))
    if not too_costly and observed is not None:
        too_costly = slower_than_full(estimate.changed_rows, observed,
                                      max_time_ratio=options.ratio("differential_max_time_ratio", config))
    if not too_costly:
        return decision
    if options.is_strict:
        raise RefreshError(f"DIFFERENTIAL refused by the cost model: {too_costly}", stream_table=st.name,
                           hint="the stream table is strict (options: strict); refresh it FULL, or drop the "
                                "option to let the cost model fall back to FULL")
    return _full_instead(decision, st, too_costly)


def without_delta(decision: Decision, st: StreamTable, why_not: str) -> Decision:
    """FULL when the delta cannot be planned (``why_not``); a strict table refuses instead."""
    if st.options.is_strict:
        raise RefreshError(f"DIFFERENTIAL impossible: {why_not}", stream_table=st.name,
                           hint="the stream table is strict (options: strict); refresh it FULL")
    return _full_instead(decision, st, why_not)


def after_failure(decision: Decision, st: StreamTable, err: Exception) -> Decision | None:
    """FULL after a DIFFERENTIAL commit that failed in a way a recompute avoids, or None (the
    error stands): an unreadable change feed, or an expression that failed on change rows (Spark
    may evaluate one on rows that cancel out, or that the plan filters later; the recompute
    evaluates only the current rows)."""
    from airflow_trickle.refresh.failures import is_change_feed_unavailable, is_evaluation_error, short

    if decision.action != Action.DIFFERENTIAL:
        return None
    if is_evaluation_error(err):
        reason = f"the delta failed to evaluate ({short(err)[:200]}); recomputed"
    elif is_change_feed_unavailable(err):
        reason = f"change feed unavailable ({short(err)[:200]}); recomputed"
    else:
        return None
    log.warning("%s: %s", st.name, reason)
    return replace(decision, action=Action.FULL, reason=reason)


def _full_instead(decision: Decision, st: StreamTable, reason: str) -> Decision:
    log.info("%s: FULL instead of DIFFERENTIAL: %s", st.name, reason)
    return replace(decision, action=Action.FULL, reason=reason)

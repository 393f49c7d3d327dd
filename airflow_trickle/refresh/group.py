"""Atomic consistency groups: refresh a diamond's members as one unit, or none of them.

Delta has no multi-table transactions, so atomicity is made of undo: before the attempt each
member's state (catalog row, storage version) is remembered; the members are refreshed in
topological order; if one fails, every member this attempt committed is put back to its
remembered state, so past the end of a failed attempt no reader sees one branch of the diamond
new and the other old.  The group's epoch (``consistency_groups`` catalog table) advances only
when the whole attempt succeeded.

Putting a member back is itself a refresh commit: the member is recomputed at its remembered
frontier and written like any FULL refresh (see :func:`_put_back`): the difference MERGEd in
when a stream table reads the member, else its rows replaced.  Its contents then equal the
remembered version's, and -- unlike a Delta ``RESTORE`` -- the commit's change feed holds the
undo, so stream tables downstream of the member (which may read its change feed across the
undone commit) stay exact.  The put-back commit carries the old
frontier under a new refresh number, so a crash right after it is repaired like any refresh.
"""
from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass, field

from airflow_trickle.catalog import RefreshRecord, StreamTable
from airflow_trickle.catalog.model import utcnow
from airflow_trickle.storage.deltalog import latest_version
from airflow_trickle.errors import RefreshError, StreamTableNotFoundError
from airflow_trickle.model import Action, Outcome
from airflow_trickle.refresh.apply import apply_refresh
from airflow_trickle.refresh.decide import recover_frontier
from airflow_trickle.refresh.engine import Environment, RefreshResult, refresh_stream_table
from airflow_trickle.storage.lease import lease_of

log = logging.getLogger(__name__)


@dataclass
class GroupResult:
    """What one attempt of a group did."""

    name: str
    members: list[str]
    epoch: int
    results: list[RefreshResult] = field(default_factory=list)
    restored: list[str] = field(default_factory=list)


@dataclass
class _Before:
    row: StreamTable
    version: int


def group_name(members: list[str]) -> str:
    return "group:" + "+".join(members)


def refresh_group(env: Environment, members: list[str], *, group: list[str] | None = None,
                  convergence_points: list[str] | None = None, mode: str | None = None,
                  initiated_by: str = "MANUAL") -> GroupResult:
    """Refresh ``members`` (topological order) all-or-nothing; raise after undoing a failed attempt.

    ``group`` names the whole group when ``members`` is part of it (the Airflow task refreshes
    only the members with new data); its epoch is the one counted.
    """
    with lease_of(env, list(members)):  # the members' commits and any rollback, one writer at a time
        return _refresh_group(env, members, group=list(group or members), convergence_points=convergence_points,
                              mode=mode, initiated_by=initiated_by)


def _refresh_group(env: Environment, members: list[str], *, group: list[str], convergence_points: list[str] | None,
                   mode: str | None, initiated_by: str) -> GroupResult:
    name = group_name(group)
    before = {}
    for member in members:
        row = env.catalog.get(member)
        if row is None:
            raise StreamTableNotFoundError("no such stream table (member of an atomic group)", stream_table=member)
        before[member] = _Before(row, latest_version(env.catalog.at(row.location)))
    results: list[RefreshResult] = []
    try:
        for member in members:
            results.append(refresh_stream_table(env, member, mode=mode, initiated_by=initiated_by))
    except BaseException as err:
        failed = members[len(results)]
        committed = [r.name for r in results if latest_version(env.catalog.at(before[r.name].row.location)) > before[r.name].version]
        restored, unrestored = [], []
        for member in reversed(committed):
            try:
                _put_back(env, before[member], initiated_by=initiated_by)
                restored.append(member)
            except Exception as undo_error:  # noqa: BLE001 - reported below; the attempt's error stays the cause
                log.exception("%s: could not restore its state before the group attempt", member)
                unrestored.append(f"{member} ({str(undo_error).strip().splitlines()[0][:200]})")
        message = (f"atomic group {name} failed at {failed}: {err}; "
                   + (f"restored {', '.join(reversed(restored))} to their state before the attempt"
                      if restored else "no member had committed" if not unrestored else "nothing restored"))
        if unrestored:
            message += (f"; could NOT restore {', '.join(unrestored)}: refresh the group again (its members stay "
                        "exact for their own frontiers)")
        env.catalog.record_group_attempt(name, group, convergence_points or [], succeeded=False, error=message)
        raise RefreshError(message, stream_table=failed) from err
    state = env.catalog.record_group_attempt(name, group, convergence_points or [], succeeded=True)
    return GroupResult(name=name, members=list(members), epoch=state.epoch, results=results)


def _put_back(env: Environment, before: _Before, *, initiated_by: str) -> None:
    """Make ``before.row``'s table hold what it held before the attempt (one FULL refresh commit)."""
    started = utcnow()
    refresh_id = uuid.uuid4().hex
    current = recover_frontier(env.catalog, env.catalog.get(before.row.name)).st
    # refresh numbers only grow: the put-back commit is numbered after the commit it undoes
    undo_from = StreamTable(**{**vars(current), "refresh_seq": max(current.refresh_seq, before.row.refresh_seq)})
    applied = apply_refresh(env, undo_from, Action.FULL, before.row.frontier, refresh_id=refresh_id,
                            data_timestamp=before.row.data_timestamp or started)
    # the schedule still sees the last *successful* refresh, so a retry is due at once
    env.catalog.update(before.row.name, lambda row: setattr(row, "last_refresh_at", before.row.last_refresh_at))
    env.catalog.append_history(RefreshRecord(
        refresh_id=refresh_id, st_name=before.row.name, seq=applied.seq, action=Action.RESTORE,
        status=Outcome.COMPLETED, rows_inserted=applied.rows_inserted, rows_deleted=applied.rows_deleted,
        start_time=started, end_time=utcnow(), reason="atomic group attempt failed; restored the pre-attempt state",
        initiated_by=initiated_by, frontier_from=current.frontier, frontier_to=before.row.frontier,
        data_timestamp=before.row.data_timestamp))

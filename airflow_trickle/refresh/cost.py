"""The cost model: is applying the delta cheaper than recomputing?  Pure functions, no Spark.

A delta's cost follows the rows it *touches* in the stream table, not the rows that changed in
the sources: 1,000 changed source rows that reach every group of an aggregate joined back to
its detail rows re-emit the whole detail.  Delta keeps no distinct counts, so the fan-out
(stream-table rows touched per changed source row) is taken from what the newest refresh that
measured it actually did: its commit records the changed source rows it consumed, and the
MERGE's own metrics say how many stored rows it inserted, updated or deleted (an overwrite's
commit says neither, so a FULL refresh measures nothing).  Until a refresh has measured it the
fan-out is assumed to be 1 -- and after :data:`REMEASURE_AFTER` FULL refreshes in a row under
that assumption, a DIFFERENTIAL runs to measure it: otherwise a table sent FULL by the assumed
fan-out would never learn its own.  A FULL refresh's commit carries the measured fan-out
forward (:func:`carried_fanout`), and a delta measures it again after as many FULL refreshes
as keep that measuring refresh's extra time to :data:`~airflow_trickle.refresh.time_rule.REMEASURE_OVERHEAD` of theirs.

>>> e = ChangeEstimate(changed_rows=1_000, source_rows=1_000_000, stored_rows=10_000, fanout=0.65)
>>> e.touched_rows, full_is_cheaper(e, max_change_ratio=0.15, max_touched_ratio=0.5) is None
(650, True)
>>> d = ChangeEstimate(changed_rows=1_000, source_rows=1_000_000, stored_rows=450_000, fanout=450.0)
>>> print(full_is_cheaper(d, max_change_ratio=0.15, max_touched_ratio=0.5))
expected to touch ~450,000 of 450,000 stored rows (fan-out 450 per changed source row, as observed on the last refresh that measured it); recomputing is cheaper
"""
from __future__ import annotations

from dataclasses import dataclass

from airflow_trickle.refresh.time_rule import REMEASURE_AFTER, ObservedTimes, remeasure_after

#: MERGE metrics of the stored rows a refresh changed (an updated row counts once).
_TOUCHED_METRICS = ("numTargetRowsInserted", "numTargetRowsUpdated", "numTargetRowsDeleted")


#: ...and a measured fan-out, carried forward in FULL commits, never after more than this: the
#: estimate follows the changes' size by itself, only the data's shape moves the fan-out.
MAX_FANOUT_REMEASURE_AFTER = 200


@dataclass(frozen=True)
class ChangeEstimate:
    """What a refresh is about to consume and what it will probably touch."""

    changed_rows: int  # source rows changed in the window, from the sources' commit metrics
    source_rows: int  # rows in the sources now (file statistics)
    stored_rows: int  # rows in the stream table now
    #: Stored rows touched per changed source row, as the newest refresh that measured it saw;
    #: None when none of the recorded ones did (then 1 is assumed).
    fanout: float | None = None
    #: Whether enough FULL refreshes ran since it was measured to measure it again
    #: (:attr:`MeasuredFanout.is_due`): the touched rule then lets the delta run.
    fanout_due: bool = False

    @property
    def touched_rows(self) -> int:
        return int(round(self.changed_rows * (1.0 if self.fanout is None else self.fanout)))


@dataclass(frozen=True)
class MeasuredFanout:
    """The fan-out a refresh measured, and the FULL refreshes since."""

    per_row: float  # stored rows touched per changed source row
    #: FULL refreshes committed since the refresh that measured it (a FULL measures nothing).
    fulls_since: int = 0
    #: FULL refreshes in a row after which a delta runs to measure it again (:func:`carried_fanout`).
    remeasure_after: int = REMEASURE_AFTER

    @property
    def is_due(self) -> bool:
        """Whether the next refresh the touched rule would send FULL measures it again instead."""
        return self.fulls_since >= self.remeasure_after


def observed_fanout(records: list[dict]) -> MeasuredFanout | None:
    """The fan-out of the newest refresh commit that measured it or carried it forward; None
    when none did.

    ``records`` are :func:`airflow_trickle.storage.deltalog.recorded_refreshes`' entries, newest
    first: a refresh's own metadata (``changed_rows``; a FULL's ``fanout``, carried forward by
    :func:`carried_fanout`) plus its commit's ``metrics``.  Only a MERGE's metrics say how many
    stored rows it touched; an overwrite's (a FULL refresh) do not -- taking it for a fan-out of
    1 kept a table FULL for good -- so it counts as one more FULL since the measurement.

    >>> merge = {"changed_rows": 4, "metrics": {"numTargetRowsInserted": "2", "numTargetRowsUpdated": "5",
    ...                                         "numTargetRowsDeleted": "1"}}
    >>> full = {"action": "FULL", "changed_rows": 9, "metrics": {"numOutputRows": "553"}}
    >>> observed_fanout([full, merge])
    MeasuredFanout(per_row=2.0, fulls_since=1, remeasure_after=8)
    >>> carried = {**full, "fanout": {"per_row": 2.0, "fulls_since": 60, "remeasure_after": 112}}
    >>> observed_fanout([full, carried, merge]).fulls_since  # the carrying FULL counted itself
    61
    >>> observed_fanout([{"changed_rows": 9, "metrics": {}}]) is None
    True
    >>> observed_fanout([full, {"action": "REINITIALIZE"}, merge]) is None
    True
    """
    fulls = 0
    for record in records:
        if str(record.get("action")) == "REINITIALIZE":
            return None  # the query or a source's schema changed: what was measured before says nothing
        carried = record.get("fanout")
        if isinstance(carried, dict) and carried.get("per_row") is not None:
            return MeasuredFanout(float(carried["per_row"]), int(carried.get("fulls_since") or 0) + fulls,
                                  int(carried.get("remeasure_after") or REMEASURE_AFTER))
        changed = record.get("changed_rows")
        metrics = record.get("metrics") or {}
        if changed and all(key in metrics for key in _TOUCHED_METRICS):
            return MeasuredFanout(touched_rows(metrics) / int(changed), fulls)
        fulls += str(record.get("action")) == "FULL"
    return None


def carried_fanout(measured: MeasuredFanout | None, observed: "ObservedTimes | None") -> dict | None:
    """What a FULL refresh's commit records of the fan-out measured before it (None: nothing
    was), so that the measurement outlives the history a refresh reads (its newest 50 commits).

    Forgotten after 50 FULL commits, it was measured again: the diamond of
    ``benchmarks/cascade.py`` at 10M rows, whose convergence point changes in every row each
    cycle, refreshes FULL in 5 s, and its measuring delta took 52-65 s every ~50 refreshes
    (~25% more time).  Now it is measured again after as many FULL refreshes as keep the
    measuring delta's extra time to :data:`~airflow_trickle.refresh.time_rule.REMEASURE_OVERHEAD` of the FULLs' (the times from
    ``observed``, the table's recent refreshes; else the count carried so far), at most
    :data:`MAX_FANOUT_REMEASURE_AFTER`: a fan-out moves with the data, not with the size of
    the changes -- the estimate multiplies it by each window's changed rows.

    >>> carried_fanout(MeasuredFanout(1140.0, 3), ObservedTimes(differential_ms=52_000, full_ms=4_900))
    {'per_row': 1140.0, 'fulls_since': 4, 'remeasure_after': 97}
    >>> carried_fanout(MeasuredFanout(1140.0, 0), None)
    {'per_row': 1140.0, 'fulls_since': 1, 'remeasure_after': 8}
    """
    if measured is None:
        return None
    every = measured.remeasure_after
    if observed is not None and observed.differential_ms is not None and observed.full_ms is not None:
        every = remeasure_after(observed.differential_ms, observed.full_ms, most=MAX_FANOUT_REMEASURE_AFTER)
    return {"per_row": measured.per_row, "fulls_since": measured.fulls_since + 1, "remeasure_after": every}


def touched_rows(metrics: dict) -> int:
    """Stored rows a MERGE inserted, updated or deleted, from its operation metrics."""
    return sum(int(metrics.get(key) or 0) for key in _TOUCHED_METRICS)


def touched_rows_matter(strategy, *, top_k: bool = False) -> bool:
    """Whether a delta's cost grows with the stored rows it touches, for a stream table stored
    with ``strategy``.  Not for an algebraic aggregate: its state is advanced from the change
    rows alone and the MERGE updates at most the touched groups, so touching every group of a
    small aggregate (a few groups, every one of which a change reaches) costs what the change
    costs -- no reason to recompute it.  Not for a top-K (``top_k``) either: it stores k rows, and
    a change of more than k/2 source rows would always "touch" more than half of them, while its
    delta costs what the delta of the query under the LIMIT costs; the time rule measures that.  A bag delta re-emits
    the rows it touches, and recomputing affected groups reads their whole input: those grow
    with the touched rows.

    >>> from airflow_trickle.model import Strategy
    >>> [touched_rows_matter(s) for s in (Strategy.BAG, Strategy.ALGEBRAIC, Strategy.RECOMPUTE, None)]
    [True, False, True, True]
    >>> touched_rows_matter(Strategy.BAG, top_k=True)
    False
    """
    from airflow_trickle.model import Strategy

    return strategy != Strategy.ALGEBRAIC and not top_k


def full_is_cheaper(estimate: ChangeEstimate, *, max_change_ratio: float, max_touched_ratio: float,
                    min_rows: int = 0) -> str | None:
    """Why recomputing beats the delta for this change, or None when the delta wins.

    The ratios say nothing when the sources and the stream table together hold at most
    ``min_rows`` rows: both ways then cost their fixed steps, whatever share changed.  The fifth
    hop of ``benchmarks/cascade.py`` filters a 50-row aggregate every row of which changes each
    cycle: the change ratio sent it FULL, 1.3-1.8 s through Spark, where its delta, committed by
    delta-rs, took 0.7-0.8 s.  Below ``min_rows`` the time rule (:func:`slower_than_full`) decides
    from the table's own refreshes.

    >>> tiny = ChangeEstimate(changed_rows=100, source_rows=50, stored_rows=48)
    >>> full_is_cheaper(tiny, max_change_ratio=0.15, max_touched_ratio=0.5, min_rows=10_000) is None
    True
    >>> print(full_is_cheaper(tiny, max_change_ratio=0.15, max_touched_ratio=0.5))
    change ratio 2.00 exceeds differential_max_change_ratio 0.15; recomputed
    """
    if estimate.source_rows + estimate.stored_rows <= min_rows:
        return None
    ratio = estimate.changed_rows / max(estimate.source_rows, 1)
    if ratio > max_change_ratio:
        return f"change ratio {ratio:.2f} exceeds differential_max_change_ratio {max_change_ratio:g}; recomputed"
    if estimate.stored_rows > 0 and estimate.touched_rows > max_touched_ratio * estimate.stored_rows:
        fanout = ("1 per changed source row, assumed: no refresh has measured it yet" if estimate.fanout is None
                  else f"{estimate.fanout:.3g} per changed source row, as observed on the last refresh that measured it")
        return (f"expected to touch ~{estimate.touched_rows:,} of {estimate.stored_rows:,} stored rows "
                f"(fan-out {fanout}); recomputing is cheaper")
    return None

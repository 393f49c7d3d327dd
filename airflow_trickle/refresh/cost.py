"""The cost model: is applying the delta cheaper than recomputing?  Pure functions, no Spark.

A delta's cost follows the rows it *touches* in the stream table, not the rows that changed in
the sources: 1,000 changed source rows that reach every group of an aggregate joined back to
its detail rows re-emit the whole detail.  Delta keeps no distinct counts, so the fan-out
(stream-table rows touched per changed source row) is taken from what the newest refresh
actually did: its commit records the changed source rows it consumed, and the MERGE's own
metrics say how many stored rows it inserted, updated or deleted.  Until a refresh has been
observed the fan-out is 1.

>>> e = ChangeEstimate(changed_rows=1_000, source_rows=1_000_000, stored_rows=10_000, fanout=0.65)
>>> e.touched_rows, full_is_cheaper(e, max_change_ratio=0.15, max_touched_ratio=0.5) is None
(650, True)
>>> d = ChangeEstimate(changed_rows=1_000, source_rows=1_000_000, stored_rows=450_000, fanout=450.0)
>>> print(full_is_cheaper(d, max_change_ratio=0.15, max_touched_ratio=0.5))
expected to touch ~450,000 of 450,000 stored rows (fan-out 450 per changed source row, as observed on the last refresh); recomputing is cheaper
"""
from __future__ import annotations

from dataclasses import dataclass

#: MERGE metrics of the stored rows a refresh changed (an updated row counts once).
_TOUCHED_METRICS = ("numTargetRowsInserted", "numTargetRowsUpdated", "numTargetRowsDeleted")


@dataclass(frozen=True)
class ChangeEstimate:
    """What a refresh is about to consume and what it will probably touch."""

    changed_rows: int  # source rows changed in the window, from the sources' commit metrics
    source_rows: int  # rows in the sources now (file statistics)
    stored_rows: int  # rows in the stream table now
    fanout: float = 1.0  # stored rows touched per changed source row, last observed

    @property
    def touched_rows(self) -> int:
        return int(round(self.changed_rows * self.fanout))


def observed_fanout(record: dict | None) -> float:
    """Stored rows touched per changed source row in a refresh commit's record (1.0 if unknown).

    ``record`` is one entry of :func:`airflow_trickle.deltalog.recorded_refreshes`: the
    refresh's own metadata (``changed_rows``) plus the commit's ``metrics``.
    """
    if not record:
        return 1.0
    changed = record.get("changed_rows")
    metrics = record.get("metrics") or {}
    if not changed or not all(key in metrics for key in _TOUCHED_METRICS):
        return 1.0
    return touched_rows(metrics) / int(changed)


def touched_rows(metrics: dict) -> int:
    """Stored rows a MERGE inserted, updated or deleted, from its operation metrics."""
    return sum(int(metrics.get(key) or 0) for key in _TOUCHED_METRICS)


def touched_rows_matter(strategy) -> bool:
    """Whether a delta's cost grows with the stored rows it touches, for a stream table stored
    with ``strategy``.  Not for an algebraic aggregate: its state is advanced from the change
    rows alone and the MERGE updates at most the touched groups, so touching every group of a
    small aggregate (TPC-H q1: 2,000 changed line items, 4 groups) costs what the change costs
    -- no reason to recompute it.  A bag delta re-emits the rows it touches, and recomputing
    affected groups reads their whole input: those grow with the touched rows.

    >>> from airflow_trickle.model import Strategy
    >>> [touched_rows_matter(s) for s in (Strategy.BAG, Strategy.ALGEBRAIC, Strategy.RECOMPUTE, None)]
    [True, False, True, True]
    """
    from airflow_trickle.model import Strategy

    return strategy != Strategy.ALGEBRAIC


def full_is_cheaper(estimate: ChangeEstimate, *, max_change_ratio: float, max_touched_ratio: float) -> str | None:
    """Why recomputing beats the delta for this change, or None when the delta wins."""
    ratio = estimate.changed_rows / max(estimate.source_rows, 1)
    if ratio > max_change_ratio:
        return f"change ratio {ratio:.2f} exceeds differential_max_change_ratio {max_change_ratio:g}; recomputed"
    if estimate.stored_rows > 0 and estimate.touched_rows > max_touched_ratio * estimate.stored_rows:
        return (f"expected to touch ~{estimate.touched_rows:,} of {estimate.stored_rows:,} stored rows "
                f"(fan-out {estimate.fanout:.3g} per changed source row, as observed on the last refresh); "
                "recomputing is cheaper")
    return None

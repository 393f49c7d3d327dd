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
as keep that measuring refresh's extra time to :data:`REMEASURE_OVERHEAD` of theirs.

>>> e = ChangeEstimate(changed_rows=1_000, source_rows=1_000_000, stored_rows=10_000, fanout=0.65)
>>> e.touched_rows, full_is_cheaper(e, max_change_ratio=0.15, max_touched_ratio=0.5) is None
(650, True)
>>> d = ChangeEstimate(changed_rows=1_000, source_rows=1_000_000, stored_rows=450_000, fanout=450.0)
>>> print(full_is_cheaper(d, max_change_ratio=0.15, max_touched_ratio=0.5))
expected to touch ~450,000 of 450,000 stored rows (fan-out 450 per changed source row, as observed on the last refresh that measured it); recomputing is cheaper
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field
from pathlib import Path

#: MERGE metrics of the stored rows a refresh changed (an updated row counts once).
_TOUCHED_METRICS = ("numTargetRowsInserted", "numTargetRowsUpdated", "numTargetRowsDeleted")


#: FULL refreshes the time rule may choose in a row before one DIFFERENTIAL measures the delta
#: again (the sources, the table and the changes move on; a measurement goes stale).
REMEASURE_AFTER = 8
#: ...or more, for a delta measured far slower than recomputing: as many as keep the measuring
#: refresh's extra time to this share of the FULLs' (on average).  A delta 4.3× its FULL
#: (TPC-H q20 at SF 1: 7.2 s, 1.7 s) measured every 9th refresh made them 37% dearer.
REMEASURE_OVERHEAD = 0.1
#: ...but never more than this: the tables grow, the changes shrink (and the rule reads the
#: newest 50 refreshes of the history: ``refresh/apply.recent_times``).
MAX_REMEASURE_AFTER = 40
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
    measuring delta's extra time to :data:`REMEASURE_OVERHEAD` of the FULLs' (the times from
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
    small aggregate (TPC-H q1: 2,000 changed line items, 4 groups) costs what the change costs
    -- no reason to recompute it.  Not for a top-K (``top_k``) either: it stores k rows, and a
    change of more than k/2 source rows would always "touch" more than half of them, while its
    delta costs what the delta of the query under the LIMIT costs (TPC-H q3 at SF 1: 15,000
    changed line items, 10 stored rows); the time rule measures that.  A bag delta re-emits
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


#: Measurements of each kind the time rule takes the fastest of: one refresh's time moves by a
#: second or more with what else the machine does (a garbage collection, a concurrent task), and
#: noise only ever adds time.
SAMPLES = 3


@dataclass(frozen=True)
class ObservedTimes:
    """What this stream table's own recent refreshes cost, from its history: the fastest of its
    newest DIFFERENTIAL refreshes (its Spark time and the source rows it consumed) and the
    fastest of its newest FULL refreshes."""

    differential_ms: int | None = None
    differential_changed: int | None = None
    full_ms: int | None = None
    #: FULL refreshes since the newest DIFFERENTIAL (or in all the history read, if none).
    fulls_since: int = 0
    #: Each of the newest DIFFERENTIAL refreshes as ``(ms, changed source rows)``: the rule
    #: compares a change with those measured on changes about as large (:func:`slower_than_full`)
    samples: tuple[tuple[int, int], ...] = field(default=(), compare=False, repr=False)


#: The code that decides what a delta costs: the DVM's plans, and how a refresh probes and
#: commits them.  A DIFFERENTIAL measured by other code does not decide (:func:`delta_planner`).
_PLANNER_SOURCES = ("dvm", "refresh/arranged.py", "refresh/arranged_recursion.py", "refresh/differential.py",
                    "refresh/narrowing.py",
                    "refresh/local_merge.py", "refresh/local_topk.py", "storage/arrangement.py", "storage/arrangements.py")


@functools.cache
def _planner_source_hash() -> int:
    import xxhash

    root, digest = Path(__file__).resolve().parent.parent, xxhash.xxh32()
    for name in _PLANNER_SOURCES:
        path = root / name
        for source in sorted(path.rglob("*.py")) if path.is_dir() else [path]:
            digest.update(source.relative_to(root).as_posix().encode())
            digest.update(source.read_bytes())
    return digest.intdigest()


def delta_planner(arranged: bool) -> int:
    """What a DIFFERENTIAL refresh is measured under, as one number its history row keeps
    (``phases["planner"]``): the code that plans, probes and commits deltas, and whether join
    inputs are probed through arrangements.  The time rule compares only measurements made
    under the current one: TPC-H's q17 and q21 measured 21 s and 136 s before their inputs were
    arranged, and those figures kept them FULL after an upgrade made their deltas cheaper."""
    import xxhash

    return xxhash.xxh32(f"{_planner_source_hash()}:{int(arranged)}".encode()).intdigest()


def spark_ms(phases: dict | None) -> int | None:
    """Milliseconds a refresh spent planning, probing and committing (its ``plan``, ``probe``
    and ``commit`` phases), or None when it did not commit."""
    if not phases or "commit" not in phases:
        return None
    return int(phases.get("plan") or 0) + int(phases.get("probe") or 0) + int(phases["commit"])


def observed_times(records, planner: int | None = None) -> ObservedTimes:
    """:class:`ObservedTimes` from history records, newest first (``RefreshRecord``-like: ``action``,
    ``status``, ``phases``; a DIFFERENTIAL's ``phases`` carries ``changed_rows``): the fastest of
    the newest :data:`SAMPLES` of each kind.  With ``planner`` (:func:`delta_planner`), only the
    DIFFERENTIAL refreshes measured under it count: one measured by other code, or with the
    arrangements turned the other way, is measured again.  A top-K's DIFFERENTIAL that read
    beyond its boundary (``phases["beyond_boundary"]``: a row left the top k, so its commit
    recomputed its rows from the query) counts with its ``plan`` and ``probe`` only, what its
    delta cost before the recompute: one crossing, right after an upgrade, sent TPC-H q10 FULL
    (15 s measured, 5-6 s FULL) for up to :data:`REMEASURE_AFTER` refreshes where its deltas
    take 2.3 s; q21's crossings spend 43 s before it, and still count as slower than its FULL.

    >>> from types import SimpleNamespace as R
    >>> observed_times([R(action="FULL", status="COMPLETED", phases={"plan": 0, "commit": 3700}),
    ...                 R(action="NO_DATA", status="COMPLETED", phases={}),
    ...                 R(action="DIFFERENTIAL", status="COMPLETED", phases={"plan": 400, "commit": 5100, "changed_rows": 2000}),
    ...                 R(action="FULL", status="COMPLETED", phases={"commit": 4300})])
    ObservedTimes(differential_ms=5500, differential_changed=2000, full_ms=3700, fulls_since=1)
    >>> crossed = R(action="DIFFERENTIAL", status="COMPLETED",
    ...             phases={"plan": 1800, "probe": 400, "commit": 12700, "changed_rows": 9000, "beyond_boundary": 1})
    >>> observed_times([crossed]).differential_ms
    2200
    """
    differentials: list[tuple[int, int]] = []
    fulls: list[int] = []
    fulls_since = 0
    for record in records:
        if str(record.status) != "COMPLETED":
            continue
        action, took = str(record.action), spark_ms(record.phases)
        if took is None:
            continue
        if action in ("FULL", "REINITIALIZE"):
            fulls_since += not differentials
            if len(fulls) < SAMPLES:
                fulls.append(took)
        elif (action == "DIFFERENTIAL" and len(differentials) < SAMPLES and record.phases.get("changed_rows") is not None
              and (planner is None or record.phases.get("planner") == planner)):
            if record.phases.get("beyond_boundary"):  # what the delta cost before the recompute
                took = int(record.phases.get("plan") or 0) + int(record.phases.get("probe") or 0)
            differentials.append((took, int(record.phases["changed_rows"])))
        if len(differentials) == SAMPLES and len(fulls) == SAMPLES:
            break
    fastest = min(differentials, default=(None, None))
    return ObservedTimes(fastest[0], fastest[1], min(fulls, default=None), fulls_since, tuple(differentials))


def remeasure_after(differential_ms: int, full_ms: int, most: int = MAX_REMEASURE_AFTER) -> int:
    """FULL refreshes in a row after which a delta measured at ``differential_ms`` (its FULL
    taking ``full_ms``) is measured again: :data:`REMEASURE_AFTER`, more when the delta is so
    slow that measuring it that often would add more than :data:`REMEASURE_OVERHEAD` of the
    FULLs' time, at most ``most``.

    >>> remeasure_after(5_500, 3_700), remeasure_after(7_155, 1_655), remeasure_after(39_500, 2_200)
    (8, 34, 40)
    """
    excess = differential_ms / max(full_ms, 1) - 1
    return min(most, max(REMEASURE_AFTER, math.ceil(round(excess / REMEASURE_OVERHEAD, 6))))


def slower_than_full(changed_rows: int, observed: ObservedTimes, *, max_time_ratio: float) -> str | None:
    """Why this refresh recomputes because the delta was measured slower than recomputing, or
    None: when the (fastest recent) DIFFERENTIAL of this stream table, for a change at least half
    as large as this one, took more than ``max_time_ratio`` times its (fastest recent) FULL.

    The rows a delta touches (:func:`full_is_cheaper`) do not show what its joins cost: each
    term joins one input's change with the whole of the others, so on tables of a few million
    rows a delta can cost more than the query (TPC-H at SF 1: 19 of 19 queries).  The history
    shows it.  After :data:`REMEASURE_AFTER` FULL refreshes in a row (more for a delta far
    slower: :func:`remeasure_after`) a DIFFERENTIAL runs again, so a measurement made on other
    data does not decide forever.

    >>> seen = ObservedTimes(differential_ms=5500, differential_changed=2000, full_ms=3700)
    >>> print(slower_than_full(1900, seen, max_time_ratio=1.0))
    its DIFFERENTIAL refreshes took 5.5 s (2,000 changed source rows), its FULL ones 3.7 s (the fastest of the last 3 of each); recomputed (differential_max_time_ratio 1)
    >>> slower_than_full(500, seen, max_time_ratio=1.0) is None  # a much smaller change: try the delta
    True

    The fastest sample of a change at most twice as large decides, not the fastest of all: a
    delta measured once over a window of many cycles (TPC-H q20 at SF 3: 35 s for 461k changed
    rows) does not speak for a small window, nor may it hide the small windows' samples (50 s
    and 42 s for 28k rows, against a 2.2 s FULL).

    >>> piled = ObservedTimes(35_100, 461_015, 2_200, 0, ((35_100, 461_015), (50_300, 28_425), (41_800, 28_311)))
    >>> slower_than_full(28_366, piled, max_time_ratio=1.0).split("),")[0]
    'its DIFFERENTIAL refreshes took 41.8 s (28,311 changed source rows'
    """
    if observed.differential_ms is None or observed.full_ms is None:
        return None
    samples = observed.samples or ((observed.differential_ms, observed.differential_changed or 0),)
    comparable = [(ms, changed) for ms, changed in samples if 2 * changed_rows >= changed]
    if not comparable:
        return None
    took, changed = min(comparable)
    if took <= max_time_ratio * max(observed.full_ms, 1):
        return None
    if observed.fulls_since >= remeasure_after(took, observed.full_ms):
        return None
    return (f"its DIFFERENTIAL refreshes took {took / 1000:.1f} s "
            f"({changed:,} changed source rows), its FULL ones "
            f"{observed.full_ms / 1000:.1f} s (the fastest of the last {SAMPLES} of each); recomputed "
            f"(differential_max_time_ratio {max_time_ratio:g})")


def describe_times(observed: ObservedTimes, *, max_time_ratio: float) -> str:
    """What the time rule knows and would do, in one line (``explain``).

    >>> print(describe_times(ObservedTimes(5500, 2000, 3700), max_time_ratio=1.0))
    DIFFERENTIAL 5.5 s (2,000 changed source rows), FULL 3.7 s (the fastest of the last 3 of each): a change of 1,000 rows or more runs FULL
    >>> print(describe_times(ObservedTimes(800, 20, 3700), max_time_ratio=1.0))
    DIFFERENTIAL 0.8 s (20 changed source rows), FULL 3.7 s (the fastest of the last 3 of each): the delta runs
    >>> print(describe_times(ObservedTimes(full_ms=3700), max_time_ratio=1.0))
    no DIFFERENTIAL refresh measured yet (FULL 3.7 s): the delta runs
    """
    if observed.differential_ms is None or observed.full_ms is None:
        seen = f" (FULL {observed.full_ms / 1000:.1f} s)" if observed.full_ms is not None else ""
        missing = "DIFFERENTIAL" if observed.differential_ms is None else "FULL"
        return f"no {missing} refresh measured yet{seen}: the delta runs"
    text = (f"DIFFERENTIAL {observed.differential_ms / 1000:.1f} s ({observed.differential_changed:,} changed "
            f"source rows), FULL {observed.full_ms / 1000:.1f} s (the fastest of the last {SAMPLES} of each): ")
    smallest = -(-(observed.differential_changed or 0) // 2)  # the smallest change the rule sends FULL
    if slower_than_full(observed.differential_changed or 0, observed, max_time_ratio=max_time_ratio) is None:
        if (observed.fulls_since >= remeasure_after(observed.differential_ms, observed.full_ms)
                and observed.differential_ms > max_time_ratio * observed.full_ms):
            return text + f"after {observed.fulls_since} FULL refreshes the next runs DIFFERENTIAL to measure it again"
        return text + "the delta runs"
    return text + f"a change of {smallest:,} row{'s' if smallest != 1 else ''} or more runs FULL"

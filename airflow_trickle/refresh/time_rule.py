"""The time rule: is this table's delta, as measured, slower than recomputing it?  Pure
functions over its refresh history, no Spark.

Estimates (``refresh/cost.py``) say what a change should cost; a table's own history says what
its deltas and recomputes did cost.  The rule compares a change with the DIFFERENTIAL refreshes
measured on changes about as large, and measures the delta again after a run of FULL refreshes:
the sources, the table and the changes move on, and a measurement goes stale.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

#: FULL refreshes the time rule may choose in a row before one DIFFERENTIAL measures the delta
#: again (the sources, the table and the changes move on; a measurement goes stale).
REMEASURE_AFTER = 8
#: ...or more, for a delta measured far slower than recomputing: as many as keep the measuring
#: refresh's extra time to this share of the FULLs' (on average): a delta several times its FULL,
#: measured every 9th refresh, made the refreshes a third dearer.
REMEASURE_OVERHEAD = 0.1
#: ...but never more than this: the tables grow, the changes shrink (and the rule reads the
#: newest 50 refreshes of the history: ``refresh/apply.recent_times``).
MAX_REMEASURE_AFTER = 40
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


#: The version of the code that decides what a delta costs -- the DVM's plans, and how a refresh
#: looks its inputs up and commits them.  Bump it in any change that makes a delta cheaper or
#: dearer: the time rule compares only measurements made under the current version (a delta
#: measured slow before its inputs were arranged kept its table FULL after the upgrade that made
#: it cheap), and one measured under another is measured again.
PLANNER_VERSION = 2


def delta_planner(arranged: bool) -> int:
    """What a DIFFERENTIAL refresh is measured under, as one number its history row keeps
    (``phases["planner"]``): :data:`PLANNER_VERSION`, and whether join inputs are probed
    through arrangements.

    >>> delta_planner(True), delta_planner(False)
    (21, 20)
    """
    return PLANNER_VERSION * 10 + int(arranged)


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
    delta cost before the recompute: counted whole, one crossing right after an upgrade would
    send a top-K whose deltas are cheap FULL for up to :data:`REMEASURE_AFTER` refreshes, while a
    delta dear before the recompute still counts as dear.

    The milliseconds a DIFFERENTIAL spent building arrangements (``phases["arrange"]``) count
    where two of the newest DIFFERENTIAL refreshes built: a warm host builds once, and that
    build is no cost of its deltas; a cold host -- a new worker pod, a cache that evicts what it
    needs -- builds at every refresh, and pays for it each time.

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
    measured: list[tuple[int, int, int]] = []  # (ms, changed rows, ms building arrangements)
    fulls: list[int] = []
    fulls_since = 0
    for record in records:
        if str(record.status) != "COMPLETED":
            continue
        action, took = str(record.action), spark_ms(record.phases)
        if took is None:
            continue
        if action in ("FULL", "REINITIALIZE"):
            fulls_since += not measured
            if len(fulls) < SAMPLES:
                fulls.append(took)
        elif (action == "DIFFERENTIAL" and len(measured) < SAMPLES and record.phases.get("changed_rows") is not None
              and (planner is None or record.phases.get("planner") == planner)):
            if record.phases.get("beyond_boundary"):  # what the delta cost before the recompute
                took = int(record.phases.get("plan") or 0) + int(record.phases.get("probe") or 0)
            measured.append((took, int(record.phases["changed_rows"]), int(record.phases.get("arrange") or 0)))
        if len(measured) == SAMPLES and len(fulls) == SAMPLES:
            break
    measured = measured[:SAMPLES]
    # builds count where they recur: a host whose arrangements do not stay (a new worker pod, an
    # evicting cache) pays for them at every refresh
    recurring = sum(1 for _, _, built in measured if built) >= 2
    differentials = [(took + (built if recurring else 0), changed) for took, changed, built in measured]
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
    rows a delta can cost more than the query (benchmarks/README.md, "TPC-H at SF 1, 22 queries
    (`tpch.py --scale 1`, 2026-11-27, evening) — before").  The history shows it.  After :data:`REMEASURE_AFTER` FULL refreshes in a row (more for a delta far
    slower: :func:`remeasure_after`) a DIFFERENTIAL runs again, so a measurement made on other
    data does not decide forever.

    >>> seen = ObservedTimes(differential_ms=5500, differential_changed=2000, full_ms=3700)
    >>> print(slower_than_full(1900, seen, max_time_ratio=1.0))
    its DIFFERENTIAL refreshes took 5.5 s (2,000 changed source rows), its FULL ones 3.7 s (the fastest of the last 3 of each); recomputed (differential_max_time_ratio 1)
    >>> slower_than_full(500, seen, max_time_ratio=1.0) is None  # a much smaller change: try the delta
    True

    The fastest sample of a change at most twice as large decides, not the fastest of all: a
    delta measured once over a window of many cycles does not speak for a small window, nor may
    it hide the small windows' samples.

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

"""Monotone cycles: refresh the stream tables of a cycle until nothing changes (seed 002 §5).

Every query on an allowed cycle is monotone (checked when the cycle is formed), so repeated
refreshes only add what the previous pass derived and the cycle settles at its fixpoint: each
member equals its query over the others.  A pass refreshes the members in order; the refresh
stops after the first pass in which no member changed a row.  Members read one another at
their latest refresh versions, and a member whose sources moved only by empty commits is
``NO_DATA`` without a Spark job, so the last, quiet pass is cheap.  A cycle that keeps
producing rows (a UNION ALL that re-derives its own rows) is stopped after
``max_fixpoint_iterations`` passes with an error.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from airflow_trickle.errors import RefreshError
from airflow_trickle.refresh.engine import Environment, RefreshResult, refresh_stream_table


@dataclass
class FixpointResult:
    members: list[str]
    passes: int
    #: Each member's refreshes, one per pass.
    results: dict[str, list[RefreshResult]] = field(default_factory=dict)


def refresh_to_fixpoint(env: Environment, members: list[str], *, mode: str | None = None,
                        initiated_by: str = "MANUAL") -> FixpointResult:
    limit = max(1, int(env.config.max_fixpoint_iterations))
    outcome = FixpointResult(members=list(members), passes=0, results={m: [] for m in members})
    for number in range(1, limit + 1):
        changed = False
        for member in members:
            # a requested mode (FULL, REINITIALIZE) applies to the first pass; later passes follow up
            result = refresh_stream_table(env, member, mode=mode if number == 1 else None, initiated_by=initiated_by)
            outcome.results[member].append(result)
            changed |= bool(result.rows_inserted or result.rows_deleted)
        outcome.passes = number
        if not changed:
            return outcome
    raise RefreshError(f"the cycle {' -> '.join(members + members[:1])} did not reach a fixpoint in {limit} passes",
                       stream_table=members[0],
                       hint="its queries keep deriving new rows (UNION ALL re-deriving its own rows?); "
                            "raise max_fixpoint_iterations or change the queries")

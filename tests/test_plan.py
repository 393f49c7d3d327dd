"""The execution plan's choices, without a JVM (``refresh/plan.py``): the committer and why,
a departure recorded as a fallback, the plan as the history keeps it."""
from __future__ import annotations

from dataclasses import replace
from types import SimpleNamespace

from airflow_trickle.config import TrickleConfig
from airflow_trickle.model import Action
from airflow_trickle.options import Placement, TableOptions
from airflow_trickle.refresh.cost import ChangeEstimate
from airflow_trickle.refresh.lookup import PartPath
from airflow_trickle.refresh.plan import (Committer, ExecutionPlan, PlannedCommit, PlannedPart, ReadPath,
                                          StoredRead, plan_commit)
from airflow_trickle.refresh.writers import Append, LocalMerge


def st(**options):
    return SimpleNamespace(options=TableOptions.parse(options, stream_table="s.t"), location=None)


def env(**settings):
    return SimpleNamespace(config=TrickleConfig(**settings))


def committed(*, table=None, environment=None, estimate=ChangeEstimate(50, 10_000, 1_000), unwritable=None):
    return plan_commit(environment or env(), table or st(), Action.DIFFERENTIAL, estimate, unwritable=unwritable)


def test_the_committer_is_delta_rs_for_a_small_change_and_spark_with_the_reason_otherwise():
    assert committed() == PlannedCommit(Committer.DELTA_RS, "~50 stored rows touched", rows=50)
    assert committed(table=st(placement="spark")).reason == "placement: spark"
    assert committed(environment=env(local_commit_max_rows=0)).reason == "local_commit_max_rows is 0"
    assert committed(estimate=None).reason == "the change's size is not known"
    large = committed(estimate=ChangeEstimate(50, 10_000, 1_000, fanout=4_000.0))
    assert (large.committer, large.rows) == (Committer.SPARK, 200_000)
    assert "above local_commit_max_rows 100,000" in large.reason
    mapped = committed(unwritable="column mapping")
    assert (mapped.committer, mapped.reason) == (Committer.SPARK, "delta-rs does not write this table: column mapping")


def test_a_departure_from_the_plan_is_a_fallback_and_the_plan_is_kept_as_json():
    commit = replace(committed(), stored_read=StoredRead.BY_KEYS)
    planned = ExecutionPlan(Action.DIFFERENTIAL, Placement.AUTO, commit,
                            parts=(PlannedPart("s.o change", ReadPath.PROBED, "a large input", rows=5, bytes=900),))
    taken = PartPath("s.o change", ReadPath.SCANNED, detail="Stale: a scan is cheaper", planned=ReadPath.PROBED)
    kept = PartPath("s.c change", ReadPath.PROBED, rows=3, detail=": probed o 2", planned=ReadPath.PROBED)
    assert kept.fallback() is None
    done = planned.with_fallbacks([taken.fallback()])
    assert done.to_dict() == {
        "action": "DIFFERENTIAL", "placement": "auto",
        "commit": {"committer": "delta-rs", "reason": "~50 stored rows touched", "rows": 50, "bytes": None,
                   "stored_read": "stored rows read by key"},
        "parts": [{"part": "s.o change", "path": "probed", "reason": "a large input", "rows": 5, "bytes": 900}],
        "fallbacks": [{"part": "s.o change", "planned": "probed", "taken": "scanned",
                       "cause": "Stale: a scan is cheaper"}]}
    assert done.lines()[1:] == ["commit: delta-rs (~50 stored rows touched; stored rows read by key)",
                                "s.o change: probed (a large input; ~5 rows, ~900 bytes to arrange)",
                                "fallback: s.o change planned probed, ran scanned: Stale: a scan is cheaper"]
    # the writer chosen once the delta is known: an append commits by Spark, whatever was planned
    assert done.written_by(LocalMerge("MERGE ...")) is done
    appended = done.written_by(Append("INSERT ..."))
    assert (appended.commit.committer, appended.commit.reason) == (Committer.SPARK, Append.what)

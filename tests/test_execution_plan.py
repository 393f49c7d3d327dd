"""One execution plan per refresh (``refresh/plan.py``): each bound that keeps rows and bytes out
of the refreshing process, forced to 0 in turn, sends its path to Spark -- the refresh stays
exact and its history says why -- and a departure from the plan is recorded as a fallback.
A cold host (a new arrangement folder at every refresh, as a fresh worker pod has) pays for
its builds, and the time rule sees it."""
from __future__ import annotations

import time

import pytest

from airflow_trickle.errors import DefinitionError
from airflow_trickle.refresh import plan
from airflow_trickle.refresh.time_rule import observed_times, spark_ms
from airflow_trickle.storage.arrangement import Arrangement
from tests.oracle import workload

JOIN = "SELECT o.id, o.amount, c.region FROM {db}.o o JOIN {db}.c c ON o.cid = c.id"


@pytest.fixture
def joined(tr, db, tmp_path, monkeypatch):
    """A join of ``o`` and ``c`` whose deltas look ``c`` up through an arrangement."""
    monkeypatch.setattr(tr.config, "arrangement_min_rows", 0)
    monkeypatch.setattr(tr.config, "arrangement_dir", str(tmp_path / "arrangements"))
    return workload(tr, db, ["o", "c"], {"joined": JOIN})


def refreshed(tr, load, step: int):
    """A change of ``o`` (new orders of customers 1 and 2, and an order's amount updated: not an
    append), the table refreshed and checked; its result and its history row's plan."""
    name = f"{load.db}.joined"
    load.insert("o", [(100 + step, 1, step, "1.00"), (200 + step, 2, step, None)])
    tr.sql(f"UPDATE {load.db}.o SET amount = amount + 1 WHERE id = 1")
    result = tr.refresh_stream_table(name)
    assert (result.status, result.action) == ("COMPLETED", "DIFFERENTIAL"), result
    load.check(name)
    [recorded] = tr.history(name, limit=1)
    assert recorded.plan == {**result.plan.to_dict(), "taken": [p.to_dict() for p in result.paths]}
    return result, recorded.plan


def part(recorded: dict, name_end: str) -> dict:
    return next(p for p in recorded["parts"] if p["part"].endswith(name_end))


def test_each_bound_forced_to_zero_runs_the_distributed_path_and_a_decline_is_a_fallback(tr, db, joined, tmp_path,
                                                                                         monkeypatch):
    result, recorded = refreshed(tr, joined, 1)
    assert part(recorded, "o change")["path"] == "probed" and recorded["commit"]["committer"] == "delta-rs"
    assert recorded["commit"]["stored_read"] == "stored rows shipped whole"  # a small stored table
    assert part(recorded, "o change")["bytes"] > 0  # a cold host: c's arrangement is built first
    assert part(recorded, "o change read once")["path"] == "read once"
    assert not recorded["fallbacks"]
    assert tr.sql(f"DESCRIBE HISTORY {db}.joined LIMIT 1").first().engineInfo.startswith("delta-rs")

    bounds = [  # (what is forced to 0, the part it moves, what the history says)
        (lambda p: p.setattr(plan, "MAX_CHANGE_ROWS", 0), "o change", "above 0: Spark joins it"),
        (lambda p: p.setattr(plan, "MAX_CHANGE_VIEW_ROWS", 0), "o change read once", "Spark reads the feed"),
        (lambda p: (p.setattr(tr.config, "arrangement_build_max_bytes", 0),
                    p.setattr(tr.config, "arrangement_dir", str(tmp_path / "cold"))),
         "o change", "above arrangement_build_max_bytes 0"),
    ]
    for step, (force, moved, why) in enumerate(bounds, start=2):
        with monkeypatch.context() as patch:
            force(patch)
            result, recorded = refreshed(tr, joined, step)
        assert part(recorded, moved)["path"] == "scanned" and why in part(recorded, moved)["reason"], recorded
        assert not any(p.path == "probed" and p.part.endswith(moved) for p in result.paths)

    with monkeypatch.context() as patch:
        patch.setattr(tr.config, "local_commit_max_bytes", 0)
        _, recorded = refreshed(tr, joined, 10)
    assert recorded["commit"]["committer"] == "spark" and "local_commit_max_bytes 0" in recorded["commit"]["reason"]
    assert not tr.sql(f"DESCRIBE HISTORY {db}.joined LIMIT 1").first().engineInfo.startswith("delta-rs")

    with monkeypatch.context() as patch:
        patch.setattr(tr.config, "local_commit_max_rows", 0)
        _, recorded = refreshed(tr, joined, 11)
    assert recorded["commit"] == {"committer": "spark", "reason": "local_commit_max_rows is 0",
                                  "rows": None, "bytes": None, "stored_read": None}

    # a lookup planned but declined on the way is a fallback, in the history and in explain
    with monkeypatch.context() as patch:
        # any row found is more than a scan is worth: the probe declines once it has counted them
        patch.setattr(plan, "PROBED_ROWS_FLOOR", 0)
        patch.setattr(plan, "MAX_PROBED_SHARE", 0)
        _, recorded = refreshed(tr, joined, 12)
    assert part(recorded, "o change")["path"] == "probed"  # planned so...
    [fallback] = [f for f in recorded["fallbacks"] if f["part"].endswith("o change")]
    assert (fallback["planned"], fallback["taken"]) == ("probed", "scanned")  # ... but scanned
    assert "a scan is cheaper" in fallback["cause"]
    explained = tr.explain(f"{db}.joined")
    assert "fallbacks of the last refresh that ran" in explained["text"] and "a scan is cheaper" in explained["text"]
    joined.insert("o", [(300, 1, 3, None)])
    explained = tr.explain(f"{db}.joined")  # the plan of the pending change, from the logs
    assert explained["plan"]["commit"]["committer"] == "delta-rs"
    assert part(explained["plan"], "o change")["path"] == "probed"
    assert "plan of the next refresh" in explained["text"]

    # placement: spark -- nothing of the table's rows through the refreshing process
    tr.alter_stream_table(f"{db}.joined", options={"placement": "spark"})
    result, recorded = refreshed(tr, joined, 13)
    assert recorded["placement"] == "spark" and recorded["parts"]
    assert {p["path"] for p in recorded["parts"]} == {"scanned"}
    assert {p["reason"] for p in recorded["parts"]} == {"placement: spark"}
    assert recorded["commit"]["committer"] == "spark" and result.paths
    assert not tr.sql(f"DESCRIBE HISTORY {db}.joined LIMIT 1").first().engineInfo.startswith("delta-rs")
    with pytest.raises(DefinitionError, match="placement"):
        tr.alter_stream_table(f"{db}.joined", options={"placement": "driver"})


def test_a_cold_host_pays_for_its_builds_and_the_time_rule_sees_it(tr, db, joined, tmp_path, monkeypatch):
    """Two deltas, each on a new arrangement folder (a new worker pod), with a build that costs
    what building a large table's arrangement does: the plan counts the bytes to build, the
    history the build's time, and the time rule -- which forgave the first build -- now sees the
    deltas dearer than recomputing, and the next refresh runs FULL, saying why."""
    monkeypatch.setattr(tr.config, "differential_max_time_ratio", 1.0)  # the suite turns the rule off
    full = tr.refresh_stream_table(f"{db}.joined", "FULL")  # a FULL measured warm
    # a build that costs what reading a large table into the process does: three FULLs' time,
    # however fast or loaded this host is
    build_ms = max(1500, 3 * spark_ms(full.phases))
    real_build = Arrangement.build.__func__

    def slow_build(cls, *args, **kwargs):
        time.sleep(build_ms / 1000)
        return real_build(cls, *args, **kwargs)

    monkeypatch.setattr(Arrangement, "build", classmethod(slow_build))

    def change(step: int) -> None:
        monkeypatch.setattr(tr.config, "arrangement_dir", str(tmp_path / f"pod{step}"))
        joined.insert("o", [(100 + step, 1, step, "1.00")])
        tr.sql(f"UPDATE {db}.o SET amount = amount + 1 WHERE id = 1")

    measured = []
    for step in (1, 2):  # the deltas measured (asked for: the rule does not choose them)
        change(step)
        assert tr.refresh_stream_table(f"{db}.joined", "DIFFERENTIAL").action == "DIFFERENTIAL"
        joined.check(f"{db}.joined")
        [recorded] = tr.history(f"{db}.joined", limit=1)
        assert part(recorded.plan, "o change")["bytes"] > 0  # the build is in the plan
        assert recorded.phases["arrange"] >= build_ms  # and in its time
        measured.append(recorded.phases)
        seen = observed_times(tr.history(f"{db}.joined", limit=50))
        if step == 1:  # one build is forgiven: a warm host builds once
            assert seen.differential_ms == spark_ms(recorded.phases)
        else:  # two are what this host's deltas cost
            assert seen.differential_ms == min(spark_ms(p) + p["arrange"] for p in measured) > build_ms
    change(3)
    result = tr.refresh_stream_table(f"{db}.joined")
    assert result.action == "FULL" and "its DIFFERENTIAL refreshes took" in result.reason, result
    joined.check(f"{db}.joined")

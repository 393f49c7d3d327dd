"""What a run refreshes: trigger-form parameters, due checks, freshness (pure, milliseconds)."""
from __future__ import annotations

import re
from datetime import datetime, timedelta, timezone

import pytest

from airflow_trickle.errors import InvalidParameterError
from airflow_trickle.project.planning import freshness_miss, is_due, select
from airflow_trickle.project import define_project

NOW = datetime(2026, 11, 26, 12, 0, tzinfo=timezone.utc)


@pytest.fixture(scope="module")
def chain():
    # s.a -> s.b -> s.c, plus s.x on its own; s.b has no schedule (CALCULATED from s.c's 10m)
    return define_project("p", warehouse="/wh", stream_tables=[
        {"name": "s.a", "query": "SELECT * FROM s.src", "schedule": "1m"},
        {"name": "s.b", "query": "SELECT * FROM s.a", "schedule": None},
        {"name": "s.c", "query": "SELECT * FROM s.b", "schedule": "10m"},
        {"name": "s.x", "query": "SELECT * FROM s.src", "schedule": "0 * * * *"},
    ])


def test_scheduled_runs_visit_everything_whatever_the_params(chain):
    selection = select(chain, {"tables": ["s.a"], "mode": "FULL"}, manual=False)
    assert selection.tables == {"s.a", "s.b", "s.c", "s.x"} and selection.mode == "AUTO" and not selection.forced


def test_manual_selection_with_upstream_and_downstream(chain):
    assert select(chain, {"tables": ["s.b"]}, manual=True).tables == {"s.b"}
    assert select(chain, {"tables": ["s.b"], "include_upstream": True}, manual=True).tables == {"s.a", "s.b"}
    assert select(chain, {"tables": ["S.B"], "include_downstream": True}, manual=True).tables == {"s.b", "s.c"}
    everything = select(chain, {"tables": [], "mode": "reinitialize"}, manual=True)
    assert everything.tables == {"s.a", "s.b", "s.c", "s.x"} and everything.mode == "REINITIALIZE"
    assert everything.forced
    assert select(chain, {"tables": ["s.*"]}, manual=True).tables == {"s.a", "s.b", "s.c", "s.x"}


@pytest.mark.parametrize("params, text", [
    ({"tables": ["s.nope"]}, "'s.nope', which is not a stream table of project 'p' (choose from s.a, s.b, s.c, "
                             "s.x, s.*)"),
    ({"tables": ["t.*"]}, "'t.*', which is not a stream table"),
    ({"tables": ["not a name!"]}, "not a name!"),
    ({"tables": 7}, "must be a list"),
    ({"mode": "FASTER"}, "'mode' must be one of AUTO, FULL, DIFFERENTIAL or REINITIALIZE"),
    ({"include_upstream": "yes"}, "'include_upstream' must be true or false"),
    ({"table": ["s.a"], "mode": "FULL"}, "unknown run parameter 'table'"),
])
def test_bad_parameters_are_refused_with_the_reason(chain, params, text):
    with pytest.raises(InvalidParameterError, match=re.escape(text)):
        select(chain, params, manual=True)


def test_due_checks_follow_each_units_schedule_with_tolerance(chain):
    unit = {u.members[-1]: u for u in chain.units}
    assert is_due(chain, unit["s.a"], {"s.a": None}, NOW) == (True, "never refreshed")
    assert not is_due(chain, unit["s.a"], {"s.a": NOW - timedelta(seconds=50)}, NOW)[0]
    # a refresh that started 10 s late is still due at the next one-minute tick
    assert is_due(chain, unit["s.a"], {"s.a": NOW - timedelta(seconds=50)}, NOW, tolerance=timedelta(seconds=30))[0]
    assert is_due(chain, unit["s.b"], {"s.b": NOW - timedelta(minutes=10)}, NOW)[0]  # inherited 10m
    assert not is_due(chain, unit["s.b"], {"s.b": NOW - timedelta(minutes=9)}, NOW)[0]
    assert is_due(chain, unit["s.x"], {"s.x": NOW - timedelta(minutes=1)}, NOW)[0]  # cron: 12:00 passed
    assert not is_due(chain, unit["s.x"], {"s.x": NOW + timedelta(minutes=1)}, NOW + timedelta(minutes=2))[0]


def test_atomic_group_fires_on_its_policy():
    def diamond(policy):
        return define_project("p", warehouse="/wh", stream_tables=[
            {"name": "s.b", "query": "SELECT * FROM s.a", "schedule": "1m"},
            {"name": "s.c", "query": "SELECT * FROM s.a", "schedule": "10m"},
            {"name": "s.d", "query": "SELECT * FROM s.b JOIN s.c USING (k)", "schedule": "10m",
             "diamond_consistency": "atomic", "diamond_schedule_policy": policy}])

    last = {"s.b": NOW - timedelta(minutes=2), "s.c": NOW - timedelta(minutes=2), "s.d": NOW - timedelta(minutes=2)}
    fastest = diamond("fastest")
    (group,) = fastest.units
    assert group.schedule_policy == "fastest" and is_due(fastest, group, last, NOW)[0]
    slowest = diamond("slowest")
    (group,) = slowest.units
    assert group.schedule_policy == "slowest" and not is_due(slowest, group, last, NOW)[0]
    assert is_due(slowest, group, {k: NOW - timedelta(minutes=10) for k in last}, NOW)[0]


def test_freshness_miss_only_past_the_target():
    target = timedelta(minutes=2)
    assert freshness_miss("s.a", target, NOW - timedelta(minutes=1), NOW) is None
    assert freshness_miss("s.a", None, NOW - timedelta(days=1), NOW) is None
    miss = freshness_miss("s.a", target, NOW - timedelta(minutes=7, seconds=5), NOW)
    assert miss.staleness == timedelta(minutes=7, seconds=5)
    assert miss.message.startswith("stream table 's.a' missed its freshness target: its data is 7m5s old (target 2m")
    assert miss.as_dict()["staleness_seconds"] == 425

"""``trickle plan``'s decisions, over catalog rows made here (no JVM)."""
from __future__ import annotations

from airflow_trickle.catalog import Dependency, StreamTable
from airflow_trickle.options import TableOptions
from airflow_trickle.project import define_project
from airflow_trickle.project.plan import Change, Schema, plan_project

CHAIN = [{"name": "s.a", "query": "SELECT k, v FROM s.src WHERE v > 1", "schedule": "5m"},
         {"name": "s.b", "query": "SELECT k, SUM(v) AS total FROM s.a GROUP BY k", "schedule": "5m"}]


def project(*tables, name="shop", **keys):
    return define_project(name, warehouse="/wh", stream_tables=[dict(t) for t in (tables or CHAIN)], **keys)


def row(name, query, *, owner="shop", schedule="5m", mode="DIFFERENTIAL", options=None):
    return StreamTable(name, f"id-{name}", query, query, schedule, mode, mode, owner=owner,
                       options=TableOptions.parse(options, stream_table=name))


def registered(owner="shop"):
    rows = [row(t["name"], t["query"], owner=owner) for t in CHAIN]
    deps = [Dependency("s.a", "s.src", "TABLE", columns_used=["k", "v"]),
            Dependency("s.b", "s.a", "STREAM_TABLE", columns_used=["k", "v"])]
    return rows, deps


def changes(plan):
    return {t.name: t.change for t in plan.tables}


def test_a_new_project_creates_every_table_and_a_registered_one_is_unchanged():
    plan = plan_project(project(), [], [])
    assert changes(plan) == {"s.a": Change.CREATE, "s.b": Change.CREATE} and plan.has_changes
    plan = plan_project(project(), *registered())
    assert changes(plan) == {"s.a": Change.UNCHANGED, "s.b": Change.UNCHANGED} and not plan.has_changes
    assert plan.text() == "project shop: 2 stream tables, 2 unchanged, nothing to do"


def test_a_reformatted_query_with_comments_is_unchanged_and_an_edited_filter_is_an_alter():
    reformatted = {**CHAIN[0], "query": "select k,\n       v   -- the value\nfrom s.src\nwhere v > 1"}
    assert changes(plan_project(project(reformatted, CHAIN[1]), *registered()))["s.a"] == Change.UNCHANGED
    edited = {**CHAIN[0], "query": "SELECT k, v FROM s.src WHERE v > 2"}
    plan = plan_project(project(edited, CHAIN[1]), *registered())
    table = plan.tables[0]
    assert table.change == Change.ALTER and table.changes == ("query",) and table.schema is None  # no Spark here
    assert "alter     s.a: query" in plan.text()


def test_schedule_mode_and_options_changes_are_alters_that_say_what_changes():
    edited = {**CHAIN[0], "schedule": "1m", "refresh_mode": "AUTO", "options": {"strict": True}}
    table = plan_project(project(edited, CHAIN[1]), *registered()).tables[0]
    assert table.change == Change.ALTER and not table.query_changed
    assert table.changes == ("schedule 5m -> 1m", "refresh mode DIFFERENTIAL -> AUTO",
                             "options {} -> {'strict': True}")
    # an option the file no longer sets is a change too (the file is the truth)
    rows, deps = registered()
    rows[0] = row("s.a", CHAIN[0]["query"], options={"strict": True, "cluster_by": ["k"]})
    table = plan_project(project(), rows, deps).tables[0]
    assert table.changes == ("options {'strict': True, 'cluster_by': ['k']} -> {}",)
    from airflow_trickle.project.plan import wanted_options

    assert wanted_options(project().stream_tables["s.a"], rows[0].options).cluster_by == ()  # clustering turned off


def columns_of(new):
    """A stand-in for Spark's analysis: every table's stored columns, and ``new`` for the new query."""
    stored = {"s.a": [("k", "int"), ("v", "int")]}
    return lambda name, query: (stored[name], new)


def test_a_query_change_says_how_the_columns_change_and_which_readers_reinitialize():
    edited = {**CHAIN[0], "query": "SELECT k, v, v * 2 AS w FROM s.src"}
    same = plan_project(project(edited, CHAIN[1]), *registered(), columns=columns_of([("k", "int"), ("v", "int")]))
    assert same.tables[0].schema == Schema.SAME and not same.tables[0].reinitialized
    added = plan_project(project(edited, CHAIN[1]), *registered(),
                         columns=columns_of([("k", "int"), ("v", "int"), ("w", "int")]))
    assert added.tables[0].schema == Schema.COMPATIBLE and added.tables[0].schema_detail == "adds w"
    assert not added.tables[0].reinitialized and not added.refusals
    retyped = plan_project(project(edited, CHAIN[1]), *registered(),
                           columns=columns_of([("k", "int"), ("v", "bigint")]), rows_of=lambda name: 1234)
    table = retyped.tables[0]
    assert table.schema == Schema.INCOMPATIBLE and table.schema_detail == "v: int -> bigint"
    assert [(r.name, r.rows) for r in table.reinitialized] == [("s.b", 1234)] and not table.refused
    assert "s.b reinitializes (a full recompute of 1,234 rows)" in retyped.text()
    removed = plan_project(project(edited, CHAIN[1]), *registered(), columns=columns_of([("k", "int")]))
    assert removed.tables[0].refused == "a reader would break: s.b uses v"


def test_a_removed_table_is_reported_and_dropped_only_with_prune():
    plan = plan_project(project(CHAIN[0]), *registered())
    assert changes(plan) == {"s.a": Change.UNCHANGED, "s.b": Change.REMOVE} and not plan.prune
    assert "apply with --prune" in plan.text() and not plan.refusals
    assert plan_project(project(CHAIN[0], deploy={"prune": True}), *registered()).prune
    assert plan_project(project(CHAIN[0]), *registered(), prune=True).prune
    # a table it no longer declares that another table still reads is not removed from under it
    rows, deps = registered()
    plan = plan_project(project(CHAIN[1]), rows, deps)
    assert changes(plan)["s.a"] == Change.REMOVE and plan.tables[-1].refused == "read by s.b, which it does not remove"
    # tables of other projects, and unowned ones, are never removed
    assert Change.REMOVE not in changes(plan_project(project(CHAIN[0]), *registered(owner=None))).values()
    assert Change.REMOVE not in changes(plan_project(project(CHAIN[0], name="other"), *registered())).values()


def test_a_table_another_project_owns_is_refused_naming_the_owner_unless_adopted():
    rows, deps = registered(owner="billing")
    rows[0].owner_file = "/projects/billing/trickle.yaml"
    plan = plan_project(project(), rows, deps)
    assert [t.name for t in plan.refusals] == ["s.a", "s.b"]
    assert plan.refusals[0].refused.startswith("owned by project 'billing' (/projects/billing/trickle.yaml)")
    assert not plan_project(project(), rows, deps, adopt=True).refusals


def test_a_table_no_project_owns_is_claimed():
    plan = plan_project(project(), *registered(owner=None))
    assert all(t.claims for t in plan.tables) and plan.has_changes and "claimed by the project" in plan.text()
    assert plan.to_json()["tables"][0]["claims"] is True


def test_an_alter_interrupted_before_its_rows_were_replaced_is_finished_by_the_next_apply():
    rows, deps = registered()
    rows[0].needs_reinit = True  # the catalog holds the new query; the stored rows are the old one's
    table = plan_project(project(), rows, deps).tables[0]
    assert table.change == Change.ALTER and table.changes == ("reinitialize (its rows are not yet its query's)",)
    plan = plan_project(project(deploy={"on_change": "stop"}), rows, deps)
    assert plan.has_changes and not plan.file_changed and table.file_changes == ()  # no reason to stop a run

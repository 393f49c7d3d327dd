"""Execute a DIFFERENTIAL refresh's plan with Spark, up to the statement that commits it.

The DVM plans once (:func:`~airflow_trickle.dvm.delta_plan.plan_refresh`, no Spark); here the
plan's preparatory statements run, each result bound into the versions the next statement is
rendered with:

1. the parts of a recursive CTE's delta, each computed once into a local checkpoint.  Spark's
   recursion re-runs the inputs of its step at each iteration and inlines a CTE at each use: in
   one statement the change feeds were read at every iteration and the removal recursion run
   twice, 10-20x the cost of the recursion itself (``benchmarks/README.md``);
2. for a top-K: the groups its aggregates' input deltas touch, counted and, when few, written
   into the SQL as literals (Spark pushes ``column IN (values)`` down to the scans); then its
   candidates (the stored rows plus the delta), computed once: collected with their bag
   identities where they are few and ordered as Arrow orders them, so that the boundary probe,
   the new top k and its changes are decided in this process and delta-rs commits them
   (``refresh/local_topk.py``: two Spark statements fewer); else into a local checkpoint, which
   the boundary probe and the commit both read, so they cost one evaluation instead of two.

A local checkpoint lives with the session's executors: a lost executor fails the commit, which
is then retried whole.  The views are temporary and dropped after the commit (:func:`drop_views`).
"""
from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass

from airflow_trickle.storage.deltalog import insert_only_commits
from airflow_trickle.dvm.base import Unsupported, Versions
from airflow_trickle.dvm.delta_plan import DeltaPlan, PlanKind, plan_refresh
from airflow_trickle.model import CdcMode, SourceType, Strategy
from airflow_trickle.names import HIDDEN_PREFIX
from airflow_trickle.options import Placement
from airflow_trickle.refresh.local_bag import LocalBag
from airflow_trickle.refresh.local_topk import LocalTopK
from airflow_trickle.refresh import plan as bounds
from airflow_trickle.refresh.plan import placement_of
from airflow_trickle.refresh.schema import source_visible_columns
from airflow_trickle.storage.errors import UNREADABLE

log = logging.getLogger(__name__)


def source_columns(env, st) -> dict[str, list[str]]:
    """The visible columns of every source of ``st`` as they are now (base tables through Spark)."""
    return columns_of_sources(env.catalog, st.name,
                              lambda dep: [c for c, _ in source_visible_columns(env, dep)])


def columns_of_sources(catalog, name: str, base_table_columns) -> dict[str, list[str]]:
    """The visible columns of every source of ``name``: an upstream stream table's from the
    catalog, a base table's from ``base_table_columns(dependency)`` (Spark, or its Delta log
    where no Spark may run), hidden columns left out."""
    columns = {}
    for dep in catalog.dependencies(name):
        if dep.source_type == SourceType.STREAM_TABLE:
            upstream = catalog.get(dep.source_name)
            columns[dep.source_name] = list(upstream.output_columns) if upstream else []
        else:
            columns[dep.source_name] = [c for c in base_table_columns(dep) if not c.startswith(HIDDEN_PREFIX)]
    return columns


def refresh_versions(env, st, current: dict[str, int], columns: dict[str, list[str]] | None = None) -> Versions:
    """The versions a refresh's delta is computed between, and how each source's changes are
    read (raw change rows: every applier consolidates what it needs); ``columns``, the
    sources' visible columns, when the caller has already read them."""
    deps = env.catalog.dependencies(st.name)
    return Versions(old=st.frontier, new=current, columns=columns if columns is not None else source_columns(env, st),
                    use_cdf={d.source_name: d.cdc_mode == CdcMode.CDF for d in deps}, consolidate=False)


def sources_only_gained_rows(env, st, current: dict[str, int]) -> bool:
    """Whether every source that changed in the window only gained rows (its Delta log says so;
    an unreadable log says no, and the MERGE path applies)."""
    try:
        return all(insert_only_commits(env.catalog.at(d.source_location), st.frontier[d.source_name], current[d.source_name])
                   for d in env.catalog.dependencies(st.name)
                   if current.get(d.source_name) != st.frontier.get(d.source_name))
    except UNREADABLE:  # "no" means the MERGE path applies
        log.debug("%s: could not tell whether the new commits only insert", st.name, exc_info=True)
        return False


def plan_differential(env, st, current: dict[str, int]) -> tuple[DeltaPlan | None, str | None]:
    """The plan of a DIFFERENTIAL refresh of ``st`` to ``current`` (planned once), or
    ``(None, why not)``."""
    if set(st.frontier) != set(current):
        return None, "the set of sources differs from the frontier"
    bag = (st.storage.strategy or Strategy.BAG) == Strategy.BAG
    try:
        return plan_refresh(st, refresh_versions(env, st, current),
                            insert_only=bag and sources_only_gained_rows(env, st, current)), None
    except Unsupported as err:
        return None, f"cannot maintain differentially: {err}"


@dataclass(frozen=True)
class Prepared:
    """The statement that applies a delta, and how this process resolves its changes (a
    top-K's, decided already: ``refresh/local_topk.py``; a bag delta's, once delta-rs commits:
    ``refresh/local_bag.py``; delta-rs commits them where it writes the table, else Spark runs
    ``sql``, which is exact either way)."""

    sql: str
    local: LocalTopK | LocalBag | None = None
    #: A top-K's row left it: its rows are recomputed from the query (a recompute's cost, not
    #: the delta's: ``refresh/time_rule.observed_times`` weighs it so)
    beyond_boundary: bool = False


def statement(env, plan: DeltaPlan, scratch: list[str], versions: Versions | None = None,
              probe_groups=None, look_up_reach=None) -> Prepared:
    """Run ``plan``'s preparatory statements; the statement that applies the delta.

    ``versions``: the plan's, with what the refresh bound already (the inputs it probed:
    ``refresh/arranged.py``); ``probe_groups(block, versions)``, when given, returns the versions
    with the inputs of an aggregate's known touched groups probed too;
    ``look_up_reach(recursive, part, its view, versions)``, called with each part of a recursive
    CTE's delta once computed, the versions with what that part let the refresh look up bound
    (``refresh/arranged_recursion.py``).  The temporary views made on the way are named in
    ``scratch`` (dropped after the commit by :func:`drop_views`).  Raises
    :class:`~airflow_trickle.dvm.base.Unsupported` when the delta cannot be rendered.
    """
    v = versions or plan.versions
    for node, part in plan.checkpoints:
        view = _checkpoint(env, plan.part_sql(v, node, part), part, scratch)
        v = v.bound(v.bindings.with_part(node, part, view))
        if look_up_reach is not None:
            v = look_up_reach(node, part, view, v)
    if not plan.probes_boundary:
        bag_delta = plan.bag_delta_sql(v)
        here = (LocalBag(env.spark, bag_delta, env.config.local_commit_max_rows)
                if bag_delta is not None and placement_of(plan.st) is Placement.AUTO else None)
        return Prepared(plan.apply_sql(v), here)
    for block in plan.counted_groups:
        if (looked_up := v.bindings.group_rows(block)) is not None and looked_up.whole:  # every row of its touched groups is bound: nothing to count
            continue
        rows = env.engine.collect(plan.groups_sql(v, block, bounds.KNOWN_GROUPS_LIMIT))
        few = len(rows) <= bounds.KNOWN_GROUPS_LIMIT
        if few:
            v = v.bound(v.bindings.with_touched_groups(block, [tuple(row) for row in rows]))
            if probe_groups is not None:
                v = probe_groups(block, v)
        log.debug("groups touched: %s%s", len(rows), "" if few else " (too many to list)")
    local = _top_k_here(env, plan, v, scratch)
    if local is not None:
        return local
    candidates = _checkpoint(env, plan.candidates_sql(v), "__trickle_candidates", scratch)
    if env.engine.first(plan.probe_sql(v, candidates))[0]:
        return Prepared(plan.apply_sql(v, candidates=candidates))
    return _beyond_boundary(plan, v)


def _beyond_boundary(plan: DeltaPlan, v: Versions) -> Prepared:
    log.info("%s: a row left the top-K; its rows are recomputed from the query", plan.st.name)
    return Prepared(plan.apply_sql(v, beyond_boundary=True), beyond_boundary=True)


def _top_k_here(env, plan: DeltaPlan, v: Versions, scratch: list[str]) -> Prepared | None:
    """The top-K's candidates collected, its boundary probed and its changes resolved in this
    process (``refresh/local_topk.py``), or None where that does not apply: delta-rs does not
    write the stored table, commits by delta-rs are turned off, an ORDER BY column Arrow does not
    order as Spark does, or more than :data:`~airflow_trickle.refresh.plan.MAX_CANDIDATES`."""
    from airflow_trickle.refresh import local_topk
    from airflow_trickle.refresh.writable import writable_columns
    from airflow_trickle.refresh.stored_reads import at_most, spark_schema
    from airflow_trickle.sql.rewrite import hoist_nested_ctes
    from airflow_trickle.storage.deltalog import open_table

    top_k, st = plan.top_k, plan.st
    if env.config.local_commit_max_rows <= 0 or not st.location or placement_of(st) is Placement.SPARK:
        return None
    table = open_table(env.catalog.at(st.location))
    kinds = dict(writable_columns(table) or ())
    if not kinds or not set(top_k.columns) <= set(kinds):
        return None
    # The stored rows (k of them) are read here, by delta-rs, and handed to Spark: Spark reading
    # the stored table after delta-rs committed the last refresh would rebuild its snapshot first,
    # in jobs of its own.
    stored = local_topk.stored_rows(table, top_k.columns)
    stored_view = f"__trickle_stored_{uuid.uuid4().hex}"
    env.engine.local_relation(stored.select(top_k.columns), stored_view,
                              schema=spark_schema([(name, kinds[name]) for name in top_k.columns]))
    scratch.append(stored_view)
    sql = local_topk.candidates_with_identity_sql(plan.candidates_sql(v, stored_view), top_k.columns)
    frame = env.spark.sql(hoist_nested_ctes(sql))
    schema = frame.schema  # analysed, not run: an ORDER BY column of another type keeps Spark's path
    if not local_topk.orderable(schema, top_k.order):
        return None
    candidates = at_most(frame, bounds.MAX_CANDIDATES)
    if candidates is None:
        return None  # the checkpoint path computes them again: rare, and exact
    if not local_topk.covers_boundary(candidates, stored, top_k.order, top_k.limit):
        return _beyond_boundary(plan, v)
    view = f"__trickle_candidates_{uuid.uuid4().hex}"
    env.engine.local_relation(candidates, view, schema=schema)
    scratch.append(view)
    top = local_topk.top_copies(candidates, top_k.order, top_k.limit)
    return Prepared(plan.apply_sql(v, candidates=view), local_topk.LocalTopK(top, stored, table.version()))


def _checkpoint(env, sql: str, prefix: str, scratch: list[str]) -> str:
    """Compute ``sql`` once into a local checkpoint, as a temporary view named ``prefix_<id>``
    (appended to ``scratch``, dropped after the commit); the view's name."""
    view = f"{prefix}_{uuid.uuid4().hex}"
    env.engine.checkpoint(sql, view)
    scratch.append(view)
    return view


def drop_views(env, scratch: list[str]) -> None:
    """Drop the temporary views a refresh made (:func:`statement`)."""
    for view in scratch:
        env.engine.drop_view(view)
    scratch.clear()


def is_append(plan: DeltaPlan | None) -> bool:
    return plan is not None and plan.kind is PlanKind.APPEND

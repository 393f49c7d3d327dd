"""Differential view maintenance: operator trees, delta rules, and how deltas are applied.

``plan`` turns a qualified defining query into an operator tree (``plan.py``), ``apply``
turns a tree and two frontiers into one MERGE (``apply.py``).
"""
from __future__ import annotations

import logging

log = logging.getLogger(__name__)


def differential_blockers(defining_query: str, sources) -> list[str]:
    """Constructs in ``defining_query`` that DIFFERENTIAL refresh cannot maintain (empty: none)."""
    from airflow_trickle.dvm.planner import unsupported_constructs

    columns = {s.name: [c for c, _ in s.columns] for s in sources.values()} if sources else None
    return unsupported_constructs(defining_query, columns)


def source_columns(env, st) -> dict[str, list[str]]:
    """The visible columns of every source of ``st`` as they are now (base tables through Spark)."""
    from airflow_trickle.names import quote_name

    return columns_of_sources(env.catalog, st.name,
                              lambda dep: [f.name for f in env.spark.table(quote_name(dep.source_name)).schema.fields])


def columns_of_sources(catalog, name: str, base_table_columns) -> dict[str, list[str]]:
    """The visible columns of every source of ``name``: an upstream stream table's from the
    catalog, a base table's from ``base_table_columns(dependency)`` (Spark, or its Delta log
    where no Spark may run), hidden columns left out."""
    from airflow_trickle.names import HIDDEN_PREFIX

    columns = {}
    for dep in catalog.dependencies(name):
        if dep.source_type == "STREAM_TABLE":
            upstream = catalog.get(dep.source_name)
            columns[dep.source_name] = list(upstream.output_columns) if upstream else []
        else:
            columns[dep.source_name] = [c for c in base_table_columns(dep) if not c.startswith(HIDDEN_PREFIX)]
    return columns


def _refresh_versions(env, st, current: dict[str, int], deps, columns: dict[str, list[str]] | None = None):
    """The versions a refresh's delta is computed between, and how each source's changes are
    read (raw change rows: every applier consolidates what it needs); ``columns``, the
    sources' visible columns, when the caller has already read them."""
    from airflow_trickle.dvm.base import Versions

    return Versions(old=st.frontier, new=current, columns=columns if columns is not None else source_columns(env, st),
                    use_cdf={d.source_name: d.cdc_mode == "cdf" for d in deps}, consolidate=False)


def pending_versions(env, st, current: dict[str, int], columns: dict[str, list[str]]):
    """The versions of the change a refresh of ``st`` would apply now (``explain`` counts it),
    over the sources' visible ``columns`` as ``explain`` read them for its plan."""
    return _refresh_versions(env, st, current, env.catalog.dependencies(st.name), columns)


def differential_merge(env, st, current: dict[str, int], *,
                       scratch: list[str] | None = None) -> tuple[str | None, str | None]:
    """The MERGE applying the change from ``st.frontier`` to ``current``, or ``(None, why not)``.

    Given a ``scratch`` list (a refresh; ``explain`` passes none and runs nothing), a top-K
    first computes its candidates into a temporary view whose name is appended there, and
    probes them to learn whether a row left its top k, in which case its new rows are
    recomputed from the query; otherwise the MERGE reads the view.  The caller drops the views
    after the commit (:func:`drop_scratch_views`).
    """
    from airflow_trickle.dvm.apply import differential_merge_sql, top_k_of
    from airflow_trickle.dvm.base import Unsupported

    if set(st.frontier) != set(current):
        return None, "the set of sources differs from the frontier"
    versions = _refresh_versions(env, st, current, env.catalog.dependencies(st.name))
    try:
        top = top_k_of(st, versions.columns) if scratch is not None else None
        beyond, candidates = _top_k_boundary(env, st, top, versions, scratch) if top else (False, None)
        prepare = (lambda node: materialize_recursions(env, node, versions, scratch)) if scratch is not None else None
        return differential_merge_sql(st, versions, versions.columns, beyond_boundary=beyond,
                                      candidates=candidates, prepare=prepare), None
    except Unsupported as err:
        return None, f"cannot maintain differentially: {err}"


def _top_k_boundary(env, st, top, versions, scratch: list[str]) -> tuple[bool, str | None]:
    """Whether a row left the top k of ``st`` (its rows must be recomputed from the query), and
    the view holding the stored rows plus the delta when they suffice.

    Both the probe and the MERGE read the candidates (the stored rows plus the query's delta,
    which for an aggregate over joins reads the sources' states): computed once, into a local
    checkpoint, they cost one evaluation instead of two.  A local checkpoint lives with the
    session's executors, so a lost executor fails the commit, which is then retried whole.
    """
    from airflow_trickle.sql.rewrite import hoist_nested_ctes

    if top.boundary_probe(st.name, versions) is None:  # nothing to decide (an OFFSET, LIMIT 0)
        return False, None
    collect_affected_groups(env, top, versions)
    candidates = _checkpoint(env, top.candidates_sql(st.name, versions), "__trickle_candidates", scratch)
    if env.spark.sql(hoist_nested_ctes(top.boundary_probe(st.name, versions, candidates))).first()[0]:
        return False, candidates
    log.info("%s: a row left the top-K; its rows are recomputed from the query", st.name)
    return True, None


def materialize_recursions(env, node, versions, scratch: list[str]) -> None:
    """Compute the parts of every recursive CTE's delta in ``node`` once, into local
    checkpoints (temporary views named in ``scratch``) that the applying statement reads.

    Spark's recursion re-runs the inputs of its step at each iteration and inlines a CTE at
    each use: in one statement the change feeds were read at every iteration and the removal
    recursion run twice, 10-20x the cost of the recursion itself (measured on a 10,000-row org
    chart: 12-24 s for the delta against 2 s for the whole recursion).  When r_old is
    recomputed, r_old and E's table at both versions are parts too
    (:meth:`~airflow_trickle.dvm.recursive.Recursive.materialized_parts`), so the recursions'
    iterations read E from memory instead of scanning Delta at each one.
    """
    from airflow_trickle.dvm.recursive import Recursive

    for recursive in operators(node):
        if not isinstance(recursive, Recursive):
            continue
        for name in recursive.materialized_parts():
            recursive.views[name] = _checkpoint(env, recursive.part_sql(versions, name), name, scratch)


#: Up to this many groups touched by an aggregate's input delta are written into the SQL as
#: literals (:func:`collect_affected_groups`); more are left to a subquery.
KNOWN_GROUPS_LIMIT = 10_000


def collect_affected_groups(env, node, versions) -> None:
    """Count the groups each aggregate in ``node`` recomputes (those its input delta touches)
    and, when there are at most :data:`KNOWN_GROUPS_LIMIT`, give them to it as literals
    (``Block.known_groups``).

    An aggregate's delta recomputes its touched groups before and after the change, and a
    subquery naming them by hash is only applied once its inputs are joined: each side cost a
    join of the whole inputs.  Written as ``group column IN (values)``, the groups become
    filters Spark pushes down to the scans (and along the join's equalities), so each side
    reads only the rows of those groups; and the input delta is evaluated once, here, instead
    of in every place that names the groups.  Used for the aggregates under a top-K, whose
    candidates hold their delta: TPC-H q3 and q18 at SF 1, 28% and 35% faster (q10 the same);
    on the suite's tiny tables (SF 0.01) too, where the count's own Spark job might have
    outweighed it: q2, q3, q10, q18 and q21 refreshed in 36-39 s with the count, 40-41 s
    without (two warm rounds each, one JVM).  Elsewhere the extra Spark job that counts the
    groups cost about what it saved (q4, q13, q17: 1 to 9% slower), so it is not used there.
    """
    from airflow_trickle.dvm.block import Block
    from airflow_trickle.sql.parse import DIALECT

    for block in reversed(list(operators(node))):  # inner aggregates first: outer input deltas use theirs
        if not (isinstance(block, Block) and block.is_aggregate and block.group and block.window_keys is None):
            continue
        if not block.changed(versions):
            continue
        sql = block.affected_groups_with_values(versions, values=True).limit(KNOWN_GROUPS_LIMIT + 1)
        rows = env.spark.sql(sql.sql(DIALECT)).collect()
        few = len(rows) <= KNOWN_GROUPS_LIMIT
        if few:
            block.known_groups = [tuple(row) for row in rows]
        log.debug("groups touched: %s%s", len(rows), "" if few else " (too many to list)")


def _checkpoint(env, sql: str, prefix: str, scratch: list[str]) -> str:
    """Compute ``sql`` once into a local checkpoint, as a temporary view named ``prefix_<id>``
    (appended to ``scratch``, dropped after the commit); the view's name."""
    import uuid

    from airflow_trickle.sql.rewrite import hoist_nested_ctes

    view = f"{prefix}_{uuid.uuid4().hex}"
    env.spark.sql(hoist_nested_ctes(sql)).localCheckpoint().createOrReplaceTempView(view)
    scratch.append(view)
    return view


def operators(node):
    """``node`` and every operator under it, outermost first."""
    from airflow_trickle.dvm.base import Node

    yield node
    children = list(getattr(node, "children", None) or []) + [n for _, n in getattr(node, "items", None) or []]
    children += [getattr(node, a) for a in ("child", "base") if isinstance(getattr(node, a, None), Node)]
    for child in children:
        yield from operators(child)


def drop_scratch_views(env, scratch: list[str]) -> None:
    """Drop the temporary views a refresh made (:func:`differential_merge`)."""
    for view in scratch:
        try:
            env.spark.catalog.dropTempView(view)
        except Exception:  # noqa: BLE001 - a view left behind is only a name in this session
            log.debug("could not drop the temporary view %s", view, exc_info=True)
    scratch.clear()


def differential_append(env, st, current: dict[str, int], *, scratch: list[str] | None = None) -> str | None:
    """An INSERT applying the change when it can only add rows, else None.

    That holds for a bag stream table whose query is monotone (no aggregate, DISTINCT, outer
    join, ...) when every source that changed only gained rows in the window (appends, or
    insert-only MERGEs of an upstream stream table): the delta then has no negative weight.
    Given a ``scratch`` list (a refresh), a recursive CTE computes the parts of its delta first
    (:func:`materialize_recursions`).
    """
    from airflow_trickle.deltalog import insert_only_commits
    from airflow_trickle.dvm.bag import bag_append_sql
    from airflow_trickle.dvm.base import Unsupported
    from airflow_trickle.dvm.planner import plan
    from airflow_trickle.dvm.recursive import read_old_from_storage
    from airflow_trickle.sql.parse import non_monotone_constructs, parse_query
    from airflow_trickle.model import Strategy

    if (st.storage.strategy or Strategy.BAG) != Strategy.BAG or set(st.frontier) != set(current):
        return None
    deps = env.catalog.dependencies(st.name)
    try:
        if not all(insert_only_commits(d.source_location, st.frontier[d.source_name], current[d.source_name])
                   for d in deps if current[d.source_name] != st.frontier[d.source_name]):
            return None
    except Exception:  # noqa: BLE001 - an unreadable log: the MERGE path decides
        return None
    if non_monotone_constructs(parse_query(st.defining_query)):
        return None
    versions = _refresh_versions(env, st, current, deps)
    try:
        node = plan(st.defining_query, versions.columns)
        read_old_from_storage(node, st.name, st.output_columns)
        if scratch is not None:
            materialize_recursions(env, node, versions, scratch)
        return bag_append_sql(st.name, st.output_columns, node.delta_sql(versions),
                              seq=st.refresh_seq + 1, dup_type=st.storage.dup_type)
    except Unsupported:
        return None


def full_source(env, st, current: dict[str, int]) -> str | None:
    """Rows with identity and state for a FULL refresh of a keyed stream table (None for bags)."""
    if not st.storage.is_keyed:
        return None
    from airflow_trickle.dvm.apply import full_source_sql
    from airflow_trickle.dvm.base import Versions

    columns = source_columns(env, st)
    return full_source_sql(st, Versions(old=current, new=current, columns=columns), columns)

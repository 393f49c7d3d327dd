"""Probe a delta's inputs through arrangements instead of scanning them.

For each term of a join's delta that ``dvm/join_terms.py`` (and ``dvm/keyed.py``,
``dvm/outer_terms.py``, ``dvm/group_probes.py``) found probeable, and that is worth it (one of
the inputs it probes holds at least ``arrangement_min_rows`` rows), the refresh:

1. reads the change of the term's changed input with delta-rs (the window's change feed, the
   columns the block reads, each row with its weight);
2. probes each other input along the term's equalities, in order: the keys of the change, or of
   an input probed before, looked up in that input's arrangement at the version the term reads
   it at (``storage/arrangements.py`` opens it warm, catches it up from the change feed, or
   builds it);
3. hands the rows found to Spark as local relations (temporary views, dropped after the commit)
   and binds them (``dvm/bindings.py``), so that this term -- and only it -- reads them.

Everything here is an optimisation: a term whose lookup declines (no change feed readable by
delta-rs, a key that is not an integer or a date, an arrangement that cannot give the version,
a bound of ``refresh/lookup.py`` met) keeps its SQL over Delta scans, and the refresh is exactly
as correct; the report says which path each part took.  Any other error fails the refresh.
"""
from __future__ import annotations

import logging

from airflow_trickle.dvm.base import Versions, operators
from airflow_trickle.dvm.join_terms import join_terms
from airflow_trickle.dvm.keyed import keyed_deltas
from airflow_trickle.dvm.outer_terms import outer_terms
from airflow_trickle.refresh.changes_once import bind_changes, read_changes_once
from airflow_trickle.refresh.lookup import (DECLINED, Lookups, PartPath, ProbeReport, ReadPath, SourceTables,
                                            arrangements_of)
from airflow_trickle.refresh.probe_groups import bind_group_chain, changed_group_chains
from airflow_trickle.refresh.probe_terms import bind_join_term, bind_keyed_groups, bind_outer_term
from airflow_trickle.storage.arrangement import Stale, Unarrangeable

log = logging.getLogger(__name__)


def probe_inputs(env, plan, scratch: list[str]) -> tuple[Versions, ProbeReport]:
    """``plan``'s versions with the relations of every term probed bound in (views named in
    ``scratch``), and what was done: the changes read once, the join-delta terms, the
    aggregates of one table whose touched groups are recomputed from it, the outer joins' terms
    and the aggregates of joins whose groups the changes' keys bound.

    Those aggregates go first: one whose inputs are all looked up by the groups ("whole") needs
    no input delta (``dvm/aggregate.py``), so the terms under it are neither probed nor handed
    to Spark, nor are the changes only they read.
    """
    v, report = plan.versions, ProbeReport()
    arrangements = arrangements_of(env.config)
    if arrangements is None:
        return v, report
    run = Lookups(env, plan.st.name, SourceTables(env, plan.st.name), arrangements, scratch, report)
    read = read_changes_once(run, plan, v)
    min_rows = env.config.arrangement_min_rows
    terms = [t for t in join_terms(plan.node, v) if run.worth_it(t.source, t.probes, min_rows)]
    grouped = [g for g in keyed_deltas(plan.node, v) if run.worth_it(g.source, [g], min_rows)]
    outer = [t for t in outer_terms(plan.node, v)
             if run.worth_it(t.source, [t.changed_probe(), *t.probes], min_rows)]
    chains = [c for c in changed_group_chains(plan, v) if run.worth_it(c[2][0].table, c[1], min_rows)]
    for term in terms:
        run.wanted.add_all(term.probes, lambda p: {v.at(p.which)[p.source]})
    both = lambda p: {v.old[p.source], v.new[p.source]}  # noqa: E731
    for g in grouped:
        run.wanted.add(g, both(g))
    for _, probes, origins in chains:
        run.wanted.add_all([*probes, *(o.via for o in origins if o.via is not None)], both)
    for term in outer:
        run.wanted.add(term.changed_probe(), both(term))
        run.wanted.add_all(term.probes, lambda p: {v.at(p.which)[p.source]})
    for block, probes, origins in chains:
        v = _attempt(run, v, f"groups by {probes[0].key}", lambda v, c=(block, probes, origins): bind_group_chain(
            run, *c, v, whole_only=c[0] in plan.counted_groups))
    unused = {id(node) for block, _, _ in chains if _whole(v, block) for node in operators(block)}
    v = bind_changes(run, v, read, unused)
    for term in [t for t in terms if id(t.block) not in unused]:
        v = _attempt(run, v, f"{term.source} change", lambda v, term=term: bind_join_term(run, term, v))
    for g in [g for g in grouped if id(g.block) not in unused]:
        v = _attempt(run, v, f"{g.source} groups by {g.key}", lambda v, g=g: bind_keyed_groups(run, g, v))
    for term in [t for t in outer if id(t.block) not in unused]:
        v = _attempt(run, v, f"{term.source} change, outer", lambda v, term=term: bind_outer_term(run, term, v))
    for event in arrangements.events:
        log.info("%s: arrangement %s", plan.st.name, event)
    report.build_ms = int(arrangements.build_seconds * 1000)
    return v, report


def _whole(v: Versions, block) -> bool:
    rows = v.bindings.group_rows(block)
    return rows is not None and rows.whole


def _attempt(run: Lookups, v: Versions, part: str, bind) -> Versions:
    """``bind(v)``: ``v`` with one part's relations bound, and its path in the report; ``v``
    unchanged when the lookup declines (:data:`~airflow_trickle.refresh.lookup.DECLINED`) --
    that part of the delta keeps its scans.  Any other error fails the refresh."""
    rows_before = run.report.rows
    try:
        bound, detail = bind(v)
    except DECLINED as err:
        run.report.paths.append(PartPath(part, ReadPath.SCANNED, detail=f"{type(err).__name__}: {err}"))
        log.info("%s: %s keeps its scans: %s", run.name, part, err, exc_info=not isinstance(err, (Stale, Unarrangeable)))
        return v
    run.report.paths.append(PartPath(part, ReadPath.PROBED, rows=run.report.rows - rows_before, detail=detail))
    return bound

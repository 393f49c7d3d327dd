"""Probe a delta's inputs through arrangements instead of scanning them: planned, then run.

For each term of a join's delta that ``dvm/join_terms.py`` (and ``dvm/keyed.py``,
``dvm/outer_terms.py``, ``dvm/group_probes.py``) found probeable, :func:`plan_lookups` decides,
before anything is read, whether it is looked up (one of the inputs it probes holds at least
``arrangement_min_rows`` rows, its change and the arrangements it builds stay within the bounds
of ``refresh/plan.py``) or scanned.  :func:`probe_inputs` then runs the lookups planned:

1. reads the change of the term's changed input with delta-rs (the window's change feed, the
   columns the block reads, each row with its weight);
2. probes each other input along the term's equalities, in order: the keys of the change, or of
   an input probed before, looked up in that input's arrangement at the version the term reads
   it at (``storage/arrangements.py`` opens it warm, catches it up from the change feed, or
   builds it);
3. hands the rows found to Spark as local relations (temporary views, dropped after the commit)
   and binds them (``dvm/bindings.py``), so that this term -- and only it -- reads them.

A lookup that declines on the way (an arrangement that cannot give the version, a key of
another type, more rows found than a scan costs) keeps its SQL over Delta scans, exactly as
correct, and the refresh records the fallback.  Any other error fails the refresh.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field

from airflow_trickle.dvm.base import Versions, operators
from airflow_trickle.dvm.join_terms import join_terms
from airflow_trickle.dvm.keyed import keyed_deltas
from airflow_trickle.dvm.outer_terms import outer_terms
from airflow_trickle.options import Placement
from airflow_trickle.refresh.changes_once import bind_changes, plan_changes_once, read_changes_once
from airflow_trickle.refresh.lookup import DECLINED, Lookups, PartPath, ProbeReport, SourceTables, arrangements_of
from airflow_trickle.refresh.plan import PlannedPart, ReadPath, placement_of
from airflow_trickle.refresh.probe_groups import bind_group_chain, changed_group_chains
from airflow_trickle.refresh.probe_terms import bind_join_term, bind_keyed_groups, bind_outer_term
from airflow_trickle.storage.arrangement import Stale, Unarrangeable

log = logging.getLogger(__name__)


@dataclass
class LookupPlan:
    """The lookups of one refresh, each with its planned part (``refresh/plan.PlannedPart``)."""

    run: Lookups | None  # None: arrangements are off
    changes: list[tuple[PlannedPart, str]] = field(default_factory=list)  # (part, source) read once
    chains: list[tuple[PlannedPart, tuple]] = field(default_factory=list)  # aggregates by group values
    terms: list[tuple[PlannedPart, object]] = field(default_factory=list)  # join terms
    grouped: list[tuple[PlannedPart, object]] = field(default_factory=list)  # keyed aggregates
    outer: list[tuple[PlannedPart, object]] = field(default_factory=list)  # outer terms

    @property
    def parts(self) -> list[PlannedPart]:
        return [part for found in (self.changes, self.chains, self.terms, self.grouped, self.outer)
                for part, _ in found]


def plan_lookups(env, plan, scratch: list[str]) -> LookupPlan:
    """Which parts of ``plan``'s delta (a ``DeltaPlan``) read their inputs through lookups, and
    why each other one scans -- decided from the Delta logs, before anything is read."""
    arrangements = arrangements_of(env.config)
    if arrangements is None:
        return LookupPlan(None)
    v, name = plan.versions, plan.st.name
    run = Lookups(env, name, SourceTables(env, name), arrangements, scratch)
    spark_only = placement_of(plan.st) is Placement.SPARK
    found = LookupPlan(run, changes=plan_changes_once(run, plan, v, spark_only=spark_only))
    planned = _Planner(run, v, env.config, spark_only)
    found.terms = [(planned.part(f"{t.source} change", t.source, t.probes), t) for t in join_terms(plan.node, v)]
    found.grouped = [(planned.part(f"{g.source} groups by {g.key}", g.source, [g]), g)
                     for g in keyed_deltas(plan.node, v)]
    found.outer = [(planned.part(f"{t.source} change, outer", t.source, [t.changed_probe(), *t.probes]), t)
                   for t in outer_terms(plan.node, v)]
    found.chains = [(planned.part(f"groups by {c[1][0].key}", c[2][0].table, c[1], [o.table for o in c[2]]), c)
                    for c in changed_group_chains(plan, v)]
    return found


class _Planner:
    """Plans one part: probed when worth it and within the bounds, else scanned, and why."""

    def __init__(self, run: Lookups, v: Versions, config, spark_only: bool):
        self.run, self.v, self.config, self.spark_only = run, v, config, spark_only

    def part(self, part: str, source: str, probes, changed=None) -> PlannedPart:
        if self.spark_only:
            return PlannedPart(part, ReadPath.SCANNED, "placement: spark")
        tables, v = self.run.tables, self.v
        if source not in tables.locations:
            return PlannedPart(part, ReadPath.SCANNED, f"delta-rs does not read {source}")
        try:
            if not tables.large_inputs(probes, self.config.arrangement_min_rows):
                return PlannedPart(part, ReadPath.SCANNED,
                                   f"no input it looks up holds arrangement_min_rows {self.config.arrangement_min_rows:,}")
            if unarrangeable := tables.unarrangeable(probes):
                return PlannedPart(part, ReadPath.SCANNED, unarrangeable)
            rows = 0
            for each in dict.fromkeys(changed or [source]):
                found, too_many = tables.change_rows(each, v.old[each], v.new[each])
                if too_many:
                    return PlannedPart(part, ReadPath.SCANNED, too_many, rows=found)
                rows += found
            built, too_large = self._builds(probes)
        except DECLINED as err:  # a table delta-rs cannot read: Spark scans it
            return PlannedPart(part, ReadPath.SCANNED, f"{type(err).__name__}: {err}")
        if too_large:
            return PlannedPart(part, ReadPath.SCANNED, too_large, rows=rows, bytes=built)
        return PlannedPart(part, ReadPath.PROBED, "a large input looked up by the change's keys"
                           + (", arrangements to build" if built else ""), rows=rows, bytes=built or None)

    def _builds(self, probes) -> tuple[int, str | None]:
        """The bytes read to build the arrangements ``probes`` need and none holds yet (a cold
        host builds each one), and why that is too much, or None."""
        built = 0
        for probe in {(p.source, p.key): p for p in probes}.values():
            size = self.run.tables.build_bytes(probe.source, probe.key, self.run.arrangements)
            if size > self.config.arrangement_build_max_bytes:
                return size, (f"building the arrangement of {probe.source} by {probe.key} reads ~{size:,} bytes, "
                              f"above arrangement_build_max_bytes {self.config.arrangement_build_max_bytes:,}")
            built += size
        return built, None


def probe_inputs(env, plan, lookups: LookupPlan) -> tuple[Versions, ProbeReport]:
    """``plan``'s versions with the relations of every part planned to be looked up bound in,
    and what was done: the changes read once, the aggregates of joins whose groups the
    changes' keys bound, the join-delta terms, the aggregates of one table whose touched groups
    are recomputed from it and the outer joins' terms.

    The aggregates of joins go first: one whose inputs are all looked up by the groups
    ("whole") needs no input delta (``dvm/aggregate.py``), so the terms under it are neither
    probed nor handed to Spark, nor are the changes only they read.
    """
    v, run = plan.versions, lookups.run
    if run is None:
        return v, ProbeReport()
    report = run.report
    for part in lookups.parts:
        if part.path is ReadPath.SCANNED:
            report.paths.append(PartPath(part.part, ReadPath.SCANNED, detail=part.reason, planned=part.path))
    chosen = {name: [(part, item) for part, item in found if part.path is not ReadPath.SCANNED]
              for name, found in (("terms", lookups.terms), ("grouped", lookups.grouped),
                                  ("outer", lookups.outer), ("chains", lookups.chains))}
    both = lambda p: {v.old[p.source], v.new[p.source]}  # noqa: E731
    for _, term in chosen["terms"]:
        run.wanted.add_all(term.probes, lambda p: {v.at(p.which)[p.source]})
    for _, g in chosen["grouped"]:
        run.wanted.add(g, both(g))
    for _, (_, probes, origins) in chosen["chains"]:
        run.wanted.add_all([*probes, *(o.via for o in origins if o.via is not None)], both)
    for _, term in chosen["outer"]:
        run.wanted.add(term.changed_probe(), both(term))
        run.wanted.add_all(term.probes, lambda p: {v.at(p.which)[p.source]})
    read = read_changes_once(run, [source for part, source in lookups.changes if part.path is ReadPath.READ_ONCE],
                             plan, v)
    for part, (block, probes, origins) in chosen["chains"]:
        v = _attempt(run, v, part, lambda v, c=(block, probes, origins): bind_group_chain(
            run, *c, v, whole_only=c[0] in plan.counted_groups))
    unused = {id(node) for _, (block, _, _) in chosen["chains"] if _whole(v, block) for node in operators(block)}
    v = bind_changes(run, v, read, unused)
    for part, term in chosen["terms"]:
        if id(term.block) not in unused:
            v = _attempt(run, v, part, lambda v, term=term: bind_join_term(run, term, v))
    for part, g in chosen["grouped"]:
        if id(g.block) not in unused:
            v = _attempt(run, v, part, lambda v, g=g: bind_keyed_groups(run, g, v))
    for part, term in chosen["outer"]:
        if id(term.block) not in unused:
            v = _attempt(run, v, part, lambda v, term=term: bind_outer_term(run, term, v))
    for event in run.arrangements.events:
        log.info("%s: arrangement %s", plan.st.name, event)
    report.build_ms = int(run.arrangements.build_seconds * 1000)
    return v, report


def _whole(v: Versions, block) -> bool:
    rows = v.bindings.group_rows(block)
    return rows is not None and rows.whole


def _attempt(run: Lookups, v: Versions, part: PlannedPart, bind) -> Versions:
    """``bind(v)``: ``v`` with one part's relations bound, and its path in the report; ``v``
    unchanged when the lookup declines (:data:`~airflow_trickle.refresh.lookup.DECLINED`) --
    that part of the delta keeps its scans, a fallback from the plan.  Any other error fails
    the refresh."""
    rows_before = run.report.rows
    try:
        bound, detail = bind(v)
    except DECLINED as err:
        run.report.paths.append(PartPath(part.part, ReadPath.SCANNED, detail=f"{type(err).__name__}: {err}",
                                         planned=part.path))
        log.info("%s: %s keeps its scans: %s", run.name, part.part, err,
                 exc_info=not isinstance(err, (Stale, Unarrangeable)))
        return v
    run.report.paths.append(PartPath(part.part, ReadPath.PROBED, rows=run.report.rows - rows_before, detail=detail,
                                     planned=part.path))
    return bound

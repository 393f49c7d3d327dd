"""Probe a join delta's inputs through arrangements instead of scanning them.

For each term of a join's delta that ``dvm/probes.py`` found probeable, and that is worth it
(one of the inputs it probes holds at least ``arrangement_min_rows`` rows), the refresh:

1. reads the change of the term's changed input with delta-rs (the window's change feed, the
   columns the block reads, each row with its weight);
2. probes each other input along the term's equalities, in order: the keys of the change, or of
   an input probed before, looked up in that input's arrangement at the version the term reads
   it at (``storage/arrangements.py`` opens it warm, catches it up from the change feed, or
   builds it);
3. hands the rows found to Spark as local relations (temporary views, dropped after the commit)
   and binds them into the :class:`~airflow_trickle.dvm.base.Versions` the delta is rendered
   with, so that this term -- and only it -- reads them (``dvm/join.py``).

Everything here is an optimisation: a term that cannot be probed (no change feed readable by
delta-rs, a key that is not an integer or a date, an arrangement that cannot give the version,
any error) keeps today's SQL over Delta scans, and the refresh is exactly as correct.  Nothing
here runs over a table's rows in Python beyond the change and the rows its keys reach.
"""
from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from airflow_trickle.dvm.base import W, Versions, operators
from airflow_trickle.dvm.probes import (OUTER_KEYS, JoinTerm, KeyedDelta, OuterTerm, Probe, item_conditions, join_terms,
                                        keyed_deltas, outer_terms)
from airflow_trickle.refresh.narrowing import narrowed
from airflow_trickle.storage.arrangement import WEIGHT, Stale, change_rows
from airflow_trickle.storage.arrangements import Arrangements

log = logging.getLogger(__name__)

#: A change of more rows than this is not read into the refreshing process: Spark joins it.
MAX_CHANGE_ROWS = 2_000_000
#: A probe that would gather more than this share of an arrangement's rows, and more than
#: ``PROBED_ROWS_FLOOR`` rows, is left to Spark's scan: rows handed to Spark as a local relation
#: cost some microseconds each, a scan a fraction of one (TPC-H q17 at SF 1: 360k of lineitem's
#: 6M rows found, three times, made the commit 9 s against a 3 s recompute).
MAX_PROBED_SHARE, PROBED_ROWS_FLOOR = 0.05, 100_000
#: The pseudo FROM item whose rows are an aggregate's touched groups (:func:`probe_groups`).
_GROUPS = -1


@dataclass
class ProbeReport:
    """What probing did in one refresh, for its log and history."""

    terms: list[str] = field(default_factory=list)  # one line per term probed, or why not
    rows: int = 0  # rows handed to Spark (changes and probed inputs)
    #: Milliseconds spent building arrangements (once per input, not per refresh: the cost
    #: model leaves them out of what a delta costs)
    build_ms: int = 0

    def lines(self) -> list[str]:
        return self.terms


def arrangements_on(config) -> bool:
    """Whether join inputs are probed through arrangements under ``config``."""
    return bool(config.arrangement_max_bytes) and config.arrangement_max_bytes > 0


def arrangements_of(config) -> Arrangements | None:
    """The refreshing process's arrangements under ``config``; None when turned off."""
    if not arrangements_on(config):
        return None
    from airflow_trickle.spark.jars import cache_root

    root = Path(config.arrangement_dir) if config.arrangement_dir else cache_root() / "arrangements"
    return Arrangements(root, int(config.arrangement_max_bytes), config.location.delta_options
                        if config.warehouse else None)


def probe_inputs(env, plan, scratch: list[str]) -> tuple[Versions, ProbeReport]:
    """``plan``'s versions with the relations of every term probed bound in (views named in
    ``scratch``), and what was done: the changes read once, the join-delta terms
    (``dvm/probes.join_terms``), the aggregates of one table whose touched groups are
    recomputed from it (``keyed_deltas``), the outer joins' terms (``outer_terms``) and the
    aggregates of joins whose groups the changes' keys bound.

    Those aggregates go first: one whose inputs are all looked up by the groups ("whole") needs
    no input delta (``dvm/aggregate.py``), so the terms under it are neither probed nor handed
    to Spark, nor are the changes only they read (TPC-H q10: 6 local relations less).
    """
    v, report = plan.versions, ProbeReport()
    arrangements = arrangements_of(env.config)
    if arrangements is None:
        return v, report
    run = _Probing(env, plan.st.name, _Tables(env, plan.st.name), arrangements, scratch, report)
    read = _read_changes_once(plan, v, run.tables, run.changes)
    min_rows = env.config.arrangement_min_rows
    terms = [t for t in join_terms(plan.node, v) if run.worth_it(t.source, t.probes, min_rows)]
    grouped = [g for g in keyed_deltas(plan.node, v) if run.worth_it(g.source, [g], min_rows)]
    outer = [t for t in outer_terms(plan.node, v)
             if run.worth_it(t.source, [_changed_probe(t), *t.probes], min_rows)]
    chains = [c for c in _changed_group_chains(plan, v) if run.worth_it(c[2][0].table, c[1], min_rows)]
    for term in terms:
        run.wanted.add_all(term.probes, lambda p: {v.at(p.which)[p.source]})
    both = lambda p: {v.old[p.source], v.new[p.source]}  # noqa: E731
    for g in grouped:
        run.wanted.add(g, both(g))
    for _, probes, origins in chains:
        run.wanted.add_all([*probes, *(o.via for o in origins if o.via is not None)], both)
    for term in outer:
        run.wanted.add(_changed_probe(term), both(term))
        run.wanted.add_all(term.probes, lambda p: {v.at(p.which)[p.source]})
    for chain in chains:
        v = run.attempt(v, f"groups by {chain[1][0].key}",
                        lambda v, chain=chain: _bind_group_chain(run, *chain, v,
                                                                 whole_only=chain[0] in plan.counted_groups))
    unused = {id(node) for block, _, _ in chains if v.groups_probed_whole(block) for node in operators(block)}
    v = _bind_changes(env, v, read, unused, scratch, report)
    for term in [t for t in terms if id(t.block) not in unused]:
        v = run.attempt(v, f"{term.source} change", lambda v, term=term: _bind_join_term(run, term, v))
    for g in [g for g in grouped if id(g.block) not in unused]:
        v = run.attempt(v, f"{g.source} groups by {g.key}", lambda v, g=g: _bind_keyed_groups(run, g, v))
    for term in [t for t in outer if id(t.block) not in unused]:
        v = run.attempt(v, f"{term.source} change, outer", lambda v, term=term: _bind_outer_term(run, term, v))
    for event in arrangements.events:
        log.info("%s: arrangement %s", plan.st.name, event)
    report.build_ms = int(arrangements.build_seconds * 1000)
    return v, report


@dataclass
class _Probing:
    """What one refresh's probes share: the sources as delta-rs sees them, the arrangements and
    what is asked of them, the changes read, and where views and the report go."""

    env: object
    name: str
    tables: "_Tables"
    arrangements: Arrangements
    scratch: list[str]
    report: ProbeReport
    wanted: "_Wanted" = field(default_factory=lambda: _Wanted())
    ready: dict = field(default_factory=dict)
    changes: dict = field(default_factory=dict)

    def worth_it(self, source: str, probes, min_rows: int) -> bool:
        return _worth_it(source, probes, self.tables, min_rows, self.report)

    def attempt(self, v: Versions, what: str, bind) -> Versions:
        """``bind(v)``: ``v`` with one term's relations bound, and a line of the report; ``v``
        unchanged when it fails -- an optimisation: that part of the delta keeps its scans."""
        try:
            bound, line = bind(v)
        except Exception as err:  # noqa: BLE001
            self.report.terms.append(f"{what}: scanned ({type(err).__name__}: {err})")
            log.info("%s: %s keeps its scans: %s", self.name, what, err,
                     exc_info=not isinstance(err, (Stale, TypeError)))
            return v
        self.report.terms.append(f"{what}{line}")
        return bound

    def register(self, relations: dict[int, tuple[pa.Table, tuple[str, ...]]]) -> dict:
        self.report.rows += sum(rows.num_rows for rows, _ in relations.values())
        return _registered(self.env, relations, self.scratch)

    def follow(self, probes, known: dict, version_of, conditions=None) -> dict:
        result: dict = {}
        _follow(probes, known, result, version_of, self.tables, self.arrangements, self.wanted, self.ready,
                conditions)
        return result


def _bind_join_term(run: _Probing, term: JoinTerm, v: Versions) -> tuple[Versions, str]:
    """A join-delta term's change and the inputs it reaches, looked up by its keys; the change
    and each input found without the rows the block's filter surely rejects (``narrowing.py``)."""
    read = _change(term.source, term.change_columns, v, run.tables, run.changes)
    conditions = scan_conditions(term.block)
    change = read if term.aggregated else narrowed(read, conditions.get(term.changed))
    relations = {term.changed: (change, term.change_columns),
                 **run.follow(term.probes, {term.changed: change}, lambda p: v.at(p.which)[p.source], conditions)}
    if term.aggregated:  # the changed item keeps its own delta: its change rows only gave keys
        del relations[term.changed]
    bound = v.bind(term.block, f"probed {term.changed}", run.register(relations))
    probed = ", ".join(f"{term.block.items[i][0]} {rows.num_rows}" for i, (rows, _) in relations.items()
                       if i != term.changed)
    rows = f"{change.num_rows} rows" if change is read else f"{change.num_rows} of {read.num_rows} rows"
    return bound, f" ({rows}{', through an aggregate' if term.aggregated else ''}): probed {probed}"


def _bind_keyed_groups(run: _Probing, g: KeyedDelta, v: Versions) -> tuple[Versions, str]:
    """An aggregate of one table: the rows of the groups its change's keys name, both sides."""
    sides = _probe_groups_of(g, v, run.tables, run.arrangements, run.wanted, run.ready, run.changes)
    nulls = sides.pop("nulls")
    for which, rows in sides.items():
        v = v.bind(g.block, f"groups {which}", run.register({0: (rows, g.columns)}))
    v = v.bind(g.block, "groups whole", True)  # every row of the groups of the change's keys
    if nulls:  # the NULL group is not arranged: its rows are read by Spark
        v = v.bind(g.block, "groups nulls", g.key)
    return v, f": probed {sides['old'].num_rows} rows before, {sides['new'].num_rows} after"


def _bind_outer_term(run: _Probing, term: OuterTerm, v: Versions) -> tuple[Versions, str]:
    """An outer term's inputs looked up by the join-key values of its change."""
    shared, sides = _probe_outer(term, v, run.tables, run.arrangements, run.wanted, run.ready, run.changes)
    v = v.bind(term.block, f"outer {term.changed}", run.register(shared))
    for which, rows in sides.items():
        v = v.bind(term.block, f"outer {term.changed} {which}", run.register({term.changed: (rows, term.columns)}))
    items = term.block.items
    probed = "".join(f", {items[i][0]} {rows.num_rows}" for i, (rows, _) in shared.items())
    return v, (f" ({items[term.changed][0]} recomputed for its keys): probed {items[term.changed][0]} "
               f"{sides['old'].num_rows} before, {sides['new'].num_rows} after{probed}")


def _bind_group_chain(run: _Probing, block, probes, origins, v: Versions, *,
                      whole_only: bool = False) -> tuple[Versions, str]:
    """An aggregate of a join: its inputs looked up by the group values the changes bound, at
    the old versions and at the new.  ``whole_only``: only when every input is looked up (a
    top-K's aggregate, which otherwise counts its touched groups first: :func:`probe_groups`)."""
    conditions = scan_conditions(block)
    values = _changed_values(run, origins, v, conditions)
    sides = {}
    for which in ("old", "new"):
        version = v.at(which)
        sides[which] = run.follow(probes, {_GROUPS: pa.table({probes[0].key: values})},
                                  lambda p, version=version: version[p.source], conditions)
        if probes[0].item not in sides[which]:
            raise Stale("a key of another type than the arrangement's")
        if whole_only and len(sides[which]) < len(probes):
            raise Stale("not every input was looked up: the touched groups are counted")
    for which, bound in _registered_sides(run.env, sides, run.scratch, run.report).items():
        v = v.bind(block, f"groups {which}", bound)
    if len(sides["new"]) == len(probes):  # every input looked up: every row of those groups, nothing else
        v = v.bind(block, "groups whole", True)
    through = "".join(f", {block.items[o.item][0]} through {block.items[o.via.item][0]}" for o in origins if o.via)
    return v, f" ({len(values)} from the changes{through}): probed " + "; ".join(
        f"{which} " + ", ".join(f"{block.items[i][0]} {rows.num_rows}" for i, (rows, _) in result.items())
        for which, result in sides.items())


#: A change of more rows than this is read by Spark's ``table_changes`` at each use instead of
#: once by delta-rs: a local relation costs some microseconds a row.
MAX_CHANGE_VIEW_ROWS = 200_000
_PLAIN = (pa.types.is_integer, pa.types.is_floating, pa.types.is_decimal, pa.types.is_string,
          pa.types.is_large_string, pa.types.is_string_view, pa.types.is_boolean, pa.types.is_date,
          pa.types.is_timestamp, pa.types.is_binary, pa.types.is_large_binary)


def _read_changes_once(plan, v: Versions, tables: "_Tables",
                       changes: dict) -> dict[str, tuple[pa.Table, tuple, list]]:
    """The change of every changed source the delta reads from its change feed, read once, by
    delta-rs: source -> (its rows, their columns, the scans reading it), for :func:`_bind_changes`.

    Why: a delta reads a change many times -- each join term, the keys of an outer term and of
    an aggregate's touched groups, both sides of each recompute (TPC-H q13: eight reads of
    ``table_changes`` in one statement) -- and each read by Spark plans and runs a scan of
    the change files.  The rows are the feed's, weighted as ``Scan.delta`` weights them; a
    source delta-rs cannot read, or a change over ``MAX_CHANGE_VIEW_ROWS`` rows or of columns
    not of plain types, keeps Spark's reads."""
    from airflow_trickle.dvm.scan import Scan
    from airflow_trickle.storage.deltalog import changed_rows

    scans: dict[str, list] = {}
    for node in operators(plan.node):
        if isinstance(node, Scan) and node.changed(v) and v.use_cdf.get(node.name, True):
            scans.setdefault(node.name, []).append(node)
    read = {}
    for source, nodes in scans.items():
        columns = tuple(dict.fromkeys(c for n in nodes for c in n.columns))
        try:
            if source not in tables.locations or changed_rows(tables.locations[source], v.old[source],
                                                              v.new[source]) > MAX_CHANGE_VIEW_ROWS:
                continue
            rows = _change(source, columns, v, tables, changes)
        except Exception as err:  # noqa: BLE001 - an optimisation: Spark reads the feed
            log.info("%s: the change of %s is read by Spark: %s", plan.st.name, source, err)
            continue
        if all(any(test(f.type) for test in _PLAIN) for f in rows.schema):
            read[source] = (rows, columns, nodes)
    return read


def _bind_changes(env, v: Versions, read: dict, unused: set[int], scratch: list[str],
                  report: ProbeReport) -> Versions:
    """``v`` with each change ``read`` handed to Spark as a temporary view every scan of it
    reads, but for the scans in ``unused`` (whose delta no statement computes)."""
    for source, (rows, columns, nodes) in read.items():
        nodes = [node for node in nodes if id(node) not in unused]
        if not nodes:
            continue
        try:
            [(view, _)] = _registered(env, {0: (rows, columns)}, scratch).values()
        except Exception as err:  # noqa: BLE001 - an optimisation: Spark reads the feed
            log.info("the change of %s is read by Spark: %s", source, err)
            continue
        for node in nodes:
            v = v.bind(node, "change", view)
        report.rows += rows.num_rows
        report.terms.append(f"{source} change ({rows.num_rows} rows) read once")
    return v


def _changed_group_chains(plan, v: Versions) -> list[tuple]:
    """The aggregates of joins below the top whose touched groups can be recomputed from inputs
    looked up by group values the changes bound (``dvm/probes.group_keys_of_changes``): for
    each, ``(block, the probes -- the group column's item first, by the values --, the
    ``GroupOrigin`` of each changed item, whose values bound the groups)``.  A top-K's aggregate
    too: looked up so, whole, it need not count its touched groups first (one Spark statement
    less: TPC-H q3), else it counts them (``probe_groups``)."""
    from airflow_trickle.dvm.block import Block
    from airflow_trickle.dvm.probes import group_chains, group_keys_of_changes

    found = []
    for block in operators(plan.node):
        if (block is plan.node or not isinstance(block, Block)
                or len(block.items) < 2 or not block.changed(v)):
            continue
        bounded = [(chain, origins) for chain in group_chains(block, v)
                   if (origins := group_keys_of_changes(block, v, chain))]
        # a group column every change holds itself before one a change reaches through another
        # input (TPC-H q18: o_orderkey, not c_custkey -- a customer's every order)
        chain, origins = min(bounded, key=lambda found: any(o.via for o in found[1]), default=(None, None))
        if origins:
            start = Probe(item=chain.item, source=chain.source, which="", key=chain.key, columns=chain.columns,
                          by=_GROUPS, by_column=chain.key)
            found.append((block, (start, *chain.probes), origins))
    return found


def _changed_values(run: _Probing, origins, v: Versions, conditions: dict) -> pa.Array:
    """The distinct group values ``origins`` (``dvm/probes.GroupOrigin``) give: each changed
    item's column among its change's rows -- or among the rows of the input its values look up,
    at the old versions and at the new --, without the rows the block's filter surely rejects
    (they meet no output row) and NULL left out; raises :class:`Stale` when a value of the
    group column itself is NULL (the NULL group changed)."""
    arrays = []
    for origin in origins:
        rows = _change(origin.table, origin.columns, v, run.tables, run.changes)
        rows = narrowed(rows, conditions.get(origin.item))
        if origin.via is None:
            arrays.append(_group_values(rows[origin.column], origin.own, origin.table))
            continue
        via = origin.via
        keys = rows[origin.column].drop_null()  # a NULL key meets no partner
        sides = _both_sides(via.source, via.key, via.columns, keys, v, run.tables, run.arrangements, run.wanted,
                            run.ready)
        for found in sides.values():
            found = narrowed(found, conditions.get(via.item))
            arrays.append(_group_values(found[origin.value], origin.own, via.source))
    return pc.unique(pa.concat_arrays(arrays))


def _group_values(values, own: bool, source: str) -> pa.Array:
    """``values`` without NULL, integers as int64; raises :class:`Stale` when ``own`` (the group
    column itself) and one is NULL."""
    values = values.combine_chunks() if isinstance(values, pa.ChunkedArray) else values
    if own and values.null_count:
        raise Stale(f"{source} holds a NULL group value among those the changes touch")
    return values.drop_null().cast(pa.int64()) if pa.types.is_integer(values.type) else values.drop_null()


def _changed_probe(term: OuterTerm) -> Probe:
    """The lookup of an outer term's changed item, by the change's keys (at both versions)."""
    return Probe(item=term.changed, source=term.source, which="", key=term.key, columns=term.columns,
                 by=OUTER_KEYS, by_column=term.key)


def _probe_outer(term: OuterTerm, v: Versions, tables: "_Tables", arrangements: Arrangements, wanted, ready,
                 changes) -> tuple[dict, dict[str, pa.Table]]:
    """An outer term's inputs looked up by the join-key values of its change: the items shared
    by both sides (item -> (rows, columns)) and the changed item's rows at ``old`` and ``new``."""
    keys = _change(term.source, term.columns, v, tables, changes)[term.key].drop_null()  # meets no partner
    sides = _both_sides(term.source, term.key, term.columns, keys, v, tables, arrangements, wanted, ready)
    shared: dict = {}
    _follow(term.probes, {OUTER_KEYS: pa.table({term.key: pc.unique(keys.combine_chunks())})}, shared,
            lambda p: v.at(p.which)[p.source], tables, arrangements, wanted, ready)
    return shared, sides


def _probe_groups_of(g: KeyedDelta, v: Versions, tables: "_Tables", arrangements: Arrangements, wanted, ready,
                     changes) -> dict[str, pa.Table]:
    """The rows of ``g``'s table whose group column holds a value of its change, at the old
    versions (``"old"``) and at the new (``"new"``), and whether the change touched the NULL
    group (``"nulls"``: the arrangement holds no NULL key, so Spark reads that group's rows)."""
    keys = _change(g.source, g.columns, v, tables, changes)[g.key]
    sides = _both_sides(g.source, g.key, g.columns, keys.drop_null(), v, tables, arrangements, wanted, ready)
    return {**sides, "nulls": keys.null_count > 0}


def _both_sides(source: str, key: str, columns, keys, v: Versions, tables: "_Tables", arrangements: Arrangements,
                wanted, ready) -> dict[str, pa.Table]:
    """The rows of ``source`` whose ``key`` is among ``keys`` (no NULL), at the old versions and
    at the new; raises :class:`Stale` when the keys cannot be looked up exactly."""
    arranged = _ready(source, key, tables, arrangements, wanted, ready)
    if not _comparable(keys.type, arranged.base.schema.field(key).type):
        raise Stale(f"a key of type {keys.type} is not looked up in the arrangement")
    values = np.asarray(pc.unique(keys).to_numpy(zero_copy_only=False))
    return {which: _probed(arranged, values, v.at(which)[source], columns) for which in ("old", "new")}


def _probed(arranged, values, version: int, columns) -> pa.Table:
    """The rows of ``arranged`` at ``version`` whose key is among ``values``; raises
    :class:`Stale`, before gathering them, when they are more than :data:`MAX_PROBED_SHARE` of
    the table (and more than :data:`PROBED_ROWS_FLOOR`)."""
    _check_share(arranged, arranged.base_rows_of(values))
    return arranged.probe(values, version, list(columns))


def _check_share(arranged, rows: int) -> None:
    held = arranged.base.num_rows
    if rows > PROBED_ROWS_FLOOR and rows > MAX_PROBED_SHARE * held:
        raise Stale(f"{arranged.uri}: {rows} of its {held} rows match; a scan is cheaper")


def _registered(env, relations: dict[int, tuple[pa.Table, tuple[str, ...]]],
                scratch: list[str]) -> dict[int, tuple[str, tuple[str, ...]]]:
    """Each FROM item's rows handed to Spark as a temporary view (named in ``scratch``):
    item -> (view, its columns), what :class:`~airflow_trickle.dvm.base.Versions` binds."""
    bound = {}
    for item, (rows, columns) in relations.items():
        view = f"__trickle_probed_{uuid.uuid4().hex}"
        scratch.append(view)
        env.engine.local_relation(rows, view)
        bound[item] = (view, columns)
    return bound


def _registered_sides(env, sides: dict[str, dict[int, tuple[pa.Table, tuple[str, ...]]]], scratch: list[str],
                      report: ProbeReport | None = None) -> dict[str, dict[int, tuple[str, tuple[str, ...]]]]:
    """:func:`_registered` for each side (``old``, ``new``) of a lookup, an item's rows handed
    to Spark once when both sides found the same ones.

    Why: an input that did not change, looked up by keys that did not change either, gives the
    same rows at both versions, and each local relation costs ~20 ms to hand over and drop
    (TPC-H q18 at SF 3 handed Spark 25 local relations, 3 of them such repeats)."""
    bound: dict[str, dict[int, tuple[str, tuple[str, ...]]]] = {}
    seen: list[tuple[pa.Table, tuple[str, ...], tuple[str, tuple[str, ...]]]] = []
    for which, relations in sides.items():
        bound[which] = {}
        for item, (rows, columns) in relations.items():
            same = next((view for held, held_columns, view in seen
                         if held_columns == columns and held.num_rows == rows.num_rows and held.equals(rows)), None)
            if same is None:
                [(_, same)] = _registered(env, {item: (rows, columns)}, scratch).items()
                seen.append((rows, columns, same))
                if report is not None:
                    report.rows += rows.num_rows
            bound[which][item] = same
    return bound


class _Wanted:
    """What one refresh asks of each arrangement -- one per (source, key), shared by its
    probes: the union of their columns and of the versions they read."""

    def __init__(self):
        self.columns: dict[tuple[str, str], list[str]] = {}
        self.versions: dict[tuple[str, str], set[int]] = {}

    def add_all(self, probes, versions_of) -> None:
        for probe in probes:
            self.add(probe, versions_of(probe))

    def add(self, probe: Probe, versions: set[int]) -> None:
        key = (probe.source, probe.key)
        held = self.columns.setdefault(key, [])
        held += [c for c in probe.columns if c not in held]
        self.versions.setdefault(key, set()).update(versions)


class _Tables:
    """The sources of one stream table as delta-rs sees them (opened once per refresh)."""

    def __init__(self, env, name: str):
        self.locations = {d.source_name: env.catalog.at(d.source_location)
                          for d in env.catalog.dependencies(name) if d.source_location}
        self._opened: dict[str, object] = {}

    def table(self, source: str):
        from airflow_trickle.storage.deltalog import open_table

        if source not in self._opened:
            self._opened[source] = open_table(self.locations[source])
        return self._opened[source]

    def rows(self, source: str) -> int:
        actions = self.table(source).get_add_actions(flatten=True)
        return sum(n for n in actions.column("num_records").to_pylist() if n)

    def uri(self, source: str) -> str:
        return self.locations[source].uri

    def options(self, source: str):
        return self.locations[source].delta_options


def _large_inputs(probes, tables: _Tables, min_rows: int) -> bool:
    """Whether delta-rs reads every input ``probes`` look up and one holds ``min_rows`` rows or
    more: probing saves a scan only of a large input."""
    return (all(p.source in tables.locations for p in probes)
            and any(tables.rows(p.source) >= min_rows for p in probes))


def _worth_it(source: str, probes, tables: _Tables, min_rows: int, report: ProbeReport) -> bool:
    """Whether probing saves a scan: the change of ``source`` is readable by delta-rs and an
    input ``probes`` look up is large."""
    if source not in tables.locations:
        return False
    try:
        return _large_inputs(probes, tables, min_rows)
    except Exception as err:  # noqa: BLE001 - unreadable by delta-rs: Spark scans it
        report.terms.append(f"{source} change: scanned ({err})")
        return False


def _change(source: str, columns: tuple[str, ...], v: Versions, tables: _Tables, changes: dict) -> pa.Table:
    """The change of ``source`` over the window (``columns`` and the weight ``W``), read once per
    refresh by delta-rs (a read of more of its columns serves a read of fewer); raises
    :class:`Stale` when it is too large to read into this process."""
    key = (source, columns)
    wider = next((rows for (name, held), rows in changes.items() if name == source and set(columns) <= set(held)),
                 None)
    if key not in changes and wider is not None:  # read already with these columns among others
        changes[key] = wider.select([*columns, W])
    if key not in changes:
        from airflow_trickle.storage.deltalog import changed_rows

        estimate = changed_rows(tables.locations[source], v.old[source], v.new[source])
        if estimate > MAX_CHANGE_ROWS:  # the commits' metrics say so before anything is read
            raise Stale(f"a change of about {estimate} rows is left to Spark")
        rows = change_rows(tables.uri(source), v.old[source], v.new[source], list(columns), tables.options(source))
        if rows.num_rows > MAX_CHANGE_ROWS:
            raise Stale(f"a change of {rows.num_rows} rows is left to Spark")
        changes[key] = rows.set_column(rows.schema.get_field_index(WEIGHT), W, rows[WEIGHT].cast(pa.int32()))
    return changes[key]


def _follow(probes, known: dict[int, pa.Table], result: dict, version_of, tables: _Tables,
            arrangements: Arrangements, wanted, ready, conditions: dict | None = None) -> None:
    """Run ``probes`` in order, each by the keys of a FROM item found before (``known``, which
    grows), at ``version_of(probe)``; the rows found go into ``result`` (item -> (rows, columns)),
    without those the item's condition in ``conditions`` (:func:`scan_conditions`) rejects."""
    for p in probes:
        by = known.get(p.by)
        if by is None:
            continue
        arranged = _ready(p.source, p.key, tables, arrangements, wanted, ready)
        keys = by[p.by_column]
        if not _comparable(keys.type, arranged.base.schema.field(p.key).type):
            continue
        values = np.asarray(pc.unique(keys.drop_null()).to_numpy(zero_copy_only=False))
        # what further equalities filter is gathered whatever its share -- in Arrow that is cheap
        # (TPC-H q9 at SF 3 looks ``partsupp`` up by the change's suppliers, 1.45M of its 2.4M rows,
        # and keeps the 18k of the change's parts) -- and checked once filtered
        rows = (arranged.probe(values, version_of(p), list(p.columns)) if p.also
                else _probed(arranged, values, version_of(p), p.columns))
        for item, column, own in p.also:  # the other equalities with rows known by now, exact filters
            if item in known and rows.num_rows and _comparable(known[item][column].type, rows[own].type):
                rows = rows.filter(pc.is_in(rows[own], value_set=pc.unique(known[item][column].drop_null())
                                            .cast(rows[own].type)))
        rows = narrowed(rows, (conditions or {}).get(p.item))
        _check_share(arranged, rows.num_rows)
        known[p.item] = rows
        result[p.item] = (rows, p.columns)


def _ready(source: str, key: str, tables: _Tables, arrangements: Arrangements, wanted: _Wanted, ready):
    """The arrangement of ``source`` by ``key``, holding what ``wanted`` asks of it, opened once
    per refresh."""
    arrangement_key = (source, key)
    if arrangement_key not in ready:
        ready[arrangement_key] = arrangements.ready(
            tables.uri(source), key, wanted.columns[arrangement_key], wanted.versions[arrangement_key],
            table_id=tables.table(source).metadata().id)
    return ready[arrangement_key]


def probe_groups(env, plan, block, v: Versions, scratch: list[str], built: list[int] | None = None) -> Versions:
    """``v`` with the inputs of ``block``'s touched groups probed, at the old versions and at the
    new, bound in (``dvm/probes.py``'s :func:`group_probes`), when the groups are known, none
    has a NULL in the column looked up, and an input probed is large; else ``v`` unchanged.

    The recompute of touched groups (``dvm/aggregate.py``) otherwise reads each input whole,
    twice, with the groups' values as an IN list that Delta's file skipping cannot use on
    random keys (TPC-H q3 at SF 1: 12 s of a 17 s refresh).  The milliseconds spent building
    arrangements are appended to ``built`` (the refresh counts them apart from the delta's)."""
    from airflow_trickle.dvm.probes import group_probes

    arrangements = arrangements_of(env.config)
    known_groups = v.known_groups(block)
    chain = group_probes(block, v) if arrangements is not None and known_groups else None
    if chain is None:
        return v
    values = [row[chain.group + 1] for row in known_groups]
    if any(value is None for value in values):
        return v
    tables = _Tables(env, plan.st.name)
    # the groups' values are the keys of a first probe, of the item holding the column
    start = Probe(item=chain.item, source=chain.source, which="", key=chain.key, columns=chain.columns,
                  by=_GROUPS, by_column=chain.key)
    probes = (start, *chain.probes)
    try:
        if not _large_inputs(probes, tables, env.config.arrangement_min_rows):
            return v
        wanted = _Wanted()
        for p in probes:
            wanted.add(p, {v.old[p.source], v.new[p.source]})
        ready: dict[tuple, object] = {}
        bound_sides = {}
        for which in ("old", "new"):
            version = v.at(which)
            result: dict = {}
            _follow(probes, {_GROUPS: pa.table({chain.key: pa.array(values)})}, result,
                    lambda p, version=version: version[p.source], tables, arrangements, wanted, ready,
                    scan_conditions(block))
            if chain.item not in result:  # a key of another type than the arrangement's
                return v
            bound_sides[which] = result
    except Exception as err:  # noqa: BLE001 - an optimisation: the groups are recomputed from scans
        log.info("%s: the touched groups are recomputed from scans: %s", plan.st.name, err,
                 exc_info=not isinstance(err, (Stale, TypeError)))
        return v
    finally:
        if built is not None:
            built.append(int(arrangements.build_seconds * 1000))
        for event in arrangements.events:
            log.info("%s: arrangement %s", plan.st.name, event)
    for which, bound in _registered_sides(env, bound_sides, scratch).items():
        v = v.bind(block, f"groups {which}", bound)
        log.info("%s: touched groups (%s) at the %s versions: probed %s", plan.st.name, len(values), which,
                 ", ".join(f"{block.items[i][0]} {rows.num_rows}" for i, (rows, _) in bound_sides[which].items()))
    return v


def scan_conditions(block) -> dict:
    """What the rows of each FROM item of ``block`` that is a scan must satisfy to meet an
    output row (``dvm/probes.item_conditions``; an aggregate's condition names its own columns,
    not its table's, so its rows found are kept whole)."""
    from airflow_trickle.dvm.scan import Scan

    return {i: condition for i, condition in item_conditions(block).items() if isinstance(block.items[i][1], Scan)}


def _comparable(left: pa.DataType, right: pa.DataType) -> bool:
    """Whether keys of type ``left`` can be looked up among keys of type ``right`` exactly."""
    if pa.types.is_integer(left) and pa.types.is_integer(right):
        return True
    return pa.types.is_date(left) and pa.types.is_date(right) and left == right

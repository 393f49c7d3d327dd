"""Bind the relations a join's delta terms read, looked up by the keys of their change.

Three kinds of term (``dvm/join_terms.py``, ``dvm/keyed.py``, ``dvm/outer_terms.py``): a linear
join term (the change and the inputs it reaches), an aggregate of one table (the rows of the
groups its change names, both sides) and the null-supplying side of a LEFT join (its inputs
recomputed for the change's join keys).  Each returns the versions with its relations bound and
what it looked up, or raises one of :data:`~airflow_trickle.refresh.lookup.DECLINED`.
"""
from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc

from airflow_trickle.dvm.base import Versions
from airflow_trickle.dvm.bindings import GroupRows, OuterRows
from airflow_trickle.dvm.join_terms import JoinTerm
from airflow_trickle.dvm.keyed import KeyedDelta
from airflow_trickle.dvm.outer_terms import OUTER_KEYS, OuterTerm
from airflow_trickle.refresh.lookup import Lookups
from airflow_trickle.refresh.narrowing import narrowed, scan_conditions


def bind_join_term(run: Lookups, term: JoinTerm, v: Versions) -> tuple[Versions, str]:
    """A join-delta term's change and the inputs it reaches, looked up by its keys; the change
    and each input found without the rows the block's filter surely rejects (``narrowing.py``)."""
    read = run.change(term.source, term.change_columns, v)
    conditions = scan_conditions(term.block)
    change = read if term.aggregated else narrowed(read, conditions.get(term.changed))
    relations = {term.changed: (change, term.change_columns),
                 **run.follow(term.probes, {term.changed: change}, lambda p: v.at(p.which)[p.source], conditions)}
    if term.aggregated:  # the changed item keeps its own delta: its change rows only gave keys
        del relations[term.changed]
    bound = v.bound(v.bindings.with_probed_term(term.block, term.changed, run.register(relations)))
    probed = ", ".join(f"{term.block.items[i][0]} {rows.num_rows}" for i, (rows, _) in relations.items()
                       if i != term.changed)
    rows = f"{change.num_rows} rows" if change is read else f"{change.num_rows} of {read.num_rows} rows"
    return bound, f" ({rows}{', through an aggregate' if term.aggregated else ''}): probed {probed}"


def bind_keyed_groups(run: Lookups, g: KeyedDelta, v: Versions) -> tuple[Versions, str]:
    """An aggregate of one table: the rows of the groups its change's keys name, both sides --
    every row of those groups (``whole``); the NULL group, which no arrangement holds, is read
    by Spark when the change touches it."""
    keys = run.change(g.source, g.columns, v)[g.key]
    sides = run.both_sides(g.source, g.key, g.columns, keys.drop_null(), v)
    bound = run.register_sides({which: {0: (rows, g.columns)} for which, rows in sides.items()})
    rows = GroupRows(old=bound["old"], new=bound["new"], whole=True,
                     null_rows=g.key if keys.null_count > 0 else None)
    return (v.bound(v.bindings.with_group_rows(g.block, rows)),
            f": probed {sides['old'].num_rows} rows before, {sides['new'].num_rows} after")


def bind_outer_term(run: Lookups, term: OuterTerm, v: Versions) -> tuple[Versions, str]:
    """An outer term's inputs looked up by the join-key values of its change: the items both
    sides share, and the changed item's rows at the old and the new versions."""
    keys = run.change(term.source, term.columns, v)[term.key].drop_null()  # a NULL meets no partner
    sides = run.both_sides(term.source, term.key, term.columns, keys, v)
    shared = run.follow(term.probes, {OUTER_KEYS: pa.table({term.key: pc.unique(keys.combine_chunks())})},
                        lambda p: v.at(p.which)[p.source])
    rows = OuterRows(shared=run.register(shared), old=run.register({term.changed: (sides["old"], term.columns)}),
                     new=run.register({term.changed: (sides["new"], term.columns)}))
    items = term.block.items
    probed = "".join(f", {items[i][0]} {found.num_rows}" for i, (found, _) in shared.items())
    return (v.bound(v.bindings.with_outer_term(term.block, term.changed, rows)),
            f" ({items[term.changed][0]} recomputed for its keys): probed {items[term.changed][0]} "
            f"{sides['old'].num_rows} before, {sides['new'].num_rows} after{probed}")

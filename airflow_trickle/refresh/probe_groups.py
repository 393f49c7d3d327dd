"""Bind the rows an aggregate of a join recomputes its touched groups from, looked up by group
values: those the changes' own keys bound (:func:`changed_group_chains`), or those Spark counted
(:func:`probe_groups`).

The recompute of touched groups (``dvm/aggregate.py``) otherwise reads each input whole, twice,
with the groups' values as an IN list that Delta's file skipping cannot use on random keys
(benchmarks/README.md, "TPC-H at SF 1, all 22: subqueries, outer joins and nested aggregates
probed").
"""
from __future__ import annotations

import logging

import pyarrow as pa
import pyarrow.compute as pc

from airflow_trickle.dvm.base import Versions, operators
from airflow_trickle.dvm.bindings import GroupRows
from airflow_trickle.dvm.block import Block
from airflow_trickle.dvm.group_probes import group_chains, group_keys_of_changes, group_probes
from airflow_trickle.dvm.join_terms import Probe
from airflow_trickle.options import Placement
from airflow_trickle.refresh.lookup import (DECLINED, Lookups, PartPath, ProbeReport, ReadPath, SourceTables,
                                           arrangements_of)
from airflow_trickle.refresh.narrowing import narrowed, scan_conditions
from airflow_trickle.refresh.plan import placement_of
from airflow_trickle.storage.arrangement import Stale

log = logging.getLogger(__name__)

#: The pseudo FROM item whose rows are an aggregate's touched groups.
GROUPS = -1


def changed_group_chains(plan, v: Versions) -> list[tuple]:
    """The aggregates of joins below the top whose touched groups can be recomputed from inputs
    looked up by group values the changes bound (``dvm/group_probes.group_keys_of_changes``):
    for each, ``(block, the probes -- the group column's item first, by the values --, the
    ``GroupOrigin`` of each changed item, whose values bound the groups)``.  A top-K's aggregate
    too: looked up so, whole, it need not count its touched groups first (one Spark statement
    less), else it counts them (:func:`probe_groups`)."""
    found = []
    for block in operators(plan.node):
        if (block is plan.node or not isinstance(block, Block)
                or len(block.items) < 2 or not block.changed(v)):
            continue
        bounded = [(chain, origins) for chain in group_chains(block, v)
                   if (origins := group_keys_of_changes(block, v, chain))]
        # a group column every change holds itself before one a change reaches through another
        # input (a line item's order, not its order's customer: a customer's every order)
        chain, origins = min(bounded, key=lambda found: any(o.via for o in found[1]), default=(None, None))
        if origins:
            start = Probe(item=chain.item, source=chain.source, which="", key=chain.key, columns=chain.columns,
                          by=GROUPS, by_column=chain.key)
            found.append((block, (start, *chain.probes), origins))
    return found


def bind_group_chain(run: Lookups, block, probes, origins, v: Versions, *,
                     whole_only: bool = False) -> tuple[Versions, str]:
    """An aggregate of a join: its inputs looked up by the group values the changes bound, at
    the old versions and at the new.  ``whole_only``: only when every input is looked up (a
    top-K's aggregate, which otherwise counts its touched groups first: :func:`probe_groups`)."""
    conditions = scan_conditions(block)
    values = _changed_values(run, origins, v, conditions)
    sides = {}
    for which in ("old", "new"):
        version = v.at(which)
        sides[which] = run.follow(probes, {GROUPS: pa.table({probes[0].key: values})},
                                  lambda p, version=version: version[p.source], conditions)
        if probes[0].item not in sides[which]:
            raise Stale("a key of another type than the arrangement's")
        if whole_only and len(sides[which]) < len(probes):
            raise Stale("not every input was looked up: the touched groups are counted")
    bound = run.register_sides(sides)
    # every input looked up: every row of those groups, nothing else
    rows = GroupRows(old=bound["old"], new=bound["new"], whole=len(sides["new"]) == len(probes))
    through = "".join(f", {block.items[o.item][0]} through {block.items[o.via.item][0]}" for o in origins if o.via)
    return v.bound(v.bindings.with_group_rows(block, rows)), f" ({len(values)} from the changes{through}): probed " \
        + "; ".join(f"{which} " + ", ".join(f"{block.items[i][0]} {found.num_rows}"
                                             for i, (found, _) in result.items())
                    for which, result in sides.items())


def _changed_values(run: Lookups, origins, v: Versions, conditions: dict) -> pa.Array:
    """The distinct group values ``origins`` (``dvm/group_probes.GroupOrigin``) give: each
    changed item's column among its change's rows -- or among the rows of the input its values
    look up, at the old versions and at the new --, without the rows the block's filter surely
    rejects (they meet no output row) and NULL left out; raises :class:`Stale` when a value of
    the group column itself is NULL (the NULL group changed)."""
    arrays = []
    for origin in origins:
        rows = narrowed(run.change(origin.table, origin.columns, v), conditions.get(origin.item))
        if origin.via is None:
            arrays.append(_group_values(rows[origin.column], origin.own, origin.table))
            continue
        via = origin.via
        keys = rows[origin.column].drop_null()  # a NULL key meets no partner
        for found in run.both_sides(via.source, via.key, via.columns, keys, v).values():
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


def probe_groups(env, plan, block, v: Versions, scratch: list[str], report: ProbeReport) -> Versions:
    """``v`` with the inputs of ``block``'s touched groups, counted by Spark, looked up at the
    old versions and at the new (``dvm/group_probes.group_probes``), when none has a NULL in the
    column looked up and an input is large; else ``v`` unchanged.  What it did goes into
    ``report``, with the milliseconds spent building arrangements (the refresh counts them apart
    from the delta's)."""
    arrangements = arrangements_of(env.config) if placement_of(plan.st) is Placement.AUTO else None
    known_groups = v.bindings.touched_groups(block)
    chain = group_probes(block, v) if arrangements is not None and known_groups else None
    if chain is None:
        return v
    values = [row[chain.group + 1] for row in known_groups]
    if any(value is None for value in values):
        return v
    run = Lookups(env, plan.st.name, SourceTables(env, plan.st.name), arrangements, scratch, report)
    part = f"touched groups ({len(values)}) by {chain.key}"
    # the groups' values are the keys of a first probe, of the item holding the column
    start = Probe(item=chain.item, source=chain.source, which="", key=chain.key, columns=chain.columns,
                  by=GROUPS, by_column=chain.key)
    probes = (start, *chain.probes)
    try:
        if not run.tables.large_inputs(probes, env.config.arrangement_min_rows):
            return v
        for p in probes:
            run.wanted.add(p, {v.old[p.source], v.new[p.source]})
        sides = {}
        for which in ("old", "new"):
            version = v.at(which)
            sides[which] = run.follow(probes, {GROUPS: pa.table({chain.key: pa.array(values)})},
                                      lambda p, version=version: version[p.source], scan_conditions(block))
            if chain.item not in sides[which]:  # a key of another type than the arrangement's
                return v
    except DECLINED as err:  # the groups are recomputed from scans
        report.paths.append(PartPath(part, ReadPath.SCANNED, detail=f"{type(err).__name__}: {err}"))
        return v
    finally:
        report.build_ms += int(arrangements.build_seconds * 1000)
        for event in arrangements.events:
            log.info("%s: arrangement %s", plan.st.name, event)
    rows_before = report.rows
    bound = run.register_sides(sides)
    report.paths.append(PartPath(part, ReadPath.PROBED, rows=report.rows - rows_before, detail=": probed " + "; ".join(
        f"{which} " + ", ".join(f"{block.items[i][0]} {rows.num_rows}" for i, (rows, _) in found.items())
        for which, found in sides.items())))
    return v.bound(v.bindings.with_group_rows(block, GroupRows(old=bound["old"], new=bound["new"])))

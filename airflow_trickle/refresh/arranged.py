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

from airflow_trickle.dvm.base import W, Versions
from airflow_trickle.dvm.probes import JoinTerm, Probe, join_terms
from airflow_trickle.storage.arrangement import WEIGHT, Stale, change_rows
from airflow_trickle.storage.arrangements import Arrangements

log = logging.getLogger(__name__)

#: A change of more rows than this is not read into the refreshing process: Spark joins it.
MAX_CHANGE_ROWS = 2_000_000
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
    ``scratch``), and what was done."""
    v, report = plan.versions, ProbeReport()
    arrangements = arrangements_of(env.config)
    terms = join_terms(plan.node, v) if arrangements is not None else ()
    if not terms:
        return v, report
    tables = _Tables(env, plan.st.name)
    worth = [t for t in terms if _worth_it(t, tables, env.config.arrangement_min_rows, report)]
    if not worth:
        return v, report
    wanted = _Wanted()
    for term in worth:
        for p in term.probes:
            wanted.add(p, {v.at(p.which)[p.source]})
    ready: dict[tuple, object] = {}
    changes: dict[tuple, pa.Table] = {}
    for term in worth:
        try:
            relations = _probe_term(term, v, tables, arrangements, wanted, ready, changes)
            bound = _registered(env, relations, scratch)
        except Exception as err:  # noqa: BLE001 - an optimisation: the term keeps its scans
            report.terms.append(f"{term.source} change: scanned ({type(err).__name__}: {err})")
            log.info("%s: the term of %s's change keeps its scans: %s", plan.st.name, term.source, err,
                     exc_info=not isinstance(err, (Stale, TypeError)))
            continue
        v = v.bind(term.block, f"probed {term.changed}", bound)
        report.rows += sum(rows.num_rows for rows, _ in relations.values())
        probed = ", ".join(f"{term.block.items[i][0]} {relations[i][0].num_rows}" for i in relations if i != term.changed)
        report.terms.append(f"{term.source} change ({relations[term.changed][0].num_rows} rows): probed {probed}")
    for event in arrangements.events:
        log.info("%s: arrangement %s", plan.st.name, event)
    report.build_ms = int(arrangements.build_seconds * 1000)
    return v, report


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


class _Wanted:
    """What one refresh asks of each arrangement -- one per (source, key), shared by its
    probes: the union of their columns and of the versions they read."""

    def __init__(self):
        self.columns: dict[tuple[str, str], list[str]] = {}
        self.versions: dict[tuple[str, str], set[int]] = {}

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


def _worth_it(term: JoinTerm, tables: _Tables, min_rows: int, report: ProbeReport) -> bool:
    """Whether a term's probes save a scan: an input it probes is large, and its change small."""
    if term.source not in tables.locations:
        return False
    try:
        return _large_inputs(term.probes, tables, min_rows)
    except Exception as err:  # noqa: BLE001 - unreadable by delta-rs: Spark scans it
        report.terms.append(f"{term.source} change: scanned ({err})")
        return False


def _probe_term(term: JoinTerm, v: Versions, tables: _Tables, arrangements: Arrangements, wanted, ready,
                changes) -> dict[int, tuple[pa.Table, tuple[str, ...]]]:
    """The change of ``term`` and the rows of each input it probes: FROM item -> (rows, columns)."""
    source = term.source
    key = (source, term.change_columns)
    if key not in changes:
        from airflow_trickle.storage.deltalog import changed_rows

        estimate = changed_rows(tables.locations[source], v.old[source], v.new[source])
        if estimate > MAX_CHANGE_ROWS:  # the commits' metrics say so before anything is read
            raise Stale(f"a change of about {estimate} rows is left to Spark")
        rows = change_rows(tables.uri(source), v.old[source], v.new[source], list(term.change_columns),
                           tables.options(source))
        if rows.num_rows > MAX_CHANGE_ROWS:
            raise Stale(f"a change of {rows.num_rows} rows is left to Spark")
        changes[key] = rows.set_column(rows.schema.get_field_index(WEIGHT), W, rows[WEIGHT].cast(pa.int32()))
    known: dict[int, pa.Table] = {term.changed: changes[key]}
    result = {term.changed: (changes[key], term.change_columns)}
    _follow(term.probes, known, result, lambda p: v.at(p.which)[p.source], tables, arrangements, wanted, ready)
    return result


def _follow(probes, known: dict[int, pa.Table], result: dict, version_of, tables: _Tables,
            arrangements: Arrangements, wanted, ready) -> None:
    """Run ``probes`` in order, each by the keys of a FROM item found before (``known``, which
    grows), at ``version_of(probe)``; the rows found go into ``result`` (item -> (rows, columns))."""
    for p in probes:
        by = known.get(p.by)
        if by is None:
            continue
        arranged = _ready(p.source, p.key, tables, arrangements, wanted, ready)
        keys = by[p.by_column]
        if not _comparable(keys.type, arranged.base.schema.field(p.key).type):
            continue
        values = pc.unique(keys.drop_null()).to_numpy(zero_copy_only=False)
        rows = arranged.probe(np.asarray(values), version_of(p), list(p.columns))
        for item, column, own in p.also:  # the other equalities with rows known by now, exact filters
            if item in known and rows.num_rows and _comparable(known[item][column].type, rows[own].type):
                rows = rows.filter(pc.is_in(rows[own], value_set=pc.unique(known[item][column].drop_null())
                                            .cast(rows[own].type)))
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
                    lambda p, version=version: version[p.source], tables, arrangements, wanted, ready)
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
    for which, result in bound_sides.items():
        v = v.bind(block, f"groups {which}", _registered(env, result, scratch))
        log.info("%s: touched groups (%s) at the %s versions: probed %s", plan.st.name, len(values), which,
                 ", ".join(f"{block.items[i][0]} {rows.num_rows}" for i, (rows, _) in result.items()))
    return v


def _comparable(left: pa.DataType, right: pa.DataType) -> bool:
    """Whether keys of type ``left`` can be looked up among keys of type ``right`` exactly."""
    if pa.types.is_integer(left) and pa.types.is_integer(right):
        return True
    return pa.types.is_date(left) and pa.types.is_date(right) and left == right

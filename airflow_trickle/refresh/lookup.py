"""What one refresh's lookups share: its sources as delta-rs sees them, the arrangements asked
of, the changes read, and the rows found handed to Spark.

Every lookup here gathers rows into the refreshing process, so each is bounded before it
gathers: a change of more than ``refresh/plan.MAX_CHANGE_ROWS`` rows is not read, and a lookup
that would gather more than ``refresh/plan.MAX_PROBED_SHARE`` of a table is left to
Spark's scan.  A bound met raises :class:`~airflow_trickle.storage.arrangement.Stale`; with the
errors delta-rs and Arrow raise for what they cannot read (:data:`DECLINED`), it sends that part
of the delta back to Spark.  Any other error is a bug and fails the refresh.
"""
from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from deltalake.exceptions import DeltaError

from airflow_trickle.dvm.base import W, Versions
from airflow_trickle.dvm.bindings import Relation, Relations
from airflow_trickle.dvm.join_terms import Probe
from airflow_trickle.refresh.narrowing import narrowed
from airflow_trickle.refresh import plan as bounds
from airflow_trickle.refresh.plan import Fallback, ReadPath, change_rows_bound
from airflow_trickle.spark.jars import cache_root
from airflow_trickle.storage.arrangement import WEIGHT, Stale, Unarrangeable, change_rows, why_key_unarrangeable
from airflow_trickle.storage.arrangements import Arrangements
from airflow_trickle.storage.deltalog import data_files, open_table

#: What a lookup may meet and still leave its part of the delta to Spark's scans: a bound it
#: checked, or a table delta-rs or Arrow cannot read as Spark does.
DECLINED = (Stale, Unarrangeable, DeltaError, pa.ArrowException, OSError)


@dataclass(frozen=True)
class PartPath:
    """How one part of a delta was read, as the refresh's history records it."""

    part: str  # the term, e.g. ``"s.o change"`` or ``"groups by cid"``
    path: ReadPath
    rows: int = 0  # rows handed to Spark for it
    detail: str = ""  # what was looked up, or why it was not
    planned: ReadPath | None = None  # the path the plan gave it

    def line(self) -> str:
        if self.path is ReadPath.SCANNED:
            return f"{self.part}: scanned ({self.detail})"
        return f"{self.part}{self.detail}"

    def fallback(self) -> Fallback | None:
        """The departure from the plan this path is, if any."""
        if self.planned is None or self.planned is self.path:
            return None
        return Fallback(self.part, str(self.planned), str(self.path), self.detail)

    def to_dict(self) -> dict:
        return {"part": self.part, "path": str(self.path), "rows": self.rows, "detail": self.detail}


@dataclass
class ProbeReport:
    """What probing did in one refresh, for its log and history."""

    paths: list[PartPath] = field(default_factory=list)
    rows: int = 0  # rows handed to Spark (changes and probed inputs)
    #: Milliseconds spent building arrangements (once per input, not per refresh: the cost
    #: model leaves them out of what a delta costs)
    build_ms: int = 0

    def lines(self) -> list[str]:
        return [p.line() for p in self.paths]

    def fallbacks(self) -> list[Fallback]:
        return [f for f in (p.fallback() for p in self.paths) if f is not None]


def arrangements_on(config) -> bool:
    """Whether join inputs are probed through arrangements under ``config``."""
    return bool(config.arrangement_max_bytes) and config.arrangement_max_bytes > 0


def arrangements_of(config) -> Arrangements | None:
    """The refreshing process's arrangements under ``config``; None when turned off."""
    if not arrangements_on(config):
        return None
    root = Path(config.arrangement_dir) if config.arrangement_dir else cache_root() / "arrangements"
    return Arrangements(root, int(config.arrangement_max_bytes), config.location.delta_options
                        if config.warehouse else None)


class SourceTables:
    """The sources of one stream table as delta-rs sees them: each opened, and each fact the
    plan reads of its log (rows, file bytes, a window's changed rows), read once per refresh --
    a delta's parts ask for the same ones many times."""

    def __init__(self, env, name: str):
        self.locations = {d.source_name: env.catalog.at(d.source_location)
                          for d in env.catalog.dependencies(name) if d.source_location}
        self._opened: dict[str, object] = {}
        self._read: dict[tuple, object] = {}

    def _once(self, key: tuple, read):
        if key not in self._read:
            self._read[key] = read()
        return self._read[key]

    def table(self, source: str):
        if source not in self._opened:
            self._opened[source] = open_table(self.locations[source])
        return self._opened[source]

    def rows(self, source: str) -> int:
        def read() -> int:
            actions = self.table(source).get_add_actions(flatten=True)
            return sum(n for n in actions.column("num_records").to_pylist() if n)
        return self._once(("rows", source), read)

    def uri(self, source: str) -> str:
        return self.locations[source].uri

    def options(self, source: str):
        return self.locations[source].delta_options

    def change_rows(self, source: str, old: int, new: int) -> tuple[int, str | None]:
        """The rows of ``source``'s change (its commits' metrics), and why it is too large to
        read here, or None (``refresh/plan.change_rows_bound``)."""
        return self._once(("changed", source, old, new), lambda: change_rows_bound(self.locations[source], old, new))

    def build_bytes(self, source: str, key: str, arrangements: Arrangements) -> int:
        """The bytes of ``source``'s files a build of its arrangement by ``key`` reads: none
        when one is kept already (it is caught up from the change feed)."""
        if arrangements.folder(self.uri(source), key).exists():
            return 0
        return self._once(("bytes", source), lambda: sum(data_files(self.locations[source])))

    def unarrangeable(self, probes) -> str | None:
        """Why an input ``probes`` look up cannot be arranged by its key (its type, from the
        log), or None."""
        for probe in probes:
            why_not = self._once(("key", probe.source, probe.key),
                                 lambda: why_key_unarrangeable(self.table(probe.source), probe.key))
            if why_not:
                return f"{probe.source}: {why_not}"
        return None

    def large_inputs(self, probes, min_rows: int) -> bool:
        """Whether delta-rs reads every input ``probes`` look up and one holds ``min_rows`` rows
        or more: probing saves a scan only of a large input."""
        return (all(p.source in self.locations for p in probes)
                and any(self.rows(p.source) >= min_rows for p in probes))


class Wanted:
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


@dataclass
class Lookups:
    """One refresh's lookups: the sources, the arrangements and what is asked of them, the
    arrangements opened and the changes read, and where views and the report go."""

    env: object
    name: str
    tables: SourceTables
    arrangements: Arrangements
    scratch: list[str]
    report: ProbeReport = field(default_factory=ProbeReport)
    wanted: Wanted = field(default_factory=Wanted)
    ready: dict = field(default_factory=dict)
    changes: dict = field(default_factory=dict)

    def register(self, relations: dict[int, tuple[pa.Table, tuple[str, ...]]]) -> Relations:
        """Each FROM item's rows handed to Spark as a temporary view (named in ``scratch``)."""
        self.report.rows += sum(rows.num_rows for rows, _ in relations.values())
        return {item: handed_to_spark(self.env, rows, columns, self.scratch)
                for item, (rows, columns) in relations.items()}

    def register_sides(self, sides: dict[str, dict[int, tuple[pa.Table, tuple[str, ...]]]]) -> dict[str, Relations]:
        """:meth:`register` for each side (``old``, ``new``) of a lookup, an item's rows handed
        to Spark once when both sides found the same ones.

        Why: an input that did not change, looked up by keys that did not change either, gives
        the same rows at both versions, and each local relation costs some milliseconds to hand
        over and drop (benchmarks/README.md, "TPC-H at SF 3, all 22: large local relations kept out
        of Spark's plans")."""
        bound: dict[str, Relations] = {}
        seen: list[tuple[pa.Table, tuple[str, ...], Relation]] = []
        for which, relations in sides.items():
            bound[which] = {}
            for item, (rows, columns) in relations.items():
                same = next((relation for held, held_columns, relation in seen
                             if held_columns == columns and held.num_rows == rows.num_rows and held.equals(rows)),
                            None)
                if same is None:
                    [same] = self.register({item: (rows, columns)}).values()
                    seen.append((rows, columns, same))
                bound[which][item] = same
        return bound

    def change(self, source: str, columns: tuple[str, ...], v: Versions) -> pa.Table:
        """The change of ``source`` over the window (``columns`` and the weight ``W``), read once
        per refresh by delta-rs (a read of more of its columns serves a read of fewer); the plan
        checked its size by the commits' metrics, and :class:`Stale` is raised when the rows
        read are more than that bound after all."""
        key = (source, columns)
        wider = next((rows for (name, held), rows in self.changes.items()
                      if name == source and set(columns) <= set(held)), None)
        if key not in self.changes and wider is not None:  # read already with these columns among others
            self.changes[key] = wider.select([*columns, W])
        if key not in self.changes:
            rows = change_rows(self.tables.uri(source), v.old[source], v.new[source], list(columns),
                               self.tables.options(source))
            if rows.num_rows > bounds.MAX_CHANGE_ROWS:
                raise Stale(f"a change of {rows.num_rows} rows is left to Spark")
            self.changes[key] = rows.set_column(rows.schema.get_field_index(WEIGHT), W, rows[WEIGHT].cast(pa.int32()))
        return self.changes[key]

    def arranged(self, source: str, key: str):
        """The arrangement of ``source`` by ``key``, holding what :attr:`wanted` asks of it,
        opened once per refresh."""
        arrangement_key = (source, key)
        if arrangement_key not in self.ready:
            self.ready[arrangement_key] = self.arrangements.ready(
                self.tables.uri(source), key, self.wanted.columns[arrangement_key],
                self.wanted.versions[arrangement_key], table_id=self.tables.table(source).metadata().id)
        return self.ready[arrangement_key]

    def follow(self, probes, known: dict[int, pa.Table], version_of, conditions: dict | None = None) -> dict:
        """Run ``probes`` in order, each by the keys of a FROM item found before (``known``, which
        grows), at ``version_of(probe)``: item -> (rows found, columns), without the rows the
        item's condition in ``conditions`` (``refresh/narrowing.scan_conditions``) rejects."""
        result: dict = {}
        for p in probes:
            by = known.get(p.by)
            if by is None:
                continue
            arranged = self.arranged(p.source, p.key)
            keys = by[p.by_column]
            if not comparable(keys.type, arranged.base.schema.field(p.key).type):
                continue
            values = np.asarray(pc.unique(keys.drop_null()).to_numpy(zero_copy_only=False))
            # what further equalities filter is gathered whatever its share -- in Arrow that is
            # cheap -- and checked once filtered
            rows = (arranged.probe(values, version_of(p), list(p.columns)) if p.also
                    else probed(arranged, values, version_of(p), p.columns))
            for item, column, own in p.also:  # the other equalities with rows known by now, exact filters
                if item in known and rows.num_rows and comparable(known[item][column].type, rows[own].type):
                    rows = rows.filter(pc.is_in(rows[own], value_set=pc.unique(known[item][column].drop_null())
                                                .cast(rows[own].type)))
            rows = narrowed(rows, (conditions or {}).get(p.item))
            check_share(arranged, rows.num_rows)
            known[p.item] = rows
            result[p.item] = (rows, p.columns)
        return result

    def both_sides(self, source: str, key: str, columns, keys, v: Versions) -> dict[str, pa.Table]:
        """The rows of ``source`` whose ``key`` is among ``keys`` (no NULL), at the old versions
        and at the new; raises :class:`Stale` when the keys cannot be looked up exactly."""
        arranged = self.arranged(source, key)
        if not comparable(keys.type, arranged.base.schema.field(key).type):
            raise Stale(f"a key of type {keys.type} is not looked up in the arrangement")
        values = np.asarray(pc.unique(keys).to_numpy(zero_copy_only=False))
        return {which: probed(arranged, values, v.at(which)[source], columns) for which in ("old", "new")}


def handed_to_spark(env, rows: pa.Table, columns, scratch: list[str]) -> Relation:
    """``rows`` handed to Spark as a temporary view, named in ``scratch`` (dropped after the
    commit)."""
    view = f"__trickle_probed_{uuid.uuid4().hex}"
    scratch.append(view)
    env.engine.local_relation(rows, view)
    return Relation(view, tuple(columns))


def probed(arranged, values, version: int, columns) -> pa.Table:
    """The rows of ``arranged`` at ``version`` whose key is among ``values``; raises
    :class:`Stale`, before gathering them, when they are more than ``refresh/plan.MAX_PROBED_SHARE``
    of the table (and more than ``PROBED_ROWS_FLOOR``)."""
    check_share(arranged, arranged.base_rows_of(values))
    return arranged.probe(values, version, list(columns))


def check_share(arranged, rows: int) -> None:
    held = arranged.base.num_rows
    if rows > bounds.PROBED_ROWS_FLOOR and rows > bounds.MAX_PROBED_SHARE * held:
        raise Stale(f"{arranged.uri}: {rows} of its {held} rows match; a scan is cheaper")


def comparable(left: pa.DataType, right: pa.DataType) -> bool:
    """Whether keys of type ``left`` can be looked up among keys of type ``right`` exactly."""
    if pa.types.is_integer(left) and pa.types.is_integer(right):
        return True
    return pa.types.is_date(left) and pa.types.is_date(right) and left == right

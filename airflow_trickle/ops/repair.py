"""The catalog rebuilt from the data: each storage table carries its stream table's definition.

The ``_trickle`` catalog is the fast index every refresh reads, but it is not the only copy of
what matters.  Each storage table holds:

* its **definition** -- query, modes, schedule, options, layout, sources -- as the table
  property ``trickle.definition`` (JSON), written when the table is created and whenever the
  definition changes (``storage/definitions.py``);
* its **frontier** -- what it has consumed -- in the commit metadata of its newest refresh
  commit (``refresh/apply.py``).

So :func:`repair` can rebuild a lost or damaged catalog from the storage tables alone
(stream-table rows and dependencies; the refresh history and group epochs start again), and
:func:`check` can compare the two and report every disagreement, without a JVM on a local
warehouse.
"""
from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING

from airflow_trickle.catalog import Dependency, StreamTable
from airflow_trickle.model import CdcMode, RefreshMode
from airflow_trickle.storage.definitions import (_DEFINED, DEFINITION_KEY, _defined, _recorded, record_definition,
                                                 rows_from_record)

if TYPE_CHECKING:
    from airflow_trickle.location import Location

log = logging.getLogger(__name__)


# -- what is stored ------------------------------------------------------------------------------


@dataclass
class Stored:
    """A Delta table of the warehouse that carries a stream table's definition."""

    name: str
    location: str
    record: dict | None  # None: the property is unreadable
    newest: dict | None  # its newest refresh commit's record
    visible_columns: list[str]


def stored_stream_tables(env) -> dict[str, Stored]:
    """Every storage table of the warehouse that carries a definition, by stream-table name."""
    from airflow_trickle.storage.deltalog import column_names, newest_refresh, table_configuration
    from airflow_trickle.names import HIDDEN_PREFIX

    found = {}
    for name, location in _warehouse_tables(env).items():
        try:
            configuration = table_configuration(env.catalog.at(location))
        except Exception:  # noqa: BLE001 - not a readable Delta table: not ours to repair
            continue
        raw = configuration.get(DEFINITION_KEY)
        if raw is None:
            continue
        try:
            record = json.loads(raw)
        except ValueError:
            record = None
        newest = newest_refresh(env.catalog.at(location))
        columns = [c for c in column_names(env.catalog.at(location)) if not c.startswith(HIDDEN_PREFIX)]
        key = (record or {}).get("name") or name
        found[key] = Stored(name=key, location=location, record=record, newest=newest, visible_columns=columns)
    return found


def _warehouse_tables(env) -> dict[str, str]:
    """``{table name: location}`` of the Delta tables stored under the warehouse: a listing of
    its directory or object-store prefix (no JVM)."""
    from airflow_trickle.location import warehouse_tables

    return {k: v for k, v in warehouse_tables(env.location).items() if v}


# -- check ---------------------------------------------------------------------------------------


@dataclass
class Finding:
    """One disagreement between the catalog and the data (or a risk to a refresh)."""

    stream_table: str
    severity: str  # ERROR: a refresh would fail or be wrong | WARNING: repairable, or at risk
    problem: str
    fix: str


def check(env) -> list[Finding]:
    """Compare the catalog with the storage tables and the sources; an empty list: all agree."""
    findings: list[Finding] = []
    stored = stored_stream_tables(env)
    catalog = {st.name: st for st in env.catalog.list()}
    edges = env.catalog.dependencies()
    for name in sorted(set(stored) - set(catalog)):
        findings.append(Finding(name, "ERROR", "its storage table is not in the catalog",
                                "trickle repair rebuilds its catalog rows from the storage table"))
    for name, st in sorted(catalog.items()):
        stored_one = stored.get(name)
        if stored_one is None:
            exists = st.location and _readable(env.catalog.at(st.location))
            if not exists:
                where = f" ({st.location})" if st.location else " (the catalog records no location)"
                findings.append(Finding(name, "ERROR", f"its storage table is missing{where}",
                                        f"drop it (trickle drop {name}) and create it again"))
                continue
            findings.append(Finding(name, "WARNING", "its storage table does not carry its definition "
                                    "(created by an older version)", "trickle repair writes it"))
        else:
            findings += _compare(st, stored_one)
        for dep in (d for d in edges if d.st_name == name):
            findings += _check_source(st, dep, env.catalog.at(dep.source_location))
    return findings


def _readable(location: "Location") -> bool:
    from airflow_trickle.storage.deltalog import latest_version

    try:
        latest_version(location)
        return True
    except Exception:  # noqa: BLE001 - gone or damaged
        return False


def _compare(st: StreamTable, stored: Stored) -> list[Finding]:
    findings = []
    if stored.record is None:
        return [Finding(st.name, "WARNING", "the definition in its storage table is unreadable",
                        "trickle repair writes it again from the catalog")]
    differing = _differing(stored.record, st)
    if differing:
        findings.append(Finding(st.name, "WARNING", f"the catalog and the storage table disagree on "
                                f"{', '.join(differing)} (an interrupted ALTER?)",
                                "trickle repair writes the catalog's definition to the storage table; "
                                "trickle repair --from-storage does the opposite"))
    if stored.visible_columns != list(st.output_columns):
        findings.append(Finding(st.name, "ERROR", f"its storage table has the columns {stored.visible_columns}, "
                                f"the catalog expects {st.output_columns}",
                                f"trickle refresh {st.name} --mode REINITIALIZE"))
    newest = stored.newest
    if newest is not None and newest["seq"] > st.refresh_seq:
        findings.append(Finding(st.name, "WARNING", f"the catalog is behind its storage table (refresh "
                                f"{st.refresh_seq} recorded, {newest['seq']} committed: an interrupted refresh)",
                                "the next refresh, or trickle repair, brings the catalog up to date"))
    elif st.refresh_seq > 0 and (newest is None or newest["seq"] < st.refresh_seq):
        committed = newest["seq"] if newest else "none"
        findings.append(Finding(st.name, "ERROR", f"the catalog records refresh {st.refresh_seq} but the storage "
                                f"table's newest refresh commit is {committed} (restored or rewritten storage?)",
                                f"trickle refresh {st.name} --mode REINITIALIZE"))
    return findings


def _check_source(st: StreamTable, dep: Dependency, where: "Location") -> list[Finding]:
    from airflow_trickle.storage.deltalog import latest_version, table_configuration

    try:
        newest = latest_version(where)
    except Exception:  # noqa: BLE001 - gone or damaged
        return [Finding(st.name, "ERROR", f"its source {dep.source_name} is unreadable at {where.uri}",
                        "restore the source, or drop the stream table")]
    findings = []
    consumed = st.frontier.get(dep.source_name)
    if consumed is not None and consumed > newest:
        findings.append(Finding(st.name, "ERROR", f"its frontier has version {consumed} of {dep.source_name}, "
                                f"which is only at version {newest} (the source was replaced?)",
                                f"trickle refresh {st.name} --mode REINITIALIZE"))
    if dep.cdc_mode == CdcMode.CDF and st.effective_mode == RefreshMode.DIFFERENTIAL:
        configuration = table_configuration(where)
        if str(configuration.get("delta.enableChangeDataFeed", "false")).lower() != "true":
            findings.append(Finding(st.name, "WARNING", f"the change data feed of {dep.source_name} is off: "
                                    "refreshes recompute instead of applying changes",
                                    f"ALTER TABLE {dep.source_name} SET TBLPROPERTIES "
                                    "(delta.enableChangeDataFeed = true)"))
    return findings


# -- repair --------------------------------------------------------------------------------------


def repair(env, *, from_storage: bool = False) -> list[dict]:
    """Make the catalog and the storage tables agree again; what was done, one dict per action.

    * a catalog table that cannot be read is moved aside (``<name>.damaged-<time>``) and made
      again (local warehouses);
    * a stream table whose storage carries a definition but that the catalog lacks (or whose
      dependency rows are gone) gets its rows back, with the frontier of its newest refresh
      commit; one whose catalog row is behind its newest refresh commit is brought up to it;
    * a storage table without the catalog's current definition gets it written (or, with
      ``from_storage``, the catalog takes the storage table's definition).
    Nothing is dropped: a catalog row without storage is left for ``check`` to report.
    """
    actions = _move_aside_damaged(env)
    stored = stored_stream_tables(env)
    catalog = {st.name: st for st in env.catalog.list()}
    edges = {}
    for dep in env.catalog.dependencies():
        edges.setdefault(dep.st_name, []).append(dep)
    for name, found in sorted(stored.items()):
        if found.record is None:
            continue
        st, dependencies = rows_from_record(found.record, found.location, found.newest)
        current = catalog.get(name)
        if current is None:
            env.catalog.insert(st, dependencies)
            actions.append({"stream_table": name, "action": "rebuilt catalog rows from storage",
                            "frontier": st.frontier, "refresh_seq": st.refresh_seq})
            continue
        if dependencies and not edges.get(name):
            env.catalog.replace(current, dependencies)
            actions.append({"stream_table": name, "action": "rebuilt dependency rows from storage"})
        if from_storage and any(_recorded(found.record, k) != _defined(current, k) for k in _DEFINED):
            _take_definition(env, current, st)
            actions.append({"stream_table": name, "action": "took the storage table's definition"})
        if found.newest is not None and found.newest["seq"] > current.refresh_seq:
            _advance(env, name, st)
            actions.append({"stream_table": name, "action": "brought the catalog up to the newest refresh commit",
                            "frontier": st.frontier, "refresh_seq": st.refresh_seq})
    for name, current in sorted(catalog.items()):
        found = stored.get(name)
        if (found is None and current.location and _readable(env.catalog.at(current.location))) or (
                found is not None and not from_storage and (found.record is None or _differing(found.record, current))):
            record_definition(env, name)
            actions.append({"stream_table": name, "action": "wrote the catalog's definition to its storage table"})
    return actions


def _differing(record: dict, st: StreamTable) -> list[str]:
    """The definition fields (its id aside) on which a stored record and a catalog row disagree."""
    return [key for key in _DEFINED if key != "st_id" and _recorded(record, key) != _defined(st, key)]


def _take_definition(env, current: StreamTable, stored: StreamTable) -> None:
    def change(row: StreamTable) -> None:
        for key in _DEFINED:
            setattr(row, key, getattr(stored, key))
        row.storage = stored.storage

    env.catalog.update(current.name, change)


def _advance(env, name: str, stored: StreamTable) -> None:
    def change(row: StreamTable) -> None:
        row.frontier, row.refresh_seq = dict(stored.frontier), stored.refresh_seq
        row.is_populated, row.needs_reinit = True, False
        row.data_timestamp = stored.data_timestamp or row.data_timestamp

    env.catalog.update(name, change)


def _move_aside_damaged(env) -> list[dict]:
    return [{"stream_table": None, "action": f"moved the unreadable catalog table {table} to {aside} "
                                             f"and made it again ({error[:120]})"}
            for table, aside, error in env.catalog.move_aside_unreadable()]

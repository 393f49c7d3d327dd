"""Read each change a delta reads once, by delta-rs, and hand it to every scan of it.

Why: a delta reads a change many times -- each join term, the keys of an outer term and of an
aggregate's touched groups, both sides of each recompute -- and each read by Spark plans and
runs a scan of the change files.  The rows are the feed's, weighted as ``Scan.delta`` weights
them.  The plan (:func:`plan_changes_once`) leaves to Spark's reads a source delta-rs cannot
read and a change over :data:`~airflow_trickle.refresh.plan.MAX_CHANGE_VIEW_ROWS` rows (by the
commits' metrics, before anything is read); a change of columns not of plain types, found once
read, keeps Spark's reads too.
"""
from __future__ import annotations

import pyarrow as pa

from airflow_trickle.dvm.base import Versions, operators
from airflow_trickle.dvm.scan import Scan
from airflow_trickle.refresh.lookup import DECLINED, Lookups, PartPath
from airflow_trickle.refresh import plan as bounds
from airflow_trickle.refresh.plan import PlannedPart, ReadPath

_PLAIN = (pa.types.is_integer, pa.types.is_floating, pa.types.is_decimal, pa.types.is_string,
          pa.types.is_large_string, pa.types.is_string_view, pa.types.is_boolean, pa.types.is_date,
          pa.types.is_timestamp, pa.types.is_binary, pa.types.is_large_binary)


def _changed_scans(plan, v: Versions) -> dict[str, list]:
    """Source -> the scans of the delta reading its change feed."""
    scans: dict[str, list] = {}
    for node in operators(plan.node):
        if isinstance(node, Scan) and node.changed(v) and v.use_cdf.get(node.name, True):
            scans.setdefault(node.name, []).append(node)
    return scans


def plan_changes_once(run: Lookups, plan, v: Versions, *, spark_only: bool) -> list[tuple[PlannedPart, str]]:
    """For each source whose change the delta reads, whether it is read once here, and why."""
    planned = []
    for source in _changed_scans(plan, v):
        part = f"{source} change read once"
        if spark_only:
            planned.append((PlannedPart(part, ReadPath.SCANNED, "placement: spark"), source))
            continue
        if source not in run.tables.locations:
            planned.append((PlannedPart(part, ReadPath.SCANNED, f"delta-rs does not read {source}"), source))
            continue
        try:
            rows, _ = run.tables.change_rows(source, v.old[source], v.new[source])
        except DECLINED as err:
            planned.append((PlannedPart(part, ReadPath.SCANNED, f"{type(err).__name__}: {err}"), source))
            continue
        if rows > bounds.MAX_CHANGE_VIEW_ROWS:
            planned.append((PlannedPart(part, ReadPath.SCANNED, f"~{rows:,} rows, above {bounds.MAX_CHANGE_VIEW_ROWS:,}: "
                                                                 "Spark reads the feed at each use", rows=rows), source))
            continue
        planned.append((PlannedPart(part, ReadPath.READ_ONCE, "read by delta-rs once", rows=rows), source))
    return planned


def read_changes_once(run: Lookups, sources: list[str], plan, v: Versions) -> dict[str, tuple[pa.Table, tuple, list]]:
    """The change of each of ``sources`` (planned to be read once), read by delta-rs: source ->
    (its rows, their columns, the scans reading it), for :func:`bind_changes`."""
    scans = _changed_scans(plan, v)
    read = {}
    for source in sources:
        nodes = scans[source]
        columns = tuple(dict.fromkeys(c for n in nodes for c in n.columns))
        part = f"{source} change read once"
        try:
            rows = run.change(source, columns, v)
        except DECLINED as err:  # Spark reads the feed
            run.report.paths.append(PartPath(part, ReadPath.SCANNED, detail=f"{type(err).__name__}: {err}",
                                             planned=ReadPath.READ_ONCE))
            continue
        if not all(any(test(f.type) for test in _PLAIN) for f in rows.schema):
            run.report.paths.append(PartPath(part, ReadPath.SCANNED, detail="a column of a type not handed over "
                                                                           "as it is", planned=ReadPath.READ_ONCE))
            continue
        read[source] = (rows, columns, nodes)
    return read


def bind_changes(run: Lookups, v: Versions, read: dict, unused: set[int]) -> Versions:
    """``v`` with each change ``read`` handed to Spark as a temporary view every scan of it
    reads, but for the scans in ``unused`` (whose delta no statement computes)."""
    for source, (rows, columns, nodes) in read.items():
        nodes = [node for node in nodes if id(node) not in unused]
        if not nodes:
            continue
        [(view, _)] = run.register({0: (rows, columns)}).values()
        bindings = v.bindings
        for node in nodes:
            bindings = bindings.with_change(node, view)
        v = v.bound(bindings)
        run.report.paths.append(PartPath(f"{source} change read once", ReadPath.READ_ONCE, rows=rows.num_rows,
                                         detail=f" ({rows.num_rows} rows)", planned=ReadPath.READ_ONCE))
    return v

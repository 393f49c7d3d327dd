"""Read each change a delta reads once, by delta-rs, and hand it to every scan of it.

Why: a delta reads a change many times -- each join term, the keys of an outer term and of an
aggregate's touched groups, both sides of each recompute -- and each read by Spark plans and
runs a scan of the change files.  The rows are the feed's, weighted as ``Scan.delta`` weights
them; a source delta-rs cannot read, or a change over :data:`MAX_CHANGE_VIEW_ROWS` rows (by the
commits' metrics, before anything is read) or of columns not of plain types, keeps Spark's reads.
"""
from __future__ import annotations

import pyarrow as pa

from airflow_trickle.dvm.base import Versions, operators
from airflow_trickle.dvm.scan import Scan
from airflow_trickle.refresh.lookup import DECLINED, Lookups, PartPath, ReadPath
from airflow_trickle.storage.deltalog import changed_rows

#: A change of more rows than this is read by Spark's ``table_changes`` at each use instead of
#: once by delta-rs: a local relation costs some microseconds a row.
MAX_CHANGE_VIEW_ROWS = 200_000
_PLAIN = (pa.types.is_integer, pa.types.is_floating, pa.types.is_decimal, pa.types.is_string,
          pa.types.is_large_string, pa.types.is_string_view, pa.types.is_boolean, pa.types.is_date,
          pa.types.is_timestamp, pa.types.is_binary, pa.types.is_large_binary)


def read_changes_once(run: Lookups, plan, v: Versions) -> dict[str, tuple[pa.Table, tuple, list]]:
    """The change of every changed source the delta reads from its change feed, read once:
    source -> (its rows, their columns, the scans reading it), for :func:`bind_changes`."""
    scans: dict[str, list] = {}
    for node in operators(plan.node):
        if isinstance(node, Scan) and node.changed(v) and v.use_cdf.get(node.name, True):
            scans.setdefault(node.name, []).append(node)
    read = {}
    for source, nodes in scans.items():
        columns = tuple(dict.fromkeys(c for n in nodes for c in n.columns))
        if source not in run.tables.locations:
            continue
        try:
            if changed_rows(run.tables.locations[source], v.old[source], v.new[source]) > MAX_CHANGE_VIEW_ROWS:
                continue
            rows = run.change(source, columns, v)
        except DECLINED as err:  # Spark reads the feed
            run.report.paths.append(PartPath(f"{source} change", ReadPath.SCANNED, detail=str(err)))
            continue
        if all(any(test(f.type) for test in _PLAIN) for f in rows.schema):
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
        run.report.paths.append(PartPath(f"{source} change", ReadPath.READ_ONCE, rows=rows.num_rows,
                                         detail=f" ({rows.num_rows} rows) read once"))
    return v

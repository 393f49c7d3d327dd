"""Facts from a Delta table's log, read with delta-rs: no JVM, a few milliseconds.

Versions decide NO_DATA and the frontier; the newest refresh commit of a storage table is the
ground truth of what it has consumed.  Both are needed before (and often instead of) Spark work.
"""
from __future__ import annotations

import contextlib
import json
import threading

from airflow_trickle.names import COMMIT_KEY, normalize_location  # noqa: F401 - what the logs are read by
from airflow_trickle.location import Location

_scope = threading.local()


@contextlib.contextmanager
def reused_handles():
    """Within this block (one refresh), :func:`open_table` opens each table once and brings the
    handle up to the newest version on later calls, instead of opening it again.

    Why: a refresh reads the same logs a dozen times (versions, row counts, refresh records,
    before and after its commit); each open replays the log, a large share of a refresh's time
    outside Spark (benchmarks/README.md, "TPC-H at SF 3, all 22: a refresh's bookkeeping
    halved, and a fairer turn order").  Only for one refresh: a table dropped and created again at the
    same place restarts its log, which a kept handle would not notice."""
    outer = getattr(_scope, "handles", None)
    if outer is None:
        _scope.handles = {}
    try:
        yield
    finally:
        if outer is None:
            _scope.handles = None


def reuse_scope() -> dict | None:
    """The :func:`reused_handles` block this thread is in (an object that stays the same for the
    whole block), or None outside one: what the catalog keys its once-a-refresh reads on."""
    return getattr(_scope, "handles", None)


def open_table(location: Location, *, fresh: bool = False):
    """The delta-rs handle of the Delta table at ``location`` (newest version), opened with its
    storage options (a plain string is refused: it would reach an object store without them).
    Inside :func:`reused_handles` a handle opened before is reused, brought up to date, unless
    ``fresh`` (a handle the caller will write through)."""
    from deltalake import DeltaTable

    if not isinstance(location, Location):
        raise TypeError(f"open_table takes a Location, not {type(location).__name__} ({location!r})")
    handles = None if fresh else getattr(_scope, "handles", None)
    if handles is None:
        return DeltaTable(location.uri, storage_options=location.delta_options)
    key = (location.uri, tuple(sorted((location.delta_options or {}).items())))
    table = handles.get(key)
    if table is None:
        table = handles[key] = DeltaTable(location.uri, storage_options=location.delta_options)
    else:
        table.update_incremental()
    return table


def why_rows_unreadable(table) -> str | None:
    """Why delta-rs would not read the rows of the delta-rs ``table`` as Spark does (None: it
    would).  Column mapping: delta-rs 1.6 looks a column up in the data files by its logical
    name, not by the physical name the mapping gave it (a column created or renamed under the
    mapping), and under the legacy protocol (reader version 2) it does not refuse -- every such
    value comes back NULL, and an arrangement of the table would silently miss every partner
    (``tests/test_arranged_joins.py``).  Deletion vectors and other reader features its scans
    refuse themselves, but its change feed reader does not: a delete by deletion vectors that
    names rows past a file's first row group aborts the process (``storage.arrangement.change_rows``
    asks here first).  They are named here so that the reason says so."""
    protocol = table.protocol()
    mode = (table.metadata().configuration or {}).get("delta.columnMapping.mode", "none")
    if mode != "none" or "columnMapping" in (protocol.reader_features or []):
        return "column mapping"
    unsupported = set(protocol.reader_features or []) - {"timestampNtz"}
    if unsupported:
        return f"reader features {', '.join(sorted(unsupported))}"
    return None


def latest_version(location: Location) -> int:
    """The newest committed version of the Delta table at ``location``."""
    return int(open_table(location).version())


def recorded_refreshes(location: Location, limit: int = 50) -> list[dict]:
    """The refresh records carried by the newest commits of a storage table, newest first.

    Each is the JSON a refresh put in its data commit (``seq``, ``frontier``, ...) plus the
    commit's ``version``.
    """
    records = []
    for commit in open_table(location).history(limit):
        raw = commit.get("userMetadata")
        if not raw:
            continue
        try:
            payload = json.loads(raw)
        except ValueError:
            continue
        if isinstance(payload, dict) and COMMIT_KEY in payload:
            records.append({**payload[COMMIT_KEY], "version": int(commit["version"]),
                            "metrics": _spark_metric_names(commit.get("operationMetrics") or {})})
    return records


#: A delta-rs MERGE's and write's metrics under the names Spark's give them.
_DELTA_RS_METRICS = {"num_target_rows_inserted": "numTargetRowsInserted",
                     "num_target_rows_updated": "numTargetRowsUpdated",
                     "num_target_rows_deleted": "numTargetRowsDeleted", "num_source_rows": "numSourceRows",
                     "num_added_rows": "numOutputRows"}


def _spark_metric_names(metrics: dict) -> dict:
    """``metrics`` with a delta-rs commit's names also given Spark's (one reader for both)."""
    return {**metrics, **{spark: metrics[rs] for rs, spark in _DELTA_RS_METRICS.items() if rs in metrics}}


def newest_refresh(location: Location) -> dict | None:
    """The record of the storage table's newest refresh commit (by commit version), or None.

    The newest commit decides: after a group rollback, a RESTORE commit (carrying the restored
    frontier under a higher number) supersedes the refresh it undid.
    """
    return newest_of(recorded_refreshes(location))


def newest_of(records: list[dict]) -> dict | None:
    """The newest refresh (by commit version) among :func:`recorded_refreshes`' ``records``."""
    return max((r for r in records if isinstance(r.get("seq"), int)), key=lambda r: r["version"], default=None)


def commit_time(commit: dict | None):
    """When a commit (one of :func:`commit_history`'s) was written, as a UTC datetime; None if unknown."""
    from datetime import datetime, timezone

    written = (commit or {}).get("timestamp")
    return datetime.fromtimestamp(int(written) / 1000, tz=timezone.utc) if written is not None else None


def commit_operations(location: Location, start_version: int, end_version: int) -> list[dict]:
    """Commit infos of versions in ``[start_version, end_version]``, oldest first; a delta-rs
    MERGE's metrics also under Spark's names, so that the readers below count a stream table's
    delta-rs commits as they count Spark's (the cost model saw no change in an upstream stream
    table that delta-rs had committed, and a downstream bag table never took the append path
    after one that only inserted)."""
    table = open_table(location)
    newest = table.version()
    infos = table.history(max(0, newest - start_version + 1))
    return sorted(({**c, "operationMetrics": _spark_metric_names(c.get("operationMetrics") or {})}
                   for c in infos if start_version <= int(c["version"]) <= end_version), key=lambda c: c["version"])


#: Row counts of one commit's changes, by operation metric (an update counts as a delete and an insert).
_CHANGE_METRICS = {
    "numOutputRows": 1, "numDeletedRows": 1, "numUpdatedRows": 2,
    "numTargetRowsInserted": 1, "numTargetRowsDeleted": 1, "numTargetRowsUpdated": 2,
}
_MERGE_OUTPUT_DOUBLES = ("numTargetRowsInserted", "numTargetRowsUpdated")


def changed_rows(location: Location, after_version: int, up_to_version: int) -> int:
    """Rows changed by the commits in ``(after_version, up_to_version]``, from their metrics."""
    total = 0
    for commit in commit_operations(location, after_version + 1, up_to_version):
        metrics = commit.get("operationMetrics") or {}
        merge = any(key in metrics for key in _MERGE_OUTPUT_DOUBLES)
        for key, weight in _CHANGE_METRICS.items():
            if merge and key == "numOutputRows":
                continue  # a MERGE's output rows repeat its inserted and updated rows
            total += weight * int(metrics.get(key) or 0)
    return total


#: Operations that never change a table's rows.
_NO_DATA_OPERATIONS = {"OPTIMIZE", "VACUUM START", "VACUUM END", "SET TBLPROPERTIES", "FSCK"}


def only_empty_commits(location: Location, after_version: int, up_to_version: int) -> bool:
    """True when no commit in ``(after_version, up_to_version]`` changed a row.

    A refresh that found nothing still commits its (empty) MERGE; a reader of that stream table
    can then skip the window without reading its change feed.  Anything unrecognised counts as
    a change.
    """
    commits = commit_operations(location, after_version + 1, up_to_version)
    if len(commits) != up_to_version - after_version:
        return False
    for commit in commits:
        operation = str(commit.get("operation") or "")
        if operation in _NO_DATA_OPERATIONS:
            continue
        metrics = commit.get("operationMetrics") or {}
        keys = ("numTargetRowsInserted", "numTargetRowsUpdated", "numTargetRowsDeleted")
        if operation != "MERGE" or any(k not in metrics for k in keys) or any(int(metrics[k]) for k in keys):
            return False
    return True


def _parameter(commit: dict, key: str) -> str:
    """A commit's operation parameter as plain text (Spark JSON-encodes string values)."""
    value = (commit.get("operationParameters") or {}).get(key)
    return str(value).strip('"') if value is not None else ""


def insert_only_commits(location: Location, after_version: int, up_to_version: int) -> bool:
    """True when every commit in ``(after_version, up_to_version]`` only added rows.

    Appends (``INSERT INTO``, ``mode("append")``, streaming appends) qualify, and so do MERGEs
    that only inserted (a stream table's refresh that found only new rows).  Anything else, or
    a gap in the history, does not.
    """
    commits = commit_operations(location, after_version + 1, up_to_version)
    if len(commits) != up_to_version - after_version:
        return False
    for commit in commits:
        operation = str(commit.get("operation") or "")
        metrics = commit.get("operationMetrics") or {}
        if operation == "WRITE" and _parameter(commit, "mode") == "Append":
            continue
        if operation == "STREAMING UPDATE" and _parameter(commit, "outputMode") == "Append":
            continue
        if operation in _NO_DATA_OPERATIONS - {"FSCK"}:
            continue
        if operation == "MERGE" and all(int(metrics.get(k, -1)) == 0 for k in (
                "numTargetRowsUpdated", "numTargetRowsDeleted")) and "numTargetRowsInserted" in metrics:
            continue
        return False
    return True


def has_no_data_files(location: Location) -> bool:
    """Whether the newest version has no data file at all: certainly empty (file statistics
    may be missing, so a zero :func:`row_count` is no proof)."""
    return open_table(location).get_add_actions(flatten=True).num_rows == 0


def row_count(location: Location) -> int:
    """Rows in the newest version, from the file statistics in the log (deleted-row vectors not
    subtracted: an estimate for ratios, not a count)."""
    actions = open_table(location).get_add_actions(flatten=True)
    return sum(n for n in actions.column("num_records").to_pylist() if n)


def stored_row_count(table) -> float:
    """Rows in the delta-rs ``table`` by its files' statistics (infinite where a file has none:
    no bound can be checked on it)."""
    counts = table.get_add_actions(flatten=True).column("num_records").to_pylist()
    return float("inf") if None in counts else sum(counts)


def table_configuration(location: Location) -> dict[str, str]:
    """The table properties (``delta.*``, ``trickle.*``, ...) of the Delta table at ``location``."""
    return dict(open_table(location).metadata().configuration or {})


def column_names(location: Location) -> list[str]:
    """The column names of the Delta table at ``location``, in order."""
    return [f.name for f in open_table(location).schema().fields]


def column_types(location: Location) -> list[tuple[str, str]]:
    """The columns of the Delta table at ``location`` with their Delta types (``integer``,
    ``decimal(10,2)``...; a nested type as its JSON)."""
    return [(f.name, getattr(f.type, "type", None) or str(f.type))
            for f in open_table(location).schema().fields]


def commit_history(location: Location, limit: int | None = None) -> list[dict]:
    """The newest ``limit`` commit infos still in the log (all without one): ``version``,
    ``timestamp`` in ms, ``operation``..."""
    return list(open_table(location).history(limit))


def active_file_count(location: Location) -> int:
    """Data files in the newest version (what a read of the table opens)."""
    return open_table(location).get_add_actions(flatten=True).num_rows


def data_files(location: Location) -> list[int]:
    """The size in bytes of each data file of the newest version, from the log."""
    return [n or 0 for n in open_table(location).get_add_actions(flatten=True).column("size_bytes").to_pylist()]

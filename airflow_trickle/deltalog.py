"""Facts from a Delta table's log, read with delta-rs: no JVM, a few milliseconds.

Versions decide NO_DATA and the frontier; the newest refresh commit of a storage table is the
ground truth of what it has consumed.  Both are needed before (and often instead of) Spark work.
"""
from __future__ import annotations

import json

#: Key under which a refresh records itself in a Delta commit's ``userMetadata``.
COMMIT_KEY = "airflow_trickle"


def normalize_location(location: str) -> str:
    """``file:/tmp/x`` (as Spark reports it) -> ``/tmp/x``; other URIs unchanged."""
    if location.startswith("file://"):
        return location[len("file://"):]
    if location.startswith("file:"):
        return location[len("file:"):]
    return location


def _open(location: str, storage_options: dict | None = None):
    from deltalake import DeltaTable

    return DeltaTable(normalize_location(location), storage_options=storage_options)


def latest_version(location: str, storage_options: dict | None = None) -> int:
    """The newest committed version of the Delta table at ``location``."""
    return int(_open(location, storage_options).version())


def recorded_refreshes(location: str, limit: int = 50, storage_options: dict | None = None) -> list[dict]:
    """The refresh records carried by the newest commits of a storage table, newest first.

    Each is the JSON a refresh put in its data commit (``seq``, ``frontier``, ...) plus the
    commit's ``version``.
    """
    records = []
    for commit in _open(location, storage_options).history(limit):
        raw = commit.get("userMetadata")
        if not raw:
            continue
        try:
            payload = json.loads(raw)
        except ValueError:
            continue
        if isinstance(payload, dict) and COMMIT_KEY in payload:
            records.append({**payload[COMMIT_KEY], "version": int(commit["version"])})
    return records


def commit_operations(location: str, start_version: int, end_version: int,
                      storage_options: dict | None = None) -> list[dict]:
    """Commit infos of versions in ``[start_version, end_version]``, oldest first."""
    table = _open(location, storage_options)
    newest = table.version()
    infos = table.history(max(0, newest - start_version + 1))
    return sorted((c for c in infos if start_version <= int(c["version"]) <= end_version), key=lambda c: c["version"])

"""Rows of the catalog tables, as plain dataclasses with their Spark schemas."""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields
from datetime import datetime, timezone

STREAM_TABLES_DDL = """
    name STRING NOT NULL, st_id STRING NOT NULL, defining_query STRING, original_query STRING,
    schedule STRING, refresh_mode STRING, effective_mode STRING, mode_reason STRING, status STRING,
    is_populated BOOLEAN, data_timestamp TIMESTAMP, frontier STRING, refresh_seq BIGINT,
    consecutive_errors INT, needs_reinit BOOLEAN, output_columns STRING, storage STRING,
    options STRING, last_refresh_at TIMESTAMP, created_at TIMESTAMP, updated_at TIMESTAMP
"""

DEPENDENCIES_DDL = """
    st_name STRING NOT NULL, source_name STRING NOT NULL, source_type STRING, columns_used ARRAY<STRING>,
    cdc_mode STRING, schema_fingerprint STRING
"""

REFRESH_HISTORY_DDL = """
    refresh_id STRING NOT NULL, st_name STRING NOT NULL, seq BIGINT, action STRING, status STRING,
    rows_inserted BIGINT, rows_deleted BIGINT, start_time TIMESTAMP, end_time TIMESTAMP,
    duration_ms BIGINT, reason STRING, error_message STRING, initiated_by STRING,
    frontier_from STRING, frontier_to STRING, data_timestamp TIMESTAMP
"""

#: Fields stored as JSON text.
_JSON_FIELDS = {"frontier", "output_columns", "storage", "options", "frontier_from", "frontier_to"}


def utcnow() -> datetime:
    return datetime.now(timezone.utc)


def _as_utc(value):
    if isinstance(value, datetime):
        return value.astimezone(timezone.utc) if value.tzinfo is None else value.astimezone(timezone.utc)
    return value


class _Row:
    """Conversion between a dataclass and a catalog row (JSON for nested fields, UTC timestamps)."""

    def to_row(self) -> dict:
        row = asdict(self)
        for key in _JSON_FIELDS & row.keys():
            row[key] = None if row[key] is None else json.dumps(row[key], sort_keys=True)
        return row

    @classmethod
    def from_row(cls, row) -> "_Row":
        data = row.asDict() if hasattr(row, "asDict") else dict(row)
        names = {f.name for f in fields(cls)}
        values = {}
        for key, value in data.items():
            if key not in names:
                continue
            if key in _JSON_FIELDS and isinstance(value, str):
                value = json.loads(value)
            values[key] = _as_utc(value)
        return cls(**values)


@dataclass
class StreamTable(_Row):
    """One stream table: its definition and its refresh state."""

    name: str
    st_id: str
    defining_query: str
    original_query: str
    schedule: str | None
    refresh_mode: str
    effective_mode: str
    mode_reason: str | None = None
    status: str = "ACTIVE"
    is_populated: bool = False
    data_timestamp: datetime | None = None
    #: ``{source name: Delta version}`` the stream table's contents correspond to.
    frontier: dict[str, int] = field(default_factory=dict)
    #: Number of the last refresh that committed data; the idempotent commit id.
    refresh_seq: int = 0
    consecutive_errors: int = 0
    needs_reinit: bool = False
    output_columns: list[str] = field(default_factory=list)
    #: How rows are identified in storage: ``{"identity": "bag"|"keyed", "hidden": [...]}``.
    storage: dict = field(default_factory=dict)
    #: Per-table settings (diamond consistency, freshness target, ...).
    options: dict = field(default_factory=dict)
    last_refresh_at: datetime | None = None
    created_at: datetime | None = None
    updated_at: datetime | None = None


@dataclass
class Dependency(_Row):
    """An edge of the dependency graph: stream table ``st_name`` reads ``source_name``."""

    st_name: str
    source_name: str
    source_type: str  # TABLE | STREAM_TABLE
    columns_used: list[str] | None = None
    cdc_mode: str = "snapshot"
    schema_fingerprint: str | None = None


@dataclass
class RefreshRecord(_Row):
    """One row of the refresh history."""

    refresh_id: str
    st_name: str
    seq: int
    action: str  # NO_DATA | FULL | DIFFERENTIAL | REINITIALIZE | SKIP
    status: str  # COMPLETED | FAILED | SKIPPED
    rows_inserted: int = 0
    rows_deleted: int = 0
    start_time: datetime | None = None
    end_time: datetime | None = None
    duration_ms: int = 0
    reason: str | None = None
    error_message: str | None = None
    initiated_by: str = "MANUAL"  # MANUAL | SCHEDULER | INITIAL
    frontier_from: dict | None = None
    frontier_to: dict | None = None
    data_timestamp: datetime | None = None

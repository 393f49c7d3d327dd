"""Rows of the catalog tables, as plain dataclasses with their Spark schemas."""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields
from datetime import datetime, timezone

from airflow_trickle.model import CdcMode, StorageLayout
from airflow_trickle.options import TableOptions


def _schemas():
    """Arrow schemas of the catalog tables (built lazily: pyarrow loads only when the catalog is used)."""
    import pyarrow as pa

    ts = pa.timestamp("us", tz="UTC")
    return {
        "stream_tables": pa.schema([
            ("name", pa.string()), ("st_id", pa.string()), ("defining_query", pa.string()),
            ("original_query", pa.string()), ("schedule", pa.string()), ("refresh_mode", pa.string()),
            ("effective_mode", pa.string()), ("mode_reason", pa.string()), ("status", pa.string()),
            ("is_populated", pa.bool_()), ("data_timestamp", ts), ("frontier", pa.string()),
            ("refresh_seq", pa.int64()), ("consecutive_errors", pa.int32()), ("needs_reinit", pa.bool_()),
            ("output_columns", pa.string()), ("location", pa.string()), ("storage", pa.string()),
            ("options", pa.string()), ("last_refresh_at", ts), ("created_at", ts), ("updated_at", ts),
            ("definition_id", pa.string()), ("owner", pa.string()), ("owner_file", pa.string()),
        ]),
        "dependencies": pa.schema([
            ("st_name", pa.string()), ("source_name", pa.string()), ("source_type", pa.string()),
            ("source_location", pa.string()), ("columns_used", pa.list_(pa.string())), ("cdc_mode", pa.string()),
            ("schema_fingerprint", pa.string()), ("definition_id", pa.string()),
        ]),
        "consistency_groups": pa.schema([
            ("name", pa.string()), ("members", pa.list_(pa.string())), ("convergence_points", pa.list_(pa.string())),
            ("epoch", pa.int64()), ("last_status", pa.string()), ("last_error", pa.string()), ("updated_at", ts),
        ]),
        "refresh_history": pa.schema([
            ("refresh_id", pa.string()), ("st_name", pa.string()), ("seq", pa.int64()), ("action", pa.string()),
            ("status", pa.string()), ("rows_inserted", pa.int64()), ("rows_deleted", pa.int64()),
            ("start_time", ts), ("end_time", ts), ("duration_ms", pa.int64()), ("reason", pa.string()),
            ("error_message", pa.string()), ("initiated_by", pa.string()), ("frontier_from", pa.string()),
            ("frontier_to", pa.string()), ("data_timestamp", ts), ("phases", pa.string()),
            ("rows_estimated", pa.int64()), ("plan", pa.string()),
        ]),
    }


@dataclass
class GroupState:
    """An atomic consistency group's epoch: how many attempts of the whole group succeeded."""

    name: str
    members: list[str]
    convergence_points: list[str]
    epoch: int = 0
    last_status: str | None = None  # COMPLETED | ROLLED_BACK
    last_error: str | None = None
    updated_at: datetime | None = None


#: Fields stored as JSON text.
_JSON_FIELDS = {"frontier", "output_columns", "storage", "options", "frontier_from", "frontier_to", "phases", "plan"}


def utcnow() -> datetime:
    return datetime.now(timezone.utc)


def _as_utc(value):
    if isinstance(value, datetime):
        return value.replace(tzinfo=timezone.utc) if value.tzinfo is None else value.astimezone(timezone.utc)
    return value


class _Row:
    """Conversion between a dataclass and a catalog row (JSON for nested fields, UTC timestamps)."""

    def to_row(self) -> dict:
        row = asdict(self)
        if isinstance(getattr(self, "storage", None), StorageLayout):
            row["storage"] = self.storage.to_dict()
        if isinstance(getattr(self, "options", None), TableOptions):
            row["options"] = self.options.to_dict()
        for key in _JSON_FIELDS & row.keys():
            row[key] = None if row[key] is None else json.dumps(row[key], sort_keys=True)
        return row

    @classmethod
    def from_row(cls, row: dict) -> "_Row":
        data = dict(row)
        names = {f.name for f in fields(cls)}
        values = {}
        for key, value in data.items():
            if key not in names:
                continue
            if key in _JSON_FIELDS and isinstance(value, str):
                value = json.loads(value)
            values[key] = _as_utc(value)
        if "storage" in names:
            values["storage"] = StorageLayout.from_dict(values.get("storage"))
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
    #: Location (path or URI) of the storage Delta table.
    location: str | None = None
    #: How rows are stored: identity, apply strategy, hidden state columns.
    storage: StorageLayout = field(default_factory=StorageLayout)
    #: Per-table settings (diamond consistency, freshness target, ...), checked.
    options: TableOptions = field(default_factory=TableOptions)
    last_refresh_at: datetime | None = None
    created_at: datetime | None = None
    updated_at: datetime | None = None
    #: Which definition (a create, or an ALTER of the query) the row holds: only the dependency
    #: rows with the same id are its edges (see ``CatalogStore.replace``).  None in catalogs
    #: written before the id existed, whose dependency rows have none either.
    definition_id: str | None = None
    #: The project that declares it (``project/plan.py``): another project declaring the same
    #: name is refused.  None: made through the API or CLI, or before projects owned tables.
    owner: str | None = None
    #: The project file of the owner, as its loader saw it (for the refusal's message).
    owner_file: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.options, TableOptions):
            self.options = TableOptions.parse(self.options, stream_table=self.name)


@dataclass
class Dependency(_Row):
    """An edge of the dependency graph: stream table ``st_name`` reads ``source_name``."""

    st_name: str
    source_name: str
    source_type: str  # a SourceType: TABLE | STREAM_TABLE
    #: Location of the source's Delta table, for reading its version without Spark.
    source_location: str | None = None
    columns_used: list[str] | None = None
    cdc_mode: str = CdcMode.SNAPSHOT  # a CdcMode
    schema_fingerprint: str | None = None
    #: The ``definition_id`` of the stream-table row this edge belongs to.
    definition_id: str | None = None


@dataclass
class RefreshRecord(_Row):
    """One row of the refresh history."""

    refresh_id: str
    st_name: str
    seq: int
    action: str  # NO_DATA | FULL | DIFFERENTIAL | REINITIALIZE | SKIP | FRESHNESS_MISS | CHANGE_FEED ...
    status: str  # COMPLETED | FAILED | SKIPPED | ALERT
    rows_inserted: int = 0
    rows_deleted: int = 0
    start_time: datetime | None = None
    end_time: datetime | None = None
    duration_ms: int = 0
    reason: str | None = None
    error_message: str | None = None
    initiated_by: str = "MANUAL"  # MANUAL | INITIAL | AIRFLOW <dag>/<run>/<task> | DEADLINE
    frontier_from: dict | None = None
    frontier_to: dict | None = None
    data_timestamp: datetime | None = None
    #: Milliseconds per refresh phase and the Spark jobs run (see ``refresh/phases.py``).
    phases: dict | None = None
    #: Rows the cost model expected the delta to touch (compare with rows_inserted + rows_deleted).
    rows_estimated: int | None = None
    #: How the refresh was planned to run (``refresh/plan.ExecutionPlan``: its action, committer
    #: and each part's read path, with the estimated rows and bytes through the refreshing
    #: process and why) and where it departed (``fallbacks``), with how each part was read
    #: (``taken``); None for a refresh that needed no Spark.
    plan: dict | None = None

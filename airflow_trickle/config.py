"""One configuration object, with every default in one place.

Values come from (lowest to highest precedence): the defaults below, environment
variables ``TRICKLE_<FIELD>`` (upper case), and keyword arguments.  ``docs/configuration.md``
lists every field.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field, fields


#: How a FULL refresh may write its rows (``TrickleConfig.full_refresh_write``).
FULL_REFRESH_WRITES = ("auto", "merge", "overwrite")


@dataclass
class TrickleConfig:
    """Settings of one airflow_trickle deployment."""

    #: Directory (or URI) of the warehouse; the catalog lives in ``<warehouse>/_trickle``.
    warehouse: str | None = None
    #: Spark master of the embedded session.
    spark_master: str = "local[*]"
    #: ``spark.sql.shuffle.partitions`` of the embedded session; small suits one machine.
    shuffle_partitions: int = 4
    #: Extra Spark configuration for the embedded session.
    spark_conf: dict[str, str] = field(default_factory=dict)
    #: Schedule given to stream tables created without one.
    default_schedule: str = "1m"
    #: Refresh mode given to stream tables created without one.
    default_refresh_mode: str = "DIFFERENTIAL"
    #: A DIFFERENTIAL refresh whose changed rows exceed this share of the source rows runs FULL.
    differential_max_change_ratio: float = 0.15
    #: A DIFFERENTIAL refresh expected to touch more than this share of the stream table's rows
    #: (changed source rows × the fan-out observed on the last refresh) runs FULL.
    differential_max_touched_ratio: float = 0.5
    #: A DIFFERENTIAL refresh runs FULL when the stream table's DIFFERENTIAL refreshes, for a
    #: change at least half as large, took more than this many times its FULL ones (the fastest
    #: of the last three of each, from the history; ``refresh/cost.py``).
    differential_max_time_ratio: float = 1.0
    #: A DIFFERENTIAL change expected to touch at most this many stored rows is committed by
    #: delta-rs in the refreshing process instead of a Spark MERGE (Spark still computes it;
    #: ``refresh/local_merge.py``); 0 turns that off.
    local_commit_max_rows: int = 100_000
    #: How a FULL refresh writes: ``auto`` (replace the stored rows unless another stream table
    #: reads this one, then MERGE only the difference), ``merge`` or ``overwrite``.
    full_refresh_write: str = "auto"
    #: Failures in a row after which a stream table is suspended.
    max_consecutive_errors: int = 3
    #: How change sets are read: ``auto`` (CDF where it is readable, snapshot diff otherwise),
    #: ``cdf`` or ``snapshot``.
    cdc_mode: str = "auto"
    #: Attempts of a refresh commit that meets a retryable error (a concurrent Delta commit,
    #: transient I/O); waits grow exponentially from ``retry_backoff_seconds``.
    refresh_attempts: int = 3
    retry_backoff_seconds: float = 1.0
    #: Allow cycles of stream tables whose queries are all monotone; they refresh to a fixpoint.
    allow_circular: bool = False
    #: Passes over a cycle before its refresh gives up as not converging.
    max_fixpoint_iterations: int = 10
    #: Attempts for a catalog write that meets a concurrent Delta commit.
    catalog_write_attempts: int = 8
    #: ``maintain`` removes the refresh history older than this many days (each stream table
    #: keeps its newest 100 rows whatever their age); None keeps it all.
    history_retention_days: float | None = None
    #: ``health`` reports a reader AT_RISK (and alerts) when a VACUUM of its source may delete a
    #: change it has not read within this many hours.
    change_feed_warning_hours: float = 24.0

    def __post_init__(self) -> None:
        if str(self.full_refresh_write).lower() not in FULL_REFRESH_WRITES:
            raise ValueError(f"full_refresh_write must be one of {', '.join(map(repr, FULL_REFRESH_WRITES))}, "
                             f"not {self.full_refresh_write!r}")

    @classmethod
    def from_env(cls, **overrides) -> "TrickleConfig":
        """Defaults, overlaid with ``TRICKLE_*`` environment variables, overlaid with ``overrides``."""
        values: dict = {}
        for f in fields(cls):
            raw = os.environ.get(f"TRICKLE_{f.name.upper()}")
            if raw is None or f.name == "spark_conf":
                continue
            default = getattr(cls(), f.name)
            # the optional fields: the warehouse (a path), the others numbers
            kind = str if f.name == "warehouse" else float if default is None else type(default)
            values[f.name] = raw.strip().lower() in ("1", "true", "yes", "on") if kind is bool else kind(raw)
        values.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**values)

"""One configuration object, with every default in one place.

Values come from (lowest to highest precedence): the defaults below, environment
variables ``TRICKLE_<FIELD>`` (upper case), and keyword arguments.  ``docs/configuration.md``
lists every field.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field, fields

from airflow_trickle.model import CdcMode, RefreshMode


#: How a FULL refresh may write its rows (``TrickleConfig.full_refresh_write``).
FULL_REFRESH_WRITES = ("auto", "merge", "overwrite")


@dataclass
class TrickleConfig:
    """Settings of one airflow_trickle deployment."""

    #: Directory or URI of the warehouse (``s3://bucket/prefix``, ``s3a://`` accepted); the
    #: catalog lives in ``<warehouse>/_trickle``.
    warehouse: str | None = None
    #: How to reach an object-store warehouse: endpoint, region, credentials, ``aws_allow_http``
    #: ... (``object_store`` names, as delta-rs takes them; ``docs/object-storage.md``).  From the
    #: environment as JSON in ``TRICKLE_STORAGE_OPTIONS``.  Credentials left out come from the
    #: standard AWS environment variables; given here, they are never logged or recorded.
    storage_options: dict[str, str] = field(default_factory=dict, repr=False)
    #: A Hive metastore (``thrift://host:9083``) for the Spark sessions, the Spark service and
    #: spark-submit jobs: stream tables are then registered there by name, for every Spark
    #: application and BI tool on the metastore.  None: Spark's in-memory catalog (the default).
    metastore_uri: str | None = None
    #: The address the Spark service (``trickle serve``) listens on.  Loopback by default: the
    #: service runs SQL with the warehouse's credentials for anyone who reaches it.  Any other
    #: address needs ``service_token``.
    service_bind_address: str = "127.0.0.1"
    #: The Spark service's shared secret: the service refuses calls without it, and clients
    #: (the CLI, refresh tasks) send it as a bearer token.  From ``TRICKLE_SERVICE_TOKEN``, or
    #: in Airflow the password of the ``spark_connect`` connection; never logged or recorded.
    service_token: str | None = field(default=None, repr=False)
    #: Seconds a writer's lease on a stream table lasts without renewal (object-store warehouses;
    #: renewed every quarter of it while the writer works).  A killed writer's tables are free
    #: again after this long.  0 turns the lease off -- only to show what it prevents.
    lease_seconds: float = 60.0
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
    #: The two ratio rules above apply only when the sources and the stream table together
    #: hold more than this many rows.  Below it a delta and a recompute both cost what their
    #: fixed steps cost, and a change larger than its small source is common (an aggregate of
    #: 50 groups, every one of which changes each cycle): the time rule decides, from what this
    #: table's own refreshes took.  0: the ratio rules apply at every size.
    differential_ratio_min_rows: int = 10_000
    #: A DIFFERENTIAL refresh runs FULL when the stream table's DIFFERENTIAL refreshes, for a
    #: change at least half as large, took more than this many times its FULL ones (the fastest
    #: of the last three of each, from the history; ``refresh/time_rule.py``).
    differential_max_time_ratio: float = 1.0
    #: A DIFFERENTIAL change expected to touch at most this many stored rows is committed by
    #: delta-rs in the refreshing process instead of a Spark MERGE (Spark still computes it;
    #: ``refresh/local_merge.py``); 0 turns that off.
    local_commit_max_rows: int = 100_000
    #: ... and expected to rewrite at most this many bytes of its files (a stored row's file is
    #: where its identity hashes to, so a few rows may touch every file of a large table).
    local_commit_max_bytes: int = 1024**3
    #: Bytes the refreshing process may keep as join arrangements (``refresh/arranged.py``): a
    #: large join input a delta probes, sorted by its join key in a memory-mapped file, so that
    #: the change's partners cost a lookup instead of a scan; the least recently used are evicted
    #: past it.  0 turns arrangements off (every join delta scans its inputs).
    arrangement_max_bytes: int = 4 * 1024**3
    #: Where they are kept: a local folder of the refreshing process (None: the
    #: ``arrangements`` folder of the cache, ``~/.cache/airflow_trickle`` or ``TRICKLE_JAR_CACHE``).
    arrangement_dir: str | None = None
    #: A join delta probes arrangements when one of the inputs it looks up holds at least this
    #: many rows (smaller inputs are scanned cheaply; the first probe builds an arrangement).
    #: An input of a few hundred thousand rows is worth it once the change is narrowed by the
    #: query's filter first (benchmarks/README.md, "TPC-H at SF 3, all 22: changes narrowed by
    #: the query's filter before they look anything up").
    arrangement_min_rows: int = 500_000
    #: A refresh builds an arrangement (reading its table into the refreshing process) only of a
    #: table whose files hold at most this many bytes; a larger input is scanned by Spark.
    arrangement_build_max_bytes: int = 4 * 1024**3
    #: How a FULL refresh writes: ``auto`` (replace the stored rows unless a stream table that
    #: refreshes DIFFERENTIAL reads this one, then MERGE only the difference), ``merge`` or ``overwrite``.
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
        from airflow_trickle.location import normalize_options

        # ``${NAME}`` in a value is read from the environment here, so a project file or a
        # connection can name a credential without holding it
        self.storage_options = {k: os.path.expandvars(v) for k, v in normalize_options(self.storage_options).items()}
        # a typo here would otherwise surface at the first refresh that reads the setting, or never
        for kind, name in ((CdcMode, "cdc_mode"), (RefreshMode, "default_refresh_mode")):
            if str(getattr(self, name)).strip().lower() not in {m.value.lower() for m in kind}:
                raise ValueError(f"{name} must be one of {', '.join(repr(m.value) for m in kind)}, "
                                 f"not {getattr(self, name)!r}")
        if str(self.full_refresh_write).lower() not in FULL_REFRESH_WRITES:
            raise ValueError(f"full_refresh_write must be one of {', '.join(map(repr, FULL_REFRESH_WRITES))}, "
                             f"not {self.full_refresh_write!r}")

    @property
    def location(self):
        """The warehouse as a :class:`~airflow_trickle.location.Location` (URI + options)."""
        from airflow_trickle.location import Location

        if not self.warehouse:
            raise ValueError("no warehouse configured")
        return Location(self.warehouse, self.storage_options)

    def __repr__(self) -> str:
        from airflow_trickle.location import redact

        shown = {f.name: getattr(self, f.name) for f in fields(self)
                 if f.name not in ("storage_options", "service_token")}
        return f"TrickleConfig({shown}, storage_options={redact(self.storage_options)})"

    @classmethod
    def from_env(cls, **overrides) -> "TrickleConfig":
        """Defaults, overlaid with ``TRICKLE_*`` environment variables, overlaid with ``overrides``."""
        values: dict = {}
        for f in fields(cls):
            raw = os.environ.get(f"TRICKLE_{f.name.upper()}")
            if raw is None or f.name == "spark_conf":
                continue
            if f.name == "storage_options":
                values[f.name] = _json_object(raw, f"TRICKLE_{f.name.upper()}")
                continue
            default = getattr(cls(), f.name)
            # the optional fields: the warehouse (a path), the others numbers
            kind = (str if f.name in ("warehouse", "metastore_uri", "arrangement_dir", "service_token")
                    else float if default is None else type(default))
            values[f.name] = raw.strip().lower() in ("1", "true", "yes", "on") if kind is bool else kind(raw)
        values.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**values)


def _json_object(raw: str, what: str) -> dict:
    import json

    try:
        value = json.loads(raw)
    except ValueError as err:
        raise ValueError(f"{what} must be a JSON object: {err}") from None
    if not isinstance(value, dict):
        raise ValueError(f"{what} must be a JSON object, not {type(value).__name__}")
    return value

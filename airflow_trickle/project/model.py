"""A project's plain metadata: its stream tables, refresh units, Spark and Airflow settings.

Built by ``loading.py`` from YAML or Python and validated there; read by the DAG factory, the
refresh operators and the Spark job.  No Airflow, Spark or JVM here.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from datetime import timedelta
from typing import Any

import networkx as nx

from airflow_trickle.config import TrickleConfig
from airflow_trickle.graph import commit_watches, group_period
from airflow_trickle.model import RefreshMode
from airflow_trickle.options import TableOptions
from airflow_trickle.schedule import ON_COMMIT, Schedule, format_duration, parse_schedule

DIAMOND_CONSISTENCY = ("none", "atomic")
DIAMOND_SCHEDULE_POLICIES = ("fastest", "slowest")
#: A stream table's freshness target, when none is given, is this many times its period.
DEFAULT_FRESHNESS_FACTOR = 2


@dataclass(frozen=True)
class StreamTableSpec:
    """One stream table as the project declares it."""

    name: str
    query: str
    #: Duration or cron text; ``None`` is CALCULATED (inherit the tightest downstream cadence).
    schedule: str | None
    refresh_mode: RefreshMode
    diamond_consistency: str = "none"
    diamond_schedule_policy: str = "fastest"
    #: Explicit freshness target; ``None`` means the default (twice the effective period).
    freshness: timedelta | None = None
    description: str = ""
    #: Tables the query reads (qualified), stream tables of the project included.
    sources: tuple[str, ...] = ()
    #: The options the file sets besides the keys above (``cluster_by``, ``strict``, the cost
    #: model's ratios, ...), checked as the API checks them.
    table_options: TableOptions = TableOptions()

    @property
    def cluster_by(self) -> tuple[str, ...]:
        """The storage's clustering columns; () for none."""
        return self.table_options.clustering

    def options(self) -> dict:
        """The per-table options stored in the catalog row."""
        options = {**self.table_options.to_dict(), "diamond_consistency": self.diamond_consistency,
                   "diamond_schedule_policy": self.diamond_schedule_policy}
        if self.freshness is not None:
            options["freshness_seconds"] = int(self.freshness.total_seconds())
        return options

    def to_json(self) -> dict:
        """A JSON-ready form that :meth:`from_json` turns back into an equal spec."""
        return {"name": self.name, "query": self.query, "schedule": self.schedule,
                "refresh_mode": str(self.refresh_mode), "diamond_consistency": self.diamond_consistency,
                "diamond_schedule_policy": self.diamond_schedule_policy,
                "freshness_seconds": None if self.freshness is None else self.freshness.total_seconds(),
                "description": self.description, "sources": list(self.sources),
                "options": self.table_options.to_dict()}

    @classmethod
    def from_json(cls, data: dict) -> "StreamTableSpec":
        """The spec :meth:`to_json` wrote (a refresh job rehydrates its tables this way).

        >>> spec = StreamTableSpec("s.t", "SELECT 1 AS x FROM s.a", "5m", "AUTO", freshness=timedelta(minutes=9),
        ...                        table_options=TableOptions(cluster_by=("x",), strict=True))
        >>> StreamTableSpec.from_json(spec.to_json()) == spec
        True
        """
        seconds = data.get("freshness_seconds")
        return cls(name=data["name"], query=data["query"], schedule=data.get("schedule"),
                   refresh_mode=RefreshMode.parse(data["refresh_mode"], what="refresh mode", stream_table=data["name"]),
                   diamond_consistency=data.get("diamond_consistency", "none"),
                   diamond_schedule_policy=data.get("diamond_schedule_policy", "fastest"),
                   freshness=None if seconds is None else timedelta(seconds=seconds),
                   description=data.get("description", ""), sources=tuple(data.get("sources", ())),
                   table_options=TableOptions.parse(data.get("options"), stream_table=data["name"]))


@dataclass(frozen=True)
class RefreshUnit:
    """What one refresh task refreshes: a single stream table, or an atomic diamond group in order."""

    members: tuple[str, ...]
    convergence_points: tuple[str, ...] = ()
    #: ``fastest`` (the group fires when any member is due) or ``slowest`` (when all are).
    schedule_policy: str = "fastest"

    @property
    def is_group(self) -> bool:
        return len(self.members) > 1

    @property
    def database(self) -> str:
        """The database whose task group holds the unit's task (its last member's)."""
        return self.members[-1].split(".", 1)[0]

    @property
    def task_name(self) -> str:
        """Task id inside the database's task group: the table name, or ``atomic__<last member>``."""
        last = self.members[-1].split(".", 1)[1]
        return f"atomic__{last}" if self.is_group else last

    @property
    def task_id(self) -> str:
        return f"{self.database}.{self.task_name}"


@dataclass(frozen=True)
class SparkSettings:
    """How refreshes run: the Airflow connection, Spark Connect or spark-submit, extra Spark configuration.

    ``submit`` None lets the connection decide: a ``spark_connect`` connection runs the engine
    in the task process against the Spark service; a ``spark`` connection submits a job.
    """

    conn_id: str = "spark_local"
    submit: bool | None = None
    conf: dict = field(default_factory=dict)
    deploy_mode: str | None = None
    driver_memory: str | None = None
    executor_memory: str | None = None
    num_executors: int | None = None


@dataclass(frozen=True)
class AirflowSettings:
    """How the generated DAG looks to Airflow."""

    dag_id: str
    #: The DAG's tick (duration, cron, or ``None`` for manual runs only); default: the shortest period.
    schedule: str | None
    pool: str | None = None
    tags: tuple[str, ...] = ("airflow_trickle",)
    #: Dotted path of a callable (or an Airflow notifier instance) called on a freshness miss.
    freshness_notifier: Any = None
    #: Attach a Deadline Alert (Airflow 3) to every run.
    deadline: bool = True
    #: Dotted path of an async callable run by the triggerer when a run misses its deadline.
    deadline_callback: str = "airflow_trickle.notifiers.freshness.record_deadline_miss"
    #: More than one, so a manual run starts while a scheduled run is in flight; two runs never
    #: refresh one stream table at once (:mod:`airflow_trickle.refresh.lock`).
    max_active_runs: int = 3
    retries: int = 0
    retry_delay: timedelta = timedelta(seconds=30)
    start_date: str = "2024-01-01"
    #: Schedule of the maintenance DAG (``<dag_id>__maintenance``: OPTIMIZE and VACUUM of every
    #: stream table, see :mod:`airflow_trickle.ops.maintain`); ``None``, the default, makes none.
    maintenance: str | None = None
    #: Its VACUUM retention in hours (default: each table's own); stretched for lagging readers.
    maintenance_retention_hours: float | None = None
    #: An Airflow connection to Airflow's own REST API (host, port, login, password): with one,
    #: each refresh task notes its outcome on its task instance and ``plan`` its selection on the
    #: run (:mod:`airflow_trickle.operators.notes`); without one, no notes.
    notes_connection: str | None = None

    #: Refresh on commit (stream tables with ``schedule: on_commit``): how often the watcher on
    #: Airflow's triggerer reads each watched source's Delta log ...
    on_commit_poll_interval: timedelta = timedelta(seconds=5)
    #: ... how long after the newest commit it waits for more before it fires (a burst is one refresh) ...
    on_commit_debounce: timedelta = timedelta(seconds=2)
    #: ... and the longest it holds a commit back while a burst goes on.
    on_commit_max_wait: timedelta = timedelta(seconds=30)

    @property
    def maintenance_dag_id(self) -> str:
        return f"{self.dag_id}__maintenance"

    @property
    def on_commit_dag_id(self) -> str:
        return f"{self.dag_id}__on_commit"


@dataclass(frozen=True)
class DeploySettings:
    """What a changed project does to the warehouse (``project/plan.py``, ``project/apply.py``)."""

    #: The DAG's plan task: ``apply`` creates and ALTERs as the file says; ``stop`` fails the run
    #: with the plan, for someone to run ``trickle apply``.
    on_change: str = "apply"
    #: Drop stream tables the project owns that its file no longer declares.
    prune: bool = False


@dataclass
class Project:
    """A validated project: its stream tables in refresh order, its graph and refresh units."""

    name: str
    warehouse: str
    stream_tables: dict[str, StreamTableSpec]
    declared_sources: tuple[str, ...] | None
    settings: dict
    spark: SparkSettings
    airflow: AirflowSettings
    freshness_factor: float = DEFAULT_FRESHNESS_FACTOR
    graph: nx.DiGraph = field(default_factory=nx.DiGraph, repr=False)
    periods: dict[str, timedelta | None] = field(default_factory=dict, repr=False)
    units: list[RefreshUnit] = field(default_factory=list, repr=False)
    deploy: DeploySettings = field(default_factory=DeploySettings)
    #: The project file it was loaded from (None: defined in Python).
    file: str | None = None

    def config(self) -> TrickleConfig:
        """The :class:`TrickleConfig` a refresh job of this project runs with."""
        conf = dict(self.settings.get("spark_conf") or {})
        conf.update(self.spark.conf)
        settings = {k: v for k, v in self.settings.items() if k != "spark_conf"}
        return TrickleConfig.from_env(warehouse=self.warehouse, spark_conf=conf, **settings)

    def unit_of(self, name: str) -> RefreshUnit:
        for unit in self.units:
            if name in unit.members:
                return unit
        raise KeyError(name)

    def schedule_of(self, unit: RefreshUnit) -> Schedule:
        """When ``unit`` is due: its own schedule, or a duration derived from the graph."""
        own = [parse_schedule(self.stream_tables[m].schedule) for m in unit.members]
        if not unit.is_group and not own[0].is_calculated:
            return own[0]
        if unit.is_group and unit.schedule_policy == "fastest" and any(s.on_commit for s in own):
            return parse_schedule(ON_COMMIT)  # no clock is faster than a commit
        period = group_period([self.periods[m] for m in unit.members], unit.schedule_policy)
        return Schedule(text=None, every=period) if period else Schedule(text=None)

    def freshness_target(self, name: str) -> timedelta | None:
        """How stale ``name`` may get: its explicit target, else ``freshness_factor`` × its period."""
        spec = self.stream_tables[name]
        if spec.freshness is not None:
            return spec.freshness
        period = self.periods.get(name)
        return None if period is None else period * self.freshness_factor

    @cached_property
    def commit_watches(self):
        """The sources watched for this project's ``on_commit`` stream tables, and what each
        commit refreshes (:func:`~airflow_trickle.graph.schedules.commit_watches`)."""
        return commit_watches(self.graph, {n: s.schedule for n, s in self.stream_tables.items()})

    def tick(self) -> str | None:
        """The generated DAG's schedule: explicit, else the shortest effective period of any unit."""
        if self.airflow.schedule is not None:
            return None if self.airflow.schedule.lower() in ("none", "manual") else self.airflow.schedule
        periods = [p for p in (self.schedule_of(u).nominal_period() for u in self.units) if p]
        if not periods:
            return None
        return format_duration(min(periods))

    def to_job_spec(self, names: list[str]) -> dict:
        """What a Spark refresh job needs to create (when missing) and refresh ``names``."""
        from airflow_trickle.location import public_options

        settings = dict(self.settings)
        if settings.get("storage_options"):  # credentials reach the job by its environment
            settings["storage_options"] = public_options(self.config().storage_options)
        return {"project": self.name, "file": self.file, "warehouse": self.warehouse, "settings": settings,
                "on_change": self.deploy.on_change, "stream_tables": [self.stream_tables[n].to_json() for n in names]}

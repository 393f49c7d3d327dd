"""Projects: the stream tables one Airflow DAG keeps fresh, declared in YAML or in Python.

A project is validated entirely without Spark, a JVM or the catalog -- SQL parse, sources,
cycles, schedules, diamond settings -- because it is loaded while Airflow parses the dags
folder, where an error must surface at import time and a JVM would cost seconds per parse.

YAML form (``docs/airflow.md`` documents every key)::

    project: shop
    warehouse: ${TRICKLE_WAREHOUSE}
    sources: [shop.orders, shop.customers]
    defaults: {schedule: 5m, diamond_consistency: atomic}
    stream_tables:
      - name: shop.order_lines
        query: SELECT o.id, c.region FROM shop.orders o JOIN shop.customers c ON o.customer_id = c.id
        schedule: 1m
      - name: shop.region_counts
        query_file: sql/region_counts.sql

Python form: ``define_project("shop", warehouse=..., stream_tables=[{...}, ...])`` takes the
same keys as keyword arguments.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

import networkx as nx

from airflow_trickle.config import TrickleConfig
from airflow_trickle.definition import check_static
from airflow_trickle.errors import CycleError, ProjectError, ProjectErrors, TrickleError, UnknownSourceError
from airflow_trickle.errors import UnsupportedConstructError
from airflow_trickle.graph import build_graph, consistency_groups, effective_periods, find_cycle, group_period
from airflow_trickle.graph import topological_order
from airflow_trickle.model import RefreshMode
from airflow_trickle.names import qualify_name
from airflow_trickle.schedule import Schedule, format_duration, parse_schedule
from airflow_trickle.sql.parse import nondeterministic_calls, source_names

DIAMOND_CONSISTENCY = ("none", "atomic")
DIAMOND_SCHEDULE_POLICIES = ("fastest", "slowest")
#: A stream table's freshness target, when none is given, is this many times its period.
DEFAULT_FRESHNESS_FACTOR = 2

_PROJECT_KEYS = {"project", "warehouse", "sources", "defaults", "settings", "spark", "airflow", "stream_tables"}
_TABLE_KEYS = {"name", "query", "query_file", "schedule", "refresh_mode", "diamond_consistency",
               "diamond_schedule_policy", "freshness", "description"}
_DEFAULT_KEYS = {"schedule", "refresh_mode", "diamond_consistency", "diamond_schedule_policy", "freshness_factor"}
_SPARK_KEYS = {"connection", "conn_id", "submit", "conf", "deploy_mode", "driver_memory", "executor_memory", "num_executors"}
_AIRFLOW_KEYS = {"dag_id", "schedule", "pool", "tags", "freshness_notifier", "deadline", "deadline_callback",
                 "max_active_runs", "retries", "retry_delay", "start_date", "maintenance",
                 "maintenance_retention_hours", "notes_connection"}


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

    def options(self) -> dict:
        """The per-table options stored in the catalog row."""
        options = {"diamond_consistency": self.diamond_consistency,
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
                "description": self.description, "sources": list(self.sources)}

    @classmethod
    def from_json(cls, data: dict) -> "StreamTableSpec":
        """The spec :meth:`to_json` wrote (a refresh job rehydrates its tables this way).

        >>> spec = StreamTableSpec("s.t", "SELECT 1 AS x FROM s.a", "5m", "AUTO", freshness=timedelta(minutes=9))
        >>> StreamTableSpec.from_json(spec.to_json()) == spec
        True
        """
        seconds = data.get("freshness_seconds")
        return cls(name=data["name"], query=data["query"], schedule=data.get("schedule"),
                   refresh_mode=RefreshMode.parse(data["refresh_mode"], what="refresh mode", stream_table=data["name"]),
                   diamond_consistency=data.get("diamond_consistency", "none"),
                   diamond_schedule_policy=data.get("diamond_schedule_policy", "fastest"),
                   freshness=None if seconds is None else timedelta(seconds=seconds),
                   description=data.get("description", ""), sources=tuple(data.get("sources", ())))


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
    #: stream table, see :mod:`airflow_trickle.maintain`); ``None``, the default, makes none.
    maintenance: str | None = None
    #: Its VACUUM retention in hours (default: each table's own); stretched for lagging readers.
    maintenance_retention_hours: float | None = None
    #: An Airflow connection to Airflow's own REST API (host, port, login, password): with one,
    #: each refresh task notes its outcome on its task instance and ``plan`` its selection on the
    #: run (:mod:`airflow_trickle.notes`); without one, no notes.
    notes_connection: str | None = None

    @property
    def maintenance_dag_id(self) -> str:
        return f"{self.dag_id}__maintenance"


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
        if not unit.is_group:
            own = parse_schedule(self.stream_tables[unit.members[0]].schedule)
            if not own.is_calculated:
                return own
        period = group_period([self.periods[m] for m in unit.members], unit.schedule_policy)
        return Schedule(text=None, every=period) if period else Schedule(text=None)

    def freshness_target(self, name: str) -> timedelta | None:
        """How stale ``name`` may get: its explicit target, else ``freshness_factor`` × its period."""
        spec = self.stream_tables[name]
        if spec.freshness is not None:
            return spec.freshness
        period = self.periods.get(name)
        return None if period is None else period * self.freshness_factor

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
        return {"project": self.name, "warehouse": self.warehouse, "settings": self.settings,
                "stream_tables": [self.stream_tables[n].to_json() for n in names]}


def load_project(path: str | os.PathLike) -> Project:
    """Read and validate a YAML project file."""
    import yaml

    file = Path(path)
    try:
        data = yaml.safe_load(file.read_text())
    except FileNotFoundError:
        raise ProjectError(f"project file {str(file)!r} does not exist") from None
    except yaml.YAMLError as err:
        raise ProjectError(f"project file {str(file)!r} is not valid YAML: {err}") from None
    if not isinstance(data, dict):
        raise ProjectError(f"project file {str(file)!r} must hold a mapping with 'project' and 'stream_tables'")
    return project_from_dict(data, base_dir=file.parent)


def define_project(project: str, *, stream_tables: list[dict], base_dir: str | os.PathLike | None = None,
                   **keys) -> Project:
    """The Python form of a project file: the same keys, as keyword arguments."""
    return project_from_dict({"project": project, "stream_tables": stream_tables, **keys},
                             base_dir=Path(base_dir) if base_dir else Path.cwd())


def project_from_dict(data: dict, *, base_dir: Path) -> Project:
    """Validate a project given as a mapping; every error names the stream table and the cause."""
    _check_keys(data, _PROJECT_KEYS, "project")
    name = data.get("project")
    if not isinstance(name, str) or not name.strip():
        raise ProjectError("a project needs a name: set 'project: <name>'")
    name = name.strip()
    warehouse = _warehouse(data.get("warehouse"), base_dir, name)
    defaults = _mapping(data.get("defaults"), "defaults")
    _check_keys(defaults, _DEFAULT_KEYS, "defaults")
    settings = _settings(_mapping(data.get("settings"), "settings"))
    spark = _spark_settings(_mapping(data.get("spark"), "spark"))
    airflow = _airflow_settings(_mapping(data.get("airflow"), "airflow"), name)
    declared = data.get("sources")
    if declared is not None:
        if not isinstance(declared, list) or not all(isinstance(s, str) for s in declared):
            raise ProjectError(f"project {name!r}: 'sources' must be a list of table names")
        declared = tuple(sorted({qualify_name(s) for s in declared}))
    entries = data.get("stream_tables")
    if not isinstance(entries, list) or not entries:
        raise ProjectError(f"project {name!r}: 'stream_tables' must be a non-empty list")

    specs: dict[str, StreamTableSpec] = {}
    problems: list[TrickleError] = []  # every stream table's, reported together
    for index, entry in enumerate(entries):
        try:
            spec = _stream_table(entry, index, defaults, base_dir)
        except TrickleError as err:
            problems.append(err)
            continue
        if spec.name in specs:
            problems.append(ProjectError(f"declared twice in project {name!r}", stream_table=spec.name))
        specs[spec.name] = spec
    problems += _source_problems(specs, declared)
    if len(problems) == 1:
        raise problems[0]
    if problems:
        raise ProjectErrors(name, problems)

    graph = build_graph([(source, spec.name) for spec in specs.values() for source in spec.sources],
                        stream_tables=specs)
    cycle = find_cycle(graph)
    if cycle:
        raise CycleError(f"the project's stream tables form a cycle: {' -> '.join(cycle)}", cycle=cycle,
                         stream_table=cycle[0], hint="a project cannot declare a cycle; monotone cycles are "
                                                     "supported through the Python API and CLI (allow_circular)")
    order = [n for n in topological_order(graph) if n in specs]
    specs = {n: specs[n] for n in order}
    periods = effective_periods(graph, {n: s.schedule for n, s in specs.items()})
    atomic = {n for n, s in specs.items() if s.diamond_consistency == "atomic"}
    units = []
    for group in consistency_groups(graph, atomic=atomic):
        policies = {specs[m].diamond_schedule_policy for m in group.convergence_points} or {"fastest"}
        units.append(RefreshUnit(tuple(group.members), tuple(group.convergence_points),
                                 "slowest" if policies == {"slowest"} else "fastest"))
    factor = defaults.get("freshness_factor", DEFAULT_FRESHNESS_FACTOR)
    if not isinstance(factor, (int, float)) or factor <= 0:
        raise ProjectError(f"project {name!r}: defaults.freshness_factor must be a positive number, not {factor!r}")
    project = Project(name=name, warehouse=warehouse, stream_tables=specs, declared_sources=declared,
                      settings=settings, spark=spark, airflow=airflow, freshness_factor=factor, graph=graph,
                      periods=periods, units=units)
    tick = project.tick()
    if tick:
        parse_schedule(tick, stream_table=None)  # a bad airflow.schedule fails at load, not in Airflow
    return project


def _stream_table(entry: Any, index: int, defaults: dict, base_dir: Path) -> StreamTableSpec:
    if not isinstance(entry, dict) or not isinstance(entry.get("name"), str) or not entry["name"].strip():
        raise ProjectError(f"stream_tables[{index}] needs a 'name'")
    label = entry["name"]
    unknown = set(entry) - _TABLE_KEYS
    if unknown:
        raise ProjectError(f"unknown key(s) {sorted(unknown)}; known keys: {sorted(_TABLE_KEYS)}", stream_table=label)
    query = entry.get("query")
    if entry.get("query_file"):
        if query:
            raise ProjectError("give 'query' or 'query_file', not both", stream_table=label)
        path = base_dir / entry["query_file"]
        try:
            query = path.read_text()
        except OSError as err:
            raise ProjectError(f"cannot read query_file {str(path)!r}: {err.strerror}", stream_table=label) from None
    if not isinstance(query, str) or not query.strip():
        raise ProjectError("needs a 'query' (SQL text) or a 'query_file'", stream_table=label)
    schedule = entry["schedule"] if "schedule" in entry else defaults.get("schedule", "1m")
    schedule = None if schedule is None or str(schedule).strip() == "" else str(schedule)
    mode = entry.get("refresh_mode", defaults.get("refresh_mode", "DIFFERENTIAL"))
    qualified, ast, _, mode = check_static(label, query, schedule, mode)
    if mode == RefreshMode.DIFFERENTIAL:
        for fn in nondeterministic_calls(ast):
            raise UnsupportedConstructError(
                f"cannot be maintained in DIFFERENTIAL mode: non-deterministic function {fn}()",
                construct=f"{fn}()", stream_table=qualified,
                hint="use refresh_mode FULL (recompute each refresh) or AUTO")
    consistency = _choice(entry, defaults, "diamond_consistency", DIAMOND_CONSISTENCY, "none", qualified)
    policy = _choice(entry, defaults, "diamond_schedule_policy", DIAMOND_SCHEDULE_POLICIES, "fastest", qualified)
    freshness = None
    if entry.get("freshness") not in (None, ""):
        parsed = parse_schedule(str(entry["freshness"]), stream_table=qualified)
        if parsed.every is None:
            raise ProjectError(f"freshness must be a duration such as '10m', not {entry['freshness']!r}",
                               stream_table=qualified)
        freshness = parsed.every
    return StreamTableSpec(name=qualified, query=query.strip(), schedule=schedule, refresh_mode=mode,
                           diamond_consistency=consistency, diamond_schedule_policy=policy, freshness=freshness,
                           description=str(entry.get("description") or ""), sources=tuple(source_names(ast)))


def _source_problems(specs: dict[str, StreamTableSpec], declared: tuple[str, ...] | None) -> list[TrickleError]:
    if declared is None:
        return []
    return [UnknownSourceError(f"the defining query reads '{source}', which is neither a stream table of the "
                               "project nor one of its declared sources", stream_table=spec.name,
                               hint="add it under 'sources:' or define it as a stream table")
            for spec in specs.values() for source in spec.sources if source not in specs and source not in declared]


def _choice(entry: dict, defaults: dict, key: str, allowed: tuple[str, ...], default: str, table: str) -> str:
    value = str(entry.get(key, defaults.get(key, default))).strip().lower()
    if value not in allowed:
        raise ProjectError(f"{key} must be one of {', '.join(allowed)}, not {entry.get(key, defaults.get(key))!r}",
                           stream_table=table)
    return value


def _warehouse(value: Any, base_dir: Path, project: str) -> str:
    raw = os.path.expandvars(str(value)) if value else os.environ.get("TRICKLE_WAREHOUSE", "")
    if not raw or "$" in raw:
        raise ProjectError(f"project {project!r} has no warehouse: set 'warehouse:' (a path or URI) "
                           "or the TRICKLE_WAREHOUSE environment variable")
    if "://" in raw:
        return raw
    return str((base_dir / raw).resolve()) if not os.path.isabs(raw) else raw


def _mapping(value: Any, key: str) -> dict:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ProjectError(f"'{key}' must be a mapping, not {type(value).__name__}")
    return value


def _check_keys(data: dict, allowed: set[str], where: str) -> None:
    unknown = set(data) - allowed
    if unknown:
        raise ProjectError(f"unknown key(s) {sorted(unknown)} in {where}; known keys: {sorted(allowed)}")


def _settings(raw: dict) -> dict:
    known = {f for f in TrickleConfig.__dataclass_fields__ if f != "warehouse"}
    _check_keys(raw, known, "settings")
    try:
        TrickleConfig(**raw)
    except (TypeError, ValueError) as err:
        raise ProjectError(f"invalid settings: {err}") from None
    return dict(raw)


def _spark_settings(raw: dict) -> SparkSettings:
    _check_keys(raw, _SPARK_KEYS, "spark")
    conf = _mapping(raw.get("conf"), "spark.conf")
    if "connection" in raw and "conn_id" in raw:
        raise ProjectError("spark: give 'connection' (or its older name 'conn_id'), not both")
    submit = raw.get("submit")
    if submit is not None and not isinstance(submit, bool):
        raise ProjectError(f"spark.submit must be true or false, not {submit!r}")
    return SparkSettings(conn_id=str(raw.get("connection", raw.get("conn_id", "spark_local"))), submit=submit,
                         conf={k: str(v) for k, v in conf.items()},
                         deploy_mode=raw.get("deploy_mode"), driver_memory=raw.get("driver_memory"),
                         executor_memory=raw.get("executor_memory"), num_executors=raw.get("num_executors"))


def _airflow_settings(raw: dict, project: str) -> AirflowSettings:
    _check_keys(raw, _AIRFLOW_KEYS, "airflow")
    dag_id = str(raw.get("dag_id") or f"trickle_{project}")
    schedule = raw.get("schedule")
    if schedule is not None and str(schedule).lower() not in ("none", "manual"):
        parse_schedule(str(schedule))
    values = {k: v for k, v in raw.items() if k not in ("dag_id", "schedule")}
    if "tags" in values:
        values["tags"] = tuple(values["tags"])
    if "retry_delay" in values:
        values["retry_delay"] = parse_schedule(str(values["retry_delay"])).every or timedelta(seconds=30)
    if values.get("maintenance") is not None:
        values["maintenance"] = str(values["maintenance"])
        if parse_schedule(values["maintenance"]).is_calculated:
            values["maintenance"] = None  # an empty schedule: no maintenance DAG
    hours = values.get("maintenance_retention_hours")
    if hours is not None and (isinstance(hours, bool) or not isinstance(hours, (int, float)) or hours < 0):
        raise ProjectError(f"project {project!r}: airflow.maintenance_retention_hours must be a number of hours "
                           f"(0 or more), not {hours!r}")
    return AirflowSettings(dag_id=dag_id, schedule=None if schedule is None else str(schedule), **values)


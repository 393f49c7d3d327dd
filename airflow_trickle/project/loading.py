"""Load and validate a project from YAML (``load_project``) or Python (``define_project``).
"""
from __future__ import annotations

import os
from datetime import timedelta
from pathlib import Path
from typing import Any

from airflow_trickle.definition.analysis import check_static
from airflow_trickle.errors import CycleError, ProjectError, ProjectErrors, TrickleError, UnknownSourceError
from airflow_trickle.errors import UnsupportedConstructError
from airflow_trickle.graph import build_graph, consistency_groups, effective_periods, find_cycle
from airflow_trickle.graph import topological_order
from airflow_trickle.model import RefreshMode
from airflow_trickle.names import qualify_name
from airflow_trickle.options import TableOptions
from airflow_trickle.project.file_model import checked_entry, checked_sections
from airflow_trickle.project.model import (DEFAULT_FRESHNESS_FACTOR, AirflowSettings, DeploySettings, Project,
                                           RefreshUnit, SparkSettings, StreamTableSpec)
from airflow_trickle.schedule import parse_schedule
from airflow_trickle.sql.parse import nondeterministic_calls, source_names


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
    return project_from_dict(data, base_dir=file.parent, file=str(file.resolve()))


def define_project(project: str, *, stream_tables: list[dict], base_dir: str | os.PathLike | None = None,
                   **keys) -> Project:
    """The Python form of a project file: the same keys, as keyword arguments."""
    return project_from_dict({"project": project, "stream_tables": stream_tables, **keys},
                             base_dir=Path(base_dir) if base_dir else Path.cwd())


def project_from_dict(data: dict, *, base_dir: Path, file: str | None = None) -> Project:
    """Validate a project given as a mapping; every error names the stream table and the cause.
    ``file``: the project file it was read from (recorded as its tables' owner)."""
    if not isinstance(data.get("project"), str) or not data["project"].strip():
        raise ProjectError("a project needs a name: set 'project: <name>'")
    data = checked_sections(data)  # the shape of every section: keys, types, choices
    name = data["project"].strip()
    warehouse = _warehouse(data.get("warehouse"), base_dir, name)
    settings = _settings(data.get("settings") or {}, name)
    # a table's defaults: the project's, else the engine settings' (which default to 1m, DIFFERENTIAL)
    defaults = {"schedule": settings.get("default_schedule", "1m"),
                "refresh_mode": settings.get("default_refresh_mode", RefreshMode.DIFFERENTIAL.value),
                **(data.get("defaults") or {})}
    spark = _spark_settings(data.get("spark") or {})
    airflow = _airflow_settings(data.get("airflow") or {}, name)
    declared = data.get("sources")
    if declared is not None:
        declared = tuple(sorted({qualify_name(s) for s in declared}))
    entries = data["stream_tables"]

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
    project = Project(name=name, warehouse=warehouse, stream_tables=specs, declared_sources=declared,
                      settings=settings, spark=spark, airflow=airflow, freshness_factor=factor, graph=graph,
                      periods=periods, units=units, deploy=DeploySettings(**(data.get("deploy") or {})), file=file)
    tick = project.tick()
    if tick:
        parse_schedule(tick, stream_table=None)  # a bad airflow.schedule fails at load, not in Airflow
    return project


def _stream_table(entry, index: int, defaults: dict, base_dir: Path) -> StreamTableSpec:
    entry = checked_entry(entry, index)
    if not entry["name"].strip():
        raise ProjectError(f"stream_tables[{index}] needs a 'name'")
    label = entry["name"]
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
    schedule = entry["schedule"] if "schedule" in entry else defaults["schedule"]
    schedule = None if schedule is None or str(schedule).strip() == "" else str(schedule)
    mode = entry.get("refresh_mode") or defaults["refresh_mode"]
    qualified, ast, _, mode = check_static(label, query, schedule, mode)
    if mode == RefreshMode.DIFFERENTIAL:
        for fn in nondeterministic_calls(ast):
            raise UnsupportedConstructError(
                f"cannot be maintained in DIFFERENTIAL mode: non-deterministic function {fn}()",
                construct=f"{fn}()", stream_table=qualified,
                hint="use refresh_mode FULL (recompute each refresh) or AUTO")
    consistency = entry.get("diamond_consistency") or defaults.get("diamond_consistency") or "none"
    policy = entry.get("diamond_schedule_policy") or defaults.get("diamond_schedule_policy") or "fastest"
    freshness = None
    if entry.get("freshness") not in (None, ""):
        parsed = parse_schedule(str(entry["freshness"]), stream_table=qualified)
        if parsed.every is None:
            raise ProjectError(f"freshness must be a duration such as '10m', not {entry['freshness']!r}",
                               stream_table=qualified)
        freshness = parsed.every
    options = dict(entry.get("options") or {})
    if entry.get("cluster_by") is not None:
        if "cluster_by" in options:
            raise ProjectError("give 'cluster_by' or 'options.cluster_by', not both", stream_table=qualified)
        options["cluster_by"] = entry["cluster_by"]
    for key in ("diamond_consistency", "diamond_schedule_policy", "freshness_seconds"):
        if key in options:  # each has its own key in the file, which the DAG factory reads
            raise ProjectError(f"set {key.replace('_seconds', '')!r} as a key of the stream table, not under "
                               "'options'", stream_table=qualified)
    parsed = TableOptions.parse(options, stream_table=qualified)
    return StreamTableSpec(name=qualified, query=query.strip(), schedule=schedule, refresh_mode=mode,
                           diamond_consistency=consistency, diamond_schedule_policy=policy, freshness=freshness,
                           description=str(entry.get("description") or ""), sources=tuple(source_names(ast)),
                           table_options=parsed)


def _source_problems(specs: dict[str, StreamTableSpec], declared: tuple[str, ...] | None) -> list[TrickleError]:
    if declared is None:
        return []
    return [UnknownSourceError(f"the defining query reads '{source}', which is neither a stream table of the "
                               "project nor one of its declared sources", stream_table=spec.name,
                               hint="add it under 'sources:' or define it as a stream table")
            for spec in specs.values() for source in spec.sources if source not in specs and source not in declared]




def _warehouse(value: Any, base_dir: Path, project: str) -> str:
    raw = os.path.expandvars(str(value)) if value else os.environ.get("TRICKLE_WAREHOUSE", "")
    if not raw or "$" in raw:
        raise ProjectError(f"project {project!r} has no warehouse: set 'warehouse:' (a path or URI) "
                           "or the TRICKLE_WAREHOUSE environment variable")
    if "://" in raw:
        return raw
    return str((base_dir / raw).resolve()) if not os.path.isabs(raw) else raw






def _settings(raw: dict, project: str) -> dict:
    """The engine settings, typed by the file's model; a default schedule is a schedule."""
    if raw.get("default_schedule") is not None:
        parse_schedule(raw["default_schedule"])
    return {key: value for key, value in raw.items() if value is not None}


def _spark_settings(raw: dict) -> SparkSettings:
    conf = raw.get("conf") or {}
    if "connection" in raw and "conn_id" in raw:
        raise ProjectError("spark: give 'connection' (or its older name 'conn_id'), not both")
    submit = raw.get("submit")
    return SparkSettings(conn_id=str(raw.get("connection", raw.get("conn_id", "spark_local"))), submit=submit,
                         conf={k: str(v) for k, v in conf.items()},
                         deploy_mode=raw.get("deploy_mode"), driver_memory=raw.get("driver_memory"),
                         executor_memory=raw.get("executor_memory"), num_executors=raw.get("num_executors"))


def _on_commit_settings(raw, project: str) -> dict[str, timedelta]:
    """``airflow.on_commit``: ``poll_interval``, ``debounce``, ``max_wait``: each a duration
    (``2s``, ``1m``) or a number of seconds (``0.5``)."""
    found = {}
    for key, value in (raw or {}).items():
        if value is None:
            continue
        if isinstance(value, (int, float)) and not isinstance(value, bool) and value >= 0:
            found[f"on_commit_{key}"] = timedelta(seconds=value)
        elif str(value).strip() in ("0", "0s"):  # a zero debounce: fire at the first poll that sees a commit
            found[f"on_commit_{key}"] = timedelta(0)
        else:
            every = parse_schedule(str(value)).every
            if every is None:
                raise ProjectError(f"project {project!r}: airflow.on_commit.{key} must be a duration such as '2s' "
                                   f"or a number of seconds, not {value!r}")
            found[f"on_commit_{key}"] = every
    if found.get("on_commit_poll_interval") == timedelta(0):
        raise ProjectError(f"project {project!r}: airflow.on_commit.poll_interval must be longer than zero")
    return found


def _airflow_settings(raw: dict, project: str) -> AirflowSettings:
    raw = {key: value for key, value in raw.items() if value is not None or key in ("schedule", "maintenance")}
    dag_id = str(raw.get("dag_id") or f"trickle_{project}")
    schedule = raw.get("schedule")
    if schedule is not None and str(schedule).lower() not in ("none", "manual"):
        parse_schedule(str(schedule))
    values = {k: v for k, v in raw.items() if k not in ("dag_id", "schedule")}
    if "tags" in values:
        values["tags"] = tuple(values["tags"])
    if "retry_delay" in values:
        values["retry_delay"] = parse_schedule(values["retry_delay"]).every or timedelta(seconds=30)
    if "start_date" in values:
        values["start_date"] = str(values["start_date"])  # YAML reads 2024-01-01 as a date
    if values.get("maintenance") is not None:
        values["maintenance"] = str(values["maintenance"])
        if parse_schedule(values["maintenance"]).is_calculated:
            values["maintenance"] = None  # an empty schedule: no maintenance DAG
    values.update(_on_commit_settings(values.pop("on_commit", None), project))
    return AirflowSettings(dag_id=dag_id, schedule=None if schedule is None else str(schedule), **values)


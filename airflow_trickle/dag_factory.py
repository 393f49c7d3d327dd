"""The DAG factory: one call in a dags-folder file turns a project into an Airflow DAG.

    # dags/shop.py -- Airflow looks for the words "airflow" and "dag" in this file
    from airflow_trickle.dag_factory import stream_table_dag

    dag = stream_table_dag("/opt/projects/shop/trickle.yaml")

The DAG has a ``plan`` task (checks the run's parameters), then one task group per database
holding one refresh task per stream table -- task id ``<database>.<table>`` -- and one task
``<database>.atomic__<table>`` per atomic diamond group (members refreshed in order by one Spark
job), wired along the dependency graph.  Building it reads the project file and nothing else:
no Spark, no JVM, no catalog.
"""
from __future__ import annotations

import os
from datetime import datetime, timezone

from airflow.sdk import DAG, Asset, Param, TaskGroup, get_parsing_context

from airflow_trickle.operators.refresh import StreamTableRefreshOperator
from airflow_trickle.operators.selection import StreamTableSelectionOperator
from airflow_trickle.model import RunMode
from airflow_trickle.project.planning import table_choices
from airflow_trickle.project import Project, load_project
from airflow_trickle.schedule import format_duration, parse_schedule
from airflow_trickle.sql.parse import pretty_sql


def stream_table_asset(project: str, name: str) -> Asset:
    """The Airflow Asset a refresh of ``name`` updates; other DAGs can schedule on it."""
    return Asset(name=f"trickle/{project}/{name}", uri=f"trickle://{project}/{name}", extra={"stream_table": name})


def source_table_asset(project: str, name: str, watchers: list | None = None) -> Asset:
    """The Asset of a base table a stream table reads: an inlet (lineage), and for a source of
    ``on_commit`` stream tables the asset its watcher updates when it commits."""
    return Asset(name=f"trickle/{project}/{name}", uri=f"trickle://{project}/{name}", extra={"source_table": name},
                 watchers=list(watchers or []))


def watched_source_asset(project: Project, source: str) -> Asset:
    """The Asset of ``source`` as every DAG of ``project`` declares it: with its commit watcher
    when ``on_commit`` stream tables read it (one definition, so no DAG drops the watcher)."""
    watches = project.commit_watches
    if source not in watches.sources:
        return source_table_asset(project.name, source)
    from airflow.sdk import AssetWatcher

    from airflow_trickle.triggers.source_commit import SourceCommitTrigger

    settings = project.airflow
    trigger = SourceCommitTrigger(
        project=project.name, warehouse=project.warehouse, source=source, readers=list(watches.sources[source]),
        serves=list(watches.refreshed[source]), dag_id=settings.on_commit_dag_id,
        poll_interval=settings.on_commit_poll_interval.total_seconds(),
        debounce=settings.on_commit_debounce.total_seconds(), max_wait=settings.on_commit_max_wait.total_seconds(),
        settings=_public_settings(project))
    return source_table_asset(project.name, source, [AssetWatcher(name=f"{project.name}__{source}", trigger=trigger)])


def _public_settings(project: Project) -> dict:
    """The project's settings without credentials: a trigger's arguments are stored in Airflow's
    database and shown with the DAG; the triggerer finds credentials in its environment."""
    from airflow_trickle.location import public_options

    settings = {k: v for k, v in project.settings.items() if k != "spark_conf"}
    if settings.get("storage_options"):
        settings["storage_options"] = public_options(project.config().storage_options)
    return settings


def _inlets(project: Project, unit) -> list[Asset]:
    """What ``unit`` reads, as Assets: so the asset graph shows source -> stream table -> stream table."""
    read = dict.fromkeys(p for m in unit.members for p in sorted(project.graph.predecessors(m))
                         if p not in unit.members)
    return [stream_table_asset(project.name, p) if p in project.stream_tables else watched_source_asset(project, p)
            for p in read]


def stream_table_dag(project: Project | str | os.PathLike, *, deadline: bool | None = None,
                     freshness_notifier=None, **dag_kwargs) -> DAG | None:
    """Build the DAG of ``project`` (a :class:`Project` or a YAML path).

    ``deadline`` overrides the project's ``airflow.deadline`` (as does the environment variable
    ``TRICKLE_DAG_DEADLINES=off``); ``freshness_notifier`` (a callable such as an Airflow notifier
    instance) overrides ``airflow.freshness_notifier``; ``dag_kwargs`` go to ``DAG``.
    Returns ``None`` without building when Airflow parses the file to run another DAG's task.
    """
    if not isinstance(project, Project):
        project = load_project(project)
    settings = project.airflow
    wanted = get_parsing_context().dag_id
    if settings.maintenance and wanted in (None, settings.maintenance_dag_id):
        maintenance_dag(project)  # registered with Airflow by its `with DAG(...)` block
    if project.commit_watches.sources and wanted in (None, settings.on_commit_dag_id):
        on_commit_dag(project, freshness_notifier=freshness_notifier)
    if wanted and wanted != settings.dag_id:
        return None

    params = trigger_form(project)
    if deadline is None and os.environ.get("TRICKLE_DAG_DEADLINES", "").lower() in ("off", "false", "0"):
        deadline = False
    use_deadline = settings.deadline if deadline is None else deadline
    kwargs = {
        "dag_id": settings.dag_id,
        "schedule": _airflow_schedule(project.tick()),
        "start_date": _start_date(settings),
        "catchup": False,
        "max_active_runs": settings.max_active_runs,
        "params": params,
        "tags": list(settings.tags),
        "default_args": _default_args(settings),
        "doc_md": _doc(project),
        **({"deadline": freshness_deadline(project)} if use_deadline and freshness_deadline(project) else {}),
        **dag_kwargs,
    }
    with DAG(**kwargs) as dag:
        plan = StreamTableSelectionOperator(task_id="plan", project=project)
        for task in _refresh_tasks(project, project.units, freshness_notifier=freshness_notifier).values():
            if not task.upstream_list:
                plan >> task
    return dag


def _refresh_tasks(project: Project, units, **operator_kwargs) -> dict:
    """One refresh task per unit, in task groups per database, wired along the graph: a task
    follows the units it reads (the caller wires those that read none)."""
    tasks = {}
    for database in dict.fromkeys(u.database for u in units):
        with TaskGroup(group_id=database, tooltip=f"stream tables of database {database}"):
            for unit in (u for u in units if u.database == database):
                tasks[unit] = StreamTableRefreshOperator(
                    task_id=unit.task_name, project=project, stream_tables=list(unit.members),
                    inlets=_inlets(project, unit),
                    outlets=[stream_table_asset(project.name, m) for m in unit.members],
                    trigger_rule="none_failed", doc_md=_unit_doc(project, unit),
                    task_display_name=_display_name(unit), **operator_kwargs)
    for unit, task in tasks.items():
        upstream = {project.unit_of(p) for m in unit.members for p in project.graph.predecessors(m)
                    if p in project.stream_tables} - {unit}
        for parent in sorted(upstream & tasks.keys(), key=lambda u: u.task_id):
            tasks[parent] >> task
    return tasks


def on_commit_dag(project: Project | str | os.PathLike, *, freshness_notifier=None) -> DAG:
    """The DAG ``<dag_id>__on_commit``: refresh on commit for the project's ``on_commit`` stream tables.

    It is scheduled on the assets of the base sources they read, each with a commit watcher
    (:class:`~airflow_trickle.triggers.source_commit.SourceCommitTrigger`) on Airflow's
    triggerer; a run holds a refresh task for every stream table a commit can reach -- the
    ``on_commit`` ones, the CALCULATED ones between them and the sources, and everything
    downstream -- and each task skips at once, without Spark, unless one of the sources that
    committed is among its own (``triggering_asset_events``). One run at a time: commits that
    land during a run make exactly one more. :func:`stream_table_dag` makes it beside the
    refresh DAG when the project has an ``on_commit`` stream table.
    """
    from airflow.sdk import AssetAny

    if not isinstance(project, Project):
        project = load_project(project)
    settings = project.airflow
    watches = project.commit_watches
    if not watches.sources:
        raise ValueError(f"project {project.name!r} has no on_commit stream table that reads a base source")
    assets = [watched_source_asset(project, source) for source in watches.sources]
    members = watches.members
    units = [u for u in project.units if members & set(u.members)]
    with DAG(dag_id=settings.on_commit_dag_id, schedule=assets[0] if len(assets) == 1 else AssetAny(*assets),
             start_date=_start_date(settings), catchup=False, max_active_runs=1,
             tags=[*settings.tags, "on_commit"], default_args=_default_args(settings),
             doc_md=(f"# Refresh on commit, project `{project.name}`\n\nRuns when "
                     + ", ".join(f"`{s}`" for s in watches.sources) + " commit (watched on Airflow's triggerer "
                     f"every {format_duration(settings.on_commit_poll_interval)}, a burst held "
                     f"{format_duration(settings.on_commit_debounce)} after its last commit, at most "
                     f"{format_duration(settings.on_commit_max_wait)}); refreshes the stream tables those "
                     "commits reach, and those downstream.")) as dag:
        _refresh_tasks(project, units, check_schedule=False, on_commit=True, freshness_notifier=freshness_notifier)
    return dag


def maintenance_dag(project: Project | str | os.PathLike) -> DAG:
    """The DAG ``<dag_id>__maintenance`` on the project's ``airflow.maintenance`` schedule: one
    task that compacts (OPTIMIZE) and VACUUMs every stream table of the project and compacts the
    catalog, keeping every version a reader still needs (:mod:`airflow_trickle.ops.maintain`).

    :func:`stream_table_dag` makes it beside the refresh DAG when the schedule is set (it is
    off by default); a separate DAG, so that its cadence is Airflow's to keep."""
    from airflow_trickle.operators.maintenance import StreamTableMaintenanceOperator

    if not isinstance(project, Project):
        project = load_project(project)
    settings = project.airflow
    if not settings.maintenance:
        raise ValueError(f"project {project.name!r} has no airflow.maintenance schedule")
    retention = settings.maintenance_retention_hours
    with DAG(dag_id=settings.maintenance_dag_id, schedule=_airflow_schedule(settings.maintenance),
             start_date=_start_date(settings), catchup=False,
             max_active_runs=1, tags=[*settings.tags, "maintenance"], default_args=_default_args(settings),
             doc_md=(f"# Maintenance of project `{project.name}`\n\nOPTIMIZE and VACUUM of its "
                     f"{len(project.stream_tables)} stream tables (retention: "
                     f"{'each table' + chr(39) + 's own' if retention is None else f'{retention:g} h'}, stretched "
                     "for readers that still need older files), then the catalog compacted. Refreshes of a "
                     "table wait while it is maintained.")) as dag:
        StreamTableMaintenanceOperator(task_id="maintain", project=project)
    return dag


def trigger_form(project: Project) -> dict[str, Param]:
    """The manual-run form: a pick-list of stream tables (and of whole databases), a mode, two flags.

    Every field may be left empty (``null`` in its type, so the form marks none as required):
    no table means all of them, no mode means AUTO.  ``tables`` lists its choices as
    ``examples`` -- what makes Airflow's form draw a multi-select -- rather than as an ``enum``,
    so a wrong name sent through the REST API is refused by the ``plan`` task in one sentence
    naming the valid choices, not by a JSON-schema dump.
    """
    choices = table_choices(project)
    modes = [m.value for m in RunMode]
    return {
        "tables": Param([], type=["null", "array"], items={"type": "string"}, uniqueItems=True,
                        examples=list(choices), values_display=choices, title="Stream tables",
                        description="Refresh these now (empty: every stream table). "
                                    "'all of <database>' picks every stream table of that database."),
        "mode": Param(RunMode.AUTO.value, type=["null", "string"], enum=[*modes, None],
                      values_display={"None": RunMode.AUTO.value}, title="Refresh mode",
                      description="AUTO lets each stream table choose; FULL recomputes; DIFFERENTIAL applies "
                                  "the change only; REINITIALIZE rebuilds the storage."),
        "include_upstream": Param(False, type=["null", "boolean"], title="Include upstream stream tables",
                                  description="Also refresh the stream tables the selected ones read."),
        "include_downstream": Param(False, type=["null", "boolean"], title="Include downstream stream tables",
                                    description="Also refresh the stream tables that read the selected ones."),
    }


def freshness_deadline(project: Project):
    """The Deadline Alert of every run: finish within the tightest freshness target of the project.

    Airflow 3.3 has deadlines per run, not per task, so the alert covers the run as a whole; its
    callback then records a miss only for the stream tables whose data is older than their own
    target (see :mod:`airflow_trickle.notifiers.freshness`)."""
    targets = {n: project.freshness_target(n) for n in project.stream_tables}
    targets = {n: t for n, t in targets.items() if t is not None}
    if not targets:
        return None
    from airflow.sdk import AsyncCallback, DeadlineReference

    from airflow_trickle.airflow_compat import deadline_alert

    tightest = min(targets.values())
    return deadline_alert(
        reference=DeadlineReference.DAGRUN_QUEUED_AT,
        interval=tightest,
        callback=AsyncCallback(project.airflow.deadline_callback, kwargs={
            "warehouse": project.warehouse, "project": project.name, "settings": project.settings,
            "targets": {n: int(t.total_seconds()) for n, t in sorted(targets.items())},
            "interval_seconds": int(tightest.total_seconds())}),
        name=f"freshness of {project.name}")


def _default_args(settings) -> dict:
    """Task defaults of the project's DAGs: retries, and the pool that caps their Spark work."""
    default_args = {"retries": settings.retries, "retry_delay": settings.retry_delay}
    if settings.pool:
        default_args["pool"] = settings.pool
    return default_args


def _start_date(settings) -> datetime:
    return datetime.fromisoformat(settings.start_date).replace(tzinfo=timezone.utc)


def _airflow_schedule(tick: str | None):
    if tick is None:
        return None
    parsed = parse_schedule(tick)
    return parsed.every if parsed.every is not None else parsed.cron


def _doc(project: Project) -> str:
    lines = [f"# Stream tables of project `{project.name}`", "",
             f"Warehouse: `{project.warehouse}`. Tick: `{project.tick() or 'manual only'}`.", "",
             "| stream table | schedule | effective period | freshness target | refresh task |",
             "|---|---|---|---|---|"]
    for name, spec in project.stream_tables.items():
        lines.append(f"| `{name}` | {spec.schedule or 'CALCULATED'} | {_duration_or_dash(project.periods.get(name))} | "
                     f"{_duration_or_dash(project.freshness_target(name))} | `{project.unit_of(name).task_id}` |")
    lines += ["", "Trigger with parameters to refresh a selection now: `tables`, `mode`, "
              "`include_upstream`, `include_downstream`."]
    return "\n".join(lines)


def _duration_or_dash(value) -> str:
    return format_duration(value) if value is not None else "-"


def _display_name(unit) -> str:
    """``order_lines``; an atomic group: ``region_report (atomic: big_orders, region_revenue, region_report)``."""
    short = [m.rsplit(".", 1)[-1] for m in unit.members]
    return f"{short[-1]} (atomic: {', '.join(short)})" if unit.is_group else short[0]


def _unit_doc(project: Project, unit) -> str:
    """The task's doc: per stream table its description, mode, schedule, target, asset and SQL."""
    parts = []
    if unit.is_group:
        parts.append(f"**Atomic diamond group** (converges at {', '.join(unit.convergence_points)}): refreshes "
                     + ", ".join(f"`{m}`" for m in unit.members) + " in this order, all or nothing; fires on the "
                     f"{unit.schedule_policy} member's schedule.")
    for name in unit.members:
        spec = project.stream_tables[name]
        asset = stream_table_asset(project.name, name)
        parts += [f"### `{name}`", spec.description or "",
                  f"Mode **{spec.refresh_mode}** · schedule **{spec.schedule or 'CALCULATED'}** "
                  f"(every {_duration_or_dash(project.periods.get(name))}) · freshness target "
                  f"**{_duration_or_dash(project.freshness_target(name))}** · asset `{asset.uri}`",
                  f"```sql\n{pretty_sql(spec.query)}\n```"]
    return "\n\n".join(p for p in parts if p)

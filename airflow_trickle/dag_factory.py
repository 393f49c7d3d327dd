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

from airflow_trickle.operators.refresh import StreamTableRefreshOperator, StreamTableSelectionOperator
from airflow_trickle.model import RunMode
from airflow_trickle.project import Project, load_project
from airflow_trickle.schedule import parse_schedule


def stream_table_asset(project: str, name: str) -> Asset:
    """The Airflow Asset a refresh of ``name`` updates; other DAGs can schedule on it."""
    return Asset(name=f"trickle/{project}/{name}", uri=f"trickle://{project}/{name}", extra={"stream_table": name})


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
    if wanted and wanted != settings.dag_id:
        return None

    names = list(project.stream_tables)
    params = {
        "tables": Param([], type="array", items={"type": "string", "enum": names}, uniqueItems=True,
                        title="Stream tables", description="Manual runs refresh these (empty: all of them)."),
        "mode": Param("AUTO", type="string", enum=[m.value for m in RunMode], title="Refresh mode",
                      description="AUTO lets each stream table choose; FULL recomputes; REINITIALIZE rebuilds."),
        "include_upstream": Param(False, type="boolean", title="Include upstream stream tables"),
        "include_downstream": Param(False, type="boolean", title="Include downstream stream tables"),
    }
    default_args = {"retries": settings.retries, "retry_delay": settings.retry_delay}
    if settings.pool:
        default_args["pool"] = settings.pool
    if deadline is None and os.environ.get("TRICKLE_DAG_DEADLINES", "").lower() in ("off", "false", "0"):
        deadline = False
    use_deadline = settings.deadline if deadline is None else deadline
    kwargs = {
        "dag_id": settings.dag_id,
        "schedule": _airflow_schedule(project.tick()),
        "start_date": datetime.fromisoformat(settings.start_date).replace(tzinfo=timezone.utc),
        "catchup": False,
        "max_active_runs": settings.max_active_runs,
        "params": params,
        "tags": list(settings.tags),
        "default_args": default_args,
        "doc_md": _doc(project),
        **({"deadline": freshness_deadline(project)} if use_deadline and freshness_deadline(project) else {}),
        **dag_kwargs,
    }
    with DAG(**kwargs) as dag:
        plan = StreamTableSelectionOperator(task_id="plan", project=project)
        tasks = {}
        for database in dict.fromkeys(u.database for u in project.units):
            with TaskGroup(group_id=database, tooltip=f"stream tables of database {database}"):
                for unit in (u for u in project.units if u.database == database):
                    tasks[unit] = StreamTableRefreshOperator(
                        task_id=unit.task_name, project=project, stream_tables=list(unit.members),
                        outlets=[stream_table_asset(project.name, m) for m in unit.members],
                        trigger_rule="none_failed", doc_md=_unit_doc(project, unit),
                        freshness_notifier=freshness_notifier)
        for unit, task in tasks.items():
            upstream = {project.unit_of(p) for m in unit.members for p in project.graph.predecessors(m)
                        if p in project.stream_tables} - {unit}
            if upstream:
                for parent in sorted(upstream, key=lambda u: u.task_id):
                    tasks[parent] >> task
            else:
                plan >> task
    return dag


def freshness_deadline(project: Project):
    """The Deadline Alert of every run: finish within the tightest freshness target of the project."""
    targets = {n: project.freshness_target(n) for n in project.stream_tables}
    targets = {n: t for n, t in targets.items() if t is not None}
    if not targets:
        return None
    from airflow.sdk import AsyncCallback, DeadlineAlert, DeadlineReference

    tightest = min(targets.values())
    return DeadlineAlert(
        reference=DeadlineReference.DAGRUN_QUEUED_AT,
        interval=tightest,
        callback=AsyncCallback(project.airflow.deadline_callback, kwargs={
            "warehouse": project.warehouse, "project": project.name, "settings": project.settings,
            "tables": sorted(n for n, t in targets.items() if t == tightest),
            "interval_seconds": int(tightest.total_seconds())}),
        name=f"freshness of {project.name}")


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
        lines.append(f"| `{name}` | {spec.schedule or 'CALCULATED'} | {project.periods.get(name) or '-'} | "
                     f"{project.freshness_target(name) or '-'} | `{project.unit_of(name).task_id}` |")
    lines += ["", "Trigger with parameters to refresh a selection now: `tables`, `mode`, "
              "`include_upstream`, `include_downstream`."]
    return "\n".join(lines)


def _unit_doc(project: Project, unit) -> str:
    if not unit.is_group:
        spec = project.stream_tables[unit.members[0]]
        return f"Refreshes `{spec.name}`:\n\n```sql\n{spec.query}\n```"
    return (f"Atomic diamond group (converges at {', '.join(unit.convergence_points)}): refreshes "
            + ", ".join(f"`{m}`" for m in unit.members) + f" in this order in one Spark job; "
            f"fires on the {unit.schedule_policy} member's schedule.")

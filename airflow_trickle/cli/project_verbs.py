"""``trickle plan``, ``trickle apply`` and ``trickle schema``: a project file against its warehouse.

``plan`` and ``apply`` read the warehouse (and its storage settings) from the project file;
``plan`` starts Spark only to analyse the columns of a changed query (``--offline``: never), so
an unchanged project plans in a second.
"""
from __future__ import annotations

import json

from airflow_trickle.api import Trickle
from airflow_trickle.cli.output import _emit
from airflow_trickle.cli.verbs import _remote
from airflow_trickle.project import load_project
from airflow_trickle.project.apply import apply_project, plan_for
from airflow_trickle.project.file_model import json_schema
from airflow_trickle.project.plan import Change

#: The verbs that take a project file instead of ``--warehouse``.
PROJECT_VERBS = ("plan", "apply", "schema")


def run_project_verb(args) -> int:
    if args.verb == "schema":
        print(json.dumps(json_schema(), indent=2))
        return 0
    project = load_project(args.project_file)
    args.warehouse = project.warehouse  # a service running for it is found by its warehouse
    tr = Trickle(project.warehouse, remote=_remote(args), config=project.config())
    try:
        if args.verb == "plan":
            plan = plan_for(tr, project, analyse=not args.offline and _query_changes(tr, project),
                            prune=args.prune or None, adopt=args.adopt)
            print(json.dumps(plan.to_json(), indent=2) if args.json else plan.text())
            return 0
        done = apply_project(tr, project, prune=args.prune or None, adopt=args.adopt)
        if args.json or done:
            _emit(args, [{"stream_table": d.name, "done": d.done, "detail": d.detail} for d in done],
                  columns=["stream_table", "done", "detail"])
        else:
            print(f"project {project.name}: nothing to do")
        return 0
    finally:
        if tr.remote is not None:  # an embedded Spark ends with the process, as for the other verbs
            tr.close()


def _query_changes(tr, project) -> bool:
    """Whether any table's query changed (only then is Spark worth starting for the plan)."""
    plan = plan_for(tr, project, analyse=False)
    return any(t.query_changed for t in plan.of(Change.ALTER))

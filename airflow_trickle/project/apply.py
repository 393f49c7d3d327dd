"""Carry out a project's plan: create, ALTER in place, drop what the file removed (with prune).

``trickle apply`` runs :func:`apply_project`; each refresh task of the generated DAG runs
:func:`apply_table` for its own tables before refreshing them, so a query edited in the project
file is live after the next DAG run, ALTERed in place (readers see the old rows or the new,
never an empty table), without a drop.

Applying converges: it plans against the catalog as it is now and does only what still differs,
and each step is one create, ALTER or drop with their own guarantees, so an apply killed at any
point and run again ends where an uninterrupted one would.  ``tr`` is a
:class:`~airflow_trickle.api.Trickle`.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass

from airflow_trickle.definition.lifecycle import replacement, stored_output_columns
from airflow_trickle.errors import DefinitionError
from airflow_trickle.project.model import Project, StreamTableSpec
from airflow_trickle.project.plan import Change, ProjectPlan, TablePlan, compared, plan_project, wanted_options
from airflow_trickle.storage.deltalog import row_count

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Applied:
    """What applying did to one stream table."""

    name: str
    #: CREATED, ALTERED, CLAIMED, DROPPED, or KEPT (removed from the file, not pruned).
    done: str
    detail: str = ""


def plan_for(tr, project: Project, *, analyse: bool = True, prune: bool | None = None,
             adopt: bool = False) -> ProjectPlan:
    """The plan of ``project`` against ``tr``'s catalog; ``analyse``: a changed query's columns
    are analysed by Spark (else ``unknown``, as in the DAG's plan task, which has no Spark)."""
    catalog = tr.catalog

    def columns(name: str, query: str):
        st = tr.get(name)
        return stored_output_columns(tr, st), replacement(tr, st, query).output_columns

    def rows_of(name: str) -> int | None:
        location = catalog.get(name).location
        return row_count(catalog.at(location)) if location else None

    return plan_project(project, *catalog.state(), columns=columns if analyse else None,
                        rows_of=rows_of, prune=prune, adopt=adopt)


def apply_project(tr, project: Project, *, prune: bool | None = None, adopt: bool = False) -> list[Applied]:
    """Make the warehouse match ``project``: every refusal is raised before anything changes."""
    plan = plan_for(tr, project, prune=prune, adopt=adopt)
    if plan.refusals:
        raise DefinitionError(f"the project cannot be applied: {plan.refusal_text()}", hint="nothing was changed")
    done = []
    for table in plan.tables:
        if table.change == Change.REMOVE:
            if plan.prune:
                tr.drop_stream_table(table.name, if_exists=True)
            done.append(Applied(table.name, "DROPPED" if plan.prune else "KEPT",
                                "" if plan.prune else "no longer in the project file; drop it with prune"))
        elif table.change != Change.UNCHANGED or table.claims:
            done.append(_carry_out(tr, project.stream_tables[table.name], table, _owner(project)))
    for applied in done:
        log.info("%s %s %s", applied.done.lower(), applied.name, applied.detail)
    return done


def apply_table(tr, spec: StreamTableSpec, *, owner: tuple[str, str | None] | None,
                on_change: str = "apply") -> Applied | None:
    """Bring one stream table in line with its project's ``spec`` (a refresh task's first step);
    None when it already is.  ``on_change`` ``stop``: a table that differs is refused instead.
    ``owner``: ``(project, file)``; None leaves ownership alone."""
    current = tr.catalog.get(spec.name)
    if current is None:
        return _carry_out(tr, spec, TablePlan(spec.name, Change.CREATE), owner)
    table = compared(spec, current)
    if owner is not None and current.owner not in (None, owner[0]):
        raise DefinitionError(f"project {owner[0]!r} declares it, but project {current.owner!r} owns it",
                              stream_table=spec.name, hint="rename it in one of the projects, or move it with "
                                                           "`trickle apply --adopt`")
    if table.file_changes and on_change == "stop":
        raise DefinitionError(f"the project file changes it ({', '.join(table.changes)}) and the project's "
                              "deploy.on_change is 'stop'", stream_table=spec.name,
                              hint="review `trickle plan` and run `trickle apply`")
    if table.change == Change.UNCHANGED and (owner is None or not table.claims):
        return None
    return _carry_out(tr, spec, table, owner)


def _carry_out(tr, spec: StreamTableSpec, table: TablePlan, owner: tuple[str, str | None] | None) -> Applied:
    if table.change == Change.CREATE:
        tr.create_stream_table(spec.name, spec.query, schedule=spec.schedule, refresh_mode=spec.refresh_mode,
                               options=spec.options(), owner=owner)
        return Applied(spec.name, "CREATED")
    if table.change == Change.UNCHANGED:  # a table no project owned: the project's from now on
        tr.alter_stream_table(spec.name, owner=owner)
        return Applied(spec.name, "CLAIMED")
    current = tr.get(spec.name)
    changes: dict = {"options": wanted_options(spec, current.options), "replace_options": True}
    if owner is not None:  # a project defined in Python (no file) keeps the file on record
        changes["owner"] = (owner[0], current.owner_file) if owner[1] is None and current.owner == owner[0] else owner
    if table.query_changed:
        changes.update(query=spec.query, reinitialize_readers=True)
    if (current.schedule or None) != spec.schedule:
        changes["schedule"] = spec.schedule
    if str(current.refresh_mode) != str(spec.refresh_mode):
        changes["refresh_mode"] = spec.refresh_mode
    tr.alter_stream_table(spec.name, **changes)
    if tr.get(spec.name).needs_reinit:  # an earlier ALTER, interrupted before its rows were replaced
        tr.refresh_stream_table(spec.name, initiated_by="APPLY")
    return Applied(spec.name, "ALTERED", ", ".join(table.changes))


def _owner(project: Project) -> tuple[str, str | None]:
    return project.name, project.file

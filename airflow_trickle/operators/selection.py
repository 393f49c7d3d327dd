"""``StreamTableSelectionOperator``: the first task of a generated DAG, which checks the run's
parameters, plans what the project file changes in the warehouse, and logs (and notes) both."""
from __future__ import annotations

from airflow.sdk import BaseOperator
from airflow.sdk.exceptions import AirflowException

from airflow_trickle.hooks.refresh_engine import StreamTableEngineHook
from airflow_trickle.hooks.trickle import TrickleHook
from airflow_trickle.operators.refresh import _is_manual, _run_parameters
from airflow_trickle.project import Project, load_project
from airflow_trickle.project.plan import Change, ProjectPlan, plan_project


class StreamTableSelectionOperator(BaseOperator):
    """The first task of a generated DAG: checks the run's parameters, plans the project file
    against the catalog (:mod:`airflow_trickle.project.plan`, no Spark) and logs what will refresh.

    The trigger form already refuses bad values; this task refuses them again (a run started
    through the REST API or the CLI skips the form), so a bad run fails here, before any refresh.

    The plan decides the rest of the run, as the project's ``deploy`` section says: with
    ``on_change: apply`` (the default) each refresh task creates or ALTERs its own tables in
    place before refreshing them; with ``on_change: stop`` a run whose plan changes anything
    fails here, the plan in its note, for ``trickle apply``; removed tables are dropped (through
    the refresh engine) only with ``prune: true``.  A refusal (a table another project owns)
    fails the run here.
    """

    ui_color = "#eeeeee"

    def __init__(self, *, project: Project | str, **kwargs) -> None:
        super().__init__(**kwargs)
        self.project = project if isinstance(project, Project) else load_project(project)

    def execute(self, context) -> dict:
        from airflow_trickle.errors import TrickleError
        from airflow_trickle.operators.notes import write_run_note, write_task_note
        from airflow_trickle.project.planning import select

        manual = _is_manual(context)
        try:
            selection = select(self.project, _run_parameters(context), manual=manual)
        except TrickleError as err:
            raise AirflowException(f"refused: {err}") from None
        tables = [n for n in self.project.stream_tables if n in selection.tables]
        changes = self._deploy_plan()
        run = f"{'manual' if manual else 'scheduled'} run: {', '.join(tables)} (mode {selection.mode})"
        text = run if not changes.has_changes else f"{run}\n{changes.text()}"
        self.log.info("%s", text)
        write_run_note(self.project.airflow.notes_connection, context, text)
        if changes.refusals or (changes.file_changed and self.project.deploy.on_change == "stop"):
            why = (f"refused: {changes.refusal_text()}" if changes.refusals else
                   "the project file changes the warehouse and deploy.on_change is 'stop': review the plan "
                   "and run `trickle apply`")
            write_task_note(self.project.airflow.notes_connection, context, f"{why}\n{changes.text()}")
            raise AirflowException(f"{why}\n{changes.text()}")
        pruned = [t.name for t in changes.of(Change.REMOVE)] if changes.prune else []
        if pruned:
            StreamTableEngineHook(self.project).drop(pruned)
        return {"tables": tables, "mode": selection.mode.value, "forced": selection.forced,
                "plan": changes.to_json()}

    def _deploy_plan(self) -> ProjectPlan:
        """The project file against the catalog (a new warehouse has none: every table is new)."""
        return plan_project(self.project, *TrickleHook(self.project.warehouse, settings=self.project.settings)
                            .catalog.state())

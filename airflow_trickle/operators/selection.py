"""``StreamTableSelectionOperator``: the first task of a generated DAG, which checks the run's
parameters and logs (and notes) what the run refreshes."""
from __future__ import annotations

from airflow.sdk import BaseOperator
from airflow.sdk.exceptions import AirflowException

from airflow_trickle.operators.refresh import _is_manual, _run_parameters
from airflow_trickle.project import Project, load_project


class StreamTableSelectionOperator(BaseOperator):
    """The first task of a generated DAG: checks the run's parameters and logs what will refresh.

    The trigger form already refuses bad values; this task refuses them again (a run started
    through the REST API or the CLI skips the form), so a bad run fails here, before any refresh.
    """

    ui_color = "#eeeeee"

    def __init__(self, *, project: Project | str, **kwargs) -> None:
        super().__init__(**kwargs)
        self.project = project if isinstance(project, Project) else load_project(project)

    def execute(self, context) -> dict:
        from airflow_trickle.errors import TrickleError
        from airflow_trickle.operators.notes import write_run_note
        from airflow_trickle.project.planning import select

        manual = _is_manual(context)
        try:
            selection = select(self.project, _run_parameters(context), manual=manual)
        except TrickleError as err:
            raise AirflowException(f"refused: {err}") from None
        tables = [n for n in self.project.stream_tables if n in selection.tables]
        plan = f"{'manual' if manual else 'scheduled'} run: {', '.join(tables)} (mode {selection.mode})"
        self.log.info("%s", plan)
        write_run_note(self.project.airflow.notes_connection, context, plan)
        return {"tables": tables, "mode": selection.mode.value, "forced": selection.forced}

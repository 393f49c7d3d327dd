"""``StreamTableMaintenanceOperator``: OPTIMIZE and VACUUM a project's stream tables."""
from __future__ import annotations

from airflow_trickle.operators.refresh import StreamTableRefreshOperator
from airflow_trickle.project import Project, load_project


class StreamTableMaintenanceOperator(StreamTableRefreshOperator):
    """OPTIMIZE and VACUUM the storage of every stream table of ``project`` and compact the
    catalog (:mod:`airflow_trickle.ops.maintain`), the way refreshes run (Spark service or
    spark-submit).  It holds the tables' refresh locks meanwhile: a refresh waits rather than
    racing a compaction (Delta would make one of the two retry).

    :param retention_hours: the VACUUM retention (default: the project's
        ``airflow.maintenance_retention_hours``, else each table's own); stretched for readers
        that still need older files, never shortened below what they need.
    """

    ui_color = "#ece6f5"
    custom_operator_name = "Stream table maintenance"

    def __init__(self, *, project: Project | str, retention_hours: float | None = None, **kwargs) -> None:
        project = project if isinstance(project, Project) else load_project(project)
        kwargs.setdefault("name", f"trickle-maintenance-{project.name}"[:200])
        super().__init__(project=project, stream_tables=list(project.stream_tables), check_schedule=False, **kwargs)
        self.retention_hours = (project.airflow.maintenance_retention_hours if retention_hours is None
                                else retention_hours)

    def execute(self, context) -> list[dict]:
        from airflow_trickle.refresh.lock import refresh_lock

        names = self.stream_tables
        with refresh_lock(self.project.warehouse, names,
                          on_wait=lambda name: self.log.info("%s is being refreshed; waiting for it", name)):
            done = self.engine.maintain(names, retention_hours=self.retention_hours)
        for table in done:
            self.log.info("%s: %s -> %s active files, retention %.1f h%s", table["table"],
                          table["active_files_before"], table["active_files_after"], table["retained_hours"],
                          f" ({table['note']})" if table["note"] else "")
        return done

    def get_openlineage_facets_on_complete(self, task_instance):
        return None  # maintenance rewrites files, not rows: no lineage to report

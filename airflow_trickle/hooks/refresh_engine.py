"""``StreamTableEngineHook``: where a refresh task's Spark work runs, chosen from its connection.

Two ways, chosen by the project's ``spark`` section (or, by default, by the type of its Airflow
connection):

* **Spark Connect** (a ``spark_connect`` connection): the engine runs in the task's own process
  against the long-lived Spark service (``trickle serve``) -- no JVM in the worker, so a
  refresh costs its query, not a JVM start;
* **spark-submit** (a ``spark`` connection, or ``submit: true``): the hook submits
  :mod:`airflow_trickle.jobs.refresh_job` through the Spark provider's ``SparkSubmitHook`` --
  ``local[*]``, YARN, Kubernetes or a standalone cluster, as the connection says.

The operators compose this hook; none of them is a ``SparkSubmitOperator``.
"""
from __future__ import annotations

import json
import sys
from datetime import timedelta
from pathlib import Path
from typing import Any

from airflow.sdk import BaseHook
from airflow.sdk.exceptions import AirflowException

from airflow_trickle.spark import require_engine
from airflow_trickle.spark.address import without_secrets

#: The Spark application a spark-submit refresh runs.
JOB_FILE = str(Path(__file__).resolve().parent.parent / "jobs" / "refresh_job.py")
#: Its driver's logging: warnings only, so the task log ends with the outcome, not Spark's INFO.
QUIET_LOGGING = str(Path(JOB_FILE).with_name("log4j2-quiet.properties"))


class StreamTableEngineHook(BaseHook):
    """The Spark behind a project's refresh tasks: the Spark service or spark-submit.

    :param project: the :class:`~airflow_trickle.project.Project` whose tables are refreshed.
    :param conn_id: the Airflow connection (default: the project's ``spark.conn_id``).
    :param name: the Spark application's name for spark-submit.
    """

    conn_name_attr = "conn_id"
    default_conn_name = "spark_local"
    hook_name = "airflow_trickle refresh engine"

    def __init__(self, project, *, conn_id: str | None = None, name: str | None = None, **kwargs) -> None:
        super().__init__(**kwargs)
        self.project = project
        self.conn_id = conn_id or project.spark.conn_id
        self.name = name or f"trickle-{project.name}"

    # -- which way ------------------------------------------------------------------------------

    def connection(self):
        """The Airflow connection; a clear error when it is not defined (the Spark provider would
        silently fall back to YARN)."""
        try:
            return self.get_connection(self.conn_id)
        except Exception as err:  # noqa: BLE001 - the message says how to define it
            raise AirflowException(
                f"Spark connection {self.conn_id!r} is not defined ({err}); for the Spark service set "
                f"AIRFLOW_CONN_{self.conn_id.upper()}='{{\"conn_type\": \"spark_connect\", \"host\": "
                f"\"sc://127.0.0.1\", \"port\": 15002}}' (after `trickle serve`), or for spark-submit on local "
                f"Spark '{{\"conn_type\": \"spark\", \"host\": \"local[*]\"}}'") from None

    def submits(self) -> bool:
        """True: spark-submit a job; False: run over Spark Connect (see the module docstring)."""
        conn_type = self.connection().conn_type
        submit = self.project.spark.submit
        if submit is None:
            return conn_type != "spark_connect"
        if not submit and conn_type != "spark_connect":
            raise AirflowException(f"spark.submit is false but connection {self.conn_id!r} is of type "
                                   f"{conn_type!r}; refreshes over Spark Connect need a 'spark_connect' connection")
        return submit

    # -- Spark Connect ------------------------------------------------------------------------

    def connect(self):
        """A :class:`~airflow_trickle.api.Trickle` over the Spark service of the connection (an
        unreachable service fails the task with the library's message); the caller closes it."""
        require_engine("a refresh task")
        from airflow.providers.apache.spark.hooks.spark_connect import SparkConnectHook

        from airflow_trickle.api import Trickle
        from airflow_trickle.errors import TrickleError

        address = SparkConnectHook(self.conn_id).get_connection_url()  # its password: the service's token
        self.log.info("working over Spark Connect at %s", without_secrets(address))
        tr = Trickle(self.project.warehouse, remote=address, config=self.project.config())
        try:
            tr.sync()
        except TrickleError as err:
            tr.close()
            raise AirflowException(str(err)) from None
        except BaseException:
            tr.close()
            raise
        return tr

    # -- spark-submit ---------------------------------------------------------------------------

    def submit(self, args: list[str]) -> None:
        """spark-submit the refresh job with ``args``, the project's Spark settings and this Python."""
        require_engine("a refresh task")
        from airflow.providers.apache.spark.hooks.spark_submit import SparkSubmitHook

        spark = self.project.spark
        options = {key: getattr(spark, key) for key in ("deploy_mode", "driver_memory", "executor_memory",
                                                        "num_executors") if getattr(spark, key) is not None}
        from airflow_trickle.location import secret_environment

        # storage credentials by the environment, never on the command line the hook logs
        env_vars = {"PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable,
                    **secret_environment(self.project.config().storage_options)}
        hook = SparkSubmitHook(conf=self.session_conf(), conn_id=self.conn_id, name=self.name[:200],
                               application_args=args, env_vars=env_vars, **options)
        hook.submit(JOB_FILE)

    def session_conf(self) -> dict:
        """The Spark settings of a submitted job: the project's session, with a quiet driver log."""
        from airflow_trickle.spark.session import session_conf

        conf = session_conf(self.project.config(), self.project.warehouse, secrets=False)
        conf.setdefault("spark.driver.extraJavaOptions", f"-Dlog4j2.configurationFile=file:{QUIET_LOGGING}")
        if "://" in self.project.warehouse:  # a remote warehouse is the cluster's own setting
            conf.pop("spark.sql.warehouse.dir", None)
        return conf

    # -- the work ---------------------------------------------------------------------------------

    def refresh(self, unit, names: list[str], *, mode: str, initiated_by: str, trickle=None) -> dict[str, dict]:
        """Refresh ``names`` (``unit``'s members still needing Spark), the chosen way; one outcome
        per table: action, status, rows, table version.  ``trickle``: the caller's
        :class:`~airflow_trickle.hooks.trickle.TrickleHook` of the warehouse, whose catalog a
        submitted job's outcomes are read from (else one is made)."""
        from airflow_trickle.catalog.model import utcnow
        from airflow_trickle.errors import TrickleError
        from airflow_trickle.jobs.refresh_job import run

        group = ({"members": list(unit.members), "convergence_points": list(unit.convergence_points)}
                 if unit.is_group else None)
        spec = self.project.to_job_spec(names)
        if not self.submits():
            self.log.info("refreshing %s (mode %s)", ", ".join(names), mode)
            tr = self.connect()
            try:
                results = run(tr, spec, names, mode=mode, initiated_by=initiated_by, group=group)
            except TrickleError as err:
                raise AirflowException(str(err)) from None
            finally:
                tr.close()
            return _connect_outcomes(tr, results)
        args = ["--spec", json.dumps(spec), "--tables", ",".join(names), "--mode", str(mode),
                "--initiated-by", initiated_by]
        if group is not None:
            args += ["--group", json.dumps(group)]
        started = utcnow() - timedelta(seconds=1)
        self.log.info("refreshing %s in a Spark job (mode %s)", ", ".join(names), mode)
        trickle = trickle or self._trickle()
        try:
            self.submit(args)
        except Exception as err:
            failure = _newest_failure(trickle, names, started)
            raise AirflowException(failure or f"refresh job for {', '.join(names)} failed: {err}") from err
        return {name: _submitted_outcome(trickle, name, started) for name in names}

    def maintain(self, names: list[str], *, retention_hours: float | None) -> list[dict]:
        """OPTIMIZE and VACUUM ``names`` and compact the catalog; what was done (spark-submit: the
        job prints it in the task log, and nothing is returned)."""
        from airflow_trickle.errors import TrickleError
        from airflow_trickle.jobs.refresh_job import maintain

        if self.submits():
            retention = [] if retention_hours is None else ["--retention-hours", str(retention_hours)]
            self.submit(["--spec", json.dumps(self.project.to_job_spec(names)), "--tables", ",".join(names),
                         "--maintain", *retention])
            return []
        tr = self.connect()
        try:
            return maintain(tr, names, retention_hours=retention_hours)
        except TrickleError as err:
            raise AirflowException(str(err)) from None
        finally:
            tr.close()

    def drop(self, names: list[str]) -> None:
        """Drop ``names`` (stream tables a project no longer declares, with ``deploy.prune``),
        readers first; a name already gone is skipped."""
        from airflow_trickle.errors import TrickleError
        from airflow_trickle.jobs.refresh_job import drop

        self.log.info("dropping %s: the project file no longer declares them (prune)", ", ".join(names))
        if self.submits():
            self.submit(["--spec", json.dumps(self.project.to_job_spec([])), "--tables", ",".join(names), "--drop"])
            return
        tr = self.connect()
        try:
            drop(tr, names)
        except TrickleError as err:
            raise AirflowException(str(err)) from None
        finally:
            tr.close()

    def _trickle(self):
        from airflow_trickle.hooks.trickle import TrickleHook

        return TrickleHook(self.project.warehouse, settings=self.project.settings)

    def get_conn(self) -> Any:
        return self.connection()


def _connect_outcomes(tr, results: list[dict]) -> dict[str, dict]:
    outcomes = {}
    for result in results:
        name = result.pop("name")
        outcomes[name] = {"table_version": _table_version(tr, name), **result}
    return outcomes


def _table_version(tr, name: str) -> int:
    from airflow_trickle.storage.deltalog import latest_version

    return latest_version(tr.catalog.at(tr.get(name).location))


def _submitted_outcome(hook, name: str, started) -> dict:
    """What the job did to ``name``: its newest history row since ``started``, and its table version."""
    records = [r for r in hook.catalog.history(name, limit=5) if r.start_time and r.start_time >= started
               and r.action != "FRESHNESS_MISS"]
    outcome: dict[str, Any] = {"table_version": hook.table_version(name)}
    if records:
        record = records[0]
        outcome.update(action=record.action, status=record.status, rows_inserted=record.rows_inserted,
                       rows_deleted=record.rows_deleted, refresh_id=record.refresh_id, seq=record.seq)
    if any(r.initiated_by == "ALTER" for r in records):  # the job applied a changed query first
        outcome["altered"] = "query"
    return outcome


def _newest_failure(hook, names: list[str], started) -> str | None:
    for name in names:
        for record in hook.catalog.history(name, limit=5):
            if record.status == "FAILED" and record.start_time and record.start_time >= started:
                return record.error_message
    return None

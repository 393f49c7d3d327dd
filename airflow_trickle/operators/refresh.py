"""``StreamTableRefreshOperator``: refresh one stream table (or one atomic group) with Spark.

Before any Spark is involved, the task answers what it can from the catalog and the Delta logs
(milliseconds, no JVM): is the unit selected in this run, is it due, is its data stale, is
there anything new beyond its frontier.  A unit with nothing to do ends as *skipped*; the tasks
downstream run anyway (their trigger rule is ``none_failed``) and decide for themselves.

Real work runs one of two ways, chosen by the project's ``spark`` section (or, by default, by
the type of its Airflow connection):

* **Spark Connect** (a ``spark_connect`` connection): the task runs the engine in its own
  process against the long-lived Spark service (``trickle serve``) -- no JVM in the worker,
  so a refresh costs its query, not a JVM start;
* **spark-submit** (a ``spark`` connection, or ``submit: true``): the task submits
  :mod:`airflow_trickle.jobs.refresh_job` through the Spark provider -- ``local[*]``, YARN,
  Kubernetes or a standalone cluster, as the connection says.
"""
from __future__ import annotations

import json
import sys
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator
from airflow.sdk import BaseOperator
from airflow.sdk.exceptions import AirflowException, AirflowSkipException

from airflow_trickle.model import RunMode
from airflow_trickle.project import Project, RefreshUnit, load_project

#: The Spark application every refresh task submits.
JOB_FILE = str(Path(__file__).resolve().parent.parent / "jobs" / "refresh_job.py")
#: Its driver's logging: warnings only, so the task log ends with the outcome, not Spark's INFO.
QUIET_LOGGING = str(Path(JOB_FILE).with_name("log4j2-quiet.properties"))


class StreamTableRefreshOperator(SparkSubmitOperator):
    """Refresh ``stream_tables`` (one table, or an atomic group's members in order) of ``project``.

    :param project: a :class:`~airflow_trickle.project.Project` or the path of its YAML file.
    :param stream_tables: qualified names; several only for an atomic diamond group.
    :param check_schedule: scheduled runs skip a unit that is not due (manual runs never do).
    :param freshness_notifier: called with the task context (plus ``freshness_miss``) on a miss;
        a callable, an Airflow notifier instance, or the dotted path of either.
    """

    ui_color = "#d9f2e6"
    custom_operator_name = "Stream table refresh"

    def __init__(self, *, project: Project | str, stream_tables: list[str], check_schedule: bool = True,
                 freshness_notifier: Any = None, conn_id: str | None = None, **kwargs) -> None:
        self.project = project if isinstance(project, Project) else load_project(project)
        spark = self.project.spark
        kwargs.setdefault("name", f"trickle-{'+'.join(stream_tables)}"[:200])
        for key in ("deploy_mode", "driver_memory", "executor_memory", "num_executors"):
            if getattr(spark, key) is not None:
                kwargs.setdefault(key, getattr(spark, key))
        super().__init__(application=JOB_FILE, conn_id=conn_id or spark.conn_id, **kwargs)
        unknown = [n for n in stream_tables if n not in self.project.stream_tables]
        if unknown:
            raise ValueError(f"{unknown} are not stream tables of project {self.project.name!r}")
        self.stream_tables = list(stream_tables)
        self.check_schedule = check_schedule
        self.freshness_notifier = freshness_notifier or self.project.airflow.freshness_notifier

    # -- the task -----------------------------------------------------------------------------

    def execute(self, context) -> dict:
        """Refresh, and note the outcome on the task instance in one line (with a
        ``notes_connection``): what it did, why it skipped, or why it failed."""
        from airflow_trickle.notes import write_task_note

        started = time.monotonic()
        conn_id = self.project.airflow.notes_connection
        self._waited = 0.0
        try:
            outcomes = self._execute(context)
        except AirflowSkipException as skipped:
            write_task_note(conn_id, context, after_wait(str(skipped), self._waited))
            raise
        except Exception as err:
            write_task_note(conn_id, context, f"FAILED: {err}")
            raise
        write_task_note(conn_id, context, note_text(outcomes, time.monotonic() - started, waited=self._waited))
        return outcomes

    def _execute(self, context) -> dict:
        from airflow_trickle.errors import TrickleError
        from airflow_trickle.planning import select
        from airflow_trickle.refresh.lock import refresh_lock

        project = self.project
        unit = project.unit_of(self.stream_tables[0])
        if unit.members != tuple(self.stream_tables):
            unit = RefreshUnit(tuple(self.stream_tables))
        try:
            selection = select(project, _run_parameters(context), manual=_is_manual(context))
        except TrickleError as err:
            raise AirflowException(f"refused: {err}") from None
        members = selection.members(unit)
        if not members:
            raise AirflowSkipException("skipped: not selected in this manual run")

        def waiting(name: str) -> None:
            self.log.info("%s is being refreshed by another run; waiting for it to finish", name)

        with refresh_lock(project.warehouse, members, on_wait=waiting) as waited:
            self._waited = waited  # for the note: a refresh that took long because it waited says so
            # inside the lock: a run that waited sees what the other one did (not due, NO_DATA)
            outcomes = self._refresh(context, unit, selection, members)
        self.log.info("%s", summary(outcomes))
        return outcomes

    def _refresh(self, context, unit: RefreshUnit, selection, members: list[str]) -> dict[str, dict]:
        from airflow_trickle.catalog.model import utcnow
        from airflow_trickle.hooks.trickle import TrickleHook
        from airflow_trickle.planning import is_due

        project = self.project
        hook = TrickleHook(project.warehouse, settings=project.settings)
        tag = _initiated_by(context)
        rows = {m: hook.catalog.get(m) for m in members}
        now = utcnow()
        if not selection.forced and self.check_schedule:
            due, why = is_due(project, unit, {m: r.last_refresh_at if r else None for m, r in rows.items()}, now,
                              tolerance=self._tolerance())
            self.log.info("%s: %s", "+".join(members), why)
            if not due:
                raise AirflowSkipException(f"skipped: {why}")
        self._check_freshness(context, hook, rows, now, tag)

        outcomes: dict[str, dict] = {}
        needing: list[str] = []
        for position, name in enumerate(members):
            cheap = None if (selection.mode != RunMode.AUTO or rows[name] is None) else hook.refresh_cheaply(
                name, initiated_by=tag)
            if cheap is None:
                needing = members[position:]
                break
            outcomes[name] = {"action": cheap.action, "status": cheap.status, "reason": cheap.reason}
            self.log.info("%s: %s (%s), no Spark job needed", name, cheap.action, cheap.reason)
        if not needing:
            actions = sorted({o["action"] for o in outcomes.values()})
            raise AirflowSkipException(f"skipped: nothing to refresh ({', '.join(actions)}): "
                                       + "; ".join(f"{n}: {o['reason']}" for n, o in outcomes.items()))

        if not self._submits():
            outcomes.update(self._refresh_over_connect(project, unit, needing, selection.mode, tag))
            self._emit_asset_events(context, outcomes)
            return outcomes
        args = ["--spec", json.dumps(project.to_job_spec(needing)), "--tables", ",".join(needing),
                "--mode", selection.mode.value, "--initiated-by", tag]
        if unit.is_group:
            args += ["--group", json.dumps({"members": list(unit.members),
                                            "convergence_points": list(unit.convergence_points)})]
        started = utcnow() - timedelta(seconds=1)
        self.log.info("refreshing %s in a Spark job (mode %s)", ", ".join(needing), selection.mode)
        try:
            self._submit(context, args)
        except Exception as err:
            failure = _newest_failure(hook, needing, started)
            raise AirflowException(failure or f"refresh job for {', '.join(needing)} failed: {err}") from err
        for name in needing:
            outcomes[name] = _outcome(hook, name, started)
        self._emit_asset_events(context, outcomes)
        return outcomes

    def _submit(self, context, args: list[str]) -> None:
        """spark-submit the job with ``args``, the project's Spark settings and this Python."""
        self.application_args = args
        self.conf = {**self._session_conf(), **(self.conf or {})}
        self.env_vars = {"PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable,
                         **(self.env_vars or {})}
        SparkSubmitOperator.execute(self, context)

    def _connect(self, project: Project):
        """A :class:`~airflow_trickle.api.Trickle` over the Spark service of the connection
        (an unreachable service fails the task with the library's message)."""
        from airflow.providers.apache.spark.hooks.spark_connect import SparkConnectHook

        from airflow_trickle.api import Trickle
        from airflow_trickle.errors import TrickleError

        address = SparkConnectHook(self._conn_id).get_connection_url()
        self.log.info("working over Spark Connect at %s", address)
        tr = Trickle(project.warehouse, remote=address, config=project.config())
        try:
            tr.sync()
        except TrickleError as err:
            tr.close()
            raise AirflowException(str(err)) from None
        except BaseException:
            tr.close()
            raise
        return tr

    def _tolerance(self) -> timedelta:
        from airflow_trickle.schedule import parse_schedule

        tick = self.project.tick()
        period = parse_schedule(tick).nominal_period() if tick else None
        return period / 2 if period else timedelta(0)

    def _session_conf(self) -> dict:
        from airflow_trickle.spark.session import session_conf

        conf = session_conf(self.project.config(), self.project.warehouse)
        conf.setdefault("spark.driver.extraJavaOptions", f"-Dlog4j2.configurationFile=file:{QUIET_LOGGING}")
        if "://" in self.project.warehouse:  # a remote warehouse is the cluster's own setting
            conf.pop("spark.sql.warehouse.dir", None)
        return conf

    def _submits(self) -> bool:
        """True: spark-submit a job; False: run over Spark Connect (see the module docstring)."""
        conn_type = self._connection().conn_type
        submit = self.project.spark.submit
        if submit is None:
            return conn_type != "spark_connect"
        if not submit and conn_type != "spark_connect":
            raise AirflowException(f"spark.submit is false but connection {self._conn_id!r} is of type "
                                   f"{conn_type!r}; refreshes over Spark Connect need a 'spark_connect' connection")
        return submit

    def _connection(self):
        from airflow.sdk import BaseHook

        try:
            return BaseHook.get_connection(self._conn_id)
        except Exception as err:  # noqa: BLE001 - the provider would silently fall back to YARN
            raise AirflowException(
                f"Spark connection {self._conn_id!r} is not defined ({err}); for the Spark service set "
                f"AIRFLOW_CONN_{self._conn_id.upper()}='{{\"conn_type\": \"spark_connect\", \"host\": "
                f"\"sc://127.0.0.1\", \"port\": 15002}}' (after `trickle serve`), or for spark-submit on local "
                f"Spark '{{\"conn_type\": \"spark\", \"host\": \"local[*]\"}}'") from None

    def _refresh_over_connect(self, project: Project, unit: RefreshUnit, names: list[str], mode: str,
                              tag: str) -> dict[str, dict]:
        """Run the refresh job's steps in this process, against the Spark service."""
        from airflow_trickle.errors import TrickleError
        from airflow_trickle.jobs.refresh_job import run

        self.log.info("refreshing %s (mode %s)", ", ".join(names), mode)
        group = ({"members": list(unit.members), "convergence_points": list(unit.convergence_points)}
                 if unit.is_group else None)
        tr = self._connect(project)
        try:
            results = run(tr, project.to_job_spec(names), names, mode=mode, initiated_by=tag, group=group)
        except TrickleError as err:
            raise AirflowException(str(err)) from None
        finally:
            tr.close()
        outcomes = {}
        for result in results:
            name = result.pop("name")
            outcomes[name] = {"table_version": _table_version(tr, name), **result}
        return outcomes

    def _check_freshness(self, context, hook, rows: dict, now, tag: str) -> None:
        from airflow_trickle.planning import freshness_miss

        for name, row in rows.items():
            miss = freshness_miss(name, self.project.freshness_target(name), row.data_timestamp if row else None, now)
            if miss is None:
                continue
            self.log.warning(miss.message)
            run_id = getattr(context.get("dag_run"), "run_id", None)
            if not hook.record_freshness_miss(miss, initiated_by=tag, run_id=run_id):
                continue  # already recorded for this run (an earlier try, or the run's deadline)
            if self.freshness_notifier:
                notify(self.freshness_notifier, {**context, "freshness_miss": miss.as_dict()})

    def _emit_asset_events(self, context, outcomes: dict[str, dict]) -> None:
        events = context.get("outlet_events")
        if events is None:
            return
        for asset in self.outlets or []:
            name = (getattr(asset, "extra", None) or {}).get("stream_table")
            if name in outcomes:
                events[asset].extra = outcomes[name]


def summary(outcomes: dict[str, dict]) -> str:
    """One line per stream table for the end of the task log: ``shop.t: DIFFERENTIAL +12 -3 rows``.

    >>> summary({"s.a": {"action": "DIFFERENTIAL", "status": "COMPLETED", "rows_inserted": 12, "rows_deleted": 3},
    ...          "s.b": {"action": "NO_DATA", "status": "COMPLETED", "reason": "no source changed"}})
    'refreshed s.a: DIFFERENTIAL +12 -3 rows; s.b: NO_DATA (no source changed)'
    """
    parts = []
    for name, outcome in outcomes.items():
        text = f"{name}: {outcome.get('action', '?')}"
        if outcome.get("rows_inserted") is not None or outcome.get("rows_deleted") is not None:
            text += f" +{outcome.get('rows_inserted') or 0} -{outcome.get('rows_deleted') or 0} rows"
        elif outcome.get("reason"):
            text += f" ({outcome['reason']})"
        if outcome.get("status") not in (None, "COMPLETED"):
            text += f" [{outcome['status']}]"
        parts.append(text)
    return "refreshed " + "; ".join(parts)


def note_text(outcomes: dict[str, dict], seconds: float, *, waited: float = 0.0) -> str:
    """The task instance's note after a refresh: :func:`summary` without the table's name when
    the task refreshes one table, and the task's time (and how much of it went on waiting for
    another run's refresh of the same table).

    >>> note_text({"s.a": {"action": "DIFFERENTIAL", "status": "COMPLETED", "rows_inserted": 12, "rows_deleted": 3}}, 1.43)
    'DIFFERENTIAL +12 -3 rows in 1.4 s'
    >>> note_text({"s.a": {"action": "FULL", "rows_inserted": 1, "rows_deleted": 0},
    ...            "s.b": {"action": "DIFFERENTIAL", "rows_inserted": 0, "rows_deleted": 2}}, 3.0)
    's.a: FULL +1 -0 rows; s.b: DIFFERENTIAL +0 -2 rows in 3.0 s'
    >>> note_text({"s.a": {"action": "DIFFERENTIAL", "rows_inserted": 1, "rows_deleted": 0}}, 20.8, waited=13.04)
    "DIFFERENTIAL +1 -0 rows in 20.8 s (13.0 s of it waiting for another run's refresh)"
    """
    text = summary(outcomes).removeprefix("refreshed ")
    if len(outcomes) == 1:
        text = text.split(": ", 1)[1]
    text = f"{text} in {seconds:.1f} s"
    return f"{text} ({waited:.1f} s of it waiting for another run's refresh)" if waited >= WAIT_WORTH_NOTING else text


#: Seconds of waiting for another run's refresh lock worth a mention in a task's note.
WAIT_WORTH_NOTING = 0.5


def after_wait(text: str, waited: float) -> str:
    """A skip note, saying when the task first waited for another run's refresh of its table.

    >>> after_wait("skipped: nothing to refresh (NO_DATA): no source changed", 12.34)
    "skipped: nothing to refresh (NO_DATA): no source changed (after waiting 12.3 s for another run's refresh)"
    >>> after_wait("skipped: not due (next in 3m)", 0.0)
    'skipped: not due (next in 3m)'
    """
    return f"{text} (after waiting {waited:.1f} s for another run's refresh)" if waited >= WAIT_WORTH_NOTING else text


def notify(notifier: Any, context: dict) -> None:
    """Call a freshness notifier: a callable (``BaseNotifier`` instances are) or a dotted path."""
    if isinstance(notifier, str):
        from airflow.sdk.module_loading import import_string

        notifier = import_string(notifier)
    notifier(context)


def _run_parameters(context) -> dict:
    """The run's parameters: the form's values, plus any other key its ``conf`` carried.

    A key the DAG does not declare (``{"table": ...}`` through the REST API) is not a param,
    but ``select`` must see it to refuse it: ignored, it would mean "every stream table".
    """
    run = context.get("dag_run")
    conf = getattr(run, "conf", None)
    return {**(dict(conf) if isinstance(conf, dict) else {}), **dict(context.get("params") or {})}


def _is_manual(context) -> bool:
    run = context.get("dag_run")
    run_type = str(getattr(run, "run_type", "") or "").lower()
    return run_type.endswith("manual")


def _initiated_by(context) -> str:
    ti = context.get("ti") or context.get("task_instance")
    run = context.get("dag_run")
    return (f"AIRFLOW {getattr(ti, 'dag_id', '?')}/{getattr(run, 'run_id', '?')}/"
            f"{getattr(ti, 'task_id', '?')}#{getattr(ti, 'try_number', 1)}")


def _table_version(tr, name: str) -> int:
    from airflow_trickle.deltalog import latest_version

    return latest_version(tr.get(name).location)


def _outcome(hook, name: str, started) -> dict:
    """What the job did to ``name``: its newest history row since ``started``, and its table version."""
    records = [r for r in hook.catalog.history(name, limit=5) if r.start_time and r.start_time >= started
               and r.action != "FRESHNESS_MISS"]
    outcome: dict[str, Any] = {"table_version": hook.table_version(name)}
    if records:
        record = records[0]
        outcome.update(action=record.action, status=record.status, rows_inserted=record.rows_inserted,
                       rows_deleted=record.rows_deleted, refresh_id=record.refresh_id, seq=record.seq)
    return outcome


def _newest_failure(hook, names: list[str], started) -> str | None:
    for name in names:
        for record in hook.catalog.history(name, limit=5):
            if record.status == "FAILED" and record.start_time and record.start_time >= started:
                return record.error_message
    return None


class StreamTableMaintenanceOperator(StreamTableRefreshOperator):
    """OPTIMIZE and VACUUM the storage of every stream table of ``project`` and compact the
    catalog (:mod:`airflow_trickle.maintain`), the way refreshes run (Spark service or
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
        from airflow_trickle.errors import TrickleError
        from airflow_trickle.jobs.refresh_job import maintain
        from airflow_trickle.refresh.lock import refresh_lock

        names = self.stream_tables
        with refresh_lock(self.project.warehouse, names,
                          on_wait=lambda name: self.log.info("%s is being refreshed; waiting for it", name)):
            if self._submits():
                retention = [] if self.retention_hours is None else ["--retention-hours", str(self.retention_hours)]
                self._submit(context, ["--spec", json.dumps(self.project.to_job_spec(names)),
                                       "--tables", ",".join(names), "--maintain", *retention])
                return []  # the job printed what it did in the task log
            tr = self._connect(self.project)
            try:
                done = maintain(tr, names, retention_hours=self.retention_hours)
            except TrickleError as err:
                raise AirflowException(str(err)) from None
            finally:
                tr.close()
        for table in done:
            self.log.info("%s: %s -> %s active files, retention %.1f h%s", table["table"],
                          table["active_files_before"], table["active_files_after"], table["retained_hours"],
                          f" ({table['note']})" if table["note"] else "")
        return done


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
        from airflow_trickle.notes import write_run_note
        from airflow_trickle.planning import select

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

"""``StreamTableRefreshOperator``: refresh one stream table (or one atomic group).

Before any Spark is involved, the task answers what it can from the catalog and the Delta logs
(milliseconds, no JVM): is the unit selected in this run, is it due, is its data stale, is
there anything new beyond its frontier.  A unit with nothing to do ends as *skipped*; the tasks
downstream run anyway (their trigger rule is ``none_failed``) and decide for themselves.

The work that needs Spark goes to :class:`~airflow_trickle.hooks.refresh_engine.StreamTableEngineHook`,
which runs it over the Spark service or as a spark-submit job, as the connection says.  The
refresh lock is :func:`~airflow_trickle.refresh.lock.refresh_lock`'s, the due check and the
freshness target :mod:`~airflow_trickle.project.planning`'s.
"""
from __future__ import annotations

import time
from datetime import timedelta
from typing import Any, Sequence

from airflow.sdk import BaseOperator
from airflow.sdk.exceptions import AirflowException, AirflowSkipException

from airflow_trickle.model import RunMode
from airflow_trickle.project import Project, RefreshUnit, load_project
from airflow_trickle.project.plan import Change, compared


class StreamTableRefreshOperator(BaseOperator):
    """Refresh ``stream_tables`` (one table, or an atomic group's members in order) of ``project``.

    :param project: a :class:`~airflow_trickle.project.Project` or the path of its YAML file.
    :param stream_tables: qualified names; several only for an atomic diamond group.
    :param check_schedule: scheduled runs skip a unit that is not due (manual runs never do).
    :param on_commit: a task of the on-commit DAG: it skips, without Spark, unless one of the
        sources whose commits triggered the run (``triggering_asset_events``) is among its own.
    :param freshness_notifier: called with the task context (plus ``freshness_miss``) on a miss;
        a callable, an Airflow notifier instance, or the dotted path of either.
    :param conn_id: the Airflow connection of the Spark service (``spark_connect``) or of
        spark-submit (``spark``); default: the project's ``spark.conn_id``.
    :param name: the Spark application's name when the refresh is submitted as a job.
    """

    template_fields: Sequence[str] = ("conn_id", "name")
    ui_color = "#d9f2e6"
    custom_operator_name = "Stream table refresh"

    def __init__(self, *, project: Project | str, stream_tables: list[str], check_schedule: bool = True,
                 on_commit: bool = False, freshness_notifier: Any = None, conn_id: str | None = None,
                 name: str | None = None, **kwargs) -> None:
        super().__init__(**kwargs)
        self.project = project if isinstance(project, Project) else load_project(project)
        unknown = [n for n in stream_tables if n not in self.project.stream_tables]
        if unknown:
            raise ValueError(f"{unknown} are not stream tables of project {self.project.name!r}")
        self.stream_tables = list(stream_tables)
        self.check_schedule = check_schedule
        self.on_commit = on_commit
        self.freshness_notifier = freshness_notifier or self.project.airflow.freshness_notifier
        self.conn_id = conn_id or self.project.spark.conn_id
        self.name = name or f"trickle-{'+'.join(stream_tables)}"[:200]

    @property
    def engine(self):
        """Where the Spark work runs (``hooks/refresh_engine.py``)."""
        from airflow_trickle.hooks.refresh_engine import StreamTableEngineHook

        return StreamTableEngineHook(self.project, conn_id=self.conn_id, name=self.name)

    # -- the task -----------------------------------------------------------------------------

    def execute(self, context) -> dict:
        """Refresh, and note the outcome on the task instance in one line (with a
        ``notes_connection``): what it did, why it skipped, or why it failed."""
        from airflow_trickle.operators.notes import write_task_note

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
        from airflow_trickle.spark import require_engine

        require_engine("a refresh task")  # a worker without the engine: say which extra, first
        from airflow_trickle.errors import TrickleError
        from airflow_trickle.project.planning import select
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
        if self.on_commit and not _is_manual(context):
            committed = committed_sources(context, project.name)
            reached = {s for m in members for s in _watched_upstream(project, m)}
            if committed is not None and not committed & reached:
                raise AirflowSkipException(f"skipped: none of its sources committed (committed: "
                                           f"{', '.join(sorted(committed)) or 'nothing'})")

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
        from airflow_trickle.project.planning import is_due

        project = self.project
        hook = TrickleHook(project.warehouse, settings=project.settings)
        tag = _initiated_by(context)
        rows = {m: hook.catalog.get(m) for m in members}
        now = utcnow()
        # a table the project file changed is ALTERed in place by this run, due or not
        edited = {m for m, row in rows.items() if row is not None
                  and compared(project.stream_tables[m], row).change == Change.ALTER}
        if edited:
            self.log.info("the project file changes %s: applied before the refresh", ", ".join(sorted(edited)))
        if not selection.forced and self.check_schedule and not edited:
            due, why = is_due(project, unit, {m: r.last_refresh_at if r else None for m, r in rows.items()}, now,
                              tolerance=self._tolerance())
            self.log.info("%s: %s", "+".join(members), why)
            if not due:
                raise AirflowSkipException(f"skipped: {why}")
        self._check_freshness(context, hook, rows, now, tag)

        outcomes: dict[str, dict] = {}
        needing: list[str] = []
        for position, name in enumerate(members):
            spark_needed = selection.mode != RunMode.AUTO or rows[name] is None or name in edited
            cheap = None if spark_needed else hook.refresh_cheaply(name, initiated_by=tag)
            if cheap is None:
                needing = members[position:]
                break
            outcomes[name] = {"action": cheap.action, "status": cheap.status, "reason": cheap.reason}
            self.log.info("%s: %s (%s), no Spark job needed", name, cheap.action, cheap.reason)
        if not needing:
            actions = sorted({o["action"] for o in outcomes.values()})
            raise AirflowSkipException(f"skipped: nothing to refresh ({', '.join(actions)}): "
                                       + "; ".join(f"{n}: {o['reason']}" for n, o in outcomes.items()))
        from airflow_trickle.operators.lineage import collect

        outcomes.update(self.engine.refresh(unit, needing, mode=selection.mode.value, initiated_by=tag, trickle=hook))
        self._lineage = collect(hook.catalog, {n: outcomes[n] for n in needing})
        self._emit_asset_events(context, outcomes)
        return outcomes

    def _tolerance(self) -> timedelta:
        from airflow_trickle.schedule import parse_schedule

        tick = self.project.tick()
        period = parse_schedule(tick).nominal_period() if tick else None
        return period / 2 if period else timedelta(0)

    def _check_freshness(self, context, hook, rows: dict, now, tag: str) -> None:
        from airflow_trickle.project.planning import freshness_miss

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

    # -- lineage (the OpenLineage provider asks; ``operators/lineage.py``) ------------------------

    def get_openlineage_facets_on_complete(self, task_instance):
        """Inputs at their frontier versions, the stream tables at their new ones, their schema,
        column lineage and defining query, and what each refresh did (collected in ``execute``)."""
        from airflow_trickle.operators.lineage import operator_lineage

        return operator_lineage(getattr(self, "_lineage", []))

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
    >>> summary({"s.a": {"action": "NO_DATA", "altered": "query", "reason": "no source has a new version"}})
    'refreshed s.a: ALTERED in place (query), then NO_DATA (no source has a new version)'
    """
    parts = []
    for name, outcome in outcomes.items():
        altered = f"ALTERED in place ({outcome['altered']}), then " if outcome.get("altered") else ""
        text = f"{name}: {altered}{outcome.get('action', '?')}"
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


def committed_sources(context, project: str) -> set[str] | None:
    """The sources whose commit watchers triggered this run (``None``: not known, e.g. a run
    triggered by hand: then every task refreshes, and those with nothing new skip cheaply)."""
    events = context.get("triggering_asset_events")
    if not events:
        return None
    prefix = f"trickle/{project}/"
    return {asset.name.removeprefix(prefix) for asset in events if asset.name.startswith(prefix)}


def _watched_upstream(project: Project, name: str) -> set[str]:
    """The watched sources whose commits reach ``name``."""
    return {source for source, reached in project.commit_watches.refreshed.items() if name in reached}


def _is_manual(context) -> bool:
    run = context.get("dag_run")
    run_type = str(getattr(run, "run_type", "") or "").lower()
    return run_type.endswith("manual")


def _initiated_by(context) -> str:
    ti = context.get("ti") or context.get("task_instance")
    run = context.get("dag_run")
    return (f"AIRFLOW {getattr(ti, 'dag_id', '?')}/{getattr(run, 'run_id', '?')}/"
            f"{getattr(ti, 'task_id', '?')}#{getattr(ti, 'try_number', 1)}")

"""Callbacks for freshness misses.

Two places notice a miss:

* every refresh task compares its stream table's data timestamp with the table's freshness
  target before refreshing; on a miss it records a ``FRESHNESS_MISS`` row in the refresh
  history and calls the project's ``freshness_notifier`` (any callable taking the task
  context, e.g. an Airflow ``SlackNotifier``/``SmtpNotifier`` instance, or a dotted path);
* every generated DAG run carries a Deadline Alert; when a run has not finished within the
  tightest freshness target, the triggerer awaits :func:`record_deadline_miss`, which records
  a miss for each stream table whose data is then older than its own target (a slow run whose
  tables are still fresh is logged, not recorded).

Either way a table's miss is recorded once per run, with the run id.
"""
from __future__ import annotations

import asyncio
import logging

from airflow.sdk import BaseNotifier

log = logging.getLogger(__name__)


async def record_deadline_miss(context: dict | None = None, *, warehouse: str, project: str,
                               interval_seconds: int, targets: dict[str, int] | None = None,
                               tables: list[str] | None = None, settings: dict | None = None,
                               **_: object) -> list[str]:
    """Deadline Alert callback (runs on the triggerer): the run is slow; which tables are stale?

    The alert is about the *run*: it did not finish within the project's tightest freshness
    target.  A stream table only misses when its own data is older than its own target, so
    each table in ``targets`` (name -> seconds) is checked, and a ``FRESHNESS_MISS`` row is
    written for the stale ones only -- once per table and run, with the run id.  Returns the
    tables recorded.  (``tables`` is what DAGs built before ``targets`` existed pass.)
    """
    targets = targets if targets is not None else dict.fromkeys(tables or (), interval_seconds)
    return await asyncio.to_thread(_record, warehouse, project, targets, interval_seconds, settings or {},
                                   context or {})


def _record(warehouse: str, project: str, targets: dict[str, int], interval_seconds: int, settings: dict,
            context: dict) -> list[str]:
    from datetime import timedelta

    from airflow_trickle.catalog.model import utcnow
    from airflow_trickle.hooks.trickle import TrickleHook
    from airflow_trickle.project.planning import freshness_miss
    from airflow_trickle.schedule import format_duration

    hook = TrickleHook(warehouse, settings=settings)
    now = utcnow()
    run = context.get("dag_run") or {}
    run = run if isinstance(run, dict) else vars(run)
    run_id = run.get("dag_run_id") or run.get("run_id") or "?"  # Airflow 3.3 sends DAGRunResponse's fields
    dag_id = run.get("dag_id") or project
    stale, fresh = [], []
    for name, seconds in targets.items():
        st = hook.catalog.get(name)
        miss = freshness_miss(name, timedelta(seconds=seconds), st.data_timestamp if st else None, now)
        if miss is None:
            fresh.append(name)
        elif hook.record_freshness_miss(miss, initiated_by=f"DEADLINE {dag_id}/{run_id}", run_id=run_id):
            stale.append(name)
    log.warning("run %s of %s did not finish within %s (its tightest freshness target; state %s): %s",
                run_id, dag_id, format_duration(timedelta(seconds=interval_seconds)), run.get("state", "?"),
                f"stale: {', '.join(stale)}" if stale else "every stream table is still within its target")
    return stale


def log_freshness_miss(context: dict) -> None:
    """A minimal ``freshness_notifier``: one warning line in the task log."""
    miss = context.get("freshness_miss") or {}
    log.warning("FRESHNESS MISS %s", miss.get("message", miss))


class FreshnessMissLogNotifier(BaseNotifier):
    """An Airflow notifier that logs a freshness miss (:func:`log_freshness_miss`): pass an
    instance as the factory's ``freshness_notifier`` (or as any Airflow callback)."""

    template_fields = ()

    def notify(self, context) -> None:
        log_freshness_miss(context)

"""Callbacks for freshness misses.

Two places notice a miss:

* every refresh task compares its stream table's data timestamp with the table's freshness
  target before refreshing; on a miss it records a ``FRESHNESS_MISS`` row in the refresh
  history and calls the project's ``freshness_notifier`` (any callable taking the task
  context, e.g. an Airflow ``SlackNotifier``/``SmtpNotifier`` instance, or a dotted path);
* every generated DAG run carries a Deadline Alert; when a run has not finished within the
  tightest freshness target, the triggerer awaits :func:`record_deadline_miss`.
"""
from __future__ import annotations

import asyncio
import logging

log = logging.getLogger(__name__)


async def record_deadline_miss(context: dict | None = None, *, warehouse: str, project: str, tables: list[str],
                               interval_seconds: int, settings: dict | None = None, **_: object) -> None:
    """Deadline Alert callback (runs on the triggerer): log the miss and record it in the history."""
    await asyncio.to_thread(_record, warehouse, project, tables, interval_seconds, settings or {}, context or {})


def _record(warehouse: str, project: str, tables: list[str], interval_seconds: int, settings: dict,
            context: dict) -> None:
    from airflow_trickle.catalog.model import utcnow
    from airflow_trickle.hooks.trickle import TrickleHook
    from airflow_trickle.planning import FreshnessMiss, freshness_miss

    from datetime import timedelta

    hook = TrickleHook(warehouse, settings=settings)
    now = utcnow()
    target = timedelta(seconds=interval_seconds)
    run = (context.get("dag_run") or {}) if isinstance(context, dict) else {}
    run_id = run.get("run_id") if isinstance(run, dict) else getattr(run, "run_id", None)
    for name in tables:
        st = hook.catalog.get(name)
        if st is None:
            continue
        miss = freshness_miss(name, target, st.data_timestamp, now) or FreshnessMiss(
            name, now - (st.data_timestamp or now), target, st.data_timestamp or now)
        log.warning("deadline missed by a run of project %s: %s", project, miss.message)
        hook.record_freshness_miss(miss, initiated_by=f"DEADLINE {project}/{run_id or '?'}")


def log_freshness_miss(context: dict) -> None:
    """A minimal ``freshness_notifier``: one warning line in the task log."""
    miss = context.get("freshness_miss") or {}
    log.warning("FRESHNESS MISS %s", miss.get("message", miss))

"""Whether anything watches the sources of an ``on_commit`` stream table: the watchers' heartbeats.

A stream table with ``schedule: on_commit`` is refreshed when an Airflow asset watcher -- a
trigger on Airflow's triggerer (:mod:`airflow_trickle.triggers.source_commit`) -- sees one of its
sources commit. Where no triggerer runs, or the on-commit DAG is paused, nothing fires and the
table silently ages. So each watcher writes a small heartbeat into the warehouse's catalog
folder (``_trickle/_watchers/<project>/<source>.json``) when it starts, every
:data:`HEARTBEAT`, and whenever it fires; ``trickle status`` and the Airflow UI's Stream tables
page read them back and say when none is alive. A file in the warehouse rather than a question
to Airflow's database: the CLI runs where no Airflow is configured, and reads nothing else.
"""
from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone

from airflow_trickle.location import Location

#: The folder of the heartbeats, under the catalog's.
WATCH_DIR = "_watchers"
#: How often a watcher writes its heartbeat while nothing happens.
HEARTBEAT = timedelta(seconds=30)
#: A heartbeat older than this many heartbeat periods (or poll intervals) means no live watcher.
MISSED_BEATS = 3


def beat_path(project: str, source: str) -> str:
    """``<project>/<source>.json``, relative to the heartbeats' folder."""
    return f"{project}/{source}.json"


def record_beat(catalog: Location, beat: dict) -> None:
    """Write a watcher's heartbeat (``project``, ``source``, ``serves``, ``polled_at``, ...)."""
    catalog.child(WATCH_DIR).write(beat_path(beat["project"], beat["source"]),
                                   json.dumps(beat, sort_keys=True, default=str).encode())


def read_beats(catalog: Location) -> list[dict]:
    """Every heartbeat in the warehouse (an unreadable one is left out, not fatal)."""
    folder = catalog.child(WATCH_DIR)
    beats = []
    for path in folder.list_files(".json"):
        try:
            beats.append(json.loads(folder.read(path)))
        except (OSError, ValueError):
            continue
    return beats


def watcher_state(name: str, beats: list[dict], now: datetime) -> dict:
    """How refresh on commit stands for the ``on_commit`` stream table ``name``:
    ``{"state": "watching" | "stale" | "none", "message": ...}``.

    >>> now = datetime(2026, 12, 1, 12, 0, 0, tzinfo=timezone.utc)
    >>> beat = {"project": "shop", "source": "shop.orders", "serves": ["shop.rev"], "poll_interval_s": 5,
    ...         "polled_at": "2026-12-01T11:59:50", "dag_id": "trickle_shop__on_commit"}
    >>> watcher_state("shop.rev", [beat], now)["message"]
    'watching shop.orders (last poll 10 s ago)'
    >>> watcher_state("shop.rev", [{**beat, "polled_at": "2026-12-01T11:50:00"}], now)["state"]
    'stale'
    >>> watcher_state("shop.rev", [], now)["state"]
    'none'
    """
    serving = [b for b in beats if name in (b.get("serves") or ())]
    if not serving:
        return {"state": "none", "message": (
            "no watcher has polled its sources: refresh on commit needs the project's on-commit DAG "
            "(<dag_id>__on_commit) unpaused in Airflow and Airflow's triggerer running")}
    ages = {b["source"]: (now - _instant(b["polled_at"])).total_seconds() for b in serving}
    allowed = {b["source"]: MISSED_BEATS * max(HEARTBEAT.total_seconds(), float(b.get("poll_interval_s") or 0))
               for b in serving}
    stale = sorted(s for s, age in ages.items() if age > allowed[s])
    if stale:
        dag = serving[0].get("dag_id", "<dag_id>__on_commit")
        return {"state": "stale", "message": (
            f"no live watcher of {', '.join(stale)}: last poll {round(max(ages[s] for s in stale))} s ago "
            f"(is Airflow's triggerer running? is the DAG {dag} paused?); commits are not refreshed until it is back")}
    errors = [f"{b['source']}: {b['error']}" for b in serving if b.get("error")]
    if errors:
        return {"state": "stale", "message": "the watcher cannot read " + "; ".join(errors)}
    return {"state": "watching", "message": f"watching {', '.join(sorted(ages))} "
                                            f"(last poll {round(max(ages.values()))} s ago)"}


def _instant(text: str) -> datetime:
    value = datetime.fromisoformat(text)
    return value if value.tzinfo else value.replace(tzinfo=timezone.utc)

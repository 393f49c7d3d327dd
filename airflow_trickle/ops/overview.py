"""What every stream table of a warehouse looks like right now -- from the catalog and the Delta
logs only (no Spark, no JVM), so the Airflow UI's Stream tables page and ``trickle status``
can ask it in milliseconds and agree on every number.

Freshness is the age of a table's data -- now minus the start of the refresh whose frontier it
holds -- against its target: the explicit ``freshness`` of its definition, else
``FRESHNESS_FACTOR`` times its effective period (its schedule, or for a CALCULATED table the
tightest schedule downstream), as a project computes it by default.
"""
from __future__ import annotations

from datetime import datetime, timedelta

from airflow_trickle.graph import build_graph, effective_periods
from airflow_trickle.ops.health import reader_status, source_health
from airflow_trickle.model import Action

#: The default freshness target is this many effective periods (the project default).
FRESHNESS_FACTOR = 2
#: Refreshes shown per stream table (the page's sparkline).
RECENT = 20


def freshness_targets(catalog) -> dict[str, timedelta | None]:
    """Each stream table's freshness target; ``None`` when it has neither one nor a period."""
    tables = catalog.list()
    graph = build_graph([(d.source_name, d.st_name) for d in catalog.dependencies()],
                        stream_tables=[st.name for st in tables])
    periods = effective_periods(graph, {st.name: st.schedule for st in tables})
    targets = {}
    for st in tables:
        explicit = st.options.freshness_seconds
        period = periods.get(st.name)
        targets[st.name] = (timedelta(seconds=float(explicit)) if explicit
                            else period * FRESHNESS_FACTOR if period else None)
    return targets


def commit_watchers(catalog, tables, now: datetime) -> dict[str, dict]:
    """For each ``on_commit`` stream table of ``tables``: is a watcher alive (``watchers.py``)."""
    from airflow_trickle.ops.watchers import read_beats, watcher_state
    from airflow_trickle.schedule import parse_schedule

    on_commit = [st.name for st in tables if st.schedule and parse_schedule(st.schedule).on_commit]
    if not on_commit:
        return {}
    beats = read_beats(catalog.location)
    return {name: watcher_state(name, beats, now) for name in on_commit}


def overview(catalog, now: datetime, *, change_feed_warning_hours: float = 24.0) -> list[dict]:
    """One row per stream table: state, last refresh, data age against its target, recent
    refreshes, and the health of its sources' change feeds (``health.py``).

    >>> overview(type("Empty", (), {"list": lambda self: [], "dependencies": lambda self: []})(), None)
    []
    """
    tables = catalog.list()
    if not tables:
        return []
    targets = freshness_targets(catalog)
    feeds = reader_status(source_health(catalog, timedelta(hours=change_feed_warning_hours), now))
    watchers = commit_watchers(catalog, tables, now)
    history: dict[str, list] = {}
    for record in catalog.history(None, limit=RECENT * 3 * len(tables)):
        history.setdefault(record.st_name, []).append(record)
    rows = []
    for st in sorted(tables, key=lambda t: t.name):
        records = history.get(st.name, [])
        refreshes = [r for r in records if r.action not in (Action.FRESHNESS_MISS, Action.CHANGE_FEED)][:RECENT]
        misses = [r for r in records if r.action == Action.FRESHNESS_MISS]
        last = refreshes[0] if refreshes else None
        age = (now - st.data_timestamp).total_seconds() if st.data_timestamp else None
        target = targets.get(st.name)
        rows.append({
            "name": st.name,
            "status": st.status,
            "refresh_mode": st.refresh_mode,
            "effective_mode": st.effective_mode,
            "mode_reason": st.mode_reason,
            "schedule": st.schedule,
            "is_populated": st.is_populated,
            "consecutive_errors": st.consecutive_errors,
            "data_timestamp": st.data_timestamp.isoformat() if st.data_timestamp else None,
            "age_s": round(age, 1) if age is not None else None,
            "target_s": target.total_seconds() if target else None,
            "stale": bool(age is not None and target and age > target.total_seconds()),
            "last": _record(last) if last else None,
            "recent": [_record(r) for r in reversed(refreshes)],  # oldest first: a sparkline
            "last_miss": _record(misses[0]) if misses else None,
            "query": st.original_query,
            "change_feed": ({"status": feeds[st.name].status, "message": feeds[st.name].message}
                            if st.name in feeds else None),
            "watcher": watchers.get(st.name),
        })
    return rows


def _record(record) -> dict:
    return {"action": record.action, "status": record.status, "reason": record.reason or record.error_message,
            "rows_inserted": record.rows_inserted, "rows_deleted": record.rows_deleted,
            "duration_ms": record.duration_ms, "initiated_by": record.initiated_by,
            "start_time": record.start_time.isoformat() if record.start_time else None,
            # how it ran (``refresh/plan.py``) and where it departed from its plan
            "plan": plan_summary(record.plan) if record.plan else None,
            "fallbacks": [f"{f['part']}: planned {f['planned']}, ran {f['taken']}: {f['cause']}"
                          for f in (record.plan or {}).get("fallbacks") or []]}


def operator_tree(catalog, name: str) -> list[str]:
    """The DVM operator tree of a DIFFERENTIAL stream table, its sources' columns read from their
    Delta logs (what ``explain`` shows first, without Spark); ``[]`` for a FULL table."""
    from deltalake import DeltaTable

    from airflow_trickle.refresh.differential import columns_of_sources
    from airflow_trickle.dvm.planner import plan

    st = catalog.get(name)
    if st is None or st.effective_mode != "DIFFERENTIAL":
        return []
    columns = columns_of_sources(catalog, name,
                                 lambda dep: [f.name for f in DeltaTable(dep.source_location).schema().fields])
    return plan(st.defining_query, columns).explain()


def plan_summary(recorded: dict) -> str:
    """A history row's plan (``refresh/plan.ExecutionPlan.to_dict``) in one line, for people.

    >>> plan_summary({"commit": {"committer": "delta-rs"}, "parts": [{"path": "probed"}, {"path": "scanned"}],
    ...               "fallbacks": [{"part": "s.o change"}]})
    'commit delta-rs · 1 probed, 1 scanned · 1 fallback (s.o change)'
    """
    paths = [p["path"] for p in recorded.get("parts") or []]
    counted = ", ".join(f"{paths.count(path)} {path}" for path in dict.fromkeys(paths))
    fallbacks = [f["part"] for f in recorded.get("fallbacks") or []]
    return " · ".join(filter(None, [f"commit {recorded['commit']['committer']}", counted,
                                    f"{len(fallbacks)} fallback{'s' if len(fallbacks) > 1 else ''} "
                                    f"({', '.join(fallbacks)})" if fallbacks else ""]))

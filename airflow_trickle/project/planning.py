"""What one DAG run refreshes: manual-run parameters, due checks, freshness. Pure functions.

A scheduled run visits every refresh unit; a unit whose schedule is not due ends at once.  A
manual run (triggered from the UI form) refreshes exactly the selected stream tables, plus
their upstream and/or downstream stream tables when asked, whatever their schedules.
"""
from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from airflow_trickle.errors import InvalidParameterError
from airflow_trickle.graph import downstream_of, upstream_of
from airflow_trickle.model import RunMode
from airflow_trickle.names import qualify_name
from airflow_trickle.project import Project, RefreshUnit
from airflow_trickle.schedule import format_duration


@dataclass(frozen=True)
class Selection:
    """The stream tables a run refreshes, how, and whether schedules are ignored."""

    tables: frozenset[str]
    mode: RunMode = RunMode.AUTO
    #: A manual run refreshes its selection now; a scheduled run only what is due.
    forced: bool = False

    def members(self, unit: RefreshUnit) -> list[str]:
        """The members of ``unit`` this run refreshes, in refresh order."""
        return [m for m in unit.members if m in self.tables]


#: The parameters of a manual run (the trigger form's fields).
RUN_PARAMETERS = ("tables", "mode", "include_upstream", "include_downstream")

#: How the form names every stream table of one database (the DAG's task group): ``shop.*``.
GROUP_SUFFIX = ".*"


def table_choices(project: Project) -> dict[str, str]:
    """The trigger form's choices for ``tables``: each stream table, then each database group.

    Values map to the labels the form shows (``{"shop.*": "all of shop"}``); ``select`` accepts
    every value.

    >>> from airflow_trickle.project import define_project
    >>> table_choices(define_project("p", warehouse="/wh", stream_tables=[
    ...     {"name": "s.a", "query": "SELECT * FROM s.src"}, {"name": "s.b", "query": "SELECT * FROM s.a"}]))
    {'s.a': 's.a', 's.b': 's.b', 's.*': 'all of s (2 stream tables)'}
    """
    choices = {name: name for name in project.stream_tables}
    for database, members in _databases(project).items():
        choices[database + GROUP_SUFFIX] = f"all of {database} ({len(members)} stream table{'s' * (len(members) > 1)})"
    return choices


def _databases(project: Project) -> dict[str, list[str]]:
    databases: dict[str, list[str]] = {}
    for name in project.stream_tables:
        databases.setdefault(name.rsplit(".", 1)[0], []).append(name)
    return databases


def select(project: Project, params: dict | None, *, manual: bool) -> Selection:
    """The selection of a run from its trigger-form ``params``; raises on any bad value.

    >>> from airflow_trickle.project import define_project
    >>> p = define_project("p", warehouse="/wh", stream_tables=[
    ...     {"name": "s.a", "query": "SELECT * FROM s.src"}, {"name": "s.b", "query": "SELECT * FROM s.a"}])
    >>> sorted(select(p, {"tables": ["s.b"], "include_upstream": True}, manual=True).tables)
    ['s.a', 's.b']
    """
    params = dict(params or {})
    names = list(project.stream_tables)
    if not manual:
        return Selection(frozenset(names))
    unknown = sorted(set(params) - set(RUN_PARAMETERS))
    if unknown:
        # a typo ('table') must not silently mean "every stream table"
        raise InvalidParameterError(
            f"unknown run parameter{'s' if len(unknown) > 1 else ''} {', '.join(map(repr, unknown))}",
            hint=f"the parameters are {', '.join(RUN_PARAMETERS)}")
    requested = params.get("tables") or []
    if isinstance(requested, str):
        requested = [t for t in (part.strip() for part in requested.split(",")) if t]
    if not isinstance(requested, list) or not all(isinstance(t, str) for t in requested):
        raise InvalidParameterError(f"'tables' must be a list of stream table names, not {requested!r}")
    chosen = set()
    databases = _databases(project)
    for text in requested:
        database = text.strip().removesuffix(GROUP_SUFFIX) if text.strip().endswith(GROUP_SUFFIX) else None
        if database in databases:
            chosen.update(databases[database])
            continue
        name = _known_name(text, names)
        if name is None:
            raise InvalidParameterError(
                f"'tables' names {text!r}, which is not a stream table of project {project.name!r}",
                hint=f"choose from {', '.join(table_choices(project))}")
        chosen.add(name)
    if not chosen:
        chosen = set(names)
    try:
        mode = RunMode.parse(params.get("mode") or RunMode.AUTO, what="mode")
    except Exception:  # noqa: BLE001 - restated as a parameter error
        raise InvalidParameterError(f"'mode' must be one of {RunMode.choices()}, not {params.get('mode')!r}") from None
    expanded = set(chosen)
    for flag, neighbours in (("include_upstream", upstream_of), ("include_downstream", downstream_of)):
        value = False if params.get(flag) is None else params[flag]  # the form sends null when left empty
        if not isinstance(value, bool):
            raise InvalidParameterError(f"'{flag}' must be true or false, not {value!r}")
        if value:
            for name in chosen:
                expanded |= {n for n in neighbours(project.graph, name) if n in project.stream_tables}
    return Selection(frozenset(expanded), mode=mode, forced=True)


def _known_name(text: str, names: list[str]) -> str | None:
    try:
        name = qualify_name(text)
    except Exception:  # noqa: BLE001 - an unparsable name is simply unknown
        return None
    return name if name in names else None


def is_due(project: Project, unit: RefreshUnit, last_refreshes: dict[str, datetime | None], now: datetime,
           tolerance: timedelta = timedelta(0)) -> tuple[bool, str]:
    """Whether a scheduled run refreshes ``unit`` at ``now``, and why (for the task log).

    ``last_refreshes`` holds each member's last refresh (``None``: never, or not created yet).
    ``tolerance`` (half the DAG's tick) keeps a table whose period equals the tick from being
    refreshed only every other run because its last refresh started a few seconds late.
    A group fires on its policy: ``fastest`` when any member is due, ``slowest`` when all are.
    """
    if any(last_refreshes.get(m) is None for m in unit.members):
        return True, "never refreshed"
    schedule = project.schedule_of(unit)
    if schedule.on_commit:  # the on-commit DAG refreshes it at each commit; here it follows its upstream
        return True, "schedule on_commit: due in every run (nothing new beyond its frontier skips without Spark)"
    if schedule.is_calculated:
        return False, "no schedule of its own and nothing downstream has one (refresh it manually)"
    probe = now + tolerance
    due = [m for m in unit.members if schedule.is_due(last_refreshes[m], probe)]
    if unit.schedule_policy == "slowest" and unit.is_group:
        fires = len(due) == len(unit.members)
    else:
        fires = bool(due)
    if fires:
        return True, f"due (schedule {schedule.text or format_duration(schedule.nominal_period())})"
    nexts = [schedule.next_due(last_refreshes[m]) for m in unit.members]
    next_due = max(nexts) if unit.schedule_policy == "slowest" and unit.is_group else min(nexts)
    newest = max(last_refreshes[m] for m in unit.members)
    return False, (f"not due (next in {format_duration(next_due - probe)}; last refreshed "
                   f"{newest:%Y-%m-%d %H:%M:%S} UTC, schedule {schedule.text or format_duration(schedule.every)})")


@dataclass(frozen=True)
class FreshnessMiss:
    """A stream table found staler than its freshness target."""

    name: str
    staleness: timedelta
    target: timedelta
    data_timestamp: datetime

    @property
    def message(self) -> str:
        return (f"stream table '{self.name}' missed its freshness target: its data is "
                f"{format_duration(self.staleness)} old (target {format_duration(self.target)}, "
                f"data as of {self.data_timestamp:%Y-%m-%d %H:%M:%S} UTC)")

    def as_dict(self) -> dict:
        return {"stream_table": self.name, "staleness_seconds": int(self.staleness.total_seconds()),
                "target_seconds": int(self.target.total_seconds()),
                "data_timestamp": self.data_timestamp.isoformat(), "message": self.message}


def freshness_miss(name: str, target: timedelta | None, data_timestamp: datetime | None,
                   now: datetime) -> FreshnessMiss | None:
    """The miss when ``name``'s data (as of ``data_timestamp``) is older than ``target`` at ``now``."""
    if target is None or data_timestamp is None:
        return None
    staleness = now - data_timestamp
    return FreshnessMiss(name, staleness, target, data_timestamp) if staleness > target else None

"""Change-feed health: can every source still give its readers the changes they have not read?

A DIFFERENTIAL refresh reads a source's changes after its frontier version F (the change data
feed) and the source as it was at F (time travel).  Both need files that ``VACUUM`` deletes once
they are older than the source's ``delta.deletedFileRetentionDuration`` (7 days by default) --
change files from the moment they are written, data files from the moment a later commit
removes them -- and log entries that are cleaned up after ``delta.logRetentionDuration``
(30 days).  The earliest such moment for a reader is the commit right after its frontier,
F + 1: from ``time(F + 1) + retention`` on, a VACUUM may break the reader.

:func:`health` reports per source and reader: the change feed on or off, the oldest version
still in the log, the retentions, the time left, and a status:

* ``OK`` -- nothing unread, or the time left is longer than ``change_feed_warning_hours``;
* ``AT_RISK`` -- less time left than that (or already past: the next VACUUM breaks it), or the
  change feed is off (refreshes recompute instead of applying changes);
* ``BROKEN`` -- a change the reader needs is gone (log entries cleaned, or, on a local
  warehouse, a file its window references deleted): its next refresh runs FULL, and says why.

AT_RISK and BROKEN readers get an ``ALERT`` row in the refresh history (once an hour at most).
Everything comes from the Delta logs: no Spark.
"""
from __future__ import annotations

import json
import logging
import re
import uuid
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import TYPE_CHECKING
from urllib.parse import unquote

from airflow_trickle.catalog.model import utcnow
from airflow_trickle.model import Action, CdcMode, Outcome, RefreshMode

if TYPE_CHECKING:
    from airflow_trickle.location import Location

log = logging.getLogger(__name__)

#: Delta's defaults when a table does not set them.
DEFAULT_DELETED_FILE_RETENTION = timedelta(days=7)
DEFAULT_LOG_RETENTION = timedelta(days=30)
#: An alert for the same reader and source is written at most this often.
ALERT_EVERY = timedelta(hours=1)

OK, AT_RISK, BROKEN = "OK", "AT_RISK", "BROKEN"
_RANK = {OK: 0, AT_RISK: 1, BROKEN: 2}

_UNITS = {"millisecond": timedelta(milliseconds=1), "second": timedelta(seconds=1), "minute": timedelta(minutes=1),
          "hour": timedelta(hours=1), "day": timedelta(days=1), "week": timedelta(weeks=1)}


def parse_interval(text: str | None, default: timedelta) -> timedelta:
    """A Delta retention property (``interval 7 days``, ``interval 1 day 12 hours``) as a timedelta.

    >>> parse_interval("interval 2 hours", timedelta(0)), parse_interval(None, timedelta(days=7))
    (datetime.timedelta(seconds=7200), datetime.timedelta(days=7))
    """
    if not text:
        return default
    pairs = re.findall(r"(\d+(?:\.\d+)?)\s*(millisecond|second|minute|hour|day|week)s?", text.lower())
    if not pairs:
        return default
    return sum((float(n) * _UNITS[unit] for n, unit in pairs), timedelta(0))


@dataclass
class ReaderHealth:
    """One stream table reading the source."""

    stream_table: str
    frontier_version: int | None
    status: str
    message: str
    #: Before a VACUUM may delete a change it has not read (None: nothing unread).
    time_left: timedelta | None = None


@dataclass
class SourceHealth:
    """One source (a base table or a stream table's storage) and its readers."""

    source: str
    location: str
    change_feed: bool
    latest_version: int
    #: The oldest version read from the log (as far back as the slowest reader needs).
    oldest_log_version: int
    deleted_file_retention: timedelta
    log_retention: timedelta
    readers: list[ReaderHealth] = field(default_factory=list)

    @property
    def status(self) -> str:
        return max((r.status for r in self.readers), key=_RANK.__getitem__, default=OK)


def health(env, *, record_alerts: bool = True, now: datetime | None = None) -> list[SourceHealth]:
    """The change-feed health of every source of a stream table (see the module docstring);
    ``record_alerts``: an ALERT history row for each reader AT_RISK or BROKEN."""
    now = now or utcnow()
    report = source_health(env.catalog, timedelta(hours=float(env.config.change_feed_warning_hours)), now)
    if record_alerts:
        _record_alerts(env, report, now)
    return report


def reader_status(report: list[SourceHealth]) -> dict[str, ReaderHealth]:
    """Each reader's worst status over its sources (what the Stream tables page shows)."""
    worst: dict[str, ReaderHealth] = {}
    for source in report:
        for reader in source.readers:
            if reader.stream_table not in worst or _RANK[reader.status] > _RANK[worst[reader.stream_table].status]:
                worst[reader.stream_table] = reader
    return worst


def source_health(catalog, warning: timedelta, now: datetime) -> list[SourceHealth]:
    """:func:`health` without the alerts, from a catalog alone."""
    tables = {st.name: st for st in catalog.list()}
    by_source: dict[str, list] = {}
    for dep in catalog.dependencies():
        if dep.st_name in tables and dep.source_location:  # rows of old catalogs may lack it
            by_source.setdefault(dep.source_name, []).append(dep)
    report = []
    for source, deps in sorted(by_source.items()):
        location = deps[0].source_location
        try:
            report.append(_source_health(source, catalog.at(location), deps, tables, now, warning))
        except Exception as err:  # noqa: BLE001 - an unreadable source is itself the finding
            readers = [ReaderHealth(d.st_name, tables[d.st_name].frontier.get(source), BROKEN,
                                    f"{source} cannot be read at {location}: {str(err)[:200]}") for d in deps]
            report.append(SourceHealth(source, location or "?", False, -1, -1, DEFAULT_DELETED_FILE_RETENTION,
                                       DEFAULT_LOG_RETENTION, readers))
    return report


def _source_health(source: str, location: "Location", deps, tables, now: datetime, warning: timedelta) -> SourceHealth:
    from airflow_trickle.storage.deltalog import commit_history, latest_version, table_configuration

    configuration = table_configuration(location)
    latest = latest_version(location)
    # only the commits of the widest unread window: a long log is not read to the start
    frontiers = [tables[d.st_name].frontier.get(source) for d in deps]
    window = max([latest - f for f in frontiers if f is not None and f < latest], default=0)
    commits = {int(c["version"]): c for c in commit_history(location, window + 1) if "version" in c}
    oldest = min(commits, default=latest)
    result = SourceHealth(
        source=source, location=location.uri,
        change_feed=str(configuration.get("delta.enableChangeDataFeed", "false")).lower() == "true",
        latest_version=latest, oldest_log_version=oldest,
        deleted_file_retention=parse_interval(configuration.get("delta.deletedFileRetentionDuration"),
                                              DEFAULT_DELETED_FILE_RETENTION),
        log_retention=parse_interval(configuration.get("delta.logRetentionDuration"), DEFAULT_LOG_RETENTION))
    for dep in deps:
        st = tables[dep.st_name]
        result.readers.append(_reader_health(result, location, st, dep, commits, now, warning))
    return result


def _reader_health(src: SourceHealth, location: "Location", st, dep, commits: dict, now: datetime,
                   warning: timedelta) -> ReaderHealth:
    from airflow_trickle.storage.deltalog import commit_time

    frontier = st.frontier.get(src.source)
    name = st.name
    if st.effective_mode != RefreshMode.DIFFERENTIAL:
        return ReaderHealth(name, frontier, OK, "refreshed FULL: needs no change feed")
    if frontier is None:
        return ReaderHealth(name, None, OK, "not populated yet: its first refresh reads the source whole")
    if frontier >= src.latest_version:
        note = "" if src.change_feed or dep.cdc_mode != CdcMode.CDF else " (but the change feed is off)"
        status = OK if not note else AT_RISK
        return ReaderHealth(name, frontier, status, f"up to date: nothing unread{note}")
    needed = frontier + 1
    if needed not in commits:
        return ReaderHealth(name, frontier, BROKEN, f"the log of {src.source} no longer holds version {needed} "
                            f"(log retention {duration_text(src.log_retention)}): the next refresh runs FULL")
    missing = _missing_files(location, needed, src.latest_version)
    if missing:
        return ReaderHealth(name, frontier, BROKEN, f"{len(missing)} file(s) of versions {needed}-{src.latest_version} "
                            f"of {src.source} are gone (vacuumed), e.g. {missing[0]}: the next refresh runs FULL")
    since = commit_time(commits.get(needed)) or now
    time_left = min(since + src.deleted_file_retention, since + src.log_retention) - now
    if dep.cdc_mode == CdcMode.CDF and not src.change_feed:
        return ReaderHealth(name, frontier, AT_RISK, f"the change data feed of {src.source} is off: refreshes "
                            "recompute instead of applying changes", time_left)
    unread = f"{src.latest_version - frontier} unread version(s) since {since:%Y-%m-%d %H:%M} UTC"
    if time_left <= timedelta(0):
        return ReaderHealth(name, frontier, AT_RISK, f"{unread}, older than the retention "
                            f"({duration_text(src.deleted_file_retention)}): the next VACUUM of {src.source} breaks it; "
                            "refresh it now", time_left)
    if time_left < warning:
        return ReaderHealth(name, frontier, AT_RISK, f"{unread}: a VACUUM of {src.source} may delete them in "
                            f"{duration_text(time_left)}; refresh it, or raise delta.deletedFileRetentionDuration", time_left)
    return ReaderHealth(name, frontier, OK, f"{unread}; {duration_text(time_left)} left before a VACUUM may delete them",
                        time_left)


def _missing_files(location: "Location", first: int, last: int) -> list[str]:
    """Files the versions ``first..last`` reference (added, removed, change files) that are gone
    from the table's directory or object-store prefix."""
    missing = []
    for version in range(first, last + 1):
        entry = f"_delta_log/{version:020d}.json"
        try:
            commit = location.read(entry).decode("utf-8")
        except (FileNotFoundError, OSError):
            continue  # compacted into a checkpoint: the oldest-version check covers it
        for line in commit.splitlines():
            action = json.loads(line) if line.strip() else {}
            for kind in ("add", "remove", "cdc"):
                path = (action.get(kind) or {}).get("path")
                if path and "://" not in path and not location.exists(unquote(path)):
                    missing.append(unquote(path))
    return missing


def duration_text(delta: timedelta) -> str:
    """A timedelta for people: ``6d23h``, ``2h05m``, ``12m``, ``-1h10m`` (already past).

    >>> duration_text(timedelta(days=6, hours=23, minutes=5)), duration_text(timedelta(minutes=-70))
    ('6d23h', '-1h10m')
    """
    seconds = int(delta.total_seconds())
    sign, seconds = ("-" if seconds < 0 else ""), abs(seconds)
    days, rest = divmod(seconds, 86400)
    hours, minutes = rest // 3600, rest % 3600 // 60
    return sign + (f"{days}d{hours:02d}h" if days else f"{hours}h{minutes:02d}m" if hours else f"{minutes}m")


def _record_alerts(env, report: list[SourceHealth], now: datetime) -> None:
    from airflow_trickle.catalog import RefreshRecord

    for source in report:
        for reader in source.readers:
            if reader.status == OK:
                continue
            reason = f"change feed of {source.source}: {reader.status}: {reader.message}"
            recent = [r for r in env.catalog.history(reader.stream_table, limit=20)
                      if r.action == Action.CHANGE_FEED and r.start_time and now - r.start_time < ALERT_EVERY
                      and (r.reason or "").startswith(f"change feed of {source.source}: {reader.status}")]
            if recent:
                continue
            st = env.catalog.get(reader.stream_table)
            env.catalog.append_history(RefreshRecord(
                refresh_id=uuid.uuid4().hex, st_name=reader.stream_table, seq=st.refresh_seq if st else 0,
                action=Action.CHANGE_FEED, status=Outcome.ALERT, start_time=now, end_time=now, reason=reason,
                initiated_by="HEALTH"))
            log.warning("%s: %s", reader.stream_table, reason)
